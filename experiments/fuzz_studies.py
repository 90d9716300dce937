"""The ``foreign_study`` class of ``fuzz_logs.py``: hostile or broken Optuna storages given to
``gfsim tune --storage``.

A case starts from a study that ``gfsim tune`` itself made (SQLite, or a journal file), then
changes one thing: SQL of its own (triggers that loop or fill, views shadowing Optuna's tables,
FTS5 and R-tree virtual tables, indexes on expressions or with conditions, generated columns),
another Optuna schema (``alembic_version`` wrong, missing, doubled or 10 MB), tables with wrong
column types or values Optuna never writes, gfsim's own attributes of the wrong type, a 10 MB
study name, attributes nested 10,000 deep or of 10 MB, NUL and terminal escapes in names and
attributes, trials RUNNING for a dead or an impossible process; or the file itself: cut
short, not SQLite, zero bytes, a folder, a FIFO, a link to ``/dev`` or ``/proc``, read-only,
with a WAL, rollback journal or shared-memory file beside it, or an in-memory or read-only URL.

Each case runs ``gfsim tune`` (the tiny log, one seed, three trials where the study holds two)
in a process of its own under an address-space cap, a file-size cap and a hang guard. Its
verdict: exit 0, or exit 2 with one ``gfsim: error:`` line and no traceback (else
**crashed**); done within the guard (else **hung**); a peak resident size under 2 GB (else
**heavy**); and, when gfsim refused it, every file of the study byte for byte as it was (else
**altered**).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "data" / "tiny.jsonl")
STUDY = "s"
HANG_S = 60.0  # a case's own guard; tune on the tiny log takes ~4 s, import included
MEMORY_CAP = 4 << 30  # address space of a case's process
FILE_CAP = 256 << 20  # the largest file a case's process may write (a filling trigger)
PEAK_LIMIT_KB = 2 << 20  # 2 GB: above it a case is heavy


def tune_args(storage: str, trials: int = 3) -> list[str]:
    return ["tune", "--log", TINY, "--param", "tau=0.3:0.99", "--trials", str(trials),
            "--seeds", "1", "--validate-seeds", "0", "--study", STUDY, "--json",
            "--storage", storage]


def run_gfsim(args: list[str], cwd: str, hang_s: float = HANG_S) -> dict:
    """``gfsim ARGS`` in a process (group) of its own under the caps: exit code, stderr,
    peak resident size (KB), and whether the guard ended it."""
    def caps():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_CAP, FILE_CAP))

    code = f"from gfsim.cli.main import app; app({args!r})"
    env = {**os.environ, "COLUMNS": "200", "GFSIM_CACHE_DIR": os.path.join(cwd, "cache")}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=err, preexec_fn=caps, start_new_session=True, env=env)
        deadline, hung = time.monotonic() + hang_s, False
        while True:  # wait4, not Popen.wait: the case's own peak resident size
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline and not hung:
                hung = True
                os.killpg(proc.pid, 9)
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read(1 << 20).decode("utf-8", "replace")
    return {"rc": proc.returncode, "stderr": text, "peak_kb": usage.ru_maxrss, "hung": hung}


# -- the studies a case starts from ---------------------------------------------------------
@functools.lru_cache(maxsize=None)
def base_study(kind: str) -> bytes:
    """The bytes of a study ``gfsim tune`` made with two trials: ``db`` (SQLite) or
    ``journal`` (made once per process)."""
    with tempfile.TemporaryDirectory(prefix="gfsim-fuzz-study-") as tmp:
        name = os.path.join(tmp, f"base.{kind}")
        url = f"sqlite:///{name}" if kind == "db" else name
        got = run_gfsim(tune_args(url, trials=2), tmp, hang_s=300)
        if got["rc"] != 0:
            raise RuntimeError(f"the base study could not be made: {got['stderr'][-2000:]}")
        if kind == "db":  # small pages: a corpus file of ~30 KB, not 112 KB
            con = sqlite3.connect(name, isolation_level=None)
            con.execute("PRAGMA page_size = 512")
            con.execute("VACUUM")
            con.close()
        return Path(name).read_bytes()


# -- mutations of an SQLite study ------------------------------------------------------------
TABLES = ["studies", "version_info", "study_directions", "study_user_attributes",
          "study_system_attributes", "trials", "trial_user_attributes",
          "trial_system_attributes", "trial_params", "trial_values",
          "trial_intermediate_values", "trial_heartbeats", "alembic_version"]
DEEP = "[" * 10_000 + "]" * 10_000
HUGE = json.dumps("x" * (10 << 20))
ESCAPES = ["s\x00x", "\x1b]0;FUZZ\x07", "\x1b[2J\x1b[31m", "[bold red]s[/]", "\u202es",
           "\ud800", "s\n\nt", "\x9b31m"]
ODD_JSON = ['"text"', "1", "-1", "null", "[]", "{}", "1e999", "NaN", '{"a": 1}', "[1, 2]",
            "not json", "", DEEP, "9" * 5000, '"\\u0000"']
DEAD_PIDS = [999_999_999, 2**31 - 1, 2**70, -1, 0, 1, "1", None, 4_194_303]


def _trigger(con, rng):
    table = rng.choice(TABLES)
    event = rng.choice(["INSERT", "UPDATE", "DELETE"])
    body = rng.choice([
        f"INSERT INTO {table} SELECT * FROM {table} LIMIT 1;",  # loops (recursive triggers)
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT count(*) FROM c;",  # runs for ever
        "CREATE_FILL",
        "SELECT RAISE(ABORT, 'fuzz');",
        f"DELETE FROM {table};"])
    if body == "CREATE_FILL":
        con.execute("CREATE TABLE fill (x BLOB)")
        body = ("INSERT INTO fill WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
                "FROM c LIMIT 100000000) SELECT zeroblob(4096) FROM c;")
    when = rng.choice(["BEFORE", "AFTER"])
    con.execute(f"CREATE TRIGGER t_fuzz {when} {event} ON {table} BEGIN {body} END")
    return f"a {when} {event} trigger on {table}: {body[:40]}"


def _view(con, rng):
    table = rng.choice([t for t in TABLES if t != "alembic_version"])
    if rng.random() < 0.5:
        con.execute(f"ALTER TABLE {table} RENAME TO {table}_real")
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM {table}_real")
        return f"a view shadowing {table}"
    con.execute(f"CREATE VIEW v_fuzz AS SELECT * FROM {table}")
    return f"a view over {table}"


def _virtual(con, rng):
    table = rng.choice(["trial_values", "trial_user_attributes", "study_user_attributes",
                        "trial_heartbeats"])
    module = rng.choice(["fts5", "fts4", "rtree"])
    cols = "(id, minx, maxx)" if module == "rtree" else "(key, value_json)"
    if rng.random() < 0.5:
        con.execute(f"DROP TABLE {table}")
        con.execute(f"CREATE VIRTUAL TABLE {table} USING {module}{cols}")
        return f"a {module} virtual table in place of {table}"
    con.execute(f"CREATE VIRTUAL TABLE vt_fuzz USING {module}{cols}")
    return f"a {module} virtual table beside the study"


def _index(con, rng):
    table, col = rng.choice([("trials", "number"), ("trial_values", "value"),
                             ("studies", "study_name"), ("trial_params", "param_name")])
    sql = rng.choice([f"CREATE INDEX i_fuzz ON {table}({col} + 1)",
                      f"CREATE INDEX i_fuzz ON {table}(length({col}))",
                      f"CREATE INDEX i_fuzz ON {table}({col}) WHERE {col} IS NOT NULL",
                      f"CREATE INDEX i_fuzz ON {table}(length(hex(zeroblob(1000000))))",
                      f"CREATE INDEX i_fuzz ON {table}({col} COLLATE NOCASE)"])
    con.execute(sql)
    return sql


def _generated(con, rng):
    table = rng.choice(["trials", "trial_values", "studies", "trial_user_attributes"])
    expr = rng.choice(["1", "length(hex(zeroblob(1000000)))", "abs(-7)"])
    if rng.random() < 0.5:
        con.execute(f"ALTER TABLE {table} ADD COLUMN g_fuzz AS ({expr}) VIRTUAL")
        return f"a virtual generated column in {table} = {expr}"
    rows = con.execute(f"SELECT sql FROM sqlite_master WHERE name = '{table}'").fetchone()
    cols = ", ".join(c[1] for c in con.execute(f"PRAGMA table_info({table})"))
    con.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
    con.execute(rows[0].replace("(", f"(g_fuzz INTEGER GENERATED ALWAYS AS ({expr}) STORED, ",
                                1))
    con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {table}_old")
    con.execute(f"DROP TABLE {table}_old")
    return f"a stored generated column in {table} = {expr}"


def _alembic(con, rng):
    op = rng.choice(["old", "unknown", "missing-row", "no-table", "two-rows", "huge", "null",
                     "escape", "version_info"])
    if op == "no-table":
        con.execute("DROP TABLE alembic_version")
    elif op == "missing-row":
        con.execute("DELETE FROM alembic_version")
    elif op == "two-rows":
        con.execute("INSERT INTO alembic_version VALUES ('v2.4.0.a')")
    elif op == "version_info":
        con.execute("UPDATE version_info SET schema_version = ?, library_version = ?",
                    (rng.choice([-1, 2**62, "x", None]), rng.choice(["0.1", "9" * 10_000])))
    else:
        value = {"old": "v1.2.0.a", "unknown": "v99.0.0.zz", "huge": "v" * (10 << 20),
                 "null": None, "escape": "\x1b]0;FUZZ\x07"}[op]
        con.execute("UPDATE alembic_version SET version_num = ?", (value,))
    return f"alembic_version: {op}"


def _wrong_types(con, rng):
    table, col, value = rng.choice([
        ("trials", "state", "BOGUS"), ("trials", "state", 99), ("trials", "number", "abc"),
        ("trials", "number", 2**62), ("trials", "number", -5), ("trials", "datetime_start",
                                                                  "not a date"),
        ("trials", "datetime_complete", 1e308), ("trials", "study_id", 999),
        ("trial_values", "value", "NaN"), ("trial_values", "value", "abc"),
        ("trial_values", "value_type", "WEIRD"), ("trial_values", "objective", 7),
        ("trial_params", "param_value", "x"), ("trial_params", "distribution_json",
                                               "not json"),
        ("trial_params", "distribution_json", '{"name": "NoSuch", "attributes": {}}'),
        ("trial_params", "distribution_json", DEEP),
        ("trial_params", "param_name", None),
        ("study_directions", "direction", "SIDEWAYS"), ("study_directions", "objective", 5),
        ("studies", "study_name", None), ("studies", "study_id", "one")])
    if rng.random() < 0.3:  # the table made again with other declared types
        sql = con.execute(f"SELECT sql FROM sqlite_master WHERE name = '{table}'").fetchone()[0]
        con.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
        con.execute(sql.replace("INTEGER", "BLOB").replace("VARCHAR", "REAL")
                    .replace("FLOAT", "TEXT"))
        con.execute(f"INSERT INTO {table} SELECT * FROM {table}_old")
        con.execute(f"DROP TABLE {table}_old")
    con.execute("PRAGMA ignore_check_constraints = ON")
    con.execute(f"UPDATE {table} SET {col} = ?", (value,))
    return f"{table}.{col} = {str(value)[:30]!r}"


def _attrs(con, rng):
    """gfsim's own attributes, and any attribute, of odd values."""
    table, key = rng.choice([
        ("study_user_attributes", "gfsim_configuration"),
        ("study_user_attributes", "gfsim_version"), ("study_user_attributes", "gfsim_runs"),
        ("study_user_attributes", "gfsim_setup"), ("trial_user_attributes", "spec"),
        ("trial_user_attributes", "metrics"), ("trial_user_attributes", "tasks"),
        ("trial_user_attributes", "search"), ("trial_user_attributes", "clipped"),
        ("trial_user_attributes", "constraint"), ("trial_user_attributes",
                                                  "values_best_speedup"),
        ("trial_user_attributes", "gfsim_worker"), ("trial_user_attributes", "gfsim_retries"),
        ("trial_user_attributes", "gfsim_heartbeat"),
        ("trial_system_attributes", "retry_history"),
        ("study_system_attributes", "fuzz")])
    value = rng.choice(ODD_JSON + [HUGE])
    owner = "study_id" if table.startswith("study") else "trial_id"
    con.execute(f"DELETE FROM {table} WHERE key = ?", (key,))
    ids = [r[0] for r in con.execute(f"SELECT DISTINCT {owner} FROM "
                                     f"{'studies' if owner == 'study_id' else 'trials'}")]
    for i in ids[:rng.choice([1, len(ids)])]:
        con.execute(f"INSERT INTO {table} ({owner}, key, value_json) VALUES (?, ?, ?)",
                    (i, key, value))
    return f"{table}[{key!r}] = {value[:30]!r}{' (10 MB)' if value is HUGE else ''}"


