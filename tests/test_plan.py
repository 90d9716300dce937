"""Planning the next search before it runs (``gfsim plan``, gfsim.tuning.plan; issue 55): the
budget's keys and their errors, a GPU-hour limit inside both closed-loop engines, token prices
as a run paid them, and plans from the real OpenEvolve runs checked against each other."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gfsim
from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.cost_models import load_cost_model
from gfsim.cost_models.paid import paid_generator
from gfsim.importers.openevolve import import_openevolve
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator import Budget, parse_budget
from gfsim.simulator.closed.engine import SEARCH_PRESETS
from gfsim.simulator.replay import replay_many
from gfsim.tuning.plan import _pooled, parse_plan_budget, search_figures

DATA = Path(__file__).parent / "data"
MODEL = load_cost_model("serverless-a100")


@pytest.fixture(scope="module")
def oe_pair(tmp_path_factory):
    """The two real OpenEvolve 0.4.1 runs of the same configuration (16 iterations, seeds 1
    and 0), imported."""
    out = []
    for name in ("openevolve", "openevolve-trace"):
        path = tmp_path_factory.mktemp(name) / f"{name}.jsonl"
        import_openevolve(DATA / name / "run", path, runtime_metric="runtime_ns")
        out.append(path)
    return out


def test_the_budget_takes_dollars_gpu_hours_or_candidates_and_names_a_bad_key():
    b = parse_plan_budget("usd=5,gpu_hours=2")
    assert (b.budget.usd, b.budget.gpu_hours, b.candidates) == (5.0, 2.0, None)
    assert parse_plan_budget("candidates=120").candidates == 120
    for bad, why in (("steps=3", "`steps`"), ("candidates=1.5", "whole number"),
                     ("candidates=0", "whole number"), ("usd=-1", "must be > 0"),
                     ("", "needs a budget"), ("gpu_hours=x", "not a number")):
        with pytest.raises(GfsimError, match=why):
            parse_plan_budget(bad)
    assert parse_budget("gpu_hours=0.5").as_dict()["gpu_hours"] == 0.5


@pytest.mark.parametrize("spec", ["all", "threshold:0.7"])
def test_a_gpu_hour_limit_stops_both_engines_alike_and_starts_no_evaluation_after_it(spec):
    log = open_log("synthetic-puct-v1")
    limit = 2.0  # GPU-hours: about a third of what the searches spend unbounded
    budget = Budget(gpu_hours=limit)
    got = {}
    for engine in ("des", "fast"):
        r = replay_many(log, [make_policy(spec)], MODEL, [0], budget=budget, engine=engine,
                        driver="puct", search=SEARCH_PRESETS["paper-standard"],
                        orphans_dropped=False)[0]
        got[engine] = r
    des, fast = got["des"].searches, got["fast"].searches
    assert [s.best_speedup for s in des] == [s.best_speedup for s in fast]
    assert [s.gpu_evals for s in des] == [s.gpu_evals for s in fast]
    for s in des:
        assert s.stopped_by == "gpu_hours"
        spans = [(a, b) for a, b in zip(s.table["measure_start_s"], s.table["measure_end_s"])
                 if a == a and b == b]  # an evaluation's span is its GPU time
        total = search_figures(s, MODEL)["gpu_hours"] * 3600
        assert sum(b - a for a, b in spans) == pytest.approx(total)
        assert total > limit * 3600  # the evaluations in flight finished past the limit
        last = max(a for a, _ in spans)  # ...but none started after it was spent
        assert sum(b - a for a, b in spans if b <= last) < limit * 3600
    unbounded = replay_many(log, [make_policy(spec)], MODEL, [0], driver="puct",
                            search=SEARCH_PRESETS["paper-standard"], orphans_dropped=False)[0]
    assert all(s.gpu_evals > b.gpu_evals for s, b in zip(unbounded.searches, des))


def test_token_prices_come_from_the_run_then_the_catalog_then_the_cost_model():
    recorded = {"models": {"a": 3, "google/gemini-3-flash": 1, "mystery": 0},
                "prices": {"usd_per_million_tokens": {"a": {"input": 1.0, "output": 2.0}}}}
    model, src = paid_generator(MODEL, recorded)
    # a: the run's own rates (3 programs); gemini-3-flash: the catalog's (0.5 / 3.0)
    assert model.generator.usd_per_m_input == pytest.approx((3 * 1.0 + 0.5) / 4)
    assert model.generator.usd_per_m_output == pytest.approx((3 * 2.0 + 3.0) / 4)
    assert src["models"]["a"].startswith("measured")
    assert src["models"]["google/gemini-3-flash"].startswith("named preset")
    assert "mystery" not in src["models"]  # it wrote no program
    assert model.forecaster == MODEL.forecaster and model.gpu == MODEL.gpu
    same, src = paid_generator(MODEL, {"models": {"tiny": 4}})
    assert same is MODEL and "assumed" in src["source"]
    same, src = paid_generator(MODEL, None)
    assert same is MODEL and "names no generator model" in src["source"]


def test_a_plan_prices_tokens_at_what_the_run_recorded(oe_pair, tmp_path):
    lines = oe_pair[0].read_text().splitlines()
    header = json.loads(lines[0])
    models = header["generator"]["models"]
    rates = {name: {"input": 5.0, "output": 30.0} for name in models}  # gemini-3-flash x10
    header["generator"]["prices"] = {"source": "test", "usd_per_million_tokens": rates}
    paid = tmp_path / "paid.jsonl"
    paid.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    kw = dict(replays=2, new_searches=4, steps=16)
    run = gfsim.plan(str(paid), "usd=50", ["log"], **kw)
    preset = gfsim.plan(str(paid), "usd=50", ["log"], prices="preset", **kw)
    llm = [p["configs"][0]["usd"]["parts"]["llm"]["mean"] for p in (run, preset)]
    assert llm[0] == pytest.approx(10 * llm[1], rel=0.02)  # input and output both x10 here
    ev = [p["configs"][0]["usd"]["parts"]["evaluations"]["mean"] for p in (run, preset)]
    assert ev[0] == pytest.approx(ev[1])
    assert run["prices"][0]["source"].startswith("measured")
    assert "assumed" in preset["prices"][0]["source"] or "cost model" in \
        preset["prices"][0]["source"]


def test_several_runs_add_their_spread_and_one_run_adds_none():
    assert _pooled([(1.0, 0.04)]) == (1.0, 0.04)
    centre, var = _pooled([(1.0, 0.04), (2.0, 0.04)])
    assert centre == 1.5
    assert var == pytest.approx(0.04 + 0.5 * 1.5)  # the centres' variance x (1 + 1/2)


def test_a_dollar_budget_caps_the_plan_and_the_parts_add_up(oe_pair):
    out = gfsim.plan(str(oe_pair[0]), "usd=0.2", ["log", "all@2"], replays=3,
                     new_searches=8, steps=16)
    for row in out["configs"]:
        usd = row["usd"]
        assert usd["lo"] <= usd["mean"] <= usd["hi"] <= 0.2
        assert sum(p["mean"] for p in usd["parts"].values()) == pytest.approx(usd["mean"])
        assert row["p_budget_exhausted"] == 1.0  # the runs spent about $0.36
        for key in ("gpu_hours", "wall_s", "best_speedup"):
            assert row[key]["lo"] <= row[key]["mean"] <= row[key]["hi"]
    assert out["configs"][0]["incumbent"] and out["configs"][0]["config"] == "all F=own"
    roomy = gfsim.plan(str(oe_pair[0]), "usd=5", ["log"], replays=3, new_searches=8)
    assert roomy["configs"][0]["p_budget_exhausted"] == 0.0


def test_the_best_speedup_s_interval_is_the_fitted_law_widened_for_plans(oe_pair):
    """The plan's best-speedup interval, from a log with improving children: centred on the
    replays, ``predictive_interval``'s t3 law widened by ``BEST_SCALE`` (fitted on the
    benchmark's short logs: without it the 90% interval held 77-85% of sister runs there), at
    every level; its lower end reaches down to the seed's speedup where at least the level's
    lower tail of new searches improved on nothing (a search that finds nothing ends there)."""
    from gfsim.simulator.predictive import ERROR_DF, ERROR_SCALE, _t
    from gfsim.tuning.plan import BEST_SCALE

    assert BEST_SCALE > 1
    for level in (0.5, 0.9):
        best = gfsim.plan(str(oe_pair[0]), "usd=1", ["log"], replays=3, new_searches=6,
                          steps=16, level=level)["configs"][0]["best_speedup"]
        imp = best["improvement"]
        half = BEST_SCALE * ERROR_SCALE * _t(0.5 + level / 2, ERROR_DF) * best["sd_log2"]
        assert best["sd_log2"] > 0 and imp["prior_weight"] == 0  # 3 improving children
        assert math.log2(best["mean"]) == best["centre_log2"]
        assert math.log2(best["hi"]) == pytest.approx(best["centre_log2"] + half)
        lo = best["centre_log2"] - half
        if imp["no_gain"] >= (1 - level) / 2:
            lo = min(lo, imp["seed_log2"])
        assert math.log2(best["lo"]) == pytest.approx(lo)


def test_p_improve_is_a_beta_binomial_chance():
    """The chance that a new search of n children finds an improving one, from a past run's
    k improving of m measured: Jeffreys' Beta(1/2, 1/2) prior on the rate, integrated."""
    from scipy import integrate, stats

    from gfsim.tuning.plan import p_improve

    for m, k, n in ((6, 0, 8), (17, 1, 17), (10, 5, 10), (0, 0, 4)):
        post = stats.beta(k + 0.5, m - k + 0.5)
        want = 1 - integrate.quad(lambda p: (1 - p) ** n * post.pdf(p), 0, 1)[0]
        assert p_improve(m, k, n) == pytest.approx(want, abs=1e-6)
    assert p_improve(6, 0, 0) == 0.0
    assert p_improve(6, 0, 4) < p_improve(6, 0, 16) < p_improve(6, 2, 16) < 1.0
    assert p_improve(60, 0, 8) < p_improve(6, 0, 8)  # more children that found nothing


