"""Where a live run measures (``gfsim.live.measure.gpus``): candidates sent to free measurers,
several at once; a measurer lost mid-measurement costs a measurement again elsewhere, flagged,
never a candidate; what a resumed run makes of it. The measurers here are stand-ins that answer as a
``TritonMeasurer`` would (the logic around the real ones); the real ones, as Ray actors on a
real cluster, are in tests/test_live_cluster.py."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from gfsim.core.errors import GfsimError
from gfsim.live.candidates import CandidateSource, Generated, task_seed
from gfsim.live.driver import LiveOptions, LiveRun
from gfsim.live.measure.gpus import LOSSES_PER_CANDIDATE, MeasurerPool, Slot, SlotLost
from gfsim.live.sources import MutationSource
from gfsim.replay_logs import load_log
from gfsim.replay_logs.io import iter_records
from gfsim.simulator.closed.engine import SearchConfig


class Died(Exception):
    """A measurement that kills the run (its process, in this test)."""


class FakeSlot(Slot):
    """A measurer at ``host:gpuN`` answering as a TritonMeasurer would (a success whose speedup
    follows from the code, on the GPU clock) after ``busy_s``; its call number ``lose_at`` is
    lost (``SlotLost``: the actor died under it), ``die_at`` raises ``Died``."""

    def __init__(self, n: int, busy_s: float = 0.02, lose_at: int = 0, die_at: int = 0,
                 active: list | None = None, script=None):
        self.where = {"measurer": n, "host": f"host{n}", "gpu": 0, "device": "fake"}
        self.busy_s, self.lose_at, self.die_at = busy_s, lose_at, die_at
        self.script = script  # script(code): may raise, as any measurer's call
        self.codes: list[str] = []
        self.active = active if active is not None else [0, 0]  # [now, most at once]
        self.closed = False

    def measure(self, task: str, code: str) -> dict:
        self.codes.append(code)
        self.active[0] += 1
        self.active[1] = max(self.active[1], self.active[0])
        try:
            time.sleep(self.busy_s)
            if self.script is not None:
                self.script(code)
            if len(self.codes) == self.lose_at:
                raise SlotLost("The actor died unexpectedly before finishing this task.")
            if len(self.codes) == self.die_at:
                raise Died(code)
        finally:
            self.active[0] -= 1
        h = int(hashlib.sha256(code.encode()).hexdigest()[:6], 16)
        speedup = 0.5 + (h % 1000) / 500
        return {"outcome": "success", "speedup": speedup, "runtime_ns": 1e6 / speedup,
                "ref_runtime_ns": 1e6, "compile_s": 0.01, "check_s": 0.01,
                "timing_s": self.busy_s, "wall_s": self.busy_s + 0.02,
                "timing_clock": "gpu", "timing_trusted": True}

    def close(self) -> None:
        self.closed = True


def _pool(*slots: Slot) -> MeasurerPool:
    return MeasurerPool(list(slots), {"placement": "test"})


def _run(out, pool, source=None, steps: int = 3, resume: bool = False):
    opts = LiveOptions(tasks=["softmax"], search=SearchConfig(
        steps=steps, parents_per_step=2, samples_per_parent=2, k_per_parent=2), seed=3)
    return LiveRun(out, opts, source or MutationSource(), None, None, resume=resume,
                   hardware={"device_name": "fake"}, provenance={"kind": "measured",
                                                                 "note": "test"},
                   pool=pool).run()


def _records(out) -> list[dict]:
    return [rec for _, rec in iter_records(out)]


# -- the pool ------------------------------------------------------------------------------------
def test_the_pool_measures_on_every_free_measurer_at_once():
    active = [0, 0]
    slots = [FakeSlot(n, busy_s=0.2, active=active) for n in range(3)]
    pool = _pool(*slots)
    out = [None] * 6
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(
        i, pool.measure("softmax", f"code {i}"))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert active[1] == 3  # never more than the measurers, and all of them at once
    assert sorted(len(s.codes) for s in slots) == [2, 2, 2]
    for ev, where, lost in out:
        assert ev["outcome"] == "success" and not lost
        assert where["host"] in {"host0", "host1", "host2"}


def test_a_measurer_lost_mid_measurement_costs_a_measurement_elsewhere_not_the_candidate():
    a, b = FakeSlot(0, lose_at=1), FakeSlot(1)
    pool = _pool(a, b)
    tries, losses = [], []
    ev, where, lost = pool.measure("softmax", "code", on_try=tries.append,
                                   on_lost=losses.append)
    assert ev["outcome"] == "success" and where["measurer"] == 1
    assert [t["measurer"] for t in tries] == [0, 1]
    assert len(lost) == 1 and lost == losses and lost[0]["measurer"] == 0
    assert "died" in lost[0]["error"] and a.closed and pool.lost == lost
    for _ in range(3):  # the lost one is gone for good
        assert pool.measure("softmax", "more")[1]["measurer"] == 1
    assert pool.describe()["lost"] == lost


def test_a_candidate_under_which_measurers_keep_disappearing_is_given_up_then_the_run_stops():
    slots = [FakeSlot(n, lose_at=1) for n in range(LOSSES_PER_CANDIDATE + 1)]
    pool = _pool(*slots)
    ev, where, lost = pool.measure("softmax", "killer")
    assert where is None and len(lost) == LOSSES_PER_CANDIDATE
    assert ev["outcome"] == "infrastructure_failure" and ev["failed_stage"] == "placement"
    assert "disappeared under this candidate" in ev["reason"]
    slots[-1].lose_at = 0  # the last one stays: measures the next candidate
    assert pool.measure("softmax", "honest")[0]["outcome"] == "success"
    slots[-1].lose_at = len(slots[-1].codes) + 1  # the last one lost: nowhere to go
    with pytest.raises(GfsimError, match="every measurer of this run was lost.*`resume`") as e:
        pool.measure("softmax", "third")
    assert "\n" not in str(e.value) and "(3: host0:gpu0" in str(e.value)


def test_an_error_of_the_measurer_itself_is_raised_and_keeps_the_measurer():
    a = FakeSlot(0, die_at=1)
    pool = _pool(a)
    with pytest.raises(Died):
        pool.measure("softmax", "code")
    assert not a.closed and pool.measure("softmax", "next")[0]["outcome"] == "success"


# -- the driver on several measurers -----------------------------------------------------------
def test_a_run_on_two_measurers_measures_each_candidate_once_and_says_where(tmp_path):
    active = [0, 0]
    slots = [FakeSlot(0, busy_s=0.05, active=active), FakeSlot(1, busy_s=0.05, active=active)]
    out = tmp_path / "two.jsonl"
    summary = _run(out, _pool(*slots))
    recs = _records(out)
    evals = [r for r in recs if r["kind"] == "evaluation"]
    measured = [e for e in evals if "reused_from" not in e]
    assert active[1] == 2 and all(s.codes for s in slots)  # both, at once
    # every measurement on one measurer, and once: the calls are the evaluations and the seed
    # on each measurer (each warms up on it, and their agreement is on record)
    assert sum(len(s.codes) for s in slots) == len(measured) + 2
    assert slots[0].codes[0] == slots[1].codes[0]
    assert {e["measured_on"]["measurer"] for e in measured} == {0, 1}
    assert all(e["measured_on"]["host"] == f"host{e['measured_on']['measurer']}"
               for e in measured)
    run = next(r for r in recs if r["kind"] == "run")
    assert run["configuration"]["capacities"]["gpus"] == 2
    assert summary["measurers"]["measurers"] == 2 and "lost" not in summary["measurers"]
    each = run["seed_on_measurers"]
    assert [e["measured_on"]["measurer"] for e in each] == [0, 1]
    assert run["seed_evaluation"]["measured_on"]["measurer"] == 0
    search = summary["searches"][0]
    assert search["seed_speedup_by_measurer"] == [e["speedup"] for e in each]
    assert search["seed_spread"] == 0.0  # (the stand-ins time a code alike)
    assert {s["steps"] for s in summary["searches"]} == {3}
    load_log(out)


class SameCode(CandidateSource):
    """Every child the same code (another than the seed's)."""

    name = "same"

    def seed(self, task):
        return task_seed(task)

    def generate(self, task, parent, key, slot):
        return Generated(task_seed(task).code + "\n# the one child\n", dict(parent.meta))


def test_the_same_code_in_flight_on_two_measurers_is_measured_once(tmp_path):
    slots = [FakeSlot(0, busy_s=0.2), FakeSlot(1, busy_s=0.2)]
    out = tmp_path / "same.jsonl"
    _run(out, _pool(*slots), source=SameCode(), steps=1)
    evals = [r for r in _records(out) if r["kind"] == "evaluation"]
    assert len(evals) == 2  # the seed's two children, sent to the two measurers at once
    assert sum("reused_from" not in e for e in evals) == 1
    assert sum(len(s.codes) for s in slots) == 3  # the seed on each, and the one child


def test_a_measurer_lost_mid_run_loses_no_candidate_and_is_flagged(tmp_path):
    slots = [FakeSlot(0, lose_at=3), FakeSlot(1)]
    out = tmp_path / "lost.jsonl"
    summary = _run(out, _pool(*slots))
    recs = _records(out)
    lost_tries = [r for r in recs if r["kind"] == "attempt" and r.get("lost")]
    assert len(lost_tries) == 1 and lost_tries[0]["lost"]["measurer"] == 0
    victim = lost_tries[0]["candidate_id"]
    tries = [r for r in recs if r["kind"] == "attempt" and r["candidate_id"] == victim]
    assert [(r["attempt"], bool(r.get("lost"))) for r in tries] == [(1, False), (1, True),
                                                                   (2, False)]
    ev = [r for r in recs if r["kind"] == "evaluation" and r["candidate_id"] == victim]
    assert len(ev) == 1 and ev[0]["outcome"] == "success"
    assert ev[0]["measured_on"]["measurer"] == 1 and ev[0]["lost"][0]["measurer"] == 0
    # every candidate chosen for measurement has its evaluation
    chosen = {r["candidate_id"] for r in recs if r["kind"] == "decision"
              and r["action"] == "measure"}
    assert chosen <= {r["candidate_id"] for r in recs if r["kind"] == "evaluation"}
    assert summary["measurers"]["lost"][0]["measurer"] == 0
    assert {s["steps"] for s in summary["searches"]} == {3}
    # resumed: nothing measured again
    again = FakeSlot(0)
    _run(out, _pool(again), resume=True)
    assert again.codes == []
    load_log(out)


def test_a_lost_measurer_is_not_counted_against_a_candidate_that_then_kills_the_run(tmp_path):
    """A candidate's first measurer is lost, its second measurement kills the run: on resume it
    was begun twice, once ended by the loss, so it killed the run once (max_attempts 1): it is
    recorded as a failure from that one attempt, not measured again."""
    out = tmp_path / "killer.jsonl"
    seen: list[str] = []
    lock = threading.Lock()

    def script(code):  # the first child: its measurer lost; measured again, it kills the run
        with lock:
            seen.append(code)
            first = next((c for c in seen if c != seen[0]), None)  # (seen[0]: the seed)
            n = seen.count(first)
        if code == first:
            if n == 1:
                raise SlotLost("The actor died unexpectedly before finishing this task.")
            raise Died(code)

    with pytest.raises(Died) as died:
        _run(out, _pool(FakeSlot(0, script=script), FakeSlot(1, script=script)), steps=1)
    code = died.value.args[0]
    again = FakeSlot(0)
    _run(out, _pool(again), steps=1, resume=True)
    assert code not in again.codes
    recs = _records(out)
    victim = [r for r in recs if r["kind"] == "attempt" and r.get("lost")][0]["candidate_id"]
    ev = [r for r in recs if r["kind"] == "evaluation" and r["candidate_id"] == victim]
    assert len(ev) == 1 and ev[0]["failed_stage"] == "attempt" and "begun once" in ev[0][
        "reason"]


def test_more_than_one_gpu_without_a_cluster_is_refused_in_one_line(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    res = CliRunner().invoke(app, ["live", "--tasks", "softmax", "--measurer", "interpret",
                                   "--trust-cpu-clock", "--gpus", "2", "--out",
                                   str(tmp_path / "x.jsonl")])
    assert res.exit_code != 0
    assert "more than one GPU needs --cluster" in res.output
    assert not (tmp_path / "x.jsonl").exists()


def test_a_cluster_that_cannot_be_reached_is_refused_before_anything_is_written(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("ray")
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    out = tmp_path / "x.jsonl"
    res = CliRunner().invoke(app, ["live", "--tasks", "softmax", "--measurer", "interpret",
                                   "--trust-cpu-clock", "--cluster", "ray://127.0.0.1:1",
                                   "--out", str(out)])
    assert res.exit_code != 0
    assert "cannot be reached" in res.output and "127.0.0.1:1" in res.output
    assert not out.exists()
