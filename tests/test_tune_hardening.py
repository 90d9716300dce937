"""No storage stops ``gfsim tune`` (issue 52): a foreign SQLite study's own SQL (triggers, views,
expression indexes) is refused before it can run, in-memory databases are refused, workers die
with the command that started them, fresh SQLite files are made race-free, a killed worker's
trials are failed and retried at the next start, and several processes never finish more
trials than asked."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app

TUNE = ["tune", "--log", "synthetic-mini", "--param", "tau=0.3:0.99", "--seeds", "1",
        "--validate-seeds", "0", "--study", "s", "--json"]
# A policy that reads the seed, so that each trial replays every seed and lasts a while.
SLOW = ["tune", "--log", "synthetic-puct-v1", "--policy", "random", "--param", "p=0.1:0.9",
        "--validate-seeds", "0", "--no-recommend", "--json", "--study", "k"]
QUIET = {**os.environ, "GFSIM_LOG_CACHE": "off"}


def gfsim(args, cwd, timeout=120, **kw):
    """``gfsim ARGS`` in a process of its own, its writes capped at 200 MB (a foreign study
    that fills the disk stops there)."""
    code = f"from gfsim.cli.main import app; app({list(args)!r})"

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200 << 20, 200 << 20))

    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=cap, env=QUIET, **kw)


def start(args, cwd):
    code = f"from gfsim.cli.main import app; app({list(args)!r})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=QUIET,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_line(stderr: str, *words: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gfsim: error: "), stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def load(storage: str, name: str):
    import optuna

    from gfsim.tuning.study import make_storage

    return optuna.load_study(study_name=name, storage=make_storage(storage, check=False))


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:",
                                 "sqlite:///file::memory:?uri=true"])
def test_an_in_memory_storage_is_refused_in_one_line(url):
    res = CliRunner().invoke(app, [*TUNE, "--trials", "2", "--storage", url])
    assert res.exit_code == 2, res.output
    one_line(res.stderr, f"--storage {url}: an in-memory SQLite database lasts one "
                         "connection, so the study would be lost")


@pytest.fixture(scope="module")
def optuna_db(tmp_path_factory) -> Path:
    """An SQLite file holding Optuna's schema and a study ``s``, as Optuna made it."""
    import optuna

    path = tmp_path_factory.mktemp("db") / "plain.db"
    optuna.create_study(study_name="s", direction="maximize",
                        storage=optuna.storages.RDBStorage(f"sqlite:///{path}"))
    return path


LOOP = ("CREATE TRIGGER t AFTER INSERT ON trials BEGIN WITH RECURSIVE r(i) AS (SELECT 1 UNION "
        "ALL SELECT i + 1 FROM r) SELECT count(*) FROM r; END")
FILL = ("CREATE TABLE big(x); CREATE TRIGGER t AFTER INSERT ON trials BEGIN INSERT INTO big "
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 100000000) "
        "SELECT zeroblob(1000) FROM r; END")


