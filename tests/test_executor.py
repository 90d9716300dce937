"""The executor seam (gfsim.core.executor) in this process and in local processes: results in
the items' order whatever finishes first, the shared input installed once per worker, a killed
worker costing a retry of its tasks only, and the refusals of a cluster that cannot be used.
The same contract on a real Ray cluster is in tests/test_cluster.py."""

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
        with pytest.raises(GfsimError, match="--cluster: expected"):
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
