"""A what-if forecaster forecasts every candidate a surrogate would read (issue 51, item 2):
failed and never-evaluated candidates by a stated failure assumption, the children a
closed-loop replay invents by the same model; each forecast is charged, and what stays
unforecast is counted in the output."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gfsim
from gfsim.api.options import open_log_arg
from gfsim.core.errors import SpecError
from gfsim.forecasts.whatif import attach, parse_whatif

TINY = str(Path(__file__).parent / "data" / "tiny.jsonl")
# tiny.jsonl: a1 compile_failed (a child of the seed kernel), a3 runtime_error and a5 incorrect
# (children of a0, measured at 1.25x), a4 and b3 generated but never evaluated (b3 a child of
# b0, 2.5x), a2 never generated.
GENERATED = {"a0", "a1", "a3", "a4", "a5", "b0", "b1", "b2", "b3", "b4"}


def _forecasts(log, name: str) -> dict:
    from gfsim.replay_logs.log import PROB_COLUMNS

    fc = log.forecasts[log.forecasts["forecaster"] == name]
    return {c: row for c, row in zip(fc["candidate_id"], fc[PROB_COLUMNS].to_numpy(float))}


def test_every_generated_candidate_gets_a_whatif_forecast_failed_ones_from_their_parent():
    f = parse_whatif("paper:gemini3-flash")
    got = _forecasts(attach(open_log_arg(TINY), f), f.name)
    assert set(got) == GENERATED  # the failed and never-evaluated too; a2 had no code
    for cid, parent_speedup in (("a3", 1.25), ("a5", 1.25), ("a1", 1.0), ("b3", 2.5)):
        probs, failed = f.distribution_one(math.log2(parent_speedup), cid)
        want = np.zeros(8) if failed else np.array(probs)
        np.testing.assert_allclose(got[cid], want, atol=1e-12, err_msg=cid)


def test_the_low_bins_assumption_is_named_keyed_and_in_range():
    from gfsim.forecasts.whatif import FAILURE_LOG2_HI, FAILURE_LOG2_LO

    f = parse_whatif("paper:gemini3-flash,failed=low,seed=3")
    assert f.name == "paper:gemini3-flash,failed=low" and f.seed == 3
    ids = [f"c{i}" for i in range(200)]
    x = f.failure_log2(ids, np.zeros(200))
    assert FAILURE_LOG2_LO <= x.min() and x.max() <= FAILURE_LOG2_HI and x.std() > 0.3
    np.testing.assert_array_equal(x, f.failure_log2(ids, np.ones(200)))  # parent ignored
    other = parse_whatif("paper:gemini3-flash,failed=low,seed=4").failure_log2(ids, [0] * 200)
    assert not np.array_equal(x, other)
    with pytest.raises(SpecError, match="failed='maybe'; valid: parent, low"):
        parse_whatif("synthetic:sigma=1,failed=maybe")


@pytest.mark.parametrize("engine", ["fast", "des"])
def test_a_trace_replay_reads_and_charges_the_forecasts_of_failed_candidates(engine):
    c = gfsim.compare(TINY, "threshold:0.7", forecaster="paper:gemini3-flash", engine=engine)
    table = c.result.candidate_table()
    failed = table[table["outcome"].isin(["compile_failed", "runtime_error", "incorrect",
                                          "timeout"])]
    assert len(failed) and not (failed["reason"] == "unforecast").any()
    decided = table[table["reason"].notna()]
    assert c.data["forecasts"] == len(decided) == len(GENERATED)
    assert c.data["unforecast"] == 0 and c.data["baseline"]["unforecast"] == 0
    assert c.data["stages"]["forecasting"]["s"] > 0
    note = next(n for n in c.data["notes"] if "SYNTHETIC what-if" in n)
    assert "7 of its 10 forecasts are of candidates without a measured speedup" in note
    assert "ASSUMPTION (failed=parent" in note


def test_candidates_decided_without_a_forecast_are_counted_in_json_and_table(tmp_path):
    cands = tmp_path / "c.csv"
    run = [sys.executable, "-m", "gfsim", "replay", "--log", TINY, "--policy", "threshold:0.7",
           "--candidates-out", str(cands)]
    out = json.loads(subprocess.run(run + ["--json"], capture_output=True, text=True,
                                    check=True, cwd=tmp_path).stdout)
    import pandas as pd

    reasons = pd.read_csv(cands)["reason"]
    assert out["unforecast"] == int((reasons == "unforecast").sum()) == 1  # b3: no forecast
    assert out["baseline"]["unforecast"] == 0
    text = subprocess.run(run, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    row = next(line for line in text.splitlines() if "decided with no forecast" in line)
    assert [w for w in row.split() if w not in "│┃|"][-3:] == ["1", "0", "+1"]




def test_invented_children_are_forecast_from_their_invented_speedup():
    from gfsim.cost_models import load_cost_model
    from gfsim.forecasts.whatif import whatif_model
    from gfsim.simulator.children import LogChildren
    from gfsim.simulator.replay import cached_traces
    from gfsim.simulator.whatif_children import WhatIfChildren

    f = parse_whatif("paper:gemini3-flash,failed=low")
    log = attach(open_log_arg(TINY), f)
    assert whatif_model(log, f.name) is f
    trace = cached_traces(log, load_cost_model("serverless-a100"), f.name)[0]
    source = WhatIfChildren(LogChildren(trace), f, trace)
    node, speedup = source.root()
    kids = source.draw(node, speedup, 0, 12, seed=5)
    invented = [k for k in kids if k.draw_source == "fallback" and not k.gen_failed]
    assert invented and all(k.has_forecast for k in kids if not k.gen_failed)
    for k in invented:
        key = f"{k.candidate_id}\x1f5"
        x = math.log2(k.speedup) if k.outcome == "success" else \
            float(f.failure_log2([key], [math.log2(speedup)])[0])
        probs, failed = f.distribution_one(x, key)
        assert k.parse_failed == failed
        np.testing.assert_allclose(k.probs, np.zeros(8) if failed else probs, atol=1e-12)


@pytest.mark.parametrize("engine", ["fast", "des"])
def test_a_closed_loop_replay_forecasts_and_charges_every_generated_child(engine):
    c = gfsim.compare(TINY, "threshold:0.7", forecaster="paper:gemini3-flash", driver="puct",
                      children="fallback", simulate=True, overgen=4, engine=engine)
    table = c.result.candidate_table()
    invented = table[table["draw_source"] == "fallback"]
    assert len(invented) > 20
    assert not (table["reason"] == "unforecast").any() and c.data["unforecast"] == 0
    assert c.data["forecasts"] == int(table["reason"].notna().sum())


def test_same_seed_same_forecasts_in_a_fresh_process(tmp_path):
    def run(name, seed):
        path = tmp_path / name
        subprocess.run([sys.executable, "-m", "gfsim", "replay", "--log", TINY, "--driver",
                        "puct", "--simulate", "--children", "model", "--overgen", "4",
                        "--forecaster", "synthetic:sigma=1,failed=low", "--seed", str(seed),
                        "--candidates-out", str(path)], capture_output=True, check=True,
                       cwd=tmp_path)
        return path.read_text()

    first = run("a.csv", 1)
    assert first == run("b.csv", 1)
    assert first != run("c.csv", 2)
