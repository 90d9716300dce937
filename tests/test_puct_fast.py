"""The closed-loop fast path (``simulator.closed.fast``) gives exactly the SimPy engine's answers.

Random logs, policies, search shapes, capacities (binding ones too), budgets, pipelines, noise
and forecast frames; half the logs use a few fixed stage times, so that children drawn from
the same logged candidate, or alike ones, tie to the instant and only the event order decides
(which budget check sees which booking, which batch decides first, whose measurement ends
first). Everything is compared bit for bit: states, actions, scores, reasons, outcomes,
measured speedups, start and end times, per-candidate and per-stage costs, counts, the anytime
rows, the draws. Each comparison runs twice: with the fast path's Python event loop and with its
compiled twin (``simulator.closed._events_kernel``), which must both give SimPy's answers.
"""

import numpy as np
import pytest

from gfsim.cost_models import Capacities, load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log, open_log
from gfsim.simulator import Budget, replay
from gfsim.simulator import world_model as wm
from gfsim.simulator.closed import fast
from gfsim.simulator.noise import MeasureNoise
from gfsim.simulator.pipeline import parse_pipeline
from gfsim.simulator.closed.engine import SearchConfig
from gfsim.testing import LogBuilder
from gfsim.worlds.landscape import Landscape, LandscapeParams
from gfsim.worlds.synth_puct import run_on_landscape

OUTCOMES = ["success"] * 6 + ["compile_failed", "runtime_error", "incorrect", "timeout"]
POLICIES = ["all", "threshold:0.6", "threshold:tau=0.9,rho=0.3,score=margin",
            "threshold:coverage=0.5", "topk:2", "topk:k=1,on_parse_failure=skip",
            "random:0.5", "oracle:0.4", "ev:2", "ev:usd_per_log2_speedup=0.05"]
PIPELINES = [None, "generate,compile,forecast,decide,check,time",
             "generate,compile,check,forecast,decide,time"]


@pytest.fixture(params=["python", "compiled"])
def events(request, monkeypatch):
    """Which event loop the fast path runs: its Python loop, or the compiled step (from the
    first child); yields a list that counts the compiled steps."""
    steps: list = []
    if request.param == "python":
        monkeypatch.setattr(fast, "_EVENTS", [None])
    else:
        kernel = pytest.importorskip("gfsim.simulator.closed._events_kernel")
        monkeypatch.setattr(fast, "_EVENTS", [kernel])
        run = kernel.run

        def counted(*args):
            steps.append(1)
            return run(*args)

        monkeypatch.setattr(kernel, "run", counted)
    yield steps
    assert (len(steps) > 0) == (request.param == "compiled")


def random_log(rng, path, tied: bool):
    """Trees of logged searches; ``tied``: stage times from a few fixed values."""
    frame = str(rng.choice(["reference", "seed", "parent"]))
    b = LogBuilder({"t0": float(rng.uniform(0.5, 1.5)), "t1": 1.0}, relative_to=frame)

    def secs(lo, hi):
        return float(rng.choice([2.0, 5.0, 10.0])) if tied else float(rng.uniform(lo, hi))

    for task in ("t0", "t1"):
        ids: list[str] = []
        for step in range(int(rng.integers(1, 6))):
            parents = [None] if not ids else list(rng.choice(ids, size=min(len(ids), 3)))
            for parent in parents[: int(rng.integers(1, 4))]:
                for _ in range(int(rng.integers(1, 6))):
                    u = rng.random()
                    outcome = str(rng.choice(OUTCOMES))
                    cid = b.candidate(
                        task, step, parent=parent, outcome=None if u > 0.97 else outcome,
                        speedup=float(rng.lognormal(0, 0.6)) if outcome == "success" else None,
                        probs=list(rng.dirichlet(np.full(8, 0.7))) if u > 0.1 else None,
                        parse_failed=0.05 < u < 0.1, gen_failed=u < 0.03,
                        gen_s=secs(1, 30), forecast_s=secs(1, 20),
                        stage_s=tuple(secs(0.1, 50) for _ in range(4)),
                        tokens=None if rng.random() < 0.5 else (1000, 2000),
                    )
                    if u >= 0.05:
                        ids.append(cid)
    return load_log(b.write(path))


def random_budget(rng) -> Budget:
    kind = rng.choice(["none", "usd", "seconds", "joules", "gpu_evals", "steps"])
    if kind == "none":
        return Budget()
    value = {"usd": rng.uniform(0.5, 8), "seconds": rng.uniform(30, 600),
             "joules": rng.uniform(2e4, 4e5), "gpu_evals": rng.integers(1, 40),
             "steps": rng.integers(1, 8)}[kind]
    return Budget(**{kind: int(value) if kind in ("gpu_evals", "steps") else float(value)})


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def assert_same(fast, slow):
    assert fast.engine == "fast" and slow.engine == "des"
    for name in ("search_id", "best_speedup", "best_candidate_id", "gpu_evals", "candidates",
                 "forecasts", "unmeasurable", "orphans", "reached", "steps", "wall_s",
                 "stopped_by", "confirmed_speedup", "true_best_speedup", "extra"):
        assert same(getattr(fast, name), getattr(slow, name)), name
    assert fast.stages == slow.stages  # every Cost field, bit for bit
    np.testing.assert_array_equal(fast.anytime, slow.anytime)
    assert fast.table.keys() == slow.table.keys()
    for key in fast.table:
        a, b = list(fast.table[key]), list(slow.table[key])
        assert len(a) == len(b) and all(map(same, a, b)), key
    assert fast.trace_hash == slow.trace_hash


