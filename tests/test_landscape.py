"""The synthetic landscape: keyed draws, parent-dependent failures, forecasts, stage times."""

import dataclasses
import math
import statistics

import numpy as np
import pytest

from gfsim.core.errors import GfsimError
from gfsim.forecasts.bins import PAPER_EDGES, speedup_to_bin
from gfsim.worlds.landscape import (
    FAILURES,
    GENERATION_FAILED,
    KERNEL_FAILURES,
    Landscape,
    LandscapeParams,
    bin_probabilities,
)


@pytest.fixture(scope="module")
def land():
    return Landscape(LandscapeParams(), seed=7, n_tasks=3)


def subtree(land, node, order, depth=2, width=3):
    """All nodes below ``node`` to ``depth``, children requested in ``order`` ('fwd'/'rev')."""
    out = {}
    idx = list(range(width)) if order == "fwd" else list(reversed(range(width)))
    for i in idx:
        c = land.child(node, i)
        out[c.node_id] = c
        if depth > 1 and c.outcome != GENERATION_FAILED:
            out.update(subtree(land, c, order, depth - 1, width))
    return out


def test_children_do_not_depend_on_request_order(land):
    root = land.root("task-01")
    fwd = subtree(land, root, "fwd", depth=3)
    # A second landscape, other tasks and other nodes asked first, children in reverse order.
    other = Landscape(LandscapeParams(), seed=7, n_tasks=3)
    for t in ("task-02", "task-00"):
        subtree(other, other.root(t), "rev", depth=2)
    rev = subtree(other, other.root("task-01"), "rev", depth=3)
    assert fwd == rev and len(fwd) > 30
    # Deep node asked directly, without its siblings, is the same node.
    deep = [n for n in fwd.values() if n.depth == 3][5]
    chain = [deep]
    while chain[-1].parent_id != root.node_id:
        chain.append(fwd[chain[-1].parent_id])
    node = root
    for n in reversed(chain):
        node = other.child(node, n.index)
    assert node == deep


def test_seed_matters_and_ids_follow_the_path(land):
    a = land.child(land.root(0), 3)
    b = Landscape(LandscapeParams(), seed=8, n_tasks=3).child(land.root(0), 3)
    assert a.node_id == b.node_id  # ids name the position in the tree
    assert (a.log2_speedup, a.fragility) != (b.log2_speedup, b.fragility)
    assert len({land.child(land.root(0), i).node_id for i in range(2000)}) == 2000


def test_tasks_are_seeded_and_described():
    a = Landscape(seed=3, n_tasks=12)
    b = Landscape(seed=3, n_tasks=12)
    assert a.tasks == b.tasks
    assert [t.task_id for t in a.tasks][:2] == ["task-00", "task-01"]
    for t in a.tasks:
        assert t.reference_runtime_ns > 0 and t.seed_speedup > 0
        assert "SYNTHETIC" in t.description
        root = a.root(t.task_id)
        assert root.speedup == t.seed_speedup and root.depth == 0 and root.drift == 0.0
    assert len({t.seed_speedup for t in a.tasks}) == 12
    assert Landscape(seed=4, n_tasks=12).tasks != a.tasks


def test_lineage_drift_and_depth(land):
    root = land.root(0)
    c = land.child(root, 0)
    g = land.child(c, 0)
    assert (c.depth, g.depth) == (1, 2) and g.parent_id == c.node_id
    # A grandchild's drift is its parent's times the decay plus noise; over many grandchildren
    # of one parent the mean drift is the parent's drift times the decay.
    p = land.params
    drifts = [land.child(c, i).drift for i in range(3000)]
    assert statistics.fmean(drifts) == pytest.approx(c.drift * p.drift_decay,
                                                     abs=4 * p.drift_sigma / math.sqrt(3000))
    # Steps are clipped: no child is further from its parent than clip + reversion pull.
    task = land.task(0)
    pull = p.reversion * abs(c.log2_speedup - task.headroom_log2)
    gaps = [abs(land.child(c, i).log2_speedup - c.log2_speedup) for i in range(3000)]
    assert max(gaps) <= p.step_clip + pull + 1e-9


