"""--children model: the conditional residual bootstrap of a log's (parent, child) pairs
(simulator.children.ModelChildren), on SYNTHETIC logs."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.cost_models import load_cost_model
from gfsim.core.errors import GfsimError
from gfsim.policies import make_policy
from gfsim.replay_logs import LogWriter, load_log, open_log
from gfsim.simulator import build_traces, replay
from gfsim.simulator.children import LogChildren, ModelChildren, pool_of, shift_probs
from gfsim.simulator.puct_engine import SEARCH_PRESETS
from gfsim.worlds.synth import build_records

MODEL = load_cost_model("serverless-a100")
runner = CliRunner()


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("mc") / "puct.jsonl"
    with LogWriter(path) as w:
        w.append_many(build_records(seed=3, candidates=None, tasks=2, driver="puct", steps=12))
    return load_log(path)


def test_shift_probs_moves_mass_by_whole_bins_and_keeps_it():
    p = np.array([0, 0, 0, 1.0, 0, 0, 0, 0])  # all in [0.71, 1.0)
    assert shift_probs(p, 0.0) is p
    moved = shift_probs(p, 1.0)  # x2: [1.42, 2.0) lies in the bin [1.41, 2.0)
    assert moved.sum() == pytest.approx(1.0) and moved.argmax() == 5
    back = shift_probs(shift_probs(p, 0.3), -0.3)
    assert back.sum() == pytest.approx(1.0)
    assert np.all(shift_probs(np.zeros(8), 2.0) == 0)  # a failed parse stays failed
    far = shift_probs(p, 10.0)
    assert far[-1] == pytest.approx(1.0)  # beyond the top bin: all of it in the top bin


def test_model_children_draw_exact_children_first_and_invent_the_rest(log):
    trace = build_traces(log, MODEL)[0]
    exact = LogChildren(trace)
    model = ModelChildren(trace)
    rid, s0 = exact.root()
    model.root()
    a = exact.draw(rid, s0, 0, 4, seed=1)
    b = model.draw(rid, s0, 0, 12, seed=1)
    assert [c.candidate_id for c in a] == [c.candidate_id for c in b[:4]]
    assert [c.draw_source for c in b[:4]] == ["own"] * 4
    invented = [c for c in b if c.draw_source == "model"]
    assert invented and all(c.code is None for c in invented)
    pool = pool_of(trace)
    index = {cid: i for i, cid in enumerate(trace.candidate_ids)}
    for c in invented:
        src = index[c.template]
        parent = pool.pool_parent_speedup[src]
        ratio = s0 / parent
        if c.outcome == "success":  # the logged step, carried onto this node
            assert c.speedup == pytest.approx(pool.speedup[src] * ratio)
        # The forecast moved with the child: the logged one, shifted by the parent ratio.
        np.testing.assert_allclose(c.probs, shift_probs(np.asarray(pool.head[src][6]),
                                                        math.log2(ratio)))
    # Keyed: the same seed gives the same children, another seed others.
    again = ModelChildren(trace)
    again.root()
    assert [c.template for c in again.draw(rid, s0, 0, 12, seed=1)] == [c.template for c in b]


def test_an_invented_child_keeps_its_lineage(log):
    trace = build_traces(log, MODEL)[0]
    pool = pool_of(trace)
    model = ModelChildren(trace)
    rid, s0 = model.root()
    kids = model.draw(rid, s0, 0, 40, seed=2)
    expanded = [c for c in kids if c.draw_source == "model" and c.outcome == "success"
                and pool.expansions.get(trace.candidate_ids.index(c.template))]
    assert expanded, "some invented child copies a logged child that the log expanded"
    child = expanded[0]
    src = trace.candidate_ids.index(child.template)
    logged_kids = {trace.candidate_ids[i] for g in pool.expansions[src] for i in g}
    grandkids = model.draw(child.candidate_id, child.speedup, 0, 2, seed=2)
    assert {g.template for g in grandkids} <= logged_kids


def test_replay_with_model_children_reproduces_a_standard_search_and_reports_its_draws(log):
    config = replace(SEARCH_PRESETS["paper-standard"], steps=12)
    exact = replay(log, make_policy("all"), MODEL, driver="puct", search=config,
                   children="model")
    for s in exact.searches:
        assert s.extra["invented_share"] == 0 and s.extra["draws"]["model"] == 0
    over = replay(log, make_policy("topk:4"), MODEL, driver="puct",
                  search=replace(config, overgen=4), children="model")
    for s in over.searches:
        assert s.extra["draws"]["fallback"] == 0 and s.extra["invented_share"] > 0.5
        assert s.extra["extrapolated"]
    des = replay(log, make_policy("topk:4"), MODEL, driver="puct", engine="des",
                 search=replace(config, overgen=4), children="model")
    assert [s.best_speedup for s in des.searches] == [s.best_speedup for s in over.searches]
    with pytest.raises(GfsimError, match="unknown child source"):
        replay(log, make_policy("all"), MODEL, driver="puct", children="nope")


def test_replay_cli_takes_children_for_puct_only():
    res = runner.invoke(app, ["replay", "--driver", "puct", "--search", "paper-filtered",
                              "--policy", "topk:4", "--children", "model", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["draws"]["model"] > 0 and out["draws"]["fallback"] == 0 and out["extrapolated"]
    res = runner.invoke(app, ["replay", "--children", "model"])
    assert res.exit_code == 2 and "puct driver" in res.stderr
    assert open_log("synthetic-puct-v1") is not None
