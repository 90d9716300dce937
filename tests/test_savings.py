"""gfsim savings: paired, censoring-aware savings with intervals, signed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.analysis.savings import savings
from gfsim.cli.main import app
from gfsim.cost_models import load_cost_model
from gfsim.replay_logs import open_log
from gfsim.simulator.replay import replay_seeds
from gfsim.simulator.results import best_at, first_reaching

runner = CliRunner()
MODEL = load_cost_model("serverless-a100")


def pairs(policy, baseline="all", seeds=range(4), log="synthetic-mini"):
    return replay_seeds(open_log(log), policy, MODEL, seeds, baseline=baseline)


def test_reaching_a_target_is_censored_at_what_was_spent():
    anytime = np.array([[0, 0, 0, 0, 1.0], [10, 2.0, 0, 1, 1.5], [20, 5.0, 0, 2, 3.0]])
    assert first_reaching(anytime, 1, 1.4) == (2.0, True)
    assert first_reaching(anytime, 1, 3.0) == (5.0, True)
    assert first_reaching(anytime, 1, 9.0) == (5.0, False)  # never: the whole spend, censored
    assert best_at(anytime, 1, 4.99) == 1.5 and best_at(anytime, 1, 100) == 3.0


def test_a_policy_against_itself_saves_nothing():
    out = savings(pairs("all"))
    for key in ("usd", "seconds", "joules"):
        s = out[f"{key}_saved_per_search"]
        assert s["mean"] == 0 and s["lo"] == 0 == s["hi"] and s["includes_zero"]
    g = out["speedup_gain_at_equal_cost"]
    assert g["mean"] == pytest.approx(1.0) and g["includes_one"]
    for name, r in out["reach_probability"].items():
        assert r["policy"] == r["baseline"]
        assert out["cost_to_target"][name]["saved_usd"]["mean"] == 0


def test_measuring_less_saves_money_and_says_what_it_costs_in_speed():
    p = pairs("random:0.3")
    out = savings(p)
    s = out["usd_saved_per_search"]
    # The figure is the mean paired difference, recomputed here from the replays themselves.
    diffs = [b.total.usd - a.total.usd for pol, base in p for a, b in zip(pol.searches,
                                                                          base.searches)]
    assert s["mean"] == pytest.approx(np.mean(diffs))
    assert s["lo"] > 0 and not s["includes_zero"] and "saves" in out["verdict"]
    # Fewer measurements: never more likely to reach a target than measuring everything.
    for r in out["reach_probability"].values():
        assert r["policy"] <= r["baseline"]
    assert out["break_even"]["usd_per_forecast"] is None  # random makes no forecasts
    # A policy that costs more is told so, signed.
    dear = savings(pairs("threshold:0.99", seeds=range(3)))
    if dear["usd_saved_per_search"]["mean"] < 0:
        assert "MORE" in dear["verdict"]


def test_break_even_price_per_forecast_zeroes_the_saving():
    p = pairs("threshold:coverage=0.5")
    out = savings(p)
    be = out["break_even"]
    n_fc = np.mean([a.forecasts for pol, _ in p for a in pol.searches])
    # At the break-even price the forecasts would cost exactly the saving more.
    assert (be["usd_per_forecast"] - be["current_usd_per_forecast"]) * n_fc == pytest.approx(
        out["usd_saved_per_search"]["mean"])


def test_cli_json_keys_and_the_puct_driver():
    res = runner.invoke(app, ["savings", "--policy", "threshold:0.7", "--driver", "puct",
                              "--seeds", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("usd_saved_per_search", "seconds_saved_per_search", "joules_saved_per_search",
                "speedup_gain_at_equal_cost", "reach_probability", "break_even", "inputs"):
        assert key in out
    assert {"mean", "lo", "hi"} <= set(out["usd_saved_per_search"])
    assert out["inputs"]["driver"] == "puct" and out["inputs"]["synthetic_log"]
    assert set(out["reach_probability"]) == {"q50", "q75", "q90"}
    assert out["seed_dependence"] and len(out["inputs"]["seeds"]) == 3  # puct draws by seed
    res = runner.invoke(app, ["savings", "--jobs", "0"])
    assert res.exit_code == 2 and "--jobs must be >= 1" in res.output


def test_savings_replays_a_deterministic_configuration_once():
    """threshold:0.7 against all under the trace driver: no seed can change either, so the
    default is one replay (not 32 identical ones), --seeds N says it was not needed, and the
    three targets, all equal, make one row."""
    res = runner.invoke(app, ["savings", "--log", "synthetic-mini", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["seeds"] == 1 and out["inputs"]["seeds"] == [0]
    assert out["seed_dependence"] is None and "replayed once" in out["seeds_note"]
    res = runner.invoke(app, ["savings", "--log", "synthetic-mini", "--seeds", "4"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "1 replay" in res.output and "--seeds 4 asked for" in res.output
    assert "q50 = q75 = q90" in res.output
    res = runner.invoke(app, ["savings", "--log", "synthetic-mini", "--policy", "random:0.5",
                              "--seeds", "3", "--json"])
    out = json.loads(res.output)
    assert out["seeds"] == 3 and "random" in out["seed_dependence"]