def test_base_failure_rates_are_the_stated_ones(land):
    probs = land.outcome_probabilities(0.0, 0.0)
    p = land.params
    for k in FAILURES:
        assert probs[k] == pytest.approx(getattr(p, "p_" + k))
    assert sum(probs.values()) == pytest.approx(1.0)
    fragile = land.outcome_probabilities(1.0, 0.0)
    assert fragile["success"] < probs["success"]
    assert fragile["infrastructure_failure"] < probs["infrastructure_failure"] + 1e-12
    assert land.outcome_probabilities(0.0, 1.0)["success"] < probs["success"]


def failure_share(land, parent, n=4000):
    kids = [land.child(parent, i) for i in range(n)]
    made = [k for k in kids if k.outcome != GENERATION_FAILED]
    kernel = sum(k.outcome in KERNEL_FAILURES for k in made) / len(made)
    infra = sum(k.outcome == "infrastructure_failure" for k in made) / len(made)
    return kernel, infra


def test_failures_depend_on_the_parent(land):
    root = land.root(0)
    robust = dataclasses.replace(root, fragility=-1.0)
    fragile = dataclasses.replace(root, fragility=1.5)
    failed = dataclasses.replace(root, fragility=-1.0, outcome="compile_failed", speedup=None)
    k_robust, i_robust = failure_share(land, robust)
    k_fragile, i_fragile = failure_share(land, fragile)
    k_failed, _ = failure_share(land, failed)
    # Expected kernel-failure shares (defaults): about 0.16 and 0.52; with a failed parent
    # (shift 0.7 on fragility -1.0 * 0.8) about 0.27. Binomial sd at n=4000 is <= 0.008.
    assert k_fragile > k_robust + 0.25
    assert k_failed > k_robust + 0.06
    # Infrastructure failures are not the kernel's fault: the same rate whatever the parent.
    assert abs(i_fragile - i_robust) < 0.012
    assert i_robust == pytest.approx(land.params.p_infrastructure_failure, abs=0.008)


def test_children_of_failed_nodes_fail_more_often_in_the_wild():
    land = Landscape(seed=11, n_tasks=1)
    root = land.root(0)
    parents = [land.child(root, i) for i in range(1500)]
    rates = {True: [], False: []}
    for p in parents:
        if p.outcome == GENERATION_FAILED:
            continue
        kids = [land.child(p, i) for i in range(8)]
        rates[p.failed] += [k.outcome in KERNEL_FAILURES for k in kids
                            if k.outcome != GENERATION_FAILED]
    assert len(rates[True]) > 1500
    assert statistics.fmean(rates[True]) > statistics.fmean(rates[False]) + 0.05


def test_generation_has_no_tokens_and_failed_generations_have_nothing_else(land):
    kids = [land.child(land.root(1), i) for i in range(400)]
    gen_failed = [k for k in kids if k.outcome == GENERATION_FAILED]
    assert 0 < len(gen_failed) < 30  # ~2% of 400
    for k in kids:
        gen = land.generation(k)
        assert set(gen) <= {"service_s", "failed_reason"} and gen["service_s"] > 0
        assert ("failed_reason" in gen) == (k.outcome == GENERATION_FAILED)
    k = gen_failed[0]
    for fn in (land.forecast, land.evaluation, lambda n: land.child(n, 0)):
        with pytest.raises(ValueError, match="never generated"):
            fn(k)


def many_nodes(land, n=3000):
    root = land.root(0)
    return [c for c in (land.child(root, i) for i in range(n)) if c.outcome != GENERATION_FAILED]