def _names(con, rng):
    op = rng.choice(["huge-other", "huge-ours", "escape-ours", "escape-other", "escape-key",
                     "many-studies"])
    name = rng.choice(ESCAPES).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if op.startswith("huge"):
        name = "n" * (10 << 20)
    if op == "many-studies":
        con.executemany("INSERT INTO studies (study_name) VALUES (?)",
                        [(f"s{k}",) for k in range(100_000)])
    elif op.endswith("other"):
        con.execute("INSERT INTO studies (study_name) VALUES (?)", (name,))
    elif op.endswith("ours"):
        con.execute("UPDATE studies SET study_name = ?", (name,))
    else:
        con.execute("INSERT INTO study_user_attributes (study_id, key, value_json) "
                    "VALUES (1, ?, ?)", (name, json.dumps(name)))
    return f"study name: {op} {name[:20]!r}"


def _running(con, rng):
    """Trials RUNNING for a process that is gone, never was, or is not a number."""
    from gfsim.core.lifeline import host_id

    pid = rng.choice(DEAD_PIDS)
    who = rng.choice([{"host": host_id(), "pid": pid, "start": 1},
                      {"host": host_id(), "pid": pid}, {"host": "elsewhere", "pid": pid},
                      {"host": host_id(), "pid": pid, "start": "x"}, "nobody", None])
    number = rng.choice(["all", "last", "new"])
    if number == "new":
        con.execute("INSERT INTO trials (number, study_id, state, datetime_start) "
                    "VALUES (2, 1, 'RUNNING', '2020-01-01 00:00:00')")
        tid = con.execute("SELECT max(trial_id) FROM trials").fetchone()[0]
        con.execute("INSERT INTO trial_params (trial_id, param_name, param_value, "
                    "distribution_json) SELECT ?, param_name, param_value, distribution_json "
                    "FROM trial_params WHERE trial_id = 1", (tid,))
        ids = [tid]
    else:
        ids = [r[0] for r in con.execute("SELECT trial_id FROM trials ORDER BY trial_id")]
        ids = ids[-1:] if number == "last" else ids
    for tid in ids:
        con.execute("UPDATE trials SET state = 'RUNNING', datetime_complete = NULL "
                    "WHERE trial_id = ?", (tid,))
        con.execute("DELETE FROM trial_user_attributes WHERE trial_id = ? AND key = "
                    "'gfsim_worker'", (tid,))
        con.execute("INSERT INTO trial_user_attributes (trial_id, key, value_json) "
                    "VALUES (?, 'gfsim_worker', ?)", (tid, json.dumps(who)))
    if rng.random() < 0.3:
        con.execute("INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, ?)",
                    (ids[0], rng.choice(["never", "1970-01-01 00:00:00", None])))
    return f"{len(ids)} trials RUNNING ({number}) for {json.dumps(who)[:60]}"