def test_the_best_speedup_s_mixture_puts_the_prior_s_weight_above_the_seed():
    """``best_interval``: with no prior weight, the t law as before; with some, its upper end
    moves up to the prior's reach, the levels nest, and at the mixture's quantiles the
    mixture's distribution function gives the levels' tails."""
    from scipy.stats import t as student

    from gfsim.simulator.predictive import ERROR_DF, ERROR_SCALE
    from gfsim.tuning import plan as p

    centre, var = 0.0, 1e-4  # a log whose new searches all end at the seed
    lo0, hi0 = p.best_interval(centre, var, 0.9)
    assert lo0 == pytest.approx(-hi0) and hi0 < 0.05
    lo, hi = p.best_interval(centre, var, 0.9, weight=0.3, seed_log2=0.0, no_gain=0.7)
    assert lo0 < lo < 0 < 0.5 < hi  # the lower tail: the world model's 7%; the prior's above
    scale = p.BEST_SCALE * ERROR_SCALE * math.sqrt(var)
    for level in (0.5, 0.8, 0.9, 0.95):
        a, b = p.best_interval(centre, var, level, weight=0.3)
        for x, tail in ((a, (1 - level) / 2), (b, (1 + level) / 2)):
            cdf = 0.7 * student.cdf((x - centre) / scale, ERROR_DF) + 0.3 * p._law_cdf(x)
            assert cdf == pytest.approx(tail, abs=1e-6)
    widths = [p.best_interval(centre, var, lv, 0.3)[1] for lv in (0.5, 0.8, 0.9, 0.95)]
    assert widths == sorted(widths)
    assert p.best_interval(2.0, 0.01, 0.9, no_gain=0.2)[0] == 0.0  # down to the seed
    assert p.best_interval(2.0, 0.01, 0.9, no_gain=0.01)[0] > 1.0