def test_evaluation_stage_rules(land):
    nodes = many_nodes(land)
    seen = set()
    for node in nodes:
        ev = land.evaluation(node)
        o = ev["outcome"]
        seen.add(o)
        assert ev["outcome"] == node.outcome and ev["candidate_id"] == node.node_id
        assert ev["cold_start_s"] > 0 and ev["service_s"] == ev["wall_s"]
        if o == "success":
            assert ev["speedup"] == node.speedup
            ratio = ev["ref_runtime_ns"] / ev["runtime_ns"]
            assert abs(ratio - ev["speedup"]) <= 1e-3 * ev["speedup"]
            assert min(ev["compile_s"], ev["check_s"], ev["timing_s"]) > 0
        else:
            assert "speedup" not in ev and "runtime_ns" not in ev
        if o == "compile_failed":
            assert ev["compile_s"] > 0 and ev["check_s"] == ev["timing_s"] == 0
        if o in ("runtime_error", "incorrect"):
            assert ev["check_s"] > 0 and ev["timing_s"] == 0
        if o == "timeout":
            assert ev["wall_s"] == pytest.approx(land.params.timeout_s) and ev["timing_s"] > 0
        if o == "infrastructure_failure":
            assert ev["compile_s"] == ev["check_s"] == ev["timing_s"] == 0
            assert ev["wall_s"] == ev["cold_start_s"]
        if o != "timeout":
            parts = ev["cold_start_s"] + ev["compile_s"] + ev["check_s"] + ev["timing_s"]
            assert ev["wall_s"] == pytest.approx(parts, abs=2e-3)
    assert seen == {"success", *FAILURES}
    walls = [land.evaluation(n)["wall_s"] for n in nodes if n.outcome == "success"]
    # Medians 60 + 15 + 60 + 190 s = 5.4 min; the median of the sum is near it.
    assert 4.8 * 60 < statistics.median(walls) < 6.0 * 60


def test_forecasts_are_keyed_and_well_formed(land):
    nodes = many_nodes(land, 2000)
    node = nodes[3]
    first = land.forecast(node, "m", 0)
    for other in nodes[:50]:
        land.forecast(other, "m", 1)
    assert land.forecast(node, "m", 0) == first
    assert land.forecast(node, "m", 1) != first and land.forecast(node, "n", 0) != first
    p = land.params
    parsed = 0
    for n in nodes:
        f = land.forecast(n)
        assert f["kind"] == "forecast" and f["candidate_id"] == n.node_id and len(f["probs"]) == 8
        assert p.forecast_input_tokens_min <= f["input_tokens"] <= p.forecast_input_tokens_max
        assert p.forecast_output_tokens_min <= f["output_tokens"] <= p.forecast_output_tokens_max
        assert p.forecast_latency_min_s <= f["latency_s"] <= p.forecast_latency_max_s
        if f["parse_failed"]:
            assert f["probs"] == [0.0] * 8 and f["predicted_bin"] is None
            continue
        parsed += 1
        raw = math.fsum(f["probs"])
        assert 0.8 <= raw <= 1.1 and f["raw_probability_sum"] == pytest.approx(raw)
        normalised = [x / raw for x in f["probs"]]
        assert math.fsum(normalised) == pytest.approx(1.0)
        assert f["predicted_bin"] == 1 + int(np.argmax(f["probs"]))
    assert parsed > 0.9 * len(nodes)
    latencies = [land.forecast(n)["latency_s"] for n in nodes]
    assert 30 < statistics.median(latencies) < 55  # docs/concepts/paper.md: ~41 s


def test_parse_failure_rate_is_roughly_as_set():
    land = Landscape(LandscapeParams(parse_failure_rate=0.2), seed=5, n_tasks=1)
    nodes = many_nodes(land, 1500)
    fails = [land.forecast(n, "synthetic", r)["parse_failed"] for n in nodes for r in range(2)]
    # Binomial sd at n ~ 2,940 is 0.0074; 0.03 is four of them.
    assert statistics.fmean(fails) == pytest.approx(0.2, abs=0.03)
    none = Landscape(LandscapeParams(parse_failure_rate=0.0), seed=5, n_tasks=1)
    assert not any(none.forecast(n)["parse_failed"] for n in nodes[:300])