def _waiting(con, rng):
    """Trials enqueued (WAITING) with fixed parameters out of the space, of other names or
    types, as an earlier run or another tool could leave them."""
    fixed = rng.choice(['{"tau": 1e308}', '{"tau": "abc"}', '{"other": 1}', '{"tau": null}',
                        '{"tau": [1, 2]}', "[]", '"x"', '{"tau": 0.5, "tau2": 0.5}'])
    for number in range(2, 2 + rng.choice([1, 3])):
        con.execute("INSERT INTO trials (number, study_id, state) VALUES (?, 1, 'WAITING')",
                    (number,))
        tid = con.execute("SELECT max(trial_id) FROM trials").fetchone()[0]
        con.execute("INSERT INTO trial_system_attributes (trial_id, key, value_json) "
                    "VALUES (?, 'fixed_params', ?)", (tid, fixed))
    return f"WAITING trials with fixed_params {fixed}"


def _many_trials(con, rng):
    """Thousands of finished trials (the study is past --trials: nothing runs)."""
    n = rng.choice([1000, 5000])
    for k in range(2, n):
        con.execute("INSERT INTO trials (number, study_id, state, datetime_start, "
                    "datetime_complete) SELECT ?, study_id, state, datetime_start, "
                    "datetime_complete FROM trials WHERE trial_id = 1", (k,))
        tid = con.execute("SELECT max(trial_id) FROM trials").fetchone()[0]
        for table in ("trial_user_attributes", "trial_params", "trial_values"):
            cols = ", ".join(c[1] for c in con.execute(f"PRAGMA table_info({table})")
                             if c[1] != "trial_id" and not c[5])
            con.execute(f"INSERT INTO {table} (trial_id, {cols}) SELECT ?, {cols} FROM "
                        f"{table} WHERE trial_id = 1", (tid,))
    return f"{n} finished trials"


