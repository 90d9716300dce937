"""Issue 51, Deliver 4: the smaller replay and recommend defects a new user met on real runs
(nonsensical policy parameters, budgets overspent, silent early stops, SIMULATED figures
called measured, zero-width intervals, recommend's defaults on logs without forecasts,
silent long replays)."""

from __future__ import annotations

import pytest

from gfsim.core.errors import SpecError
from gfsim.policies import make_policy


# -- policy parameters that make no sense are refused, naming the valid range ---------------
@pytest.mark.parametrize("spec, valid", [
    ("topk:0", "k >= 1"),
    ("topk:k=-3", "k >= 1"),
    ("random:0", "range 0 to 1, 0 excluded"),
    ("oracle:p=0", "range 0 to 1, 0 excluded"),
    ("threshold:coverage=0", "range 0 to 1, 0 excluded"),
    ("threshold:tau=1.5", "range 0 to 1"),
])
def test_a_policy_parameter_outside_its_range_is_one_line_naming_the_range(spec, valid):
    with pytest.raises(SpecError) as info:
        make_policy(spec)
    assert valid in str(info.value) and "\n" not in str(info.value)


def test_the_smallest_sensible_values_still_build():
    assert make_policy("topk:1").k == 1
    assert make_policy("random:1").p == 1.0


# -- a budget is never exceeded: a step the search cannot afford is not started -------------
from pathlib import Path  # noqa: E402

from gfsim.cost_models import load_cost_model  # noqa: E402
from gfsim.importers.openevolve import import_openevolve  # noqa: E402
from gfsim.replay_logs import load_log, resolve_log  # noqa: E402
from gfsim.simulator import Budget, replay  # noqa: E402

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def openevolve_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("oe") / "oe.jsonl"
    import_openevolve(DATA / "openevolve" / "run", out, runtime_metric="runtime_ns")
    return load_log(out)


def total(result, key):
    return [getattr(s.total, key) if key != "seconds" else s.wall_s for s in result.searches]


def test_a_usd_budget_below_one_step_spends_nothing(openevolve_log):
    # The OpenEvolve run's first step costs $0.03 to generate alone: usd=0.01 spent $0.03.
    r = replay(openevolve_log, make_policy("all"), load_cost_model("serverless-a100"),
               budget=Budget(usd=0.01))
    (s,) = r.searches
    assert s.stopped_by == "usd" and s.total.usd == 0.0 and s.candidates == 0


LIMITS = [("usd", Budget(usd=1.5)), ("joules", Budget(joules=3e5)),
          ("seconds", Budget(seconds=900.0))]


@pytest.mark.parametrize("cost", ["serverless-a100", "reserved-h100"])
@pytest.mark.parametrize("key, budget", LIMITS)
def test_no_trace_replay_spends_past_its_budget(key, budget, cost):
    log = load_log(resolve_log("synthetic-mini"))
    model = load_cost_model(cost)
    free = replay(log, make_policy("all"), model, orphans_dropped=False)
    capped = replay(log, make_policy("all"), model, budget=budget, orphans_dropped=False)
    limit = getattr(budget, key)
    assert max(total(free, key)) > limit  # the budget binds
    for s, spent in zip(capped.searches, total(capped, key)):
        assert spent <= limit and s.stopped_by == key


@pytest.mark.parametrize("cost", ["serverless-a100", "reserved-h100"])
@pytest.mark.parametrize("key, budget", LIMITS)
def test_no_closed_loop_replay_spends_past_its_budget_in_either_engine(key, budget, cost):
    log = load_log(resolve_log("synthetic-mini"))
    model = load_cost_model(cost)
    runs = {engine: replay(log, make_policy("threshold:0.7"), model, budget=budget,
                           driver="puct", engine=engine, simulate=True, orphans_dropped=False)
            for engine in ("des", "fast")}
    limit = getattr(budget, key)
    for engine, r in runs.items():
        assert all(spent <= limit for spent in total(r, key)), engine
        assert {s.stopped_by for s in r.searches} == {key}
    for a, b in zip(runs["des"].searches, runs["fast"].searches):
        assert (a.trace_hash, a.reached, a.stopped_by, a.total.usd) == \
               (b.trace_hash, b.reached, b.stopped_by, b.total.usd)