@pytest.mark.parametrize("sql, what", [
    (LOOP, "a trigger 't' on table 'trials'"),  # hung gfsim tune for ever
    (FILL, "a trigger 't' on table 'trials'"),  # filled the disk
    ("CREATE VIEW v AS SELECT * FROM trials", "a view 'v'"),
    ("CREATE INDEX e ON trial_values (zeroblob(value))", "an index 'e' on an expression"),
    ("CREATE INDEX w ON trials (number) WHERE number > 3", "an index 'w' on an expression or "
                                                          "with a condition"),
    ("ALTER TABLE trials ADD COLUMN g AS (zeroblob(1000)) VIRTUAL",
     "a generated column 'g' in table trials"),
])
def test_a_foreign_sqlite_study_with_sql_of_its_own_is_refused(optuna_db, tmp_path, sql, what):
    db = tmp_path / "foreign.db"
    db.write_bytes(optuna_db.read_bytes())
    with sqlite3.connect(db) as con:
        con.executescript(sql)
    before = db.read_bytes()
    proc = gfsim([*TUNE, "--trials", "2", "--storage", f"sqlite:///{db}"], tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr[-3000:]
    one_line(proc.stderr, f"--storage sqlite:///{db}: holds {what}",
             "a foreign study is not opened")
    assert db.read_bytes() == before


def test_an_optuna_study_with_a_plain_index_of_its_own_still_tunes(optuna_db, tmp_path):
    db = tmp_path / "indexed.db"
    db.write_bytes(optuna_db.read_bytes())
    with sqlite3.connect(db) as con:
        con.execute("CREATE INDEX p ON trials (number, state DESC)")
    res = CliRunner().invoke(app, [*TUNE, "--trials", "2", "--storage", f"sqlite:///{db}"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trials"] == 2


def test_a_named_pipe_as_sqlite_file_is_one_line_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "p.db")
    proc = gfsim([*TUNE, "--trials", "1", "--storage", "sqlite:///p.db"], tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr[-3000:]
    one_line(proc.stderr, "--storage sqlite:///p.db: p.db is not a regular file")


def _open_at(barrier, url, conn):
    from gfsim.core.errors import GfsimError
    from gfsim.tuning.study import make_storage

    barrier.wait()
    try:
        make_storage(url)
        conn.send("ok")
    except GfsimError as exc:
        conn.send(str(exc))


def test_processes_opening_a_fresh_sqlite_file_together_all_succeed(tmp_path):
    import optuna  # noqa: F401 - imported once here, not in every child

    ctx = multiprocessing.get_context("fork")
    outcomes = []
    for attempt in range(4):
        url = f"sqlite:///{tmp_path}/fresh{attempt}.db"
        barrier = ctx.Barrier(4)
        pipes = [ctx.Pipe(duplex=False) for _ in range(4)]
        procs = [ctx.Process(target=_open_at, args=(barrier, url, send)) for _, send in pipes]
        for p in procs:
            p.start()
        for (recv, _), p in zip(pipes, procs):
            assert recv.poll(120), "a process opening the file hung"
            outcomes.append(recv.recv())
            p.join(30)
    assert outcomes == ["ok"] * len(outcomes), [o for o in outcomes if o != "ok"][:2]


def test_die_with_parent_ends_a_child_when_its_parent_is_killed():
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # the parent to be killed: starts a child that asks to die with it
        child = os.fork()
        if child == 0:
            from gfsim.core.lifeline import die_with_parent

            die_with_parent(os.getppid())
            os.write(write, b"%d\n" % os.getpid())
            time.sleep(120)
            os._exit(0)
        time.sleep(120)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = int(f.readline())
    os.kill(middle, signal.SIGKILL)
    os.waitpid(middle, 0)
    from gfsim.core.lifeline import process_start

    deadline = time.time() + 30
    while process_start(child) is not None and time.time() < deadline:
        time.sleep(0.05)
    alive = process_start(child) is not None
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the child outlived its killed parent"


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _running_with_params(storage, name) -> list:
    import optuna

    try:
        trials = load(storage, name).trials
    except Exception:  # the study is not made yet
        return []
    return [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and t.params]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the workers in /proc")
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_workers_die_with_a_killed_command_and_their_trials_are_retried_at_once(tmp_path,
                                                                               kind):
    import optuna

    from gfsim.tuning.study import retry_of

    storage = "k.journal" if kind == "journal" else "sqlite:///k.db"
    where = str(tmp_path / storage) if kind == "journal" else f"sqlite:///{tmp_path}/k.db"
    # the default heartbeat (30 s): nothing is failed for going silent in this test
    args = [*SLOW, "--seeds", "150", "--trials", "2", "--workers", "2", "--storage", storage]
    proc = start(args, tmp_path)
    workers, running = [], []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(running) < 2:
            time.sleep(0.3)
            running = _running_with_params(where, "k")
        assert len(running) == 2, "the workers never started their trials"
        workers = _children(proc.pid)
        proc.kill()  # SIGKILL: the command has no chance to stop its workers
        proc.wait()
        deadline = time.time() + 60  # a hang guard: they die at once, or finish a trial
        while any(Path(f"/proc/{w}").exists() for w in workers) and time.time() < deadline:
            time.sleep(0.1)
        orphans = [w for w in workers if Path(f"/proc/{w}").exists()]
        assert not orphans, "workers outlived the killed command"
        after = {t.number: t.state for t in load(where, "k").trials}
        assert all(after[t.number] == optuna.trial.TrialState.RUNNING for t in running), \
            f"workers went on with their trials after the command was killed: {after}"
    finally:
        for w in workers:
            if Path(f"/proc/{w}").exists():
                os.kill(w, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    again = gfsim(args, tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    study = load(where, "k")
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.COMPLETE] == 2, states
    assert not states[optuna.trial.TrialState.RUNNING], states
    for killed in running:
        failed = study.trials[killed.number]
        assert failed.state == optuna.trial.TrialState.FAIL
        [retry] = [t for t in study.trials if retry_of(t) == killed.number]
        assert retry.params == killed.params and retry.state == optuna.trial.TrialState.COMPLETE


@pytest.mark.slow
def test_a_killed_commands_trial_is_failed_and_retried_at_the_next_start(tmp_path):
    import optuna

    from gfsim.tuning.study import retry_of

    # the default heartbeat (30 s): the rerun comes long before the trial could go stale
    args = [*SLOW, "--seeds", "150", "--trials", "2", "--storage", "k.journal"]
    proc = start(args, tmp_path)
    try:
        deadline = time.time() + 120
        running = []
        while time.time() < deadline and not running:
            time.sleep(0.3)
            running = _running_with_params(str(tmp_path / "k.journal"), "k")
        assert running, "the command never started a trial"
    finally:
        proc.kill()
        proc.wait()
    again = gfsim(args, tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    study = load(str(tmp_path / "k.journal"), "k")
    [killed] = running
    assert study.trials[killed.number].state == optuna.trial.TrialState.FAIL
    [retry] = [t for t in study.trials if retry_of(t) == killed.number]
    assert retry.params == killed.params and retry.state == optuna.trial.TrialState.COMPLETE
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.COMPLETE] == 2 and not states[
        optuna.trial.TrialState.RUNNING], states


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_several_commands_on_one_study_finish_exactly_its_trials(tmp_path, kind):
    import optuna

    storage = "o.journal" if kind == "journal" else "sqlite:///o.db"
    where = str(tmp_path / storage) if kind == "journal" else f"sqlite:///{tmp_path}/o.db"
    load_ok = gfsim([*SLOW, "--seeds", "20", "--trials", "1", "--storage", storage], tmp_path)
    assert load_ok.returncode == 0, load_ok.stderr[-3000:]  # made once: one study, one schema
    procs = [start([*SLOW, "--seeds", "20", "--trials", "6", "--storage", storage], tmp_path)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    study = load(where, "k")
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.COMPLETE] == 6, states
    assert set(states) <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    for t in study.trials:
        if t.state == optuna.trial.TrialState.PRUNED:
            from gfsim.tuning.claims import BEYOND_ATTR

            assert t.user_attrs[BEYOND_ATTR] == 6 and not t.params


def test_a_trial_is_beyond_the_total_when_as_many_before_it_count(tmp_path):
    import optuna

    from gfsim.tuning.claims import beyond_total
    from gfsim.tuning.study import make_storage

    storage = make_storage(str(tmp_path / "b.journal"))
    study = optuna.create_study(study_name="b", storage=storage)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    # two processes' trials, started together when one trial was left to run
    first = optuna.load_study(study_name="b", storage=storage).ask()
    second = optuna.load_study(study_name="b", storage=storage).ask()
    assert not beyond_total(first, 2)
    assert beyond_total(second, 2)
    assert not beyond_total(second, 3)


class _RacedObjective:
    """A trial function whose first trial another worker completes first, as happens when
    two workers pop the same waiting trial from SQLite (no row locks: optuna#4621)."""

    heartbeat, retries, total = None, 1, None

    def __init__(self, url: str, name: str):
        self.url, self.name, self.calls = url, name, 0

    def __call__(self, trial):
        import optuna

        self.calls += 1
        x = trial.suggest_float("x", 0.0, 1.0)
        if self.calls == 1:  # the other worker, through its own handle, tells it first
            optuna.load_study(study_name=self.name, storage=self.url).tell(trial.number, 1.0)
        return x

    def close(self):
        pass


def test_a_trial_another_worker_completed_first_is_dropped_and_the_worker_goes_on(tmp_path):
    import optuna

    from gfsim.tuning.study import _worker

    url = f"sqlite:///{tmp_path}/race.db"
    optuna.create_study(study_name="race", storage=url)
    objective = _RacedObjective(url, "race")
    _worker((url, "race", "tpe", 0, False, objective, 3))  # raised ValueError before
    trials = optuna.load_study(study_name="race", storage=url).trials
    assert objective.calls >= 3  # the share was run on after the trial told twice
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value == 1.0
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