def _directions(con, rng):
    op = rng.choice(["two", "none", "minimize"])
    if op == "two":
        con.execute("INSERT INTO study_directions (direction, study_id, objective) "
                    "VALUES ('MINIMIZE', 1, 1)")
    elif op == "none":
        con.execute("DELETE FROM study_directions")
    else:
        con.execute("UPDATE study_directions SET direction = 'MINIMIZE'")
    return f"study directions: {op}"


SQL_OPS = {"waiting": _waiting, "many_trials": _many_trials, "directions": _directions,
           "trigger": _trigger, "view": _view, "virtual": _virtual, "index": _index,
           "generated": _generated, "alembic": _alembic, "wrong_types": _wrong_types,
           "attrs": _attrs, "names": _names, "running": _running}


def _mutated_db(op: str, rng: random.Random) -> tuple[bytes, str]:
    with tempfile.TemporaryDirectory(prefix="gfsim-fuzz-study-") as tmp:
        name = os.path.join(tmp, "x.db")
        Path(name).write_bytes(base_study("db"))
        con = sqlite3.connect(name, isolation_level=None)
        con.execute("PRAGMA synchronous = OFF")  # (100,000 single inserts: no fsync each)
        try:
            for _ in range(20):  # a draw SQLite itself refuses (NULL where NOT NULL): again
                con.execute("BEGIN")
                try:
                    what = SQL_OPS[op](con, rng)
                except sqlite3.Error:
                    con.execute("ROLLBACK")
                    continue
                con.execute("COMMIT")
                break
        finally:
            con.close()
        return Path(name).read_bytes(), what


