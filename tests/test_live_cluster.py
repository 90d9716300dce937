"""``gfsim live --cluster``: the sandboxed measurer as Ray actors of a real cluster (the one
scripts/test-all starts: a head and a second worker process on loopback, GFSIM_RAY_ADDRESS),
on the CPU under the Triton interpreter: each candidate sent to a free measurer, the log saying
which one timed it, an actor killed mid-measurement costing a measurement elsewhere, flagged.
The same on GPUs is the device machine's (docs/how-to/run-on-a-cluster.md says what it
measured). Marked slow; skipped without a cluster unless GFSIM_REQUIRE_RAY is set."""

from __future__ import annotations

import json
import os
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from typer.testing import CliRunner  # noqa: E402

from gfsim.cli.main import app  # noqa: E402
from gfsim.core.errors import GfsimError  # noqa: E402
from gfsim.live.measure.measurer import MeasurerConfig  # noqa: E402
from gfsim.replay_logs import load_log  # noqa: E402
from gfsim.replay_logs.io import iter_records  # noqa: E402

pytestmark = pytest.mark.slow
runner = CliRunner()
SMALL = ["--measurer", "interpret", "--trust-cpu-clock", "--steps", "2", "--parents-per-step",
         "2", "--samples-per-parent", "2", "--k-per-parent", "2"]


@pytest.fixture
def ray_address(monkeypatch) -> str:
    address = os.environ.get("GFSIM_RAY_ADDRESS", "")
    if not address:
        if os.environ.get("GFSIM_REQUIRE_RAY"):
            pytest.fail("GFSIM_REQUIRE_RAY is set but GFSIM_RAY_ADDRESS names no cluster")
        pytest.skip("no Ray cluster (GFSIM_RAY_ADDRESS; scripts/test-all starts one)")
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", address)
    return address


def _records(out) -> list[dict]:
    return [rec for _, rec in iter_records(out)]


def _config() -> MeasurerConfig:
    return MeasurerConfig(rse_target=0.05, max_reps=10, energy_window_s=0.0, interpret=True,
                          cpu_timing=True)


def test_a_live_search_on_two_measurers_of_the_cluster_says_which_timed_each(ray_address,
                                                                             tmp_path):
    out = tmp_path / "run.jsonl"
    res = runner.invoke(app, ["live", "--tasks", "softmax", *SMALL, "--cluster", "ray",
                              "--gpus", "2", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    placed = summary["measurers"]
    assert placed["placement"] == "ray" and placed["address"] == ray_address
    assert placed["measurers"] == 2 and "lost" not in placed
    recs = _records(out)
    header = recs[0]
    assert [m["measurer"] for m in header["hardware"]["measurers"]] == [0, 1]
    assert "2 measurers of a Ray cluster" in header["provenance"]["note"]
    run = next(r for r in recs if r["kind"] == "run")
    assert run["configuration"]["capacities"]["gpus"] == 2
    assert [e["measured_on"]["measurer"] for e in run["seed_on_measurers"]] == [0, 1]
    evals = [r for r in recs if r["kind"] == "evaluation"]
    assert evals and all(r["measured_on"]["host"] and r["measured_on"]["gpu"] is None
                         for r in evals)
    assert {r["measured_on"]["measurer"] for r in evals} == {0, 1}
    assert len(summary["searches"][0]["seed_speedup_by_measurer"]) == 2
    assert summary["fidelity"]["capacities"]["gpus"] == 2
    load_log(out)
    # resumed on the cluster: nothing measured again
    res = runner.invoke(app, ["live", "--tasks", "softmax", *SMALL, "--cluster", "ray",
                              "--gpus", "2", "--out", str(out), "--resume", "--json"])
    assert res.exit_code == 0, res.output
    assert [r for r in _records(out) if r["kind"] == "evaluation"] == evals


def test_a_measurer_killed_mid_measurement_loses_no_candidate(ray_address, tmp_path):
    """The first measurer's actor is killed while it measures the search's third candidate:
    that candidate is measured again on the other, and its evaluation says so."""
    import ray

    from gfsim.live.driver import LiveOptions, LiveRun
    from gfsim.live.measure.gpus import ray_pool
    from gfsim.live.sources import MutationSource
    from gfsim.simulator.closed.engine import SearchConfig

    pool = ray_pool("ray", _config(), 2)
    first = pool.slots[0]
    calls = []
    measure = first.measure

    def measure_then_kill(task, code):
        calls.append(code)
        if len(calls) == 3:  # (1: the seed) kill the actor while it works
            threading.Timer(0.1, lambda: ray.kill(first.actor)).start()
        return measure(task, code)

    first.measure = measure_then_kill
    out = tmp_path / "killed.jsonl"
    opts = LiveOptions(tasks=["softmax"], search=SearchConfig(
        steps=2, parents_per_step=2, samples_per_parent=2, k_per_parent=2), seed=1,
        trust_cpu_clock=True)
    summary = LiveRun(out, opts, MutationSource(), None, None, pool=pool,
                      hardware={"device_name": "cpu"},
                      provenance={"kind": "measured", "note": "test"}).run()
    recs = _records(out)
    lost = [r for r in recs if r["kind"] == "attempt" and r.get("lost")]
    assert len(lost) == 1 and lost[0]["lost"]["measurer"] == 0
    victim = lost[0]["candidate_id"]
    ev = [r for r in recs if r["kind"] == "evaluation" and r["candidate_id"] == victim]
    assert len(ev) == 1 and ev[0]["outcome"] == "success"
    assert ev[0]["measured_on"]["measurer"] == 1 and ev[0]["lost"][0]["measurer"] == 0
    chosen = {r["candidate_id"] for r in recs if r["kind"] == "decision"
              and r["action"] == "measure"}
    assert chosen <= {r["candidate_id"] for r in recs if r["kind"] == "evaluation"}
    later = [r for r in recs if r["kind"] == "evaluation"
             and recs.index(r) > recs.index(lost[0])]
    assert later and all(r["measured_on"]["measurer"] == 1 for r in later)
    assert summary["measurers"]["lost"][0]["measurer"] == 0
    assert {s["steps"] for s in summary["searches"]} == {2}
    load_log(out)


def test_a_cluster_without_gpus_is_refused_for_gpu_measurement_in_one_line(ray_address,
                                                                            tmp_path):
    from gfsim.live.measure.gpus import ray_pool

    with pytest.raises(GfsimError, match="has no GPU") as got:
        ray_pool("ray", MeasurerConfig())
    assert "\n" not in str(got.value)
    with pytest.raises(GfsimError, match=r"`gpus` 64: the Ray cluster .* has \d+ CPUs"):
        ray_pool("ray", _config(), 64)
