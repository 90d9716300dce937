"""The executor seam (gfsim.core.executor) in this process, in local processes and on a real Ray
cluster: results in the items' order whatever finishes first, the shared input installed once
per worker, a killed worker costing a retry of its tasks only, the refusals of a cluster that
cannot be used, and the commands that fan out (counterfactual, recommend, plan, savings, tune)
giving the same figures wherever they ran."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gfsim.core.errors import GfsimError
from gfsim.core.executor import (
    RETRIES,
    InProcess,
    LocalProcesses,
    RayCluster,
    _mismatch,
    make_executor,
    parse_cluster,
    source_fingerprint,
    whereabouts,
)


class Shared:
    """A shared input that writes a line to ``path`` each time it is unpickled (installed)."""

    def __init__(self, path, factor):
        self.path, self.factor = str(path), factor

    def __getstate__(self):
        return {"path": self.path, "factor": self.factor}

    def __setstate__(self, state):
        self.__dict__.update(state)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def scaled(shared, item):
    time.sleep(0.02 * (item % 3))  # finishing out of order
    return shared.factor * item


def die_once(folder, item):
    """Kills its own process the first time it runs item 3; returns the item after."""
    mark = os.path.join(folder, f"ran-{item}")
    with open(mark, "a") as f:
        f.write("x")
    if item == 3 and os.path.getsize(mark) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return item * item


def always_die(folder, item):
    os.kill(os.getpid(), signal.SIGKILL)


def fails(shared, item):
    if item == 2:
        raise GfsimError("item 2 is bad")
    return item


@pytest.mark.parametrize("jobs", [1, 2])
def test_results_come_in_the_items_order_with_progress(tmp_path, jobs):
    shared = Shared(tmp_path / "installs", 3)
    seen = []
    with make_executor(jobs, shared=shared) as ex:
        assert isinstance(ex, InProcess if jobs == 1 else LocalProcesses)
        out = ex.run(scaled, range(10), progress=lambda d, t: seen.append((d, t)))
        again = ex.run(scaled, [5, 4])  # the same workers, warm
    assert out == [3 * i for i in range(10)] and again == [15, 12]
    assert seen == [(d, 10) for d in range(1, 11)]
    assert ex.describe() == {"executor": "in-process" if jobs == 1 else "local-processes",
                             "workers": jobs}


def test_the_shared_input_travels_once_per_worker_not_per_task(tmp_path):
    installs = tmp_path / "installs"
    with LocalProcesses(2, Shared(installs, 2)) as ex:
        assert ex.run(scaled, range(40)) == [2 * i for i in range(40)]
    # Unpickled at most once per process (forked processes inherit it: none), never per task.
    pids = installs.read_text().split() if installs.exists() else []
    assert len(pids) <= 2 and len(set(pids)) == len(pids)


def test_a_killed_worker_costs_a_retry_of_its_tasks_only(tmp_path):
    with LocalProcesses(2, str(tmp_path)) as ex:
        out = ex.run(die_once, range(8))
        assert out == [i * i for i in range(8)]  # nothing lost, nothing twice
        assert ex.run(die_once, [9]) == [81]  # the pool came back
    assert (tmp_path / "ran-3").read_text() == "xx"  # item 3: killed once, run again once


def test_a_worker_that_always_dies_ends_the_map_in_one_line(tmp_path):
    with LocalProcesses(2, str(tmp_path)) as ex:
        with pytest.raises(GfsimError, match=f"died {RETRIES + 1} times"):
            ex.run(always_die, range(3))


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_error_of_the_task_reaches_the_caller_as_it_was(jobs):
    with make_executor(jobs) as ex:
        with pytest.raises(GfsimError, match="item 2 is bad"):
            ex.run(fails, range(4))


def test_cluster_values_are_parsed_or_refused(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert parse_cluster(None) is None and parse_cluster("") is None
    assert parse_cluster("ray") == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert parse_cluster("ray") == "10.0.0.5:6379"
    assert parse_cluster("ray://head:10001") == "ray://head:10001"
    for bad in ("dask", "ray://head", "ray://head:port", "slurm://x:1"):
        with pytest.raises(GfsimError, match="`cluster`: expected"):
            parse_cluster(bad)


def test_a_cluster_that_cannot_be_reached_is_refused_before_any_work(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(GfsimError) as got:
        with make_executor(cluster=f"ray://127.0.0.1:{port}") as ex:
            ex.run(die_once, [1])
    message = str(got.value)
    assert "\n" not in message and time.monotonic() - t0 < 30
    assert ("cannot be reached" in message and f"127.0.0.1:{port}" in message) or \
        "pip install 'gfsim[cluster]'" in message
    assert not (tmp_path / "ran-1").exists()  # no work ran


def test_a_cluster_whose_workers_run_another_gfsim_is_refused():
    mine = whereabouts()
    assert _mismatch(mine, dict(mine)) is None
    assert "cannot import gfsim" in _mismatch(mine, {"error": "ModuleNotFoundError: gfsim"})
    assert "run gfsim 0.0.1" in _mismatch(mine, {**mine, "gfsim": "0.0.1"})
    assert "other gfsim sources" in _mismatch(mine, {**mine, "source": "0" * 16})


def test_the_source_fingerprint_is_the_same_in_a_fresh_process(tmp_path):
    # (-P and another folder: the checkout's gfsim/ must not shadow the install under test)
    code = "from gfsim.core.executor import source_fingerprint; print(source_fingerprint())"
    fresh = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                           timeout=120, check=True, cwd=tmp_path).stdout.strip()
    assert fresh == source_fingerprint() and len(fresh) == 16


def test_the_ray_executor_is_lazy_until_used():
    ex = RayCluster("127.0.0.1:1")  # a constructor does no work
    assert ex._ray is None and json.dumps({"address": ex.address})


def test_the_commands_refuse_an_unreachable_cluster_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    for args in (["recommend", "--log", "synthetic-mini", "--driver", "trace"],
                 ["counterfactual", "--world", "nk-light-fragile", "--seeds", "2"]):
        got = CliRunner().invoke(app, [*args, "--cluster", "ray://127.0.0.1:1"])
        assert got.exit_code == 2, got.output
        lines = [line for line in got.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "--cluster" in lines[0], got.output


def _without_where(out: dict) -> dict:
    where = out.pop("ran_on")
    assert where["executor"] in ("in-process", "local-processes", "ray")
    return out


def test_a_plan_and_savings_are_the_same_on_one_process_and_on_two():
    """Their replays go through the seam: (configuration, log) cells for a plan, seeds for
    savings; the figures must not depend on where they ran."""
    import gfsim

    plans = [_without_where(gfsim.plan("synthetic-mini", "usd=5", ["log", "topk:2@2"],
                                       replays=2, new_searches=4, jobs=jobs))
             for jobs in (1, 2)]
    assert plans[0] == plans[1] and len(plans[0]["configs"]) == 2
    saved = [_without_where(gfsim.savings("synthetic-mini", "topk:2", driver="closed",
                                          seeds=3, jobs=jobs)) for jobs in (1, 2)]
    assert saved[0] == saved[1]



def test_the_search_steps_replayed_in_other_processes_are_heard_here():
    """A progress bar counts the steps every replay ticks; a worker's ticks come back with
    its task (simulator.progress.ticked_map): the same count on one process and on two."""
    import gfsim
    from gfsim.simulator.progress import listening

    def steps(call) -> int:
        n = [0]
        with listening(lambda k: n.__setitem__(0, n[0] + k)):
            call()
        return n[0]

    for call in (lambda jobs: gfsim.savings("synthetic-mini", "topk:2", driver="closed",
                                            seeds=3, jobs=jobs),
                 lambda jobs: gfsim.plan("synthetic-mini", "usd=5", ["log", "topk:2@2"],
                                         replays=2, new_searches=4, jobs=jobs)):
        call(1)  # (a first call ticks some steps once per process: what it then caches)
        here, there = steps(lambda: call(1)), steps(lambda: call(2))
        assert here > 0 and there == here

# -- the same on a real Ray cluster ---------------------------------------------------------------
# The one scripts/test-all starts (a head and a second worker process on loopback,
# GFSIM_RAY_ADDRESS), or any a developer names there; these tests are marked slow (CI runs them).
# They are skipped without a cluster, unless GFSIM_REQUIRE_RAY is set, when they fail.


@pytest.fixture(scope="module")
def _cluster_address() -> str:
    address = os.environ.get("GFSIM_RAY_ADDRESS", "")
    if not address:
        if os.environ.get("GFSIM_REQUIRE_RAY"):
            pytest.fail("GFSIM_REQUIRE_RAY is set but GFSIM_RAY_ADDRESS names no cluster "
                        "(scripts/test-all starts one)")
        pytest.skip("no Ray cluster (GFSIM_RAY_ADDRESS; scripts/test-all starts one)")
    ray = pytest.importorskip("ray")
    # This module's task functions travel by value: the cluster's workers cannot import a test
    # module (gfsim's own functions travel by name, as in use).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield address
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def ray_address(_cluster_address, monkeypatch) -> str:
    """The cluster's address; ``--cluster ray`` finds it in ``$RAY_ADDRESS``."""
    monkeypatch.setenv("RAY_ADDRESS", _cluster_address)
    return _cluster_address


