"""Small exact traces through the SimPy engine (tests/data-style logs built in code)."""

import subprocess
import sys

import numpy as np
import pytest

from gfsim.core.errors import GfsimError
from gfsim.cost_models import Capacities, Usage, load_cost_model
from gfsim.policies import Decisions, Policy, make_policy
from gfsim.replay_logs import load_log, resolve_log
from gfsim.simulator import Budget, replay
from gfsim.testing import LogBuilder

SERVERLESS = load_cost_model("serverless-a100")
RESERVED = load_cost_model("reserved-h100")


def caps(**kw):
    base = dict(generator=16, forecaster=16, compile_workers=4, gpus=1)
    return Capacities(**{**base, **kw})


def run(builder, tmp_path, policy="all", model=SERVERLESS, **kw):
    log = load_log(builder.write(tmp_path / "log.jsonl"))
    kw.setdefault("capacities", caps())
    return replay(log, make_policy(policy), model, **kw)


def two_siblings():
    b = LogBuilder()
    b.candidate("t", 0, speedup=1.5)
    b.candidate("t", 0, speedup=2.0)
    return b


def test_one_gpu_serialises_measurements(tmp_path):
    # Both generated at t=10 in parallel; each measurement is 1+2+3+4 = 10 s on the one GPU.
    r = run(two_siblings(), tmp_path).searches[0]
    assert r.table["measure_start_s"] == [10.0, 10.0]
    assert r.table["measure_end_s"] == [20.0, 30.0]
    assert r.wall_s == 30.0 and r.gpu_evals == 2 and r.best_speedup == 2.0


def test_two_gpus_measure_in_parallel(tmp_path):
    r = run(two_siblings(), tmp_path, capacities=caps(gpus=2)).searches[0]
    assert r.table["measure_end_s"] == [20.0, 20.0] and r.wall_s == 20.0


def test_one_generator_slot_serialises_generation(tmp_path):
    r = run(two_siblings(), tmp_path, capacities=caps(generator=1, gpus=2)).searches[0]
    # The batch decides when its last member is generated (t=20).
    assert r.table["measure_start_s"] == [20.0, 20.0] and r.wall_s == 30.0


def test_forecast_stage_runs_only_for_policies_that_read_forecasts(tmp_path):
    b = LogBuilder()
    b.candidate("t", 0, speedup=1.5, probs=LogBuilder.onehot(5, 0.5), forecast_s=5.0)
    r_all = run(b, tmp_path, "all").searches[0]
    r_thr = run(b, tmp_path, "threshold:0.7").searches[0]
    assert r_all.forecasts == 0 and r_thr.forecasts == 1
    assert r_thr.table["measure_start_s"][0] == r_all.table["measure_start_s"][0] + 5.0
    assert r_thr.stages["forecasting"].usd > 0 == r_all.stages["forecasting"].usd


def test_step_barrier_holds_the_next_step(tmp_path):
    b = LogBuilder()
    p = b.candidate("t", 0, speedup=1.5)
    b.candidate("t", 0, speedup=1.1, stage_s=(0, 0, 0, 100.0))  # a slow sibling
    b.candidate("t", 1, parent=p, speedup=1.7)
    r = run(b, tmp_path, capacities=caps(gpus=2)).searches[0]
    # Step 1 starts only when step 0's slow measurement ends (t = 10 + 100).
    assert r.table["measure_start_s"][2] == 110.0 + 10.0


@pytest.mark.parametrize("model", [SERVERLESS, RESERVED], ids=["serverless", "reserved"])
@pytest.mark.parametrize("policy", ["all", "threshold:0.6", "topk:1", "random:0.5"])
def test_stage_costs_sum_to_totals(tmp_path, model, policy):
    log = load_log(resolve_log("synthetic-mini"))
    result = replay(log, make_policy(policy), model, seed=4, orphans_dropped=False)
    for r in result.searches:
        assert r.total.usd == pytest.approx(sum(c.usd for c in r.stages.values()))
        idle = r.stages["idle"]
        per_candidate = sum(r.table["usd"])
        assert r.total.usd == pytest.approx(per_candidate + idle.usd)
    figures = result.figures()
    assert figures["usd"] == pytest.approx(sum(s["usd"] for s in figures["stages"].values()))
    assert figures["joules"] == pytest.approx(
        sum(s["joules"] for s in figures["stages"].values()))


def test_reserved_billing_charges_the_whole_wall_clock(tmp_path):
    b = two_siblings()
    r = run(b, tmp_path, model=RESERVED, capacities=caps(gpus=2)).searches[0]
    gpu_usd = sum(r.stages[s].usd for s in ("cold_start", "compilation", "check", "timing",
                                            "idle") if s != "compilation")
    assert gpu_usd == pytest.approx(2 * r.wall_s * RESERVED.gpu.usd_per_hour / 3600)
    assert r.stages["idle"].usd > 0
    assert r.stages["cold_start"].seconds == 0  # a warm reserved worker has no cold start