# -- every early stop says why ---------------------------------------------------------------
def test_a_closed_loop_search_out_of_logged_children_says_so(openevolve_log):
    import gfsim

    out = gfsim.compare(openevolve_log, "all", children="own", driver="puct",
                        simulate=True).to_dict()
    (search,) = out["searches"]
    assert search["stop_reason"]["code"] == "out_of_children"
    note = next(n for n in out["notes"] if n.startswith("why the search stopped"))
    assert "drew none" in note and f"{search['gpu_evals']} GPU evaluations" in note


def test_a_budget_stop_says_which_limit_and_a_full_run_adds_no_note():
    import gfsim

    capped = gfsim.compare("synthetic-mini", "all", budget="usd=2").to_dict()
    assert {s["stop_reason"]["code"] for s in capped["searches"]} == {"budget:usd"}
    assert any("USD budget" in n for n in capped["notes"])
    full = gfsim.compare("synthetic-mini", "all").to_dict()
    assert {s["stop_reason"]["code"] for s in full["searches"]} == {"steps_done"}
    assert not any(n.startswith("why") for n in full["notes"])


# -- nothing SIMULATED is labelled measured --------------------------------------------------
def test_a_simulated_replay_calls_its_best_simulated_in_notes_and_plots(openevolve_log):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import gfsim
    from gfsim.analysis.plots import anytime_panels

    sim = gfsim.compare(openevolve_log, "all", children="own", driver="puct", simulate=True)
    assert sim.data["best_evidence"]["basis"] == "simulated"
    note = next(n for n in sim.data["notes"] if n.startswith("best_speedup is"))
    assert "SIMULATED" in note and "MEASURED" not in note
    fig, axes = plt.subplots(1, 2)
    anytime_panels({"policy": [p[0] for p in sim.pairs]}, axes)
    assert all("SIMULATED" in ax.get_ylabel() and "measured" not in ax.get_ylabel()
               for ax in axes)
    plt.close(fig)
    trace = gfsim.compare(openevolve_log, "all")  # the logged order: its bests were measured
    assert any("best speedup, MEASURED" in n for n in trace.data["notes"])


# -- no interval is shown where the replays cannot differ ------------------------------------
from typer.testing import CliRunner  # noqa: E402

from gfsim.analysis.stats import POINT_WORDS  # noqa: E402
from gfsim.cli.main import app  # noqa: E402

WIDE = {"COLUMNS": "200"}


def test_savings_on_one_search_no_seed_can_change_says_point_not_x_to_x(openevolve_log):
    # One task, a policy that reads no seed: every replay alike; it said "-$0.29 to -$0.29".
    import gfsim

    out = gfsim.savings(openevolve_log, "topk:1", forecaster="paper:gemini3-flash")
    assert out["usd_saved_per_search"]["point"]
    assert POINT_WORDS in out["verdict"] and " to " not in out["verdict"]
    res = CliRunner().invoke(app, ["savings", "--log", openevolve_log.path, "--policy", "topk:1",
                                   "--forecaster", "paper:gemini3-flash"], env=WIDE)
    assert res.exit_code == 0, res.output
    usd_row = next(line for line in res.output.splitlines() if line.lstrip().startswith("USD"))
    assert "(point)" in usd_row and "[" not in usd_row
    assert POINT_WORDS in " ".join(res.output.split())


def test_recommend_says_point_where_every_task_gains_alike():
    # On tiny.jsonl every task's gain is 1.000x: it printed "1.000x 1.00-1.00".
    res = CliRunner().invoke(app, ["recommend", "--log", str(DATA / "tiny.jsonl"), "--driver",
                                   "trace", "--seeds", "1", "--candidate", "topk:1"], env=WIDE)
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.lstrip().startswith("topk:1"))
    assert "(point)" in row and "1.00-1.00" not in row
    text = " ".join(res.output.split())
    assert "in every replay" in text and "lower bound 1.000x" not in text