@pytest.mark.slow
def test_the_cluster_is_joined_checked_and_described(ray_address):
    import gfsim
    from gfsim.core.executor import RayCluster, source_fingerprint

    with RayCluster(ray_address) as ex:
        where = ex.describe()
        with pytest.raises(GfsimError, match="item 2 is bad"):  # fn's error, as it was
            ex.run(fails, range(4))
    assert where["executor"] == "ray" and where["address"] == ray_address
    assert where["nodes"] >= 2 and where["workers"] >= 2  # the head and a second worker
    assert where["gfsim"] == gfsim.__version__ and where["source"] == source_fingerprint()


@pytest.mark.slow
def test_on_the_cluster_a_killed_worker_costs_a_retry_of_its_task_only(ray_address, tmp_path):
    from gfsim.core.executor import RayCluster

    with RayCluster(ray_address, str(tmp_path)) as ex:
        assert ex.run(die_once, range(6)) == [i * i for i in range(6)]
    assert (tmp_path / "ran-3").read_text() == "xx"  # killed once, run again once
    assert all((tmp_path / f"ran-{i}").read_text() == "x" for i in (0, 1, 2, 4, 5))


@pytest.mark.slow
def test_the_shared_input_goes_through_the_object_store_once(ray_address, tmp_path):
    from gfsim.core.executor import RayCluster

    installs = tmp_path / "installs"
    progress = []
    with RayCluster(ray_address, Shared(installs, 5)) as ex:
        out = ex.run(scaled, range(30), progress=lambda d, t: progress.append((d, t)))
        assert out == [5 * i for i in range(30)]
    assert progress[-1] == (30, 30) and len(progress) == 30
    # Put once (pickled here, not unpickled), then read once per worker process that ran a
    # task: fewer installs than tasks, however Ray spread them.
    pids = installs.read_text().split()
    assert 1 <= len(pids) < 30 and len(set(pids)) == len(pids)


