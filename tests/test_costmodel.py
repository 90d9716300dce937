"""The learned cost-model forecaster (``gfsim.forecasts.costmodel``): prequential (a forecast
never sees its own or a later measurement), the stated prior at step 0, better than that prior
once it has data, usable from ``gfsim forecast``, ``replay`` and ``score``, and clear errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError, SpecError
from gfsim.forecasts.costmodel import (
    CostModelSpec,
    distribution,
    encode,
    parse_costmodel,
    prequential_records,
)
from gfsim.replay_logs import load_log

runner = CliRunner()


@pytest.fixture(scope="module")
def world_log(tmp_path_factory):
    """A measure-all standard search on the measured fp8_quant world (candidates carry their
    variant, parameters and H200 compile features)."""
    out = tmp_path_factory.mktemp("cm") / "fp8.jsonl"
    res = runner.invoke(app, ["synth", "--world", "h200:fp8_quant", "--driver", "puct",
                              "--steps", "12", "--seed", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_the_spec_grammar_and_its_errors():
    assert parse_costmodel("costmodel") == CostModelSpec()
    s = parse_costmodel("costmodel:min_train=4,prior_sigma=0.5")
    assert (s.min_train, s.prior_sigma) == (4, 0.5)
    assert s.name == "costmodel:min_train=4,prior_sigma=0.5"
    for bad, words in (("costmodel:nope=1", "unknown key"), ("costmodel:min_train=x", "whole"),
                       ("costmodel:prior_sigma=-1", "outside")):
        with pytest.raises(SpecError, match=words):
            parse_costmodel(bad)


def test_encoding_and_the_bins():
    f = encode({"variant": "row_loop", "params": {"GPP": 4, "SCALE": "div"},
                "features": {"regs_max": 31, "sass_instructions": 255}}, 1.5)
    assert f == {"variant=row_loop": 1.0, "p:GPP": 2.0, "p:SCALE=div": 1.0,
                 "b:regs_max": 5.0, "b:sass_instructions": 8.0, "parent_log2": 1.5}
    p = distribution(np.array([0.0, 3.0]), 0.3)
    assert p.shape == (2, 8) and np.allclose(p.sum(axis=1), 1.0)
    assert p[0].argmax() in (3, 4) and p[1].argmax() == 7  # 1x on the 1.0 edge; 8x in bin 8


def test_step_zero_is_the_stated_prior_centred_on_the_parent(world_log):
    log = load_log(world_log, cache=False)
    recs, summary = prequential_records(log, CostModelSpec())
    seed = log.header["tasks"][0]["seed_speedup"]
    first = [r for r in recs if not r["learned"]]
    assert first and summary["prior"] == len(first) and summary["learned"] > 0
    step0 = set(log.candidates.loc[log.candidates["step"] == 0, "candidate_id"])
    for r in first:
        assert r["width_log2"] == 1.0 and r["trained_on"] < 8
        if r["candidate_id"] in step0:  # children of the seed kernel
            assert r["centre_log2"] == pytest.approx(math.log2(seed), abs=1e-6)
            assert r["trained_on"] == 0


def test_a_forecast_never_sees_its_own_or_a_later_measurement(world_log):
    log = load_log(world_log, cache=False)
    cand = log.candidates
    recs, _ = prequential_records(log, CostModelSpec())
    cut = int(cand["step"].max()) // 2
    later = set(cand.loc[cand["step"] >= cut, "candidate_id"])
    ev = log.evaluations.copy()
    ok = ev["candidate_id"].isin(later) & (ev["outcome"] == "success")
    assert ok.sum() > 5
    ev.loc[ok, "speedup"] = ev.loc[ok, "speedup"] * 7.0  # rewrite the future
    log.evaluations = ev
    again, _ = prequential_records(log, CostModelSpec())
    before = {r["candidate_id"]: r for r in recs}
    changed = 0
    for r in again:
        step = int(cand.loc[cand["candidate_id"] == r["candidate_id"], "step"].iloc[0])
        if step <= cut:  # decided before any rewritten measurement arrived
            assert r["probs"] == before[r["candidate_id"]]["probs"]
        else:
            changed += r["probs"] != before[r["candidate_id"]]["probs"]
    assert changed > 0  # and the rewritten measurements do train what comes after


def test_it_beats_its_own_prior_once_it_has_data(world_log):
    from gfsim.forecasts.costmodel import attach_costmodel
    from gfsim.forecasts.scoring import score_log

    log = load_log(world_log, cache=False)
    learned = attach_costmodel(log, CostModelSpec())
    prior = attach_costmodel(log, CostModelSpec(min_train=10**6))
    s1 = {r["forecaster"]: r for r in score_log(learned)}["costmodel"]
    s0 = {r["forecaster"]: r for r in score_log(prior)}["costmodel:min_train=1e+06"]
    assert s1["crps"] < 0.7 * s0["crps"] and s1["nll"] < s0["nll"]


def test_gfsim_forecast_writes_a_valid_log_that_replay_and_score_read(world_log, tmp_path):
    out = tmp_path / "cm.jsonl"
    res = runner.invoke(app, ["forecast", "-l", str(world_log), "-f", "costmodel", "-o",
                              str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    n = summary["forecast_now"]
    assert n == summary["costmodel"]["candidates"] > 50
    log = load_log(out, cache=False)
    assert (log.forecasts["forecaster"] == "costmodel").sum() == n
    assert log.header["forecasters"][-1]["mode"] == "costmodel"
    res = runner.invoke(app, ["forecast", "-l", str(world_log), "-f", "costmodel", "-o",
                              str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["forecast_now"] == 0  # resumed
    res = runner.invoke(app, ["score", "--log", str(out), "--json"])
    assert res.exit_code == 0 and "costmodel" in res.stdout
    res = runner.invoke(app, ["replay", "--log", str(world_log), "--policy", "threshold:0.7",
                              "--forecaster", "costmodel", "--driver", "puct", "--json"])
    assert res.exit_code == 0, res.output


def test_a_log_without_features_is_refused_in_one_line(tmp_path):
    out = tmp_path / "nk.jsonl"
    runner.invoke(app, ["synth", "--world", "nk-heavy", "--driver", "puct", "--steps", "3",
                        "-o", str(out)])
    with pytest.raises(GfsimError, match="source_meta") as err:
        prequential_records(load_log(out, cache=False), CostModelSpec())
    assert "\n" not in str(err.value)
    res = runner.invoke(app, ["replay", "--log", str(out), "--policy", "threshold:0.7",
                              "--forecaster", "costmodel"])
    assert res.exit_code != 0 and "source_meta" in res.output
