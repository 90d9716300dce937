"""The executor seam on a real Ray cluster: the one scripts/test-all starts (a head and a second
worker process on loopback, ``GFSIM_RAY_ADDRESS``), or any a developer names there. The
counterfactual benchmark and a recommendation give on it what they give locally, seed for seed;
a killed worker costs a retry of its task only; the shared input goes through the object store
once. Skipped without a cluster, unless ``GFSIM_REQUIRE_RAY`` is set (CI), when that fails."""

import os
import signal

import pytest

from gfsim.core.errors import GfsimError

ADDRESS = os.environ.get("GFSIM_RAY_ADDRESS", "")
if not ADDRESS:
    if os.environ.get("GFSIM_REQUIRE_RAY"):
        pytest.fail("GFSIM_REQUIRE_RAY is set but GFSIM_RAY_ADDRESS names no cluster "
                    "(scripts/test-all starts one)", pytrace=False)
    pytest.skip("no Ray cluster (GFSIM_RAY_ADDRESS; scripts/test-all starts one)",
                allow_module_level=True)
ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _tasks_by_value():
    """This module's task functions travel by value: the cluster's workers cannot import a
    test module (gfsim's own functions travel by name, as in use)."""
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


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
    return shared.factor * item


def die_once(folder, item):
    mark = os.path.join(folder, f"ran-{item}")
    with open(mark, "a") as f:
        f.write("x")
    if item == 3 and os.path.getsize(mark) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return item * item


def fails(shared, item):
    if item == 2:
        raise GfsimError("item 2 is bad")
    return item


def test_the_cluster_is_joined_checked_and_described():
    import gfsim
    from gfsim.core.executor import RayCluster, source_fingerprint

    with RayCluster(ADDRESS) as ex:
        where = ex.describe()
        with pytest.raises(GfsimError, match="item 2 is bad"):  # fn's error, as it was
            ex.run(fails, range(4))
    assert where["executor"] == "ray" and where["address"] == ADDRESS
    assert where["nodes"] >= 2 and where["workers"] >= 2  # the head and a second worker
    assert where["gfsim"] == gfsim.__version__ and where["source"] == source_fingerprint()


def test_a_killed_worker_costs_a_retry_of_its_task_only(tmp_path):
    from gfsim.core.executor import RayCluster

    with RayCluster(ADDRESS, str(tmp_path)) as ex:
        assert ex.run(die_once, range(6)) == [i * i for i in range(6)]
    assert (tmp_path / "ran-3").read_text() == "xx"  # killed once, run again once
    assert all((tmp_path / f"ran-{i}").read_text() == "x" for i in (0, 1, 2, 4, 5))


def test_the_shared_input_goes_through_the_object_store_once(tmp_path):
    from gfsim.core.executor import RayCluster

    installs = tmp_path / "installs"
    progress = []
    with RayCluster(ADDRESS, Shared(installs, 5)) as ex:
        out = ex.run(scaled, range(30), progress=lambda d, t: progress.append((d, t)))
        assert out == [5 * i for i in range(30)]
    assert progress[-1] == (30, 30) and len(progress) == 30
    # Put once (pickled here, not unpickled), then read once per worker process that ran a
    # task: fewer installs than tasks, however Ray spread them.
    pids = installs.read_text().split()
    assert 1 <= len(pids) < 30 and len(set(pids)) == len(pids)


def test_the_counterfactual_benchmark_on_the_cluster_is_the_local_one():
    import gfsim

    kw = dict(policies=["all", "topk:2"], overgen=[1, 2], seeds=2, steps=4, replay_seeds=2,
              direct_reps=2, fresh_seeds=2)
    local = gfsim.counterfactual("nk-light-fragile", jobs=2, **kw)
    remote = gfsim.counterfactual("nk-light-fragile", cluster=ADDRESS_SPEC, **kw)
    assert remote.pop("ran_on")["executor"] == "ray"
    assert local.pop("ran_on")["executor"] == "local-processes"
    assert remote == local