@pytest.mark.slow
def test_the_counterfactual_benchmark_on_the_cluster_is_the_local_one(ray_address):
    import gfsim

    kw = dict(policies=["all", "topk:2"], overgen=[1, 2], seeds=2, steps=4, replay_seeds=2,
              direct_reps=2, fresh_seeds=2)
    local = gfsim.counterfactual("nk-light-fragile", jobs=2, **kw)
    remote = gfsim.counterfactual("nk-light-fragile", cluster="ray", **kw)
    assert remote.pop("ran_on")["executor"] == "ray"
    assert local.pop("ran_on")["executor"] == "local-processes"
    assert remote == local


@pytest.mark.slow
def test_a_recommendation_on_the_cluster_is_the_local_one(ray_address):
    import gfsim

    kw = dict(driver="closed", seeds=2, fresh_seeds=2, prices=False)
    local = gfsim.recommend("synthetic-mini", ["topk:2", "threshold:0.7"], jobs=1, **kw)
    remote = gfsim.recommend("synthetic-mini", ["topk:2", "threshold:0.7"],
                             cluster="ray", **kw)
    where = remote.pop("ran_on")
    assert where["executor"] == "ray" and where["nodes"] >= 2
    assert local.pop("ran_on")["executor"] == "in-process"
    assert remote == local


