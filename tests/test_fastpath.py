"""The closed-form fast path agrees with the SimPy engine wherever it applies."""

import numpy as np
import pytest

from gfsim.core.errors import GfsimError
from gfsim.cost_models import Capacities, load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log, resolve_log
from gfsim.simulator import Budget, build_traces, replay
from gfsim.simulator.trace import fast as fastpath
from gfsim.simulator.trace.fast import _segmented, _sums, run_fast, run_fast_many
from gfsim.simulator.replay import calibration_batch
from gfsim.simulator.noise import MeasureNoise
from gfsim.simulator.pipeline import parse_pipeline
from gfsim.testing import LogBuilder

OUTCOMES = ["success"] * 6 + ["compile_failed", "runtime_error", "incorrect", "timeout",
                              "infrastructure_failure"]
POLICIES = ["all", "threshold:0.6", "threshold:tau=0.9,rho=0.3,score=margin",
            "threshold:coverage=0.5", "topk:2", "topk:k=1,on_parse_failure=skip",
            "random:0.5", "oracle:0.4", "ev:2", "ev:usd_per_log2_speedup=0.05"]
PIPELINES = [None, "generate,compile,forecast,decide,check,time",
             "generate,compile,check,forecast,decide,time"]
WIDE = Capacities(generator=64, forecaster=64, compile_workers=64, gpus=64)


def random_log(rng, path, tasks: int = 2):
    """A random log of one search per task (its steps, batches, outcomes and forecasts)."""
    frame = rng.choice(["reference", "seed", "parent"])
    seeds = {"t0": float(rng.uniform(0.5, 1.5)), "t1": 1.0}
    seeds.update({f"t{k}": float(rng.uniform(0.5, 1.5)) for k in range(2, tasks)})
    b = LogBuilder(seeds, relative_to=frame)
    for task in seeds:
        ids: list[str] = []
        for step in range(int(rng.integers(1, 6))):
            parents = [None] if not ids else list(rng.choice(ids, size=min(len(ids), 3)))
            for parent in parents[: int(rng.integers(1, 4))]:
                for _ in range(int(rng.integers(1, 5))):
                    u = rng.random()
                    outcome = str(rng.choice(OUTCOMES))
                    cid = b.candidate(
                        task, step, parent=parent, outcome=outcome,
                        speedup=float(rng.lognormal(0, 0.6)) if outcome == "success" else None,
                        probs=list(rng.dirichlet(np.full(8, 0.7))) if u > 0.1 else None,
                        parse_failed=0.05 < u < 0.1, gen_failed=u < 0.03,
                        deferred=0.03 <= u < 0.05, gen_s=float(rng.uniform(1, 30)),
                        forecast_s=float(rng.uniform(1, 20)),
                        stage_s=tuple(float(x) for x in rng.uniform(0.1, 50, size=4)),
                        tokens=None if rng.random() < 0.5 else (1000, 2000),
                    )
                    if u >= 0.05:
                        ids.append(cid)
    return load_log(b.write(path))