def test_cpu_compile_failures_never_reach_the_gpu(tmp_path):
    b = LogBuilder()
    b.candidate("t", 0, outcome="compile_failed", speedup=None)
    r = run(b, tmp_path, model=RESERVED).searches[0]
    assert r.gpu_evals == 1
    assert r.stages["compilation"].usd == pytest.approx(2.0 * 0.0472 / 3600)
    assert r.stages["check"].seconds == r.stages["timing"].seconds == 0
    served = run(b, tmp_path, model=SERVERLESS).searches[0]
    assert served.stages["cold_start"].seconds == 1.0  # on the GPU host it paid a container


def test_gpu_eval_budget_stops_measuring(tmp_path):
    b = LogBuilder()
    for s in (1.2, 1.4, 1.6):
        b.candidate("t", 0, speedup=s)
    r = run(b, tmp_path, budget=Budget(gpu_evals=2)).searches[0]
    assert r.gpu_evals == 2 and r.stopped_by == "gpu_evals" and r.best_speedup == 1.4
    assert r.table["state"] == ["measured", "measured", "budget_stopped"]


def test_step_budget_stops_after_that_many_steps(tmp_path):
    b = LogBuilder()
    p = b.candidate("t", 0, speedup=1.2)
    b.candidate("t", 1, parent=p, speedup=3.0)
    r = run(b, tmp_path, budget=Budget(steps=1)).searches[0]
    assert r.steps == 1 and r.stopped_by == "steps" and r.best_speedup == 1.2


def test_usd_budget_stops_before_a_step_it_cannot_afford(tmp_path):
    # It used to stop only once the limit was reached, overshooting by the work in flight.
    log = load_log(resolve_log("synthetic-mini"))
    free = replay(log, make_policy("all"), SERVERLESS, orphans_dropped=False)
    capped = replay(log, make_policy("all"), SERVERLESS, budget=Budget(usd=5.0),
                    orphans_dropped=False)
    for r, f in zip(capped.searches, free.searches):
        assert r.stopped_by == "usd"
        assert 0 < r.total.usd <= 5.0 < f.total.usd
        assert r.gpu_evals < f.gpu_evals


def orphan_log():
    b = LogBuilder()
    bad = b.candidate("t", 0, speedup=0.3, probs=LogBuilder.onehot(1))  # confident and slow
    b.candidate("t", 0, speedup=1.2, probs=LogBuilder.onehot(5, 0.3))
    child = b.candidate("t", 1, parent=bad, speedup=4.0, probs=LogBuilder.onehot(8, 0.3))
    b.candidate("t", 2, parent=child, speedup=5.0, probs=LogBuilder.onehot(8, 0.3))
    return b


def test_orphans_are_counted_kept_and_dropped(tmp_path):
    result = run(orphan_log(), tmp_path, "threshold:0.7")
    kept, dropped = result.searches[0], result.orphans_dropped[0]
    assert kept.table["state"] == ["skipped", "measured", "measured", "measured"]
    assert kept.table["orphan"] == [False, False, True, False]
    assert kept.orphans == 1 and result.figures()["orphan_share"] == pytest.approx(1 / 4)
    assert kept.best_speedup == 5.0
    # Dropped: the orphan is never generated, so its child is an orphan too.
    assert dropped.table["state"] == ["skipped", "measured", "orphan_dropped", "orphan_dropped"]
    assert dropped.best_speedup == 1.2 and dropped.candidates == 2


def test_a_deferred_candidate_is_unmeasurable_not_guessed(tmp_path):
    b = LogBuilder()
    b.candidate("t", 0, speedup=1.5)
    b.candidate("t", 0, outcome=None, deferred=True)
    r = run(b, tmp_path).searches[0]
    assert r.unmeasurable == 1 and r.gpu_evals == 1
    assert r.table["state"] == ["measured", "unmeasurable"]
    assert r.table["usd"][1] == pytest.approx(SERVERLESS.cost(Usage("generation", 10, 1000,
                                                                      2000)).usd)


@pytest.mark.parametrize("frame, measured", [("parent", True), ("reference", False)])
def test_forecasts_are_converted_to_the_reference_frame(tmp_path, frame, measured):
    b = LogBuilder(relative_to=frame)
    p = b.candidate("t", 0, speedup=2.0)  # no forecast: measured by every policy
    # One-hot bin 5 = (1.0, 1.41] relative to the forecast's frame, fully confident.
    b.candidate("t", 1, parent=p, speedup=2.5, probs=LogBuilder.onehot(5))
    r = run(b, tmp_path, "threshold:0.7").searches[0]
    # Against the parent (2.0x) that is 2.0-2.8x > best 2.0: promising. Against the
    # reference it is 1.0-1.41x < 2.0 with confidence 1: skipped.
    assert (r.table["state"][1] == "measured") is measured


def test_measured_energy_is_used_when_the_log_is_from_the_same_gpu(tmp_path):
    b = LogBuilder(device_name="A100-80GB")
    b.candidate("t", 0, speedup=1.5, energy_j=1000.0)
    r = run(b, tmp_path).searches[0]
    gpu_j = sum(r.stages[s].joules for s in ("cold_start", "compilation", "check", "timing"))
    assert gpu_j == pytest.approx(1000.0)