# -- recommend's defaults work on any imported log ------------------------------------------
def test_recommend_defaults_on_a_log_without_forecasts_leave_the_forecast_readers_out():
    import gfsim

    # It refused: "policy 'topk' reads forecasts and the log has none" (its own default grid).
    out = gfsim.recommend(str(DATA / "tiny-no-forecasts.jsonl"), driver="trace", prices=False)
    assert [c["config"] for c in out["recommendation"]["configs"]] == ["all"]
    (note,) = out["notes"]
    assert "topk:4" in note and "ev:10" in note and "--forecaster" in note
    res = CliRunner().invoke(app, ["recommend", "--log", str(DATA / "tiny-no-forecasts.jsonl"),
                                   "--driver", "trace", "--no-prices"], env=WIDE)
    assert res.exit_code == 0, res.output
    assert "are left out" in " ".join(res.output.split())


def test_recommend_with_a_whatif_forecaster_keeps_the_whole_grid(openevolve_log):
    from gfsim.api.options import replay_inputs
    from gfsim.api.recommend import default_candidates, grid_for

    got = replay_inputs(openevolve_log, forecaster="paper:gemini3-flash",
                        cost="serverless-a100", driver="trace", search=None, children="auto",
                        simulate=False, budget=None)
    assert grid_for(got.log, "trace", got.forecaster, got.learning) == \
        (default_candidates("trace"), [])
    bare = replay_inputs(openevolve_log, forecaster=None, cost="serverless-a100",
                         driver="trace", search=None, children="auto", simulate=False,
                         budget=None)
    kept, left = grid_for(bare.log, "trace", bare.forecaster, bare.learning)
    assert kept == ["all"] and "topk:4" in left


# -- long replays show progress --------------------------------------------------------------
REPLAY = ["replay", "--log", "synthetic-mini", "--driver", "puct", "--steps", "6", "-p", "all"]


@pytest.mark.parametrize("args", [
    REPLAY,
    ["recommend", "--log", "synthetic-mini", "--driver", "trace", "--seeds", "1",
     "--candidate", "topk:2", "--no-prices"],
    ["savings", "--log", "synthetic-mini", "--policy", "topk:2", "--seeds", "1"],
], ids=["replay", "recommend", "savings"])
def test_a_replaying_command_shows_its_steps_on_a_terminals_stderr(args):
    res = CliRunner().invoke(app, args, env={**WIDE, "TTY_COMPATIBLE": "1"})
    assert res.exit_code == 0, res.output
    assert "search steps" in res.stderr and "search steps" not in res.stdout


@pytest.mark.parametrize("extra, env", [(["--json"], {"TTY_COMPATIBLE": "1"}),
                                        ([], {"TTY_COMPATIBLE": "0"})])
def test_no_progress_with_json_or_off_a_terminal(extra, env):
    res = CliRunner().invoke(app, REPLAY + extra, env={**WIDE, **env})
    assert res.exit_code == 0, res.output
    assert "search steps" not in res.stderr


def test_the_engines_tick_every_step_alike_in_either_engine():
    from gfsim.simulator.progress import listening

    log = load_log(resolve_log("synthetic-mini"))
    model = load_cost_model("serverless-a100")
    # The check that PUCT reproduces each logged search runs once per log in a process (it is
    # kept): run it before counting, so that neither engine counts it and the other not
    # (whether an earlier test in this process ran it decided which did).
    replay(log, make_policy("all"), model, driver="puct", simulate=True, orphans_dropped=False)
    counted = {}
    for engine in ("des", "fast"):
        ticks = []
        with listening(ticks.append):
            r = replay(log, make_policy("all"), model, driver="puct", engine=engine,
                       simulate=True, orphans_dropped=False)
        assert sum(ticks) >= sum(s.steps for s in r.searches) > 0, engine
        counted[engine] = sum(ticks)
    assert counted["des"] == counted["fast"]
