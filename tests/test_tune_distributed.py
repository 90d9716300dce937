"""Tuning across processes: workers on one PostgreSQL study, killed workers' trials retried,
and optuna-dashboard reading a gfsim study."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

TUNE = ["tune", "--log", "synthetic-puct-v1", "--param", "tau=0.3:0.99", "--validate-seeds", "0",
        "--json"]


def gfsim(args, cwd, **kw):
    """Start ``gfsim ARGS`` in its own process group (so that it can be killed whole)."""
    code = f"from gfsim.cli.main import app; app({args!r})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def load(storage, name):
    import optuna

    from gfsim.tuning.study import make_storage

    return optuna.load_study(study_name=name, storage=make_storage(storage))


def test_two_workers_on_one_postgresql_study(postgres_url, tmp_path):
    import optuna

    name = f"two-{uuid.uuid4().hex[:8]}"
    args = TUNE + ["--storage", postgres_url, "--study", name, "--trials", "8", "--seeds", "2"]
    procs = [gfsim(args, tmp_path) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    study = load(postgres_url, name)
    states = [t.state for t in study.trials]
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers))  # every trial exactly once
    # Exactly 8 finish; a trial one worker started past the total is ended PRUNED, unrun.
    assert states.count(optuna.trial.TrialState.COMPLETE) == 8
    assert set(states) <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    assert len({(t.datetime_start, t.number) for t in study.trials}) == len(states)


def _kill_mid_trial(storage, name, tmp_path, heartbeat_args):
    import optuna

    # A policy that reads the seed, so that a trial replays all 400 seeds (a deterministic
    # configuration replays each trial once); the second worker joins the study with the
    # same settings (a study refuses others) and runs two trials, the killed one's retry
    # among them. The replay cache is off: with it, a trial whose parameters an earlier test
    # already replayed (the other storage kind draws the same first trial) ends in under a
    # second, before it can be killed.
    quiet = {**os.environ, "GFSIM_LOG_CACHE": "off"}
    same = ["tune", "--log", "synthetic-puct-v1", "--policy", "random", "--param", "p=0.1:0.9",
            "--validate-seeds", "0", "--json", "--storage", storage, "--study", name,
            "--seeds", "400", *heartbeat_args]
    slow = same + ["--trials", "3"]
    a = gfsim(slow, tmp_path, env=quiet)
    deadline = time.time() + 120
    running = None
    while time.time() < deadline and running is None:
        time.sleep(0.5)
        try:
            trials = load(storage, name).trials
        except Exception:  # the study is not created yet
            continue
        # A trial that is running and has drawn its parameters (they are set a moment after
        # the trial starts).
        running = next((t for t in trials if t.state == optuna.trial.TrialState.RUNNING
                        and t.params), None)
    assert running is not None, "worker A never started a trial"
    time.sleep(1.5)
    os.killpg(a.pid, signal.SIGKILL)  # mid-trial: no chance to tidy up
    a.wait(timeout=30)
    time.sleep(4)  # past the grace period (three heartbeats of 1 s)
    quick = same + ["--trials", "2"]
    b = gfsim(quick, tmp_path, env=quiet)
    out, err = b.communicate(timeout=600)
    assert b.returncode == 0, err[-2000:]
    return running.number, running.params


@pytest.mark.parametrize("kind", ["postgresql", "journal"])
def test_a_killed_workers_trial_is_failed_and_retried(postgres_url, tmp_path, kind):
    import optuna

    from gfsim.tuning.study import retry_of

    name = f"kill-{kind}-{uuid.uuid4().hex[:8]}"
    storage = postgres_url if kind == "postgresql" else str(tmp_path / f"{name}.journal")
    killed, params = _kill_mid_trial(storage, name, tmp_path, ["--heartbeat", "1"])
    study = load(storage, name)
    by_number = {t.number: t for t in study.trials}
    assert by_number[killed].state == optuna.trial.TrialState.FAIL
    retries = [t for t in study.trials if retry_of(t) == killed]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert params and retries[0].params == params == by_number[killed].params
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_opens_a_gfsim_study(tmp_path):
    import shutil
    import urllib.request

    from typer.testing import CliRunner

    from gfsim.cli.main import app

    exe = shutil.which("optuna-dashboard") or os.path.join(os.path.dirname(sys.executable),
                                                           "optuna-dashboard")
    if not os.path.exists(exe):
        pytest.skip("optuna-dashboard is not installed (pip install 'gfsim[test]')")
    db = tmp_path / "s.db"
    res = CliRunner().invoke(app, ["tune", "--log", "synthetic-mini", "--param", "tau=0.3:0.99",
                                   "--seeds", "2", "--trials", "3", "--storage",
                                   f"sqlite:///{db}", "--study", "dash", "--validate-seeds",
                                   "0", "--json"])
    assert res.exit_code == 0, res.output
    port = _free_port()
    proc = subprocess.Popen([exe, f"sqlite:///{db}", "--host", "127.0.0.1", "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=tmp_path, start_new_session=True)
    try:
        body = None
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies",
                                            timeout=2) as r:
                    body = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.5)
        assert body is not None, "optuna-dashboard did not answer"
        names = [s.get("study_name") for s in body.get("study_summaries", [])]
        assert "dash" in names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