@pytest.mark.parametrize("case", range(40))
def test_fast_path_agrees_with_the_event_engine(tmp_path, case):
    rng = np.random.default_rng(case)
    log = random_log(rng, tmp_path / "log.jsonl")
    model = load_cost_model(str(rng.choice(["serverless-a100", "reserved-h100"])))
    policy = str(rng.choice(POLICIES))
    kwargs = dict(seed=case, capacities=WIDE, pipeline=parse_pipeline(rng.choice(PIPELINES)),
                  budget=Budget(steps=int(rng.integers(1, 6))) if rng.random() < 0.3
                  else Budget(), noise=MeasureNoise(0.1) if case % 2 else None)
    fast = replay(log, make_policy(policy), model, engine="auto", **kwargs)
    slow = replay(log, make_policy(policy), model, engine="des", **kwargs)
    assert {r.engine for r in slow.searches} == {"des"}
    # Continuous random times leave no ties, so auto must have taken the fast path.
    assert {r.engine for r in fast.searches} == {"fast"}
    for f, s in zip(fast.searches + fast.orphans_dropped, slow.searches + slow.orphans_dropped):
        assert f.trace_hash == s.trace_hash  # states, decisions and end times (to 1 us)
        assert f.table["action"] == s.table["action"]
        assert f.table["state"] == s.table["state"]
        assert f.best_speedup == s.best_speedup and f.best_candidate_id == s.best_candidate_id
        assert (f.confirmed_speedup, f.true_best_speedup) == (s.confirmed_speedup,
                                                              s.true_best_speedup)
        np.testing.assert_array_equal(f.table["speedup"], s.table["speedup"])
        assert (f.gpu_evals, f.forecasts, f.candidates, f.unmeasurable, f.orphans, f.steps) == (
            s.gpu_evals, s.forecasts, s.candidates, s.unmeasurable, s.orphans, s.steps)
        # Times agree to rounding: the fast path adds durations in a different order.
        assert f.wall_s == pytest.approx(s.wall_s, rel=1e-12) and f.stopped_by == s.stopped_by
        np.testing.assert_allclose(f.table["measure_end_s"], s.table["measure_end_s"],
                                   rtol=1e-12)
        for stage in f.stages:
            assert f.stages[stage].usd == pytest.approx(s.stages[stage].usd, rel=1e-9, abs=1e-12)
            assert f.stages[stage].joules == pytest.approx(s.stages[stage].joules, rel=1e-9)
            assert f.stages[stage].seconds == pytest.approx(s.stages[stage].seconds, rel=1e-9)
        assert f.table["usd"] == pytest.approx(s.table["usd"], rel=1e-9)
        assert f.anytime.shape == s.anytime.shape
        np.testing.assert_array_equal(f.anytime[:, [3, 4]], s.anytime[:, [3, 4]])
        np.testing.assert_allclose(f.anytime[:, :3], s.anytime[:, :3], rtol=1e-9)


def test_the_fast_path_is_used_when_nothing_binds():
    log = load_log(resolve_log("synthetic-mini"))
    model = load_cost_model("serverless-a100")
    r = replay(log, make_policy("threshold:0.7"), model, capacities=WIDE)
    assert {s.engine for s in r.searches} == {"fast"}


@pytest.mark.parametrize("budget, caps, reason", [
    (Budget(usd=10), WIDE, "budget"),
    (Budget(), Capacities(generator=64, forecaster=64, compile_workers=64, gpus=2),
     "GPU capacity binds"),
    (Budget(), Capacities(generator=2, forecaster=64, compile_workers=64, gpus=64),
     "generator capacity binds"),
])
def test_the_engine_runs_where_the_fast_path_cannot(budget, caps, reason):
    log = load_log(resolve_log("synthetic-mini"))
    model = load_cost_model("serverless-a100")
    r = replay(log, make_policy("all"), model, capacities=caps, budget=budget)
    assert {s.engine for s in r.searches} == {"des"}
    with pytest.raises(GfsimError, match=reason):
        replay(log, make_policy("all"), model, capacities=caps, budget=budget, engine="fast")