@pytest.mark.slow
def test_a_cluster_running_other_gfsim_sources_is_refused_before_any_work(ray_address,
                                                                          monkeypatch, tmp_path):
    """The cluster's workers answer the probe with their own fingerprint; this process's is
    made to differ (as an edited checkout's would): refused, and no task ran."""
    import gfsim.core.executor as executor

    monkeypatch.setattr(executor, "source_fingerprint", lambda: "0" * 16)
    with pytest.raises(GfsimError, match="other gfsim sources") as got:
        with executor.RayCluster(ray_address, str(tmp_path)) as ex:
            ex.run(die_once, [1])
    assert "\n" not in str(got.value) and not (tmp_path / "ran-1").exists()


@pytest.mark.slow
def test_a_plan_and_savings_on_the_cluster_are_the_local_ones(ray_address):
    import gfsim

    def plan(**kw):
        return gfsim.plan("synthetic-mini", "usd=5", ["log", "topk:2@2"], replays=2,
                          new_searches=4, **kw)

    local, remote = plan(jobs=2), plan(cluster="ray")
    assert remote.pop("ran_on")["executor"] == "ray" and local.pop("ran_on")
    assert remote == local

    def saved(**kw):
        return gfsim.savings("synthetic-mini", "topk:2", driver="closed", seeds=3, **kw)

    local, remote = saved(jobs=2), saved(cluster="ray")
    assert remote.pop("ran_on")["executor"] == "ray" and local.pop("ran_on")
    assert remote == local


@pytest.mark.slow
def test_tune_runs_its_trial_workers_as_cluster_tasks_against_postgresql(ray_address,
                                                                          postgres_url):
    """Six trials on the cluster's tasks, against PostgreSQL; each trial's value is its own
    replay's whatever process ran it: the same tau tuned here gives the same value."""
    import uuid

    import gfsim
    from gfsim.tuning.claims import WORKER_ATTR

    kw = dict(trials=6, seeds=2, storage=postgres_url, heartbeat=5, recommend=False,
              driver="closed", validate_seeds=2)  # (closed loop: seeds matter, scored again)
    space = ["tau=0.5|0.7|0.9"]
    t = gfsim.tune("synthetic-mini", "threshold", space, cluster="ray",
                   study=f"cluster-{uuid.uuid4().hex[:10]}", **kw)
    out = t.to_dict()
    assert out["ran_on"]["executor"] == "ray" and out["ran_on"]["workers"] >= 2
    assert out["trials"] == 6 and out["ran_now"] == 6
    done = [tr for tr in t.study.trials if tr.state.name == "COMPLETE"]
    assert len(done) == 6
    assert all(tr.user_attrs[WORKER_ATTR]["pid"] != os.getpid() for tr in done)  # not here
    here = gfsim.tune("synthetic-mini", "threshold", space, study=f"here-{uuid.uuid4().hex[:10]}",
                      **kw)
    values = {tr.params["tau"]: tr.value for tr in here.study.trials
              if tr.state.name == "COMPLETE"}
    shared = [tr for tr in done if tr.params["tau"] in values]
    assert shared and all(tr.value == values[tr.params["tau"]] for tr in shared)
    # The out-of-sample scores, replayed on the cluster after the trials: per spec, the same.
    oos = {r["spec"]: r["fresh_seeds"] for r in here.to_dict()["out_of_sample"]}
    theirs = [r for r in out["out_of_sample"] if r["spec"] in oos]
    assert theirs and all(r["fresh_seeds"] == oos[r["spec"]] for r in theirs), (
        out["out_of_sample"], here.to_dict()["out_of_sample"])