# -- mutations of the file -------------------------------------------------------------------
LINK_TARGETS = ["/dev/zero", "/dev/null", "/dev/full", "/dev/urandom", "/proc/self/mem",
                "/proc/self/environ", "/proc/kcore", "/proc/self/pagemap", "/proc", "/",
                "/nonexistent/x.db"]
URLS = ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared",
        "sqlite:///file:{path}?mode=memory&uri=true", "sqlite:///{path}?mode=ro",
        "sqlite:///file:{path}?mode=ro&uri=true", "sqlite+pysqlite:///{path}",
        "sqlite:///{path}?timeout=abc", "sqlite:////proc/self/mem", "sqlite:///{path}/sub.db",
        "sqlite:///file:{path}?vfs=unix-none&uri=true", "sqlite:///{path}?check_same_thread=x"]


def pack(main: bytes, side: bytes) -> bytes:
    """A case's main file and the file beside it, as one payload (a corpus file)."""
    return len(main).to_bytes(8, "big") + main + side


def unpack(data: bytes) -> tuple[bytes, bytes]:
    n = int.from_bytes(data[:8], "big")
    return data[8:8 + n], data[8 + n:]


def _file_case(rng: random.Random) -> tuple[bytes, str, str]:
    db = base_study("db")
    op = rng.choice(["truncated", "not-sqlite", "zero", "header-only", "dir", "fifo", "link",
                     "read-only", "side", "url", "page-flip"])
    if op == "truncated":
        cut = rng.choice([100, 4096, 4097, len(db) // 2, len(db) - 1])
        return db[:cut], ".db@study", f"cut at byte {cut} of {len(db)}"
    if op == "page-flip":
        data = bytearray(db)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(100, len(data))] = rng.randrange(256)
        return bytes(data), ".db@study", "bytes flipped past the header"
    if op == "not-sqlite":
        data = rng.choice([b"not a database\n" * 100, os.urandom(8192),
                           b"SQLite format 3\x00" + os.urandom(4080), base_study("journal")])
        return data, ".db@study", "a file that is not SQLite"
    if op == "header-only":
        return db[:100], ".db@study", "the 100-byte header only"
    if op == "zero":
        return b"", ".db@study", "a zero-byte file"
    if op in ("dir", "fifo"):
        return b"", f".db@study@{op}", f"a {'folder' if op == 'dir' else 'FIFO'}"
    if op == "link":
        target = rng.choice(LINK_TARGETS)
        return target.encode(), ".db@study@link", f"a link to {target}"
    if op == "read-only":
        return db, ".db@study@ro", "a read-only file (mode 0444)"
    if op == "url":
        url = rng.choice(URLS)
        return url.encode() + b"\n" + db, ".db@study@url", f"the URL {url}"
    return _side(db, rng)


def _side(db: bytes, rng: random.Random) -> tuple[bytes, str, str]:
    """A WAL, rollback journal or shared-memory file beside the study: garbage, or a real
    WAL holding a write the main file lacks."""
    which = rng.choice(["wal", "journal", "shm"])
    if which == "wal" and rng.random() < 0.6:
        with tempfile.TemporaryDirectory(prefix="gfsim-fuzz-study-") as tmp:
            name = os.path.join(tmp, "x.db")
            Path(name).write_bytes(db)
            con = sqlite3.connect(name, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA wal_autocheckpoint=0")
            con.execute("CREATE TRIGGER t_wal AFTER INSERT ON trials BEGIN "
                        "SELECT RAISE(ABORT, 'from the WAL'); END")
            # read while the connection is open: closing it checkpoints the WAL into the file
            main, side = Path(name).read_bytes(), Path(name + "-wal").read_bytes()
            con.close()
            return pack(main, side), ".db@study@side-wal", \
                "a trigger that only the WAL beside the file holds"
    side = rng.choice([os.urandom(4096), b"\x00" * 32768, db[:4096] * 3])
    return pack(db, side), f".db@study@side-{which}", f"a garbage -{which} file beside it"


# -- mutations of a journal file -------------------------------------------------------------
def _journal_case(rng: random.Random) -> tuple[bytes, str, str]:
    text = base_study("journal")
    lines = text.splitlines(keepends=True)
    op = rng.choice(["deep-attr", "huge-name", "escape-name", "nul", "link", "fifo", "dir",
                     "read-only", "running-dead", "odd-attr"])
    if op in ("link", "fifo", "dir", "read-only"):
        how = {"read-only": "ro"}.get(op, op)
        target = rng.choice(LINK_TARGETS)
        return (target.encode() if op == "link" else text), f".journal@study@{how}", \
            f"journal: {op}{' to ' + target if op == 'link' else ''}"
    ops = [json.loads(x) for x in lines]
    if op == "deep-attr":
        extra = '{"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"k": ' + \
                DEEP + "}}\n"
        return text + extra.encode(), ".journal@study", "journal: an attribute 10,000 deep"
    if op in ("huge-name", "escape-name"):
        name = "n" * (10 << 20) if op == "huge-name" else rng.choice(ESCAPES)
        ops.insert(1, {"op_code": 0, "worker_id": "w", "study_name": name, "directions": [2]})
    elif op == "nul":
        ops.append({"op_code": 2, "worker_id": "w", "study_id": 0,
                    "user_attr": {"k\x00\x1b]0;x\x07": "v\x00"}})
    elif op == "odd-attr":
        ops.append({"op_code": 2, "worker_id": "w", "study_id": 0,
                    "user_attr": {rng.choice(["gfsim_configuration", "gfsim_version",
                                              "gfsim_runs"]): rng.choice([1, "x", None, []])}})
    else:  # a trial created RUNNING by a process that is gone
        ops.append({"op_code": 4, "worker_id": "w", "study_id": 0,
                    "datetime_start": "2020-01-01T00:00:00.000000",
                    "user_attrs": {"gfsim_worker": {"host": "x", "pid": rng.choice(DEAD_PIDS)}}})
    data = "".join(json.dumps(o, ensure_ascii=rng.random() < 0.5) + "\n" for o in ops)
    return data.encode("utf-8", "surrogatepass"), ".journal@study", f"journal: {op}"


def foreign_study(lines, i, rng: random.Random) -> tuple[bytes, str, str]:
    """(payload, suffix, what) of one hostile storage (the log's ``lines`` are not used)."""
    roll = rng.random()
    if roll < 0.6:
        op = rng.choice(sorted(SQL_OPS))
        data, what = _mutated_db(op, rng)
        return data, ".db@study", what
    if roll < 0.85:
        return _file_case(rng)
    return _journal_case(rng)


# -- running a case --------------------------------------------------------------------------
def materialise_study(folder: str, data: bytes, suffix: str) -> tuple[str, str]:
    """Make a case's storage in ``folder`` as its suffix says: its path and the URL (or
    journal path) ``gfsim tune`` is given."""
    kinds = suffix.split("@")
    ext, how = kinds[0], kinds[-1]
    path = os.path.join(folder, "study" + ext)
    url = path if ext == ".journal" else f"sqlite:///{path}"
    if how == "link":
        os.symlink(data.decode(), path)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dir":
        os.makedirs(path)
    elif how == "url":
        line, _, body = data.partition(b"\n")
        Path(path).write_bytes(body)
        url = line.decode().replace("{path}", path)
    elif how.startswith("side-"):
        main, side = unpack(data)
        Path(path).write_bytes(main)
        Path(f"{path}-{how[5:]}").write_bytes(side)
    else:
        Path(path).write_bytes(data)
        if how == "ro":
            os.chmod(path, 0o444)
    return path, url


def _fingerprint(folder: str) -> dict[str, str]:
    """Each regular file of the case's folder (not followed through links): its SHA-256."""
    out = {}
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if stat.S_ISREG(os.lstat(full).st_mode):
            out[name] = hashlib.sha256(Path(full).read_bytes()).hexdigest()
    return out


def run_study_case(tmp: str, data: bytes, suffix: str) -> tuple[list[tuple[str, str]], int]:
    """The results (as ``fuzz_logs.judge`` reads them) and peak resident size (KB) of
    ``gfsim tune`` on one case's storage."""
    folder = os.path.join(tmp, f"study-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    try:
        _, url = materialise_study(folder, data, suffix)
        before = _fingerprint(folder)
        cwd = os.path.join(tmp, f"cwd-{os.getpid()}")
        os.makedirs(cwd, exist_ok=True)
        got = run_gfsim(tune_args(url), cwd)
        after = _fingerprint(folder)
    finally:
        for root, dirs, _ in os.walk(folder):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(os.path.join(tmp, f"cwd-{os.getpid()}"), ignore_errors=True)
    return [verdict(got, before, after)], got["peak_kb"]


def verdict(got: dict, before: dict, after: dict) -> tuple[str, str]:
    """("ok" | "error" | "crash" | "hung" | "heavy" | "altered", detail) of one run."""
    err = got["stderr"]
    errors = [ln for ln in err.splitlines() if ln.startswith("gfsim: error:")]
    if got["hung"]:
        return "hung", f"no end within {HANG_S:.0f} s"
    if got["peak_kb"] > PEAK_LIMIT_KB:
        return "heavy", f"peak {got['peak_kb'] / 2**20:.2f} GiB"
    if "Traceback" in err or got["rc"] not in (0, 2):
        tail = [ln for ln in err.splitlines() if ln.strip()][-1:] or ["(no output)"]
        return "crash", f"exit {got['rc']}: {tail[0][:200]}"
    if got["rc"] == 2:
        others = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(
            ("gfsim: error:", "gfsim: warning:", "note:", "  "))]
        if len(errors) != 1 or others:
            return "crash", f"exit 2 with output {err[:200]!r}"
        changed = [n for n in set(before) | set(after) if before.get(n) != after.get(n)]
        if changed:
            return "altered", f"refused, yet changed {', '.join(sorted(changed))}: " \
                              f"{errors[0][14:160]}"
        return "error", errors[0][len("gfsim: error: "):][:200]
    return "ok", ""