def sharp(rule):
    """A forecaster that says exactly the latent speedup it is centred on."""
    return LandscapeParams(fail_forecast=rule, forecast_sigma=0.0, forecast_shrink=1.0,
                           forecast_spread=0.02, forecast_difficulty_sigma=0.0,
                           parse_failure_rate=0.0)


def test_failing_candidates_are_forecast_by_the_stated_rule():
    by_parent = Landscape(sharp("parent"), seed=2, n_tasks=1)
    by_own = Landscape(sharp("own"), seed=2, n_tasks=1)
    root = by_parent.root(0)
    parent = by_parent.child(root, 0)
    kids = [by_parent.child(parent, i) for i in range(600)]
    assert kids == [by_own.child(parent, i) for i in range(600)]  # the rule moves no latent
    failing = [k for k in kids if k.failed and k.outcome != GENERATION_FAILED]
    differ = [k for k in failing if speedup_to_bin(2 ** k.log2_speedup, "paper")
              != speedup_to_bin(2 ** parent.log2_speedup, "paper")]
    assert len(differ) > 10
    parent_bin = int(speedup_to_bin(2 ** parent.log2_speedup, "paper"))
    for k in differ:
        assert by_parent.forecast_target_log2(k) == parent.log2_speedup
        assert by_own.forecast_target_log2(k) == k.log2_speedup
        assert by_parent.forecast(k)["predicted_bin"] == parent_bin
        assert by_own.forecast(k)["predicted_bin"] == int(
            speedup_to_bin(2 ** k.log2_speedup, "paper"))
    for k in [k for k in kids if k.outcome == "success"][:50]:
        assert by_parent.forecast(k) == by_own.forecast(k)  # successes: no difference


def test_bin_probabilities_integrate_a_gaussian_over_paper_edges():
    p = bin_probabilities(math.log2(1.2), 0.3)
    assert math.fsum(p) == pytest.approx(1.0) and int(np.argmax(p)) == 4  # (1.0, 1.41]
    # Probability of bin 5 = Phi((log2 1.41 - c)/w) - Phi((0 - c)/w).
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    c, w = math.log2(1.2), 0.3
    assert p[4] == pytest.approx(phi((math.log2(PAPER_EDGES[4]) - c) / w) - phi(-c / w))
    hot = bin_probabilities(c, w, temperature=0.5)
    cold = bin_probabilities(c, w, temperature=2.0)
    assert max(hot) > max(p) > max(cold)
    assert bin_probabilities(50.0, 0.1)[-1] == 1.0 and bin_probabilities(-50.0, 0.1)[0] == 1.0
    assert math.fsum(bin_probabilities(0.0, 1.0, temperature=1e-4)) == pytest.approx(1.0)


def test_params_are_documented_and_checked():
    p = LandscapeParams()
    listed = p.as_assumptions()
    assert set(listed) == {f.name for f in dataclasses.fields(LandscapeParams)}
    for name, entry in listed.items():
        assert entry["value"] == getattr(p, name) and entry["note"]
        assert "default" in entry["note"], name
        assert entry["label"] in ("assumption", "from REFERENCE.md")
    assert listed["p_compile_failed"]["label"] == "assumption"
    assert p.cold_start_median_s + p.compile_median_s + p.check_median_s + p.timing_median_s \
        == pytest.approx(5.4 * 60, abs=3)
    for bad in (dict(p_compile_failed=1.2), dict(fail_forecast="nobody"), dict(step_scale=-1),
                dict(p_compile_failed=0.5, p_incorrect=0.5), dict(raw_sum_min=2.0),
                dict(forecast_spread=0.0), dict(reversion=1.5), dict(stage_sigma=float("nan"))):
        with pytest.raises(GfsimError, match="landscape parameters"):
            LandscapeParams(**bad)
    with pytest.raises(GfsimError):
        Landscape(seed=-1)
    with pytest.raises(GfsimError):
        Landscape(n_tasks=0)
    with pytest.raises(KeyError, match="unknown task"):
        Landscape(n_tasks=2).root("task-09")