def test_a_log_with_few_improving_children_leans_on_the_improvement_prior(oe_pair):
    """The second OpenEvolve run never beat its seed by more than noise (1 child of 17 faster
    than its parent): the world model fitted to it invents no improvement, so its plan's best
    speedup puts the weight its new searches fall short of ``p_improve`` on the improvement
    prior and says so; the first run (3 improving children) puts none there."""
    outs = [gfsim.plan(str(p), "usd=1", ["log"], replays=2, new_searches=8, steps=16)
            for p in oe_pair]
    assert [o["evidence"][0]["improving_children"] for o in outs] == [3, 1]
    assert [o["evidence"][0]["few"] for o in outs] == [False, True]
    imp = [o["configs"][0]["best_speedup"]["improvement"] for o in outs]
    assert imp[0]["prior_weight"] == 0
    assert imp[1]["prior_weight"] == pytest.approx(imp[1]["p_improve"]
                                                   - imp[1]["model_improved"])
    assert imp[1]["prior_weight"] > 0.3
    assert outs[1]["configs"][0]["rests_on"]["best_speedup_prior_weight"] == \
        imp[1]["prior_weight"]
    best = outs[1]["configs"][0]["best_speedup"]
    assert best["hi"] > 1.5 and best["lo"] <= 1.0  # it may find a 1.5x kernel, or nothing
    result = CliRunner().invoke(app, ["plan", "--log", str(oe_pair[1]), "--budget", "usd=1",
                                      "--candidate", "log", "--replays", "2", "--steps", "16",
                                      "--new-searches", "8"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "1 of its 17 measured children beat their parent" in said
    assert f"{imp[1]['prior_weight']:.0%} of its law rests on a prior (assumed)" in said


def test_a_candidates_budget_cuts_the_steps(oe_pair):
    out = gfsim.plan(str(oe_pair[0]), "candidates=6", ["log", "all@2"], replays=2,
                     new_searches=4, steps=16)
    f1, f2 = out["configs"]
    assert f1["p_budget_exhausted"] == f2["p_budget_exhausted"] == 1.0
    # 6 candidates: 6 steps at F 1, 3 at F 2; the shorter search spends less
    assert f2["wall_s"]["mean"] < f1["wall_s"]["mean"]
    with pytest.raises(GfsimError, match="fewer than one step"):
        gfsim.plan(str(oe_pair[0]), "candidates=1", ["all@2"], replays=2, new_searches=4)


def test_a_plan_from_one_real_run_covers_the_dollars_and_best_of_its_sister_run(oe_pair):
    """Held-out pairs: plan from one OpenEvolve run (16 planned steps, as both ran) and check
    the other run's dollars and best speedup against the 90% interval, both ways. The first
    run found a 1.64x kernel, the second nothing beyond noise (1.003x): planned from the
    second, the best rests partly on the improvement prior; from the first, the interval
    reaches down to the seed, as 4 of its 32 new searches found nothing."""
    actual = {}
    for path in oe_pair:
        r = gfsim.compare(str(path), "all", driver="closed").to_dict()
        actual[path] = r
    for a, b in (oe_pair, oe_pair[::-1]):
        row = gfsim.plan(str(a), "usd=1", ["log"], steps=16)["configs"][0]
        for key in ("usd", "best_speedup"):
            got = row[key]
            assert got["lo"] <= actual[b][key] <= got["hi"], (a.name, key, got, actual[b][key])


def test_a_plan_from_one_real_shinka_run_covers_the_dollars_of_its_sister_run(tmp_path):
    """The two real ShinkaEvolve 0.0.7 runs of the same configuration (10 generations, seeds 0
    and 1: tests/data/shinka and tests/data/shinka-sister), planned from each other: the
    dollars and best speedups are covered both ways: the run with no improving child (6
    measured) leans on the improvement prior for its sister's 1.76x, the other's interval
    holds its sister's 1.0x."""
    from gfsim.importers.shinka import import_shinka

    paths = []
    for name in ("shinka", "shinka-sister"):
        paths.append(tmp_path / f"{name}.jsonl")
        import_shinka(DATA / name / "run", paths[-1])
    actual = {p: gfsim.compare(str(p), "all", driver="closed").to_dict() for p in paths}
    for a, b in (paths, paths[::-1]):
        out = gfsim.plan(str(a), "usd=5", ["log"])
        usd, best = out["configs"][0]["usd"], out["configs"][0]["best_speedup"]
        assert usd["lo"] <= actual[b]["usd"] <= usd["hi"], (a.name, usd, actual[b]["usd"])
        assert best["lo"] <= actual[b]["best_speedup"] <= best["hi"], (a.name, best)
        assert (best["improvement"]["prior_weight"] > 0) == out["evidence"][0]["few"]


def test_the_command_prints_each_figure_at_80_columns_and_its_json(oe_pair):
    runner = CliRunner()
    res = runner.invoke(app, ["plan", "--log", str(oe_pair[0]), "--log", str(oe_pair[1]),
                              "--budget", "usd=1", "--candidate", "log", "--replays", "2",
                              "--new-searches", "4"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    for words in ("USD", "GPU-hours", "wall-clock", "best speedup", "planned steps",
                  "token prices", "2 past runs' spread"):
        assert words in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    res = runner.invoke(app, ["plan", "--log", str(oe_pair[0]), "--budget", "gpu_hours=0.05",
                              "--candidate", "log", "--replays", "2", "--new-searches", "4",
                              "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)["configs"][0]
    for key in ("usd", "gpu_hours", "wall_s", "best_speedup"):
        assert set(row[key]) >= {"mean", "lo", "hi"}
        assert all(math.isfinite(row[key][k]) for k in ("mean", "lo", "hi"))
    assert 0.0 <= row["p_budget_exhausted"] <= 1.0
    res = runner.invoke(app, ["plan", "--log", str(oe_pair[0])])
    assert res.exit_code != 0 and "--budget" in res.output
    res = runner.invoke(app, ["plan", "--log", str(oe_pair[0]), "--budget", "usd=1",
                              "--prices", "paid"])
    assert res.exit_code != 0 and "--prices" in res.output


def test_the_improvement_law_is_the_one_its_experiment_fits():
    """``IMPROVEMENT_LAW`` is what ``experiments/fit_improvement_law.py --fit`` fits on the
    dev rows it keeps, and those rows are of logs with few improving children too."""
    import gzip
    import sys

    from gfsim.tuning.plan import FEW_IMPROVING, IMPROVEMENT_LAW

    sys.path.insert(0, str(DATA.parents[1] / "experiments"))
    from fit_improvement_law import fitted_law

    with gzip.open(DATA.parents[1] / "experiments" / "data" / "improvement_dev.json.gz",
                   "rt") as f:
        rows = json.load(f)
    assert sum(r["improving"] <= FEW_IMPROVING for r in rows) >= 50
    assert fitted_law(rows) == IMPROVEMENT_LAW
    assert list(IMPROVEMENT_LAW) == sorted(IMPROVEMENT_LAW) and IMPROVEMENT_LAW[0] > 0