def test_missing_usage_is_imputed_and_counted(tmp_path):
    b = LogBuilder()
    b.candidate("t", 0, speedup=1.5, tokens=None)  # mutation tokens never logged
    r = run(b, tmp_path)
    gen = r.searches[0].stages["generation"]
    assert gen.usd_imputed == gen.usd > 0
    assert 0 < r.figures()["usd_imputed_share"] < 1


def test_shape_rules(tmp_path):
    pairs = LogBuilder(shape="pairs")
    pairs.candidate("t", 0, speedup=1.5)
    with pytest.raises(GfsimError, match="pairs"):
        run(pairs, tmp_path)
    space = LogBuilder(shape="config_space")
    space.candidate("t", 0, speedup=1.5, probs=LogBuilder.onehot(5))
    with pytest.raises(GfsimError, match="config_space"):
        run(space, tmp_path, "threshold:0.7")
    assert run(space, tmp_path, "all").searches[0].gpu_evals == 1
    none = LogBuilder(with_forecast_header=False)
    none.candidate("t", 0, speedup=1.5)
    with pytest.raises(GfsimError, match="reads forecasts and the log has none"):
        run(none, tmp_path, "topk:1")


# -- common random numbers and determinism ----------------------------------------------
class MeasureUntil(Policy):
    """Measures everything before step ``s``, nothing from then on (test-only)."""

    name = "measure-until"

    def __init__(self, s):
        super().__init__()
        self.s = s

    def decide(self, batch, state):
        n = len(batch)
        return Decisions.build(np.full(n, state.step < self.s), np.zeros(n), ("x",) * n)


def test_policies_that_agree_up_to_a_step_have_identical_traces_up_to_it():
    log = load_log(resolve_log("synthetic-mini"))
    base = replay(log, make_policy("all"), SERVERLESS, orphans_dropped=False)
    cut = replay(log, MeasureUntil(5), SERVERLESS, orphans_dropped=False)
    for a, b in zip(base.searches, cut.searches):
        early = [i for i, s in enumerate(a.table["step"]) if s < 5]
        late = [i for i, s in enumerate(a.table["step"]) if s >= 5]
        for col in ("state", "measure_start_s", "measure_end_s", "speedup"):
            nan_free = [[None if x != x else x for x in (t.table[col][i] for i in early)]
                        for t in (a, b)]
            assert nan_free[0] == nan_free[1], col
        assert any(a.table["state"][i] != b.table["state"][i] for i in late)


def test_keyed_randomness_nests_random_policies():
    log = load_log(resolve_log("synthetic-mini"))
    lo = replay(log, make_policy("random:0.3"), SERVERLESS, seed=2, orphans_dropped=False)
    hi = replay(log, make_policy("random:0.6"), SERVERLESS, seed=2, orphans_dropped=False)
    lo_set = set(lo.candidate_table().query("state == 'measured'")["candidate_id"])
    hi_set = set(hi.candidate_table().query("state == 'measured'")["candidate_id"])
    assert lo_set < hi_set
    other = replay(log, make_policy("random:0.3"), SERVERLESS, seed=3, orphans_dropped=False)
    assert other.trace_hash() != lo.trace_hash()


def test_same_seed_same_trace_hash_in_a_fresh_process(tmp_path):
    # cwd away from the checkout: `python -c` puts cwd first on sys.path, and the source
    # tree's gfsim/ folder would shadow the installed package.
    code = (
        "from gfsim.replay_logs import load_log, resolve_log;"
        "from gfsim.cost_models import load_cost_model;"
        "from gfsim.policies import make_policy;"
        "from gfsim.simulator import replay;"
        "r = replay(load_log(resolve_log('synthetic-mini')), make_policy('random:0.5'),"
        " load_cost_model('reserved-h100'), seed=7);"
        "print(r.trace_hash())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    log = load_log(resolve_log("synthetic-mini"))
    here = replay(log, make_policy("random:0.5"), RESERVED, seed=7)
    assert out.stdout.strip() == here.trace_hash()


def test_coverage_form_measures_about_the_asked_fraction():
    log = load_log(resolve_log("synthetic-mini"))
    # rho=1 switches off the promise rule so that only confidence decides.
    for q in (0.2, 0.5, 0.8):
        r = replay(log, make_policy(f"threshold:coverage={q},rho=1"), SERVERLESS,
                   orphans_dropped=False)
        t = r.candidate_table()
        decided = t[t["action"].notna()]
        usable = decided[decided["reason"] != "parse-failed"]
        share = (usable["action"] == "measure").mean()
        assert abs(share - q) < 0.1, (q, share)


def test_ev_measures_more_as_a_doubling_is_worth_more():
    log = load_log(resolve_log("synthetic-mini"))
    evals = []
    for rate in (0.01, 1.0, 100.0):
        r = replay(log, make_policy(f"ev:{rate}"), SERVERLESS, orphans_dropped=False)
        evals.append(r.figures()["gpu_evals"])
    assert evals[0] < evals[1] < evals[2] <= 359
