"""One frozen settings object for a replay (gfsim.simulator.settings.ReplaySettings): built once
at the front door, passed down whole, the same answers as the keywords it replaces."""

from __future__ import annotations

import dataclasses

import pytest

from gfsim.core.errors import GfsimError
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator import ReplaySettings, parse_budget
from gfsim.simulator.replay import replay_many

MODEL = load_cost_model("serverless-a100")


def test_it_is_frozen_checked_and_replaced_by_name():
    s = ReplaySettings(driver="puct", budget=parse_budget("usd=5"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.driver = "trace"  # type: ignore[misc]
    assert s.replace(engine="des").engine == "des" and s.engine == "auto"
    assert s.closed_loop and not ReplaySettings().closed_loop
    with pytest.raises(GfsimError, match="`driver`: unknown driver 'greedy'"):
        ReplaySettings(driver="greedy")
    with pytest.raises(GfsimError, match="`engine`: unknown engine"):
        s.replace(engine="gpu")
    with pytest.raises(GfsimError, match="unknown replay setting.*colour"):
        s.replace(colour="red")
    assert ReplaySettings.of(s) is s and ReplaySettings.of(None) == ReplaySettings()


@pytest.mark.parametrize("driver", ["trace", "puct"])
def test_a_settings_object_replays_as_the_keywords_did(driver):
    log = open_log("synthetic-mini")
    keywords = dict(budget=parse_budget("usd=3"), driver=driver,
                    **({"children": "fallback"} if driver == "puct" else {}))
    seeds = [0, 1]

    def bests(results):
        return [(r.best_speedup, r.total.usd, [s.gpu_evals for s in r.searches]) for r in results]

    by_keywords = replay_many(log, [make_policy("threshold:0.6") for _ in seeds], MODEL, seeds,
                              **keywords)
    settings = ReplaySettings(**keywords)
    by_object = replay_many(log, [make_policy("threshold:0.6") for _ in seeds], MODEL, seeds,
                            settings)
    assert bests(by_object) == bests(by_keywords)
    # keywords beside an object change only what they name
    loose = replay_many(log, [make_policy("threshold:0.6") for _ in seeds], MODEL, seeds,
                        settings, budget=parse_budget("usd=1000"))
    assert bests(loose) != bests(by_object)


def test_the_front_door_builds_it_once_and_the_tuner_reads_it_whole():
    from gfsim.api.options import replay_inputs
    from gfsim.tuning.trials import TrialSetup

    got = replay_inputs("synthetic-mini", forecaster="paper:gemini3-flash", cost="serverless-a100",
                        driver="puct", search="paper-filtered", children="auto",
                        simulate=False, budget="usd=4", overgen=2)
    s = got.settings
    assert isinstance(s, ReplaySettings)
    assert (s.driver, s.children, s.forecaster, s.search.overgen, s.budget.usd) == \
        ("puct", "model", "paper:gemini3-flash", 2, 4.0)
    assert got.puct_only == {"children": "model", "simulate": False}
    setup = TrialSetup.of(got.log, got.model, "all", [0], s)
    assert setup.settings == s.replace(orphans_dropped=False)
    assert (setup.driver, setup.budget, setup.forecaster) == ("puct", s.budget, s.forecaster)
    # A field replaced makes the settings again (the tuner's trials replace the driver).
    trace_setup = dataclasses.replace(setup, driver="trace")
    assert trace_setup.settings.driver == "trace" and trace_setup.settings.budget == s.budget
    trace = replay_inputs("synthetic-mini", forecaster=None, cost="serverless-a100",
                          driver="trace", search=None, children="auto", simulate=False,
                          budget=None)
    assert trace.puct_only == {} and trace.settings.children == "fallback"