def _same(a, b, where=""):
    """Equal to the bit (NaN equal to NaN), through dicts, lists and arrays."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{k}]")
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), where
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, where
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("case", range(12))
def test_searches_replayed_together_give_what_each_gives_alone(tmp_path, case, monkeypatch):
    # Lockstep shares policy calls, clocks and sums across searches: none of it may leak
    # from one search into another, to the last bit of any figure. (Anytime rows are worked
    # out in runs of whole searches of a bounded size: runs of one to a few searches here.)
    monkeypatch.setattr(fastpath, "_ANYTIME_ROWS", [1, 7, 40, 1 << 18][case % 4])
    rng = np.random.default_rng(500 + case)
    log = random_log(rng, tmp_path / "log.jsonl", tasks=int(rng.integers(3, 12)))
    model = load_cost_model(str(rng.choice(["serverless-a100", "reserved-h100"])))
    traces = build_traces(log, model)
    policy = make_policy(POLICIES[case % len(POLICIES)])
    policy.fit(calibration_batch(traces), case)
    args = (policy, model, WIDE, Budget(steps=3) if case % 4 == 3 else Budget(), case,
            case % 3 == 0, parse_pipeline(PIPELINES[case % 3]),
            MeasureNoise(0.1) if case % 2 else None)
    together = run_fast_many(traces, *args)
    assert len(together) == len(traces) > 2
    for t, r in zip(traces, together):
        alone = run_fast(t, *args)
        for f in ("search_id", "best_speedup", "best_candidate_id", "gpu_evals", "candidates",
                  "forecasts", "unmeasurable", "orphans", "reached", "steps", "wall_s",
                  "stopped_by", "confirmed_speedup", "true_best_speedup", "table"):
            _same(getattr(alone, f), getattr(r, f), f)
        assert alone.stages == r.stages
        _same(alone.anytime, r.anytime, "anytime")


def test_counts_at_or_below_in_slices_of_groups_are_the_counts_of_one_sort(monkeypatch):
    # A large replay counts bookings at or below each measurement's end in runs of whole
    # groups (less memory at once): the counts a per-group searchsorted gives, ties and
    # groups without values or probes included.
    rng = np.random.default_rng(3)
    n_groups = 40
    vgroup = np.sort(rng.integers(0, n_groups, 3000))
    pgroup = np.sort(rng.integers(0, n_groups, 900))
    values = rng.integers(0, 50, len(vgroup)).astype(float)  # many ties
    probes = rng.integers(0, 50, len(pgroup)).astype(float)
    want = [int(np.searchsorted(np.sort(values[vgroup == g]), p, "right"))
            for p, g in zip(probes, pgroup)]
    for size in (1, 7, 100, 1000, 10**6):
        monkeypatch.setattr(fastpath, "_COUNT_SLICE", size)
        got = fastpath._counts_at_or_below(values, vgroup, probes, pgroup, n_groups)
        assert got.tolist() == want, size


def test_segment_sums_and_running_sums_are_numpys_to_the_bit():
    rng = np.random.default_rng(7)
    for scale in (1.0, 1e3, 1e-3):
        sizes = rng.integers(1, 300, size=80)
        x = rng.random(int(sizes.sum())) * scale
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        want = [x[a:a + n].sum() for a, n in zip(starts, sizes)]
        assert _sums(x, starts, sizes).tolist() == want
        running = np.concatenate([np.cumsum(x[a:a + n]) for a, n in zip(starts, sizes)])
        assert _segmented(np.cumsum, x, starts, sizes).tolist() == running.tolist()


def test_a_big_search_then_small_ones_that_are_no_views_of_one_log(tmp_path):
    """Traces that are not views of one log's columns (stored ones, copies) are laid out one
    by one; a search of at least _KEEP_LAYOUT candidates keeps its layout, and the small
    searches after it are laid out beside it, each as it replays alone (a big search's kept
    layout once took the place of the list the small ones were added to)."""
    import pickle

    model = load_cost_model("serverless-a100")
    b = LogBuilder(tasks={"big": 1.0, "small": 1.0, "tiny": 1.0})
    for task, n in (("big", fastpath._KEEP_LAYOUT + 8), ("small", 6), ("tiny", 3)):
        for i in range(n):
            b.candidate(task, step=i // 4, speedup=1.0 + (i * 7 % 11) / 10,
                        probs=b.onehot(1 + i % 8, 0.6))
    traces = [pickle.loads(pickle.dumps(t))  # (a copy holds its own fields: no view)
              for t in build_traces(load_log(b.write(tmp_path / "log.jsonl")), model)]
    policy = make_policy("threshold:0.7")
    together = run_fast_many(traces, policy, model, WIDE, Budget(), 0)
    for t, got in zip(traces, together):
        alone = run_fast(t, policy, model, WIDE, Budget(), 0)
        assert (got.best_speedup, got.gpu_evals, got.total.usd) == \
            (alone.best_speedup, alone.gpu_evals, alone.total.usd)