def test_a_recommendation_on_the_cluster_is_the_local_one():
    import gfsim

    kw = dict(driver="closed", seeds=2, fresh_seeds=2, prices=False)
    local = gfsim.recommend("synthetic-mini", ["topk:2", "threshold:0.7"], jobs=1, **kw)
    remote = gfsim.recommend("synthetic-mini", ["topk:2", "threshold:0.7"],
                             cluster=ADDRESS_SPEC, **kw)
    where = remote.pop("ran_on")
    assert where["executor"] == "ray" and where["nodes"] >= 2
    assert local.pop("ran_on")["executor"] == "in-process"
    assert remote == local


ADDRESS_SPEC = "ray"  # --cluster ray: the cluster at $RAY_ADDRESS (set below)


@pytest.fixture(autouse=True)
def _ray_address(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ADDRESS)


def test_a_cluster_running_other_gfsim_sources_is_refused_before_any_work(monkeypatch,
                                                                          tmp_path):
    """The cluster's workers answer the probe with their own fingerprint; this process's is
    made to differ (as an edited checkout's would): refused, and no task ran."""
    import gfsim.core.executor as executor

    monkeypatch.setattr(executor, "source_fingerprint", lambda: "0" * 16)
    with pytest.raises(GfsimError, match="other gfsim sources") as got:
        with executor.RayCluster(ADDRESS, str(tmp_path)) as ex:
            ex.run(die_once, [1])
    assert "\n" not in str(got.value) and not (tmp_path / "ran-1").exists()


def test_a_plan_and_savings_on_the_cluster_are_the_local_ones():
    import gfsim

    def plan(**kw):
        return gfsim.plan("synthetic-mini", "usd=5", ["log", "topk:2@2"], replays=2,
                          new_searches=4, **kw)

    local, remote = plan(jobs=2), plan(cluster=ADDRESS_SPEC)
    assert remote.pop("ran_on")["executor"] == "ray" and local.pop("ran_on")
    assert remote == local

    def saved(**kw):
        return gfsim.savings("synthetic-mini", "topk:2", driver="closed", seeds=3, **kw)

    local, remote = saved(jobs=2), saved(cluster=ADDRESS_SPEC)
    assert remote.pop("ran_on")["executor"] == "ray" and local.pop("ran_on")
    assert remote == local


def test_tune_runs_its_trial_workers_as_cluster_tasks_against_postgresql(postgres_url):
    """Six trials on the cluster's tasks, against PostgreSQL; each trial's value is its own
    replay's whatever process ran it: the same tau tuned here gives the same value."""
    import uuid

    import gfsim
    from gfsim.tuning.claims import WORKER_ATTR

    kw = dict(trials=6, seeds=2, storage=postgres_url, heartbeat=5, recommend=False)
    space = ["tau=0.5|0.7|0.9"]
    t = gfsim.tune("synthetic-mini", "threshold", space, cluster=ADDRESS_SPEC,
                   study=f"cluster-{uuid.uuid4().hex[:10]}", **kw)
    out = t.to_dict()
    assert out["ran_on"]["executor"] == "ray" and out["ran_on"]["workers"] >= 2
    assert out["trials"] == 6 and out["ran_now"] == 6
    done = [tr for tr in t.study.trials if tr.state.name == "COMPLETE"]
    assert len(done) == 6
    assert all(tr.user_attrs[WORKER_ATTR]["pid"] != os.getpid() for tr in done)  # not here
    here = gfsim.tune("synthetic-mini", "threshold", space, study=f"here-{uuid.uuid4().hex[:10]}",
                      **kw).study.trials
    values = {tr.params["tau"]: tr.value for tr in here if tr.state.name == "COMPLETE"}
    shared = [tr for tr in done if tr.params["tau"] in values]
    assert shared and all(tr.value == values[tr.params["tau"]] for tr in shared)


def test_tune_on_a_cluster_refuses_a_study_only_this_host_reaches(tmp_path):
    import gfsim

    with pytest.raises(GfsimError, match="--cluster: the trial workers .* postgresql"):
        gfsim.tune("synthetic-mini", "threshold", ["tau=0.3:0.95"], trials=2,
                   storage=f"sqlite:///{tmp_path}/s.db", cluster=ADDRESS_SPEC)
