"""--children model: a world model fitted to a log (gfsim.simulator.world_model), on SYNTHETIC
logs (the landscape's and an NK world's)."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import LogWriter, load_log
from gfsim.simulator import build_traces, replay
from gfsim.simulator.children import LogChildren, pool_of, shift_probs
from gfsim.simulator.closed.engine import SEARCH_PRESETS
from gfsim.simulator.world_model import (
    SHRINK_PAIRS,
    TASK_MIN_PAIRS,
    ModelChildren,
    OwnChildren,
    fit_neighbourhood,
    world_model,
)
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.forecasts.bins import speedup_to_bin
from gfsim.worlds.nk import NKParams, NKWorld
from gfsim.worlds.synth import build_records
from gfsim.worlds.synth_puct import world_log_records

MODEL = load_cost_model("serverless-a100")
runner = CliRunner()


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("mc") / "puct.jsonl"
    with LogWriter(path) as w:
        w.append_many(build_records(seed=3, candidates=None, tasks=2, driver="puct", steps=12))
    return load_log(path)


@pytest.fixture(scope="module")
def nk_log(tmp_path_factory):
    """A standard search on an NK world, whose mutations often repeat a kernel."""
    world = NKWorld(NKParams(), 1, 1)
    path = tmp_path_factory.mktemp("nk") / "nk.jsonl"
    with LogWriter(path) as w:
        w.append_many(world_log_records(world, seed=1, steps=20, log_id="nk-test",
                                        command="test"))
    return load_log(path)


def _root(source):
    rid, s0 = source.root()
    return rid, s0


def test_shift_probs_moves_mass_by_whole_bins_and_keeps_it():
    p = np.array([0, 0, 0, 1.0, 0, 0, 0, 0])  # all in [0.71, 1.0)
    assert shift_probs(p, 0.0) is p
    moved = shift_probs(p, 1.0)  # x2: [1.42, 2.0) lies in the bin [1.41, 2.0)
    assert moved.sum() == pytest.approx(1.0) and moved.argmax() == 5
    assert shift_probs(shift_probs(p, 0.3), -0.3).sum() == pytest.approx(1.0)
    assert np.all(shift_probs(np.zeros(8), 2.0) == 0)  # a failed parse stays failed
    assert shift_probs(p, 10.0)[-1] == pytest.approx(1.0)  # beyond the top bin: all in it
    edges = np.log2(np.array([0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0]))  # other bins
    half = shift_probs(p, 0.5 * math.log2(1 / 0.9), edges)  # half the bin [0.9, 1.0) width
    assert half[3] == pytest.approx(0.5) and half[4] == pytest.approx(0.5)


def test_fit_neighbourhood_recovers_the_size_of_a_uniform_neighbourhood():
    rng = np.random.default_rng(0)
    for n in (6, 25):
        seqs = []
        for _ in range(300):
            seen, seq = set(), []
            for k in rng.integers(n, size=8):
                seq.append((len(seen), int(k) in seen))
                seen.add(int(k))
            seqs.append(seq)
        assert fit_neighbourhood(seqs) == pytest.approx(n, rel=0.15)
    assert fit_neighbourhood([[(0, False), (1, False)]]) == math.inf


def test_exact_children_first_then_invented_ones_with_forecasts_about_their_own_truth(log):
    trace = build_traces(log, MODEL)[0]
    exact = LogChildren(trace)
    model = ModelChildren(trace)
    rid, s0 = _root(exact)
    model.root()
    a = exact.draw(rid, s0, 0, 4, seed=1)
    b = model.draw(rid, s0, 0, 60, seed=1)
    assert [c.candidate_id for c in a] == [c.candidate_id for c in b[:4]]
    assert [c.draw_source for c in b[:4]] == ["own"] * 4
    invented = [c for c in b if c.draw_source == "model"]
    assert len(invented) == 60 - sum(c.draw_source != "model" for c in b)
    # Every invented child is its own kernel (the landscape log has no repeats).
    assert len({c.code for c in invented}) == len(invented)
    ok = [c for c in invented if c.outcome == "success" and c.has_forecast
          and not c.parse_failed]
    assert len(ok) > 10
    # Its forecast is about its own drawn speedup: the forecast's modal bin is near the bin
    # of the truth about as often as the logged forecaster's is for its own children.
    def hit_rate(probs, speedups):
        return np.mean(np.abs(np.argmax(probs, axis=1) + 1 - speedup_to_bin(speedups)) <= 1)

    logged = [i for i in range(len(trace)) if trace.outcome[i] == "success"
              and trace.has_forecast[i] and not trace.parse_failed[i]]
    mine = hit_rate(np.array([c.probs for c in ok]), np.array([c.speedup for c in ok]))
    theirs = hit_rate(trace.probs[logged], np.asarray(trace.speedup)[logged])
    assert mine == pytest.approx(theirs, abs=0.25)
    # Keyed: the same seed gives the same children, another seed (another member) others.
    again = ModelChildren(trace)
    again.root()
    assert [c.speedup for c in again.draw(rid, s0, 0, 60, seed=1)] == \
        pytest.approx([c.speedup for c in b], nan_ok=True)
    other = ModelChildren(trace)
    other.root()
    assert [c.speedup for c in other.draw(rid, s0, 0, 60, seed=2)] != \
        pytest.approx([c.speedup for c in b], nan_ok=True)


def test_ensemble_members_are_bootstrap_refits_and_tasks_shrink_to_the_pool(log):
    traces = build_traces(log, MODEL)
    wm = world_model(traces, "crb")
    assert world_model(traces, "crb") is wm  # one model per log, shared by every replay
    m1, m2 = wm.member(1), wm.member(2)
    assert wm.member(1) is m1
    # A member resamples whole expansions within each search: as many groups, some twice.
    full = wm.parts[0]
    idx1 = m1.index[m1.part == 0]
    assert len(set(full.group[idx1])) < len(set(full.group))
    assert not np.array_equal(np.sort(idx1), np.sort(m2.index[m2.part == 0]))
    for task, n in m1.counts.items():
        want = n / (n + SHRINK_PAIRS) if n >= TASK_MIN_PAIRS else 0.0
        assert m1.weight(task) == pytest.approx(want)


def test_crb_children_keep_their_lineage(log):
    trace = build_traces(log, MODEL)[0]
    pool = pool_of(trace)
    model = ModelChildren(trace, world_model([trace], "crb"))
    rid, s0 = model.root()
    kids = model.draw(rid, s0, 0, 60, seed=2)
    index = {cid: i for i, cid in enumerate(trace.candidate_ids)}
    expanded = [c for c in kids if c.draw_source == "model" and c.outcome == "success"
                and pool.expansions.get(index[c.template])]
    assert expanded, "some invented child copies a logged child that the log expanded"
    child = expanded[0]
    logged_kids = {trace.candidate_ids[i] for g in pool.expansions[index[child.template]]
                   for i in g}
    grandkids = model.draw(child.candidate_id, child.speedup, 0, 2, seed=2)
    assert {g.template for g in grandkids} <= logged_kids


def test_gbm_steps_follow_the_logged_steps(log):
    traces = build_traces(log, MODEL)
    trace = traces[0]
    model = ModelChildren(trace, world_model(traces, "gbm"))
    rid, s0 = model.root()
    kids = [c for e in range(4) for c in model.draw(rid, s0, e, 80, seed=3)
            if c.draw_source == "model"]
    steps = np.log2([c.speedup / s0 for c in kids if c.outcome == "success"])
    part = world_model(traces, "gbm").parts[0]
    logged = part.step[np.isfinite(part.step)]
    assert np.median(steps) == pytest.approx(np.median(logged), abs=0.5)
    fail = np.mean([c.outcome != "success" for c in kids])
    assert fail == pytest.approx(np.mean(part.outcome != "success"), abs=0.15)


@pytest.mark.parametrize("family", ["crb", "gbm"])
def test_invented_children_repeat_kernels_as_often_as_the_log_does(nk_log, family):
    traces = build_traces(nk_log, MODEL)
    wm = world_model(traces, family)
    size = wm.member(5).neighbourhood[traces[0].task_id]
    assert math.isfinite(size) and size > 1  # the NK log repeats kernels among siblings
    model = ModelChildren(traces[0], wm)
    rid, s0 = model.root()
    kids = model.draw(rid, s0, 0, 200, seed=5)
    codes = [c.code for c in kids if not c.gen_failed]
    distinct = len(set(codes))
    # 200 uniform draws from a neighbourhood of `size` kernels: about this many distinct.
    expect = size * (1 - (1 - 1 / size) ** len(codes))
    assert distinct == pytest.approx(expect, rel=0.35)
    # A repeat is that kernel again: same outcome and speedup.
    first = {}
    for c in kids:
        if c.code in first:
            assert c.outcome == first[c.code].outcome
            assert c.speedup == pytest.approx(first[c.code].speedup, nan_ok=True)
        first.setdefault(c.code, c)


def test_own_children_invent_nothing(log):
    trace = build_traces(log, MODEL)[0]
    own = OwnChildren(trace)
    rid, s0 = own.root()
    kids = own.draw(rid, s0, 0, 500, seed=0)
    assert 0 < len(kids) < 500 and {c.draw_source for c in kids} <= {"own", "other_expansion"}


@pytest.mark.parametrize("children", ["model", "model:gbm"])
def test_replay_with_model_children_reproduces_a_standard_search(log, children):
    config = replace(SEARCH_PRESETS["paper-standard"], steps=12)
    exact = replay(log, make_policy("all"), MODEL, driver="puct", search=config,
                   children=children)
    plain = replay(log, make_policy("all"), MODEL, driver="puct", search=config)
    for s, p in zip(exact.searches, plain.searches):
        assert s.extra["invented_share"] == 0 and s.extra["draws"]["model"] == 0
        assert s.best_speedup == p.best_speedup
    over = replay(log, make_policy("topk:4"), MODEL, driver="puct",
                  search=replace(config, overgen=4), children=children)
    for s in over.searches:
        assert s.extra["draws"]["fallback"] == 0 and s.extra["invented_share"] > 0.5
        assert s.extra["extrapolated"]
    des = replay(log, make_policy("topk:4"), MODEL, driver="puct", engine="des",
                 search=replace(config, overgen=4), children=children)
    assert [s.best_speedup for s in des.searches] == [s.best_speedup for s in over.searches]
    with pytest.raises(GfsimError, match="unknown child source"):
        replay(log, make_policy("all"), MODEL, driver="puct", children="nope")


@pytest.mark.slow
def test_replay_savings_and_tune_take_children_for_puct_only(tmp_path):
    res = runner.invoke(app, ["replay", "--driver", "puct", "--search", "paper-filtered",
                              "--policy", "topk:4", "--children", "model", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["draws"]["model"] > 0 and out["draws"]["fallback"] == 0 and out["extrapolated"]
    assert out["invented_share"] > 0.5
    res = runner.invoke(app, ["replay", "--children", "model"])
    assert res.exit_code == 2 and "puct driver" in res.stderr
    res = runner.invoke(app, ["savings", "--driver", "puct", "--search", "paper-filtered",
                              "--children", "model", "--seeds", "2", "--json"])
    assert res.exit_code == 0, res.output
    inputs = json.loads(res.stdout)["inputs"]
    assert inputs["children"] == "model" and inputs["policy_draws"]["invented_share"] > 0.5
    assert inputs["baseline_draws"]["invented_share"] < inputs["policy_draws"]["invented_share"]
    res = runner.invoke(app, ["tune", "--driver", "puct", "--search", "paper-filtered",
                              "--policy", "threshold", "--param", "overgen=1:4:int",
                              "--trials", "2", "--seeds", "2", "--validate-seeds", "0",
                              "--children", "model", "--study", "t",
                              "--storage", f"sqlite:///{tmp_path / 't.db'}", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["children"] == "model" and out["draws_of_first"]["draws"]
    # Without --children (auto), the puct driver draws from the world model, tuning overgen or
    # tau alone; --children fallback still asks for the logged pool.
    for i, (extra, want) in enumerate(((["--param", "overgen=1:4:int"], "model"),
                                       ([], "model"), (["--children", "fallback"], "fallback"))):
        res = runner.invoke(app, ["tune", "--driver", "puct", "--search", "paper-filtered",
                                  "--policy", "threshold", "--param", "tau=0.3:0.9", *extra,
                                  "--trials", "1", "--seeds", "2", "--validate-seeds", "0",
                                  "--study", f"auto-{i}",
                                  "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["children"] == want
    res = runner.invoke(app, ["savings", "--children", "model:xyz"])
    assert res.exit_code == 2 and "unknown child source" in res.stderr