@pytest.mark.parametrize("case", range(60))
def test_the_fast_path_reproduces_the_simpy_engine(tmp_path, case, events):
    rng = np.random.default_rng(1000 + case)
    log = random_log(rng, tmp_path / "log.jsonl", tied=case % 2 == 0)
    model = load_cost_model(str(rng.choice(["serverless-a100", "reserved-h100"])))
    caps = Capacities(*(int(rng.choice([1, 2, 3, 64])) for _ in range(4)))
    search = SearchConfig(steps=int(rng.integers(1, 9)), parents_per_step=int(rng.integers(1, 4)),
                          samples_per_parent=int(rng.integers(1, 5)),
                          overgen=int(rng.integers(1, 4)), k_per_parent=int(rng.integers(1, 5)))
    kwargs = dict(driver="puct", search=search, seed=case, capacities=caps,
                  simulate=True, budget=random_budget(rng),
                  pipeline=parse_pipeline(rng.choice(PIPELINES)),
                  noise=MeasureNoise(0.1) if case % 3 == 0 else None, orphans_dropped=False)
    policy = str(rng.choice(POLICIES))
    fast = replay(log, make_policy(policy), model, engine="auto", **kwargs)
    slow = replay(log, make_policy(policy), model, engine="des", **kwargs)
    for f, s in zip(fast.searches, slow.searches, strict=True):
        assert_same(f, s)


@pytest.mark.parametrize("policy", ["all", "threshold:0.7", "topk:2", "ev:10"])
@pytest.mark.parametrize("overgen", [1, 4])
def test_the_shipped_log_replays_alike_under_a_budget(policy, overgen, events):
    # The tuning workload: fallback-heavy at F = 4 (children drawn twice from one logged
    # candidate tie exactly), a USD budget that ends every search, generator slots that bind.
    log = open_log("synthetic-puct-v1")
    kwargs = dict(driver="puct", search=SearchConfig(overgen=overgen), seed=overgen,
                  budget=Budget(usd=40), orphans_dropped=False)
    model = load_cost_model("serverless-a100")
    fast = replay(log, make_policy(policy), model, engine="fast", **kwargs)
    slow = replay(log, make_policy(policy), model, engine="des", **kwargs)
    assert "usd" in {s.stopped_by for s in slow.searches}
    for f, s in zip(fast.searches, slow.searches, strict=True):
        assert_same(f, s)


def test_direct_runs_on_a_landscape_agree(events):
    # Children that are not copies of logged ones (no plan is shared between them).
    land = Landscape(LandscapeParams(), seed=4, n_tasks=2)
    task = land.tasks[0].task_id
    config = SearchConfig(steps=12, overgen=2)
    fast, _ = run_on_landscape(land, task, config, "threshold:0.7", seed=2, engine="fast",
                               capacities=Capacities(generator=3, forecaster=2, gpus=2))
    slow, _ = run_on_landscape(land, task, config, "threshold:0.7", seed=2, engine="des",
                               capacities=Capacities(generator=3, forecaster=2, gpus=2))
    assert_same(fast, slow)


def test_the_compiled_step_waits_until_the_process_has_stepped_enough_children(monkeypatch):
    kernel = pytest.importorskip("gfsim.simulator.closed._events_kernel")
    monkeypatch.setattr(fast, "_EVENTS", [])
    monkeypatch.setattr(fast, "_STEPPED", [0])
    monkeypatch.setattr(wm, "COMPILE_AFTER", 1000)
    assert fast._events_kernel() is None and fast._EVENTS == []  # not loaded, not even tried
    fast._STEPPED[0] = 1000
    monkeypatch.setattr(wm, "COMPILED", False)  # GFSIM_COMPILED=off
    assert fast._events_kernel() is None and fast._EVENTS == []
    monkeypatch.setattr(wm, "COMPILED", True)
    assert fast._events_kernel() is kernel


def test_a_compiled_step_that_cannot_run_leaves_the_python_loop_in_charge(monkeypatch):
    kernel = pytest.importorskip("gfsim.simulator.closed._events_kernel")
    monkeypatch.setattr(fast, "_EVENTS", [])
    monkeypatch.setattr(fast, "_STEPPED", [10**9])

    def broken(*args):
        raise RuntimeError("this machine's LLVM cannot compile it")

    monkeypatch.setattr(kernel, "run", broken)
    assert fast._events_kernel() is None and fast._EVENTS == [None]
    log = open_log("synthetic-puct-v1")
    result = replay(log, make_policy("threshold:0.7"), load_cost_model("serverless-a100"),
                    driver="puct", search=SearchConfig(steps=3), seed=0, engine="fast",
                    orphans_dropped=False)
    assert result.searches[0].gpu_evals > 0
