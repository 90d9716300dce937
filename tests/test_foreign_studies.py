"""Foreign Optuna studies given to ``gfsim tune --storage`` (issue 52, item 7): what the
``foreign_study`` fuzz class (experiments/fuzz_studies.py) found, each built here from a
study gfsim tune made. Before the fixes each ended in a traceback (a trial state Optuna does
not know, text that is not UTF-8, JSON nested 10,000 deep, gfsim's own attribute of another
type, a finished trial without values), wrote beside a refused study (the ``-shm`` file of a
WAL), or let SQLite write into ``/proc/self/mem``. Now each is one line and the files stay
as they were; a study gfsim made still tunes. The fuzz corpus (tests/data/fuzz) holds some
of the generated storages too."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.tuning.rdb_rows import json_depth

TINY = str(Path(__file__).parent / "data" / "tiny.jsonl")
CORPUS = Path(__file__).parent / "data" / "fuzz"
TUNE = ["tune", "--log", TINY, "--param", "tau=0.3:0.99", "--seeds", "1", "--validate-seeds",
        "0", "--study", "s", "--json"]
DEEP = "[" * 10_000 + "]" * 10_000


def tune(storage: str, trials: int = 3):
    return CliRunner().invoke(app, [*TUNE, "--trials", str(trials), "--storage", storage])


def one_line(res, *words: str) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.output[-3000:])
    assert lines[0].startswith("gfsim: error: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()
            if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, bytes]:
    """A study gfsim tune made with two trials: SQLite and journal."""
    out = {}
    for kind in ("db", "journal"):
        path = tmp_path_factory.mktemp("made") / f"s.{kind}"
        res = tune(f"sqlite:///{path}" if kind == "db" else str(path), trials=2)
        assert res.exit_code == 0, res.output[-3000:]
        out[kind] = path.read_bytes()
    return out


def test_a_study_gfsim_made_still_tunes(made, tmp_path):
    db, journal = tmp_path / "s.db", tmp_path / "s.journal"
    db.write_bytes(made["db"])
    journal.write_bytes(made["journal"])
    for storage in (f"sqlite:///{db}", str(journal)):
        res = tune(storage)
        assert res.exit_code == 0, res.output[-3000:]
        assert json.loads(res.stdout)["trials"] == 3


@pytest.mark.parametrize("sql, words", [
    ("UPDATE trials SET state = 'BOGUS' WHERE number = 0",  # LookupError
     "table trials row 1: state 'BOGUS' is none of RUNNING/COMPLETE/PRUNED/FAIL/WAITING"),
    ("UPDATE trial_user_attributes SET value_json = CAST(X'7B2261223A22FF227D' AS TEXT) "
     "WHERE key = 'metrics' AND trial_id = 2",  # StorageInternalError
     "table trial_user_attributes row 11: value_json is not UTF-8 (byte 6)"),
    (f"UPDATE trial_params SET distribution_json = '{DEEP}'",  # RecursionError
     "table trial_params row 1: distribution_json nests 10000 deep (at most 64)"),
    ("UPDATE trial_params SET param_name = NULL",  # a parameter None: TypeError in --json
     "table trial_params row 1: param_name is NULL, not text"),
    ("UPDATE trial_values SET objective = 7 WHERE trial_id = 2",  # IndexError in Optuna
     "table trial_values row 2: objective 7 is past its study's directions"),
    (f"UPDATE study_user_attributes SET value_json = '{'9' * 5000}' WHERE key = 'gfsim_runs'",
     "table study_user_attributes row 3: value_json '999"),  # ValueError: int digits limit
])
def test_a_row_optuna_never_writes_is_refused_unopened(made, tmp_path, sql, words):
    db = tmp_path / "s.db"
    db.write_bytes(made["db"])
    with sqlite3.connect(db) as con:
        con.execute(sql)
    before = files(tmp_path)
    one_line(tune(f"sqlite:///{db}"), words, "which Optuna never writes",
             "a foreign or damaged study is not opened")
    assert files(tmp_path) == before


@pytest.mark.parametrize("sql, words", [
    ("UPDATE trial_user_attributes SET value_json = '[1, 2]' WHERE key = 'spec'",  # TypeError
     "trial 0: its attribute spec is not a policy spec (text)"),
    ("DELETE FROM trial_values WHERE trial_id = 1",  # TypeError in ranking the trials
     "trial 0: finished without a value per direction"),
    ("UPDATE trial_user_attributes SET value_json = '[[1.0], [2.0, 3.0]]' "
     "WHERE key = 'values_best_speedup'",  # ValueError in leave-one-task-out
     "trial 0: its attribute values_best_speedup is not a table of numbers"),
    ("UPDATE trial_user_attributes SET value_json = '\"nopolicy\"' WHERE key = 'spec'",
     "trial 0: its spec 'nopolicy' is no policy"),  # refused after a trial ran: file changed
    ("INSERT INTO trials (number, study_id, state) VALUES (2, 1, 'WAITING');"
     "INSERT INTO trial_system_attributes (trial_id, key, value_json) "
     "VALUES (3, 'fixed_params', '{\"tau\": \"abc\"}')",  # ValueError from Optuna
     "trial 2: waits to run tau='abc', outside the space tuned"),
    ("INSERT INTO trials (number, study_id, state) VALUES (2, 1, 'WAITING');"
     "INSERT INTO trial_system_attributes (trial_id, key, value_json) "
     "VALUES (3, 'fixed_params', '{\"tau\": 1e308}')",  # refused, amid Optuna's warnings
     "trial 2: waits to run tau=1e+308, outside the space tuned"),
])
def test_gfsims_own_records_of_another_shape_are_refused(made, tmp_path, sql, words):
    db = tmp_path / "s.db"
    db.write_bytes(made["db"])
    with sqlite3.connect(db) as con:
        con.executescript(sql)
    before = files(tmp_path)
    one_line(tune(f"sqlite:///{db}"), "study 's' in sqlite:///", words,
             "it is not a study gfsim tune wrote, or was changed since")
    assert files(tmp_path) == before


def test_a_schema_that_is_not_utf8_is_refused(tmp_path):
    # a byte flipped in the schema of a study gfsim made: the fuzz case (seed 53, case 7)
    # that ended in a UnicodeDecodeError traceback
    data = (CORPUS / "foreign_study--was-crashed--20261206-53-7.db@study").read_bytes()
    db = tmp_path / "s.db"
    db.write_bytes(data)
    one_line(tune(f"sqlite:///{db}"), "is not an SQLite database Optuna can read (its schema "
             "is not UTF-8); the file is left as it is")
    assert db.read_bytes() == data


def test_a_journal_line_nested_10000_deep_is_named_by_line(made, tmp_path):
    journal = tmp_path / "s.journal"
    line = '{"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"k": ' + DEEP + "}}"
    journal.write_bytes(made["journal"] + line.encode() + b"\n")
    number = journal.read_bytes().count(b"\n")
    before = files(tmp_path)
    one_line(tune(str(journal)), f"line {number} nests 10002 deep (at most 64)")  # RecursionError
    assert files(tmp_path) == before


def test_a_journal_study_refused_for_its_records_is_left_as_it_was(made, tmp_path):
    # (Optuna's create_study(load_if_exists=True) appended a create operation to the journal
    # before finding the study there: every later refusal left the file changed)
    journal = tmp_path / "s.journal"
    line = '{"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"gfsim_version": 1}}'
    journal.write_bytes(made["journal"] + line.encode() + b"\n")
    before = files(tmp_path)
    one_line(tune(str(journal)), "its attribute gfsim_version is not a list of versions")
    assert files(tmp_path) == before


def test_a_journal_study_of_other_settings_is_refused_unchanged(made, tmp_path):
    journal = tmp_path / "s.journal"
    journal.write_bytes(made["journal"])
    args = [a if a != "tau=0.3:0.99" else "tau=0.2:0.9" for a in TUNE]
    res = CliRunner().invoke(app, [*args, "--trials", "3", "--storage", str(journal)])
    one_line(res, "was made with")
    assert journal.read_bytes() == made["journal"]  # (a create operation was appended)


def test_a_study_refused_for_sql_in_its_wal_leaves_no_file_behind(made, tmp_path):
    db = tmp_path / "s.db"
    db.write_bytes(made["db"])
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("CREATE TRIGGER t AFTER INSERT ON trials BEGIN SELECT 1; END")
    kept = {name: (tmp_path / name).read_bytes() for name in ("s.db", "s.db-wal")}
    con.close()  # (checkpoints the WAL into s.db and removes it: put back the state before)
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "s.db-shm").unlink(missing_ok=True)
    before = files(tmp_path)
    one_line(tune(f"sqlite:///{db}"), "holds a trigger 't' on table 'trials'")
    assert files(tmp_path) == before  # the read made s.db-shm: removed again


@pytest.mark.parametrize("query, name", [("vfs=unix-none", "vfs"), ("nolock=1", "nolock"),
                                         ("immutable=1", "immutable")])
def test_a_url_that_turns_locking_off_is_refused(made, tmp_path, query, name):
    # (vfs=unix-none: a commit beside the heartbeat thread failed, StorageInternalError)
    db = tmp_path / "s.db"
    db.write_bytes(made["db"])
    one_line(tune(f"sqlite:///file:{db}?{query}&uri=true"), f"sets {name}, which turns "
             "SQLite's locking off")
    assert db.read_bytes() == made["db"]


@pytest.mark.parametrize("target", ["/proc/self/mem", "/proc/self/environ"])
def test_a_link_into_proc_is_not_a_study_file(tmp_path, target):
    (tmp_path / "s.db").symlink_to(target)
    one_line(tune(f"sqlite:///{tmp_path / 's.db'}"), "is not a regular file (it leads to",
             "an SQLite study must be a file")


def test_json_depth_counts_arrays_and_objects_not_brackets_in_strings():
    assert json_depth('{"a": [1, {"b": "[[[{"}]]}') == 3
    assert json_depth('"\\"[[["') == 0
    assert json_depth(DEEP) == 10_000


def test_the_fuzz_verdict_counts_a_changed_refused_study_a_peak_and_a_traceback():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fuzz_studies", Path(__file__).parent.parent / "experiments" / "fuzz_studies.py")
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    refused = {"rc": 2, "stderr": "gfsim: error: --storage x: no\n", "peak_kb": 1, "hung": False}
    assert fuzz.verdict(refused, {"s.db": "a"}, {"s.db": "a"})[0] == "error"
    assert fuzz.verdict(refused, {"s.db": "a"}, {"s.db": "b"})[0] == "altered"
    assert fuzz.verdict(refused, {"s.db": "a"}, {"s.db": "a", "s.db-shm": "c"})[0] == "altered"
    assert fuzz.verdict({**refused, "peak_kb": 3 << 20}, {}, {})[0] == "heavy"
    assert fuzz.verdict({**refused, "hung": True}, {}, {})[0] == "hung"
    crashed = {"rc": 1, "stderr": "Traceback (most recent call last):\nValueError: x\n",
               "peak_kb": 1, "hung": False}
    assert fuzz.verdict(crashed, {}, {}) == ("crash", "exit 1: ValueError: x")
    two = {**refused, "stderr": "gfsim: error: a\nsomething else\n"}
    assert fuzz.verdict(two, {}, {})[0] == "crash"
