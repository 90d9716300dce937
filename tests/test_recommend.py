"""A recommendation against the incumbent (gfsim.tuning.recommend, ``gfsim recommend``, the end
of ``gfsim tune``; issue 40): it keeps the incumbent unless a gain is detectable, says what its
intervals are over, and finds the prices over which a gain holds."""

import json
import math

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.cost_models import load_cost_model, with_prices
from gfsim.replay_logs import open_log
from gfsim.simulator import parse_budget
from gfsim.simulator.shape import OwnShape
from gfsim.tuning.recommend import parse_config, recommendation
from gfsim.tuning.trials import TrialSetup

MODEL = load_cost_model("serverless-a100")


def _setup(budget="usd=20,steps=10", driver="puct", log="synthetic-puct-v1"):
    search = OwnShape() if driver == "puct" else None
    return TrialSetup(open_log(log), MODEL, "all", driver, parse_budget(budget), [0], search,
                      **({"children": "model"} if driver == "puct" else {}))


def test_configurations_parse_by_name_and_fail_by_name():
    own = OwnShape()
    assert parse_config("all@1", "puct", own).search == OwnShape(overgen=1)
    assert parse_config("threshold:0.7@4", "puct", own).label == "threshold:0.7 F=4"
    assert parse_config("log", "puct", OwnShape(overgen=2)) == parse_config("all@own", "puct",
                                                                            own)
    assert parse_config("ev:10", "trace", None).search is None
    for bad, why in (("all@0", "whole number"), ("all@x", "whole number"),
                     ("@2", "names no policy"), ("nosuch@2", "nosuch")):
        with pytest.raises(GfsimError, match=why):
            parse_config(bad, "puct", own)
    with pytest.raises(GfsimError, match="only with `driver` puct"):
        parse_config("all@2", "trace", None)


def test_prices_scale_the_gpu_and_the_forecaster_alone():
    m = with_prices(MODEL, gpu=2.0, forecaster=0.5)
    assert m.gpu.usd_per_hour == 2 * MODEL.gpu.usd_per_hour
    assert m.forecaster.usd_per_m_output == 0.5 * MODEL.forecaster.usd_per_m_output
    assert m.generator == MODEL.generator and m.cpu == MODEL.cpu
    assert m.gpu.active_w == MODEL.gpu.active_w
    assert with_prices(MODEL) is MODEL
    with pytest.raises(GfsimError):
        with_prices(MODEL, gpu=0.0)


def test_a_configuration_that_replays_as_the_incumbent_is_never_recommended():
    # The shipped log's searches run at F 1: all@own replays exactly as all@1, every seed.
    setup = _setup()
    base = parse_config("all@1", "puct", OwnShape())
    same = parse_config("all@own", "puct", OwnShape())
    rec = recommendation(setup, [same], base, range(3), fresh_seeds=range(10, 13))
    assert rec["keeps_incumbent"] and rec["choice"] == "all F=1"
    gain = rec["configs"][1]["expected_gain"]
    assert gain["mean"] == pytest.approx(1.0) and not gain["detectable"]
    assert gain["settled_by"].startswith("nothing would show a gain")
    assert "keep the incumbent" in rec["verdict"] and "prices" not in rec
    assert "what would settle it" in rec["verdict"]
    assert "new search" in rec["over"] and rec["fresh_seeds"] == [10, 11, 12]
    assert "what adopting it gives" in rec["expected_over"]
    assert rec["log_surprise"]["factor"] >= 1.0


def test_a_clear_gain_is_recommended_with_its_interval_and_prices():
    # Measuring a random fifth of the children loses to measuring them all, on every seed.
    setup = _setup()
    base = parse_config("random:0.2@1", "puct", OwnShape())
    rec = recommendation(setup, [parse_config("all@1", "puct", OwnShape())], base, range(4),
                         fresh_seeds=range(10, 14))
    assert not rec["keeps_incumbent"] and rec["choice"] == "all F=1"
    g = rec["configs"][1]["expected_gain"]
    assert g["detectable"] and 1.0 < g["lower_bound"] <= g["mean"]
    assert g["lo"] < g["lower_bound"] and g["mean"] < g["hi"] and g["settled_by"] is None
    # one new search's gain: the same centre, wider (it adds that search's own randomness)
    n = rec["configs"][1]["new_search_gain"]
    assert n["mean"] == pytest.approx(g["mean"]) and n["lo"] < g["lo"] and g["hi"] < n["hi"]
    assert rec["verdict"].startswith("use all F=1") and "adopting it" in rec["verdict"]
    gpu = rec["prices"]["gpu"]
    assert gpu["now"] == MODEL.gpu.usd_per_hour and "x1" in gpu["gain_at"]
    for lo, hi in ((gpu["from"], gpu["now"]), (gpu["now"], gpu["to"])):
        assert lo is None or hi is None or lo < hi
    # neither policy forecasts: the forecast price cannot matter
    assert "does not matter" in rec["prices"]["forecaster"]["note"]
    for row in rec["configs"]:
        assert 0.0 <= row["invented_share"] <= 1.0 and row["best_rests_on"]


def test_without_a_usd_limit_prices_cannot_change_the_gain():
    setup = _setup(budget="steps=10")
    rec = recommendation(setup, [parse_config("all@1", "puct", OwnShape())],
                         parse_config("random:0.2@1", "puct", OwnShape()), range(3),
                         fresh_seeds=range(10, 13))
    assert not rec["keeps_incumbent"]
    assert "no USD limit" in rec["prices"]["note"]


