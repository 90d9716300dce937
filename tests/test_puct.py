"""The puct driver: the reference search's archive, the draw hierarchy, replay fidelity, and
the counterfactual check against the landscape a log came from (all SYNTHETIC)."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import LogWriter, load_log, open_log
from gfsim.simulator import build_traces, replay
from gfsim.simulator.children import LogChildren
from gfsim.simulator.closed.puct import ArchiveNode, ChildResult, PuctArchive
from gfsim.simulator.closed.engine import EXTRAPOLATED_SHARE, SEARCH_PRESETS, SearchConfig
from gfsim.testing import LogBuilder
from gfsim.worlds.counterfactual import compare
from gfsim.worlds.synth import build_records

runner = CliRunner()
MODEL = load_cost_model("serverless-a100")


def archive(k=2):
    return PuctArchive(ArchiveNode("root", 1.0, (), is_seed=True), k_per_parent=k)


# -- archive and selection ---------------------------------------------------------------------
def test_the_first_step_expands_only_the_root():
    assert [n.node_id for n in archive().select_parents(2)] == ["root"]


def test_scores_follow_the_reference_formula():
    a = archive()
    root = a.root
    a.complete_step([root], [ChildResult("root", "x", 2.0), ChildResult("root", "y", 1.5)])
    # After one expansion: T = 1, n(root) = 1, m(root) = 2.0; rewards root 1, x 2, y 1.5.
    scale = 2.0 - 1.5  # non-seed rewards only
    prior = {"x": 3 / 6, "y": 2 / 6, "root": 1 / 6}  # weights N - rank, N = 3
    bonus = math.sqrt(1 + 1)
    expected = {"root": 2.0 + scale * prior["root"] * bonus / 2,
                "x": 2.0 + scale * prior["x"] * bonus,
                "y": 1.5 + scale * prior["y"] * bonus}
    got = {node.node_id: score for score, _, node in a.scores()}
    assert got == pytest.approx(expected)
    assert [node.node_id for _, _, node in a.scores()][0] == "x"


def test_a_chosen_parent_blocks_its_lineage():
    a = archive(k=3)
    a.complete_step([a.root], [ChildResult("root", "x", 3.0), ChildResult("root", "y", 1.1)])
    x = a.get("x")
    a.complete_step([x], [ChildResult("x", "x1", 3.5)])
    chosen = [n.node_id for n in a.select_parents(3)]
    # x1 scores best; it blocks x and root (ancestors), so y is the only other choice.
    assert chosen == ["x1", "y"]


def test_step_completion_counts_visits_admits_top_k_and_drops_failures_and_duplicates():
    a = archive(k=2)
    a.complete_step([a.root], [ChildResult("root", "x", 2.0, code="c1")])
    x = a.get("x")
    a.complete_step([x], [ChildResult("x", "f", None), ChildResult("x", "p", 2.5, code="c2"),
                          ChildResult("x", "q", 2.2, code="c1"),  # same code as x
                          ChildResult("x", "r", 1.2)])
    assert a.visits == {"root": 2, "x": 1} and a.expansions == 2
    assert a.best_child == {"root": 2.0, "x": 2.5}  # direct parents only
    # Top 2 by reward are p and q; q is a duplicate of x's code, f failed, r is below k.
    assert [n.node_id for n in a.nodes] == ["root", "x", "p"]
    assert a.get("p").ancestors == ("x", "root")
    # A parent whose children all failed still gains a visit and T grows.
    p = a.get("p")
    a.complete_step([p], [ChildResult("p", "z", None)])
    assert a.visits["p"] == 1 and a.expansions == 3 and "p" not in a.best_child


def test_capacity_keeps_the_best_and_the_seed():
    a = PuctArchive(ArchiveNode("root", 0.1, (), is_seed=True), k_per_parent=5, capacity=3)
    a.complete_step([a.root], [ChildResult("root", f"c{i}", float(i)) for i in range(1, 5)])
    assert sorted(n.node_id for n in a.nodes) == ["c3", "c4", "root"]


# -- draws -------------------------------------------------------------------------------------
def small_log(tmp_path):
    b = LogBuilder({"t": 1.0})
    a = b.candidate("t", 0, speedup=1.6)
    b.candidate("t", 0, speedup=1.2)
    b.candidate("t", 1, parent=a, speedup=2.0)
    b.candidate("t", 2, parent=a, speedup=2.2)
    b.candidate("t", 1, parent=a, outcome="compile_failed", speedup=None)
    return load_log(b.write(tmp_path / "log.jsonl"))


def test_draws_follow_the_hierarchy_without_replacement(tmp_path):
    trace = build_traces(small_log(tmp_path), MODEL)[0]
    src = LogChildren(trace)
    root_id, _ = src.root()
    kids = src.draw(root_id, 1.0, 0, 4, seed=0)
    assert [k.draw_source for k in kids] == ["own", "own", "fallback", "fallback"]
    assert [k.template for k in kids[:2]] == ["t-0001", "t-0002"]
    a = kids[0].candidate_id  # replay node standing for logged t-0001 (1.6x)
    first = src.draw(a, 1.6, 0, 2, seed=0)  # its first logged expansion: step 1
    assert [(k.draw_source, k.template) for k in first] == [("own", "t-0003"),
                                                            ("own", "t-0005")]
    second = src.draw(a, 1.6, 1, 3, seed=0)
    assert [k.draw_source for k in second] == ["own", "fallback", "fallback"]
    assert second[0].template == "t-0004"
    # Fallback children carry the child/parent ratio over to the node's own speedup.
    for k in second[1:]:
        if k.outcome == "success":
            assert k.code is None and k.speedup > 0
    again = LogChildren(trace)
    again.root()
    assert [k.template for k in again.draw(root_id, 1.0, 0, 4, seed=0)] == [
        k.template for k in kids]


def test_replaying_a_logged_standard_search_reproduces_it(tmp_path):
    records = build_records(seed=3, candidates=None, tasks=2, driver="puct", steps=12)
    path = tmp_path / "puct.jsonl"
    with LogWriter(path) as w:
        w.append_many(records)
    log = load_log(path)
    r = replay(log, make_policy("all"), MODEL, driver="puct",
               search=SearchConfig(steps=12), seed=9)
    for s in r.searches:
        assert s.extra["draws"]["own"] == s.candidates and s.extra["fallback_share"] == 0
        logged = log.candidates[log.candidates["search_id"] == s.search_id]
        assert s.candidates == len(logged)
        assert sorted(t for t in s.table["template"]) == sorted(logged["candidate_id"])
        ev = log.evaluations[log.evaluations["candidate_id"].isin(set(logged["candidate_id"]))]
        assert s.gpu_evals == len(ev)
        assert s.best_speedup == pytest.approx(ev["speedup"].max())


def test_paper_standard_and_filtered_spend_the_same_evaluation_budget():
    log = open_log("synthetic-puct-v1")
    std = replay(log, make_policy("all"), MODEL, driver="puct",
                 search=SEARCH_PRESETS["paper-standard"], seed=1)
    flt = replay(log, make_policy("topk:4"), MODEL, driver="puct",
                 search=SEARCH_PRESETS["paper-filtered"], seed=1)
    for s, f in zip(std.searches, flt.searches):
        assert s.gpu_evals <= 316 and f.gpu_evals <= 316
        expansions_s = len(set(zip(s.table["parent_node"], s.table["step"])))
        expansions_f = len(set(zip(f.table["parent_node"], f.table["step"])))
        assert s.candidates == 4 * expansions_s and f.candidates == 16 * expansions_f
        generated = sum(1 for st in f.table["state"] if st != "generation_failed")
        assert f.forecasts == generated  # one forecast per generated mutation
        assert s.forecasts == 0
        # At most k = 4 measured per parent expansion.
        per = {}
        for node, step, st in zip(f.table["parent_node"], f.table["step"], f.table["state"]):
            per[(node, step)] = per.get((node, step), 0) + (st == "measured")
        assert max(per.values()) <= 4
    assert flt.searches[0].extra["extrapolated"] == (
        flt.searches[0].extra["fallback_share"] > EXTRAPOLATED_SHARE)


def test_cli_reports_the_fallback_share():
    res = runner.invoke(app, ["replay", "--driver", "puct", "--search", "paper-filtered",
                              "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["driver"] == "puct" and out["search"]["overgen"] == 4
    assert out["baseline"]["search"]["overgen"] == 1
    assert 0 <= out["fallback_share"] <= 1 and isinstance(out["extrapolated"], bool)
    assert sum(out["draws"].values()) == out["candidates"]


# -- the counterfactual check -----------------------------------------------------------------
BIAS_BOUND = 0.15  # log2 best speedup, where fewer than 25% of children are fallback draws


def test_replays_agree_with_the_landscape_where_they_do_not_extrapolate():
    rows = compare(range(1, 4), ["all", "threshold:0.7"], [1, 4], tasks=2, steps=20)
    exact = [r for r in rows if r.policy == "all" and r.overgen == 1]
    assert exact and all(r.fallback_share == 0 and r.log2_bias == 0
                         and r.replay_evals == r.direct_evals for r in exact)
    near = [r for r in rows if r.fallback_share < EXTRAPOLATED_SHARE]
    assert abs(np.mean([r.log2_bias for r in near])) <= BIAS_BOUND
    # A measure-all log cannot support 4x overgeneration: most children are borrowed.
    assert np.mean([r.fallback_share for r in rows if r.overgen == 4]) > 0.5