@pytest.mark.slow
def test_on_the_cluster_a_trial_workers_killed_trial_is_failed_and_retried(ray_address,
                                                                          postgres_url):
    """A cluster task running trials is killed (SIGKILL, its Ray worker process) mid-trial:
    Ray runs the task again, the trial it held is failed by its missed heartbeats and retried
    once with its parameters, and the study ends with every trial it asked for."""
    import threading
    import uuid

    import optuna

    import gfsim
    from gfsim.tuning.claims import WORKER_ATTR
    from gfsim.tuning.study import make_storage, retry_of

    name = f"cluster-kill-{uuid.uuid4().hex[:10]}"
    done: dict = {}

    def tune():
        try:
            done["out"] = gfsim.tune("synthetic-puct-v1", "random", ["p=0.1:0.9"], trials=3,
                                     seeds=400, storage=postgres_url, study=name, heartbeat=1,
                                     recommend=False, validate_seeds=0, workers=1,
                                     cluster="ray")
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            done["error"] = exc

    thread = threading.Thread(target=tune)
    thread.start()
    running, deadline = None, time.time() + 180
    while running is None and time.time() < deadline and thread.is_alive():
        time.sleep(0.5)
        try:
            trials = optuna.load_study(study_name=name,
                                       storage=make_storage(postgres_url)).trials
        except Exception:  # noqa: BLE001 - the study is not created yet
            continue
        running = next((t for t in trials if t.state == optuna.trial.TrialState.RUNNING
                        and t.params and (t.user_attrs.get(WORKER_ATTR) or {}).get("pid")),
                       None)
    assert running is not None, done.get("error") or "no trial ever ran on the cluster"
    pid = running.user_attrs[WORKER_ATTR]["pid"]
    assert pid != os.getpid()
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)  # (the cluster runs on this host: its worker is a process here)
    thread.join(600)
    assert not thread.is_alive() and "error" not in done, done.get("error")
    study = optuna.load_study(study_name=name, storage=make_storage(postgres_url))
    by_number = {t.number: t for t in study.trials}
    assert by_number[running.number].state == optuna.trial.TrialState.FAIL
    retries = [t for t in study.trials if retry_of(t) == running.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].params == running.params
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert done["out"].to_dict()["ran_on"]["executor"] == "ray"


@pytest.mark.slow
def test_tune_on_a_cluster_refuses_a_study_only_this_host_reaches(ray_address, tmp_path):
    import gfsim

    with pytest.raises(GfsimError, match="`cluster`: the trial workers .* postgresql"):
        gfsim.tune("synthetic-mini", "threshold", ["tau=0.3:0.95"], trials=2,
                   storage=f"sqlite:///{tmp_path}/s.db", cluster="ray")


@pytest.mark.slow
def test_the_commands_say_they_ran_on_the_cluster(ray_address):
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    for args in (["plan", "--log", "synthetic-mini", "--budget", "usd=5", "--candidate", "log",
                  "--replays", "2", "--new-searches", "4"],
                 ["savings", "--log", "synthetic-mini", "--policy", "topk:2", "--driver",
                  "closed", "--seeds", "3"]):
        got = CliRunner().invoke(app, [*args, "--cluster", "ray"])
        assert got.exit_code == 0, got.output
        assert f"ran on the Ray cluster at {ray_address}: " in " ".join(got.output.split())