def test_a_seed_free_trace_replay_is_judged_over_the_log_s_tasks():
    setup = _setup(budget="usd=5", driver="trace", log="synthetic-mini")
    rec = recommendation(setup, [parse_config("threshold:0.7", "trace", None)],
                         parse_config("all", "trace", None), [0])
    assert "tasks" in rec["over"] and rec["fresh_seeds"] == []
    assert rec["configs"][1]["invented_share"] == 0.0


def test_recommend_command_prints_the_verdict_and_fails_on_a_bad_incumbent():
    args = ["recommend", "--candidate", "all@1", "--candidate", "ev:10@2", "--incumbent",
            "random:0.2@1", "--budget", "usd=20,steps=8", "--seeds", "2", "--fresh-seeds",
            "2", "--no-prices"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["recommendation"]
    assert out["incumbent"] == "random:0.2 F=1" and len(out["configs"]) == 3
    assert all(math.isfinite(r["best_speedup"]["mean"]) for r in out["configs"])
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0 and "recommendation:" in text.output
    bad = CliRunner().invoke(app, ["recommend", "--incumbent", "all@zero"])
    assert bad.exit_code == 2 and "--incumbent" in bad.output and "whole number" in bad.output


def test_an_undetected_gain_says_what_evidence_would_settle_it():
    import numpy as np

    from gfsim.simulator.predictive import EXPECTED_DF, EXPECTED_SCALE, _t, expected_gain
    from gfsim.tuning.recommend import _settled_by

    base = parse_config("all@1", "puct", OwnShape())
    wide = parse_config("topk:4@2", "puct", OwnShape())
    assert wide.search.overgen == 2
    # A gain hidden by the sampling error of two fresh searches: more of them would show it.
    fresh = np.stack([np.zeros(2), np.array([0.094, 0.306])])
    got = expected_gain(np.zeros((2, 2)), fresh)
    assert got.lower[1] < 0 < got.mean[1]
    said = _settled_by(got, 1, wide, 2, True, 0.9)
    need = int(said.split("about ")[1].split()[0])
    assert said.startswith("more seeds") and need > 2
    # ... and with that many the bound would pass 0 (the same mean and spread per search),
    # with one fewer not.
    sd = math.sqrt(got.sampling[1] * 2 / need + got.misfit[1])
    fewer = math.sqrt(got.sampling[1] * 2 / (need - 1) + got.misfit[1])
    assert got.mean[1] - EXPECTED_SCALE * _t(0.9, EXPECTED_DF) * fewer <= 0
    assert got.mean[1] - EXPECTED_SCALE * _t(0.9, EXPECTED_DF) * sd > 0
    # A gain the world model's misfit hides (a wide spread per search): no number of seeds
    # shows it; children measured at F > 1 (or more logged searches) would.
    fresh = np.stack([np.zeros(4), np.array([0.9, -0.6, 1.2, -0.5])])
    got = expected_gain(np.zeros((2, 4)), fresh)
    said = _settled_by(got, 1, wide, 4, True, 0.9)
    assert said.startswith("a measured batch of its children at F > 1")
    assert _settled_by(got, 1, base, 4, True, 0.9).startswith("more logged searches")


def test_a_gain_adopted_through_the_large_door_says_so_and_needs_no_settling():
    """A configuration adoptable only as a large gain (its 90% bound under 1x, its 70% one
    above): the verdict names the door and both bounds, and the row has nothing to settle;
    with none adoptable the verdict names both doors."""
    from gfsim.tuning.recommend import _verdict

    adoption = {"level": 0.9, "large_gain": 2 ** 0.2, "large_level": 0.7}
    big = {"config": "topk:4 F=8", "expected_gain": {
        "mean": 1.4, "lo": 0.9, "hi": 2.1, "lower_bound": 0.97, "detectable": False,
        "large_lower_bound": 1.12, "adoptable": True, "settled_by": None},
        "new_search_gain": {"mean": 1.4, "lo": 0.8, "hi": 2.4}}
    rows = [{"config": "all F=1"}, big]
    big["invented_share"] = 0.94
    said = _verdict(rows, 1, 1, 0.9, adoption)
    assert said.endswith("children 94% invented by the world model (what the gain rests on)")
    assert said.startswith("use topk:4 F=8") and "adopted at 70%" in said
    assert "1.120x there" in said and "0.970x at 90%" in said
    big["expected_gain"].update(adoptable=False, settled_by="more seeds")
    kept = _verdict(rows, 0, 1, 0.9, adoption)
    assert kept.startswith("keep the incumbent") and "nor one of 1.149x or more at 70%" in kept


def test_a_recommendation_json_says_its_adoption_rule_and_each_row_whether_adoptable():
    own = OwnShape()
    rec = recommendation(_setup(), [parse_config("topk:2@2", "puct", own)],
                         parse_config("all@1", "puct", own), [0, 1], fresh_seeds=[0, 1],
                         prices=False)
    assert rec["adoption"] == {"level": 0.9, "large_gain": pytest.approx(2 ** 0.2),
                               "large_level": 0.7}
    e = rec["configs"][1]["expected_gain"]
    assert isinstance(e["adoptable"], bool) and e["large_lower_bound"] >= e["lower_bound"]
    assert (e["settled_by"] is None) == e["adoptable"]
    assert rec["keeps_incumbent"] == (not e["adoptable"])
    # What adoptable ones are ranked by: the mean of the expected gain and the replays' gain.
    replays = rec["configs"][1]["best_speedup"]["mean"] / rec["configs"][0]["best_speedup"]["mean"]
    assert e["ranking_gain"] == pytest.approx(math.sqrt(e["mean"] * replays))
