"""What the next search will cost and find, before it runs: ``gfsim plan``.

From past runs (one or more logs) and a budget (USD, GPU-hours or candidates), each
configuration (``POLICY@F``; ``log``: measure every child, each search in its own shape, the
runs as they ran) is predicted for one new search like the past ones:

- its dollars, split into LLM tokens (generation), forecasts and evaluations (compiling,
  cold starts, checks, timings, idle GPUs), its GPU-hours and its wall-clock;
- the best speedup the budget buys;
- the chance that the budget stops it before its planned steps.

Per log, a figure is centred on the log replayed under the configuration (``seeds``: the log's
own children first, its recorded seconds, tokens and outcomes; priced at the run's own token
prices where its folder recorded them, ``cost_models.paid``) and spread by searches simulated
wholly on the world model fitted to the log (``fresh_seeds``: every child invented, each a new
search), plus the centre's error and the two's disagreement: ``predictive.predictive_interval``
for the best speedup (its error law fitted on the counterfactual benchmark's dev worlds, and
the log's surprise; widened by ``BEST_SCALE``, fitted for the plan on short logs); the same
variance with a t quantile over the new searches (normal theory; the wall-clock's widened by
``COST_SCALE``) for dollars, hours and seconds. Several logs add
their run-to-run spread: the centres' variance, times 1 + 1/L. How often these intervals hold
a new search on the benchmark's worlds: ``experiments/plan_coverage.py``.

Past runs with ``FEW_IMPROVING`` or fewer children faster than their parent cannot show what a
new search may find: the world model invents children from their own steps. There the best
speedup's law is a mixture: the world model's, and with the weight the world model's searches
fall short of ``p_improve`` (the chance that a new search finds an improving child, from the
runs' measured and improving children), the seed's speedup times ``IMPROVEMENT_LAW`` (what
improving sister runs of such logs found on the benchmark's dev worlds: a prior, and the plan
says how much of the interval rests on it; ``experiments/fit_improvement_law.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from gfsim.core.errors import GfsimError, SpecError

__all__ = ["PlanBudget", "parse_plan_budget", "plan", "search_figures", "PLAN_KEYS",
           "REPLAYS", "NEW_SEARCHES", "COST_SCALE", "BEST_SCALE", "FEW_IMPROVING",
           "IMPROVED_LOG2", "IMPROVEMENT_LAW", "improving_children", "p_improve",
           "best_interval"]

REPLAYS = 8  # replays of each log per configuration (the centre)
NEW_SEARCHES = 32  # searches simulated wholly on the world model per log and configuration
PLAN_KEYS = ("usd", "gpu_hours", "candidates", "gpu_evals", "seconds", "joules")
# What a new search's dollars are made of: cost stages per part.
PARTS = {"llm": ("generation",), "forecasts": ("forecasting",),
         "evaluations": ("cold_start", "compilation", "check", "timing", "idle")}
_GPU_STAGES = ("cold_start", "check", "timing", "idle")  # compilation too on a GPU host
_FIGURES = ("usd", "usd_llm", "usd_forecasts", "usd_evaluations", "gpu_hours", "wall_s")
# The normal-theory interval of a new search's wall-clock covered 83% of the direct runs at
# 90% on the counterfactual benchmark's dev worlds (dollars 95%, GPU-hours 92%); widened 1.12x
# (fitted there) it covers 90% on dev, 89% on the held-out seeds and 90% on the measured H200
# worlds (experiments/plan_coverage.py; docs/how-to/plan-a-search.md).
COST_SCALE = {"wall_s": 1.12}
FEW_IMPROVING = 2  # a log with this many children faster than their parent, or fewer: warned
# The best speedup's interval, ``predictive_interval``'s law (fitted for recommendations on the
# benchmark's 40-step logs), covered 92% of sister runs at 90% from 40-step logs but 77-85% from
# logs of 2 to 24 steps, of one search or two, on the dev worlds (12 world seeds each): the
# world model fitted to a short log spreads new searches too little. Widened 1.3x (fitted
# there, over every length pooled) it holds 54 / 80 / 90 / 95% at 50 / 80 / 90 / 95%
# (experiments/plan_coverage.py --steps N [--one-task]; docs/how-to/plan-a-search.md).
BEST_SCALE = 1.3
IMPROVED_LOG2 = 0.01  # a search whose best passes its seed's by more (log2; 0.7%) improved
# What new searches that improved found (log2 of their best over their seed's speedup) where
# their past run had FEW_IMPROVING or fewer improving children: quantiles at 0, 0.05, ..., 1,
# from the sisters of 1-step to 24-step logs of one search on the counterfactual benchmark's
# dev worlds (SYNTHETIC but for the Kernel Tuner runtimes; experiments/fit_improvement_law.py
# --fit). A prior: the output says how much of the interval rests on it.
IMPROVEMENT_LAW = (0.02, 0.038, 0.055, 0.101, 0.129, 0.141, 0.158, 0.185, 0.187, 0.242, 0.323,
                   0.342, 0.404, 0.468, 0.63, 0.66, 0.735, 0.876, 1.026, 1.278, 2.273)


@dataclass(frozen=True)
class PlanBudget:
    """A plan's budget: the engines' ``Budget`` and, apart, a number of candidates (LLM
    proposals; each search's steps are cut to fit them, ``candidates // per step``)."""

    budget: object
    candidates: int | None
    text: str

    def as_dict(self) -> dict:
        return {**self.budget.as_dict(), "candidates": self.candidates}


def parse_plan_budget(text: str | None) -> PlanBudget:
    """``usd=5``, ``gpu_hours=2``, ``candidates=200`` (and ``gpu_evals``, ``seconds``,
    ``joules``), comma-separated; one line naming the key otherwise."""
    from gfsim.core.specs import parse_kv
    from gfsim.simulator import parse_budget

    if text is None or not text.strip():
        raise SpecError("`budget`: a plan needs a budget: usd=N, gpu_hours=H or candidates=N "
                        "(comma-separated to combine)")
    engine, candidates = [], None
    for key, raw in parse_kv(text, "budget"):
        if key not in PLAN_KEYS:
            raise SpecError(f"`budget`: unknown key {key!r}; valid: {', '.join(PLAN_KEYS)} "
                            "(the search's length is `steps`)")
        if key == "candidates":
            try:
                candidates = int(raw)
            except ValueError:
                candidates = 0
            if candidates < 1 or str(candidates) != raw.strip():
                raise SpecError(f"`budget`: candidates must be a whole number >= 1, got {raw!r}")
        else:
            engine.append(f"{key}={raw}")
    return PlanBudget(parse_budget(",".join(engine)), candidates, text.strip())


def search_figures(search, model) -> dict:
    """One replayed search's figures: dollars (total and per part), GPU-hours, wall-clock
    seconds, log2 best speedup, the imputed dollars, and whether a budget stopped it."""
    stages = search.stages
    usd = {part: sum(stages[s].usd for s in names) for part, names in PARTS.items()}
    gpu = _GPU_STAGES + (("compilation",) if model.compile_on == "gpu_host" else ())
    total = search.total
    return {"usd": total.usd, **{f"usd_{k}": v for k, v in usd.items()},
            "gpu_hours": sum(stages[s].seconds for s in gpu) / 3600.0,
            "wall_s": search.wall_s, "log2_best": math.log2(search.best_speedup),
            "log2_seed": math.log2(search.seed_speedup), "gpu_evals": search.gpu_evals,
            "usd_imputed": total.usd_imputed, "stopped": search.stopped_by is not None}


def _per_replay(results, model) -> dict[str, np.ndarray]:
    """Each figure per replay (seed): the mean over its searches (one new search like the
    log's); ``stopped``: the share of its searches a budget stopped."""
    rows = [[search_figures(s, model) for s in r.searches] for r in results]
    keys = (*_FIGURES, "log2_best", "log2_seed", "gpu_evals", "usd_imputed", "stopped")
    out = {k: np.array([np.mean([float(f[k]) for f in fs]) for fs in rows]) for k in keys}
    # (whether it improved: any of its searches, as a share of them)
    out["improved"] = np.array([np.mean([f["log2_best"] - f["log2_seed"] > IMPROVED_LOG2
                                         for f in fs]) for fs in rows])
    return out


def _centre_var(rq: np.ndarray, fz: np.ndarray, surprise: float = 1.0) -> tuple[float, float]:
    """``predictive_interval``'s centre and variance for one log: the replays' mean; a new
    search's spread, the centre's error and the disagreement between the two (times the log's
    surprise)."""
    n = len(rq)
    centre = float(rq.mean())
    var = (float(fz.var(ddof=1)) + (float(rq.var(ddof=1)) / n if n > 1 else 0.0)
           + (float(fz.mean()) - centre) ** 2) * surprise
    return centre, var


def _pooled(per_log: list[tuple[float, float]]) -> tuple[float, float]:
    """Several logs' (centre, variance) as one: their mean centre; their mean variance plus
    the run-to-run spread of the centres (times 1 + 1/L, the mean's own error)."""
    centres = np.array([c for c, _ in per_log])
    var = float(np.mean([v for _, v in per_log]))
    if len(per_log) > 1:
        var += float(centres.var(ddof=1)) * (1 + 1 / len(per_log))
    return float(centres.mean()), var


@dataclass
class _LogRun:
    """One log's inputs to a plan: its setup (priced as the run paid) and its prices'
    source."""

    log: object
    setup: object
    prices: dict

    @functools.cached_property
    def traces(self) -> list:
        """The log's traces under its setup's prices (a candidates budget's step count reads
        each search's shape from them), built once for every configuration."""
        from gfsim.simulator import build_traces

        return build_traces(self.log, self.setup.model)


def plan(logs: list, configs: list, model, budget: PlanBudget, *, steps: int | None = None,
         seeds=range(REPLAYS), fresh_seeds=range(REPLAYS, REPLAYS + NEW_SEARCHES),
         level: float = 0.9, children: str = "model", prices: bool = True,
         forecaster: str | None = None, simulate: bool = False, jobs: int = 1,
         cluster: str | None = None) -> dict:
    """The plan of ``configs`` (``recommend.Config``s, the incumbent first) for one new search
    like those of ``logs`` under ``budget`` and cost model ``model``: per configuration each
    figure's centre and ``level`` interval, what it rests on, and the chance that the budget
    stops the search early. ``steps``: each search's planned steps (None: its own).
    ``prices``: the generator's token prices as each run paid them where it recorded them.
    ``jobs`` processes, or the Ray cluster ``cluster`` names (``gfsim.core.executor``), replay
    the (configuration, log) cells; the same plan wherever they ran (``ran_on``)."""
    from gfsim.cost_models.paid import paid_generator
    from gfsim.tuning.trials import TrialSetup

    if not logs:
        raise GfsimError("a plan needs at least one past run (`log`)")
    if not 0.5 <= level < 1:
        raise GfsimError(f"`level` must be in [0.5, 1), got {level!r}")
    seeds, fresh_seeds = list(seeds), list(fresh_seeds)
    if len(fresh_seeds) < 2:
        raise GfsimError("`new_searches` must be at least 2: a new search's spread needs two")
    runs = []
    for log in logs:
        priced, source = paid_generator(model, log.header.get("generator")) if prices else \
            (model, {"source": f"the cost model's ({model.name}; --prices preset)"})
        setup = TrialSetup(log, priced, "all", "closed", budget.budget, seeds,
                           forecaster=forecaster, children=children, simulate=simulate)
        runs.append(_LogRun(log, setup, source))
    shared = _PlanInputs(runs, budget, seeds, fresh_seeds, children)
    cells = [(k, config.spec, config.search if steps is None else
              replace(config.search, steps=steps), j)
             for k, config in enumerate(configs) for j in range(len(runs))]
    from gfsim.core.executor import make_executor

    from gfsim.simulator.progress import ticked_map

    with make_executor(min(jobs, len(cells)), cluster, shared=shared) as executor:
        done = list(ticked_map(executor, _plan_cell, cells))
        ran_on = executor.describe()
    surprise = [got[4] for (k, *_), got in zip(cells, done) if k == 0]
    evidence = [{"log": r.log.display_name, **improving_children(r.traces)} for r in runs]
    together = {k: sum(e[k] for e in evidence)
                for k in ("measured_children", "improving_children")}
    rows = []
    for k, config in enumerate(configs):
        mine = [got for (i, *_), got in zip(cells, done) if i == k]
        rows.append(_row(config, [(rq, fz) for rq, fz, *_ in mine], [g[2] for g in mine],
                         [g[3] for g in mine], surprise, budget, level, k == 0, together))
    return {"level": level, "budget": budget.as_dict(), "logs": [r.log.display_name for r in runs],
            "prices": [{"log": r.log.display_name, **r.prices} for r in runs],
            "evidence": evidence,
            "replays_per_log": len(seeds), "new_searches_per_log": len(fresh_seeds),
            "log_surprise": surprise, "configs": rows, "over": _over(len(runs), len(seeds),
                                                                   len(fresh_seeds), level),
            "ran_on": ran_on}


def p_improve(measured: int, improving: int, children: float) -> float:
    """The chance that a new search measuring ``children`` children finds at least one
    faster than its parent, where a past run found ``improving`` of its ``measured``: the
    rate's posterior under Jeffreys' prior (Beta(1/2, 1/2)), integrated (a beta-binomial).
    On the benchmark's dev worlds it said 33% where 22% of sister runs improved (logs with no
    improving child) and 76% where 75% did (one or two)."""
    from scipy.special import betaln

    a, b = improving + 0.5, measured - improving + 0.5
    return float(-math.expm1(betaln(a, b + max(children, 0.0)) - betaln(a, b)))


def _law_cdf(x: float) -> float:
    """``IMPROVEMENT_LAW``'s cumulative probability at log2 gain ``x`` (linear between its
    quantiles)."""
    qs = IMPROVEMENT_LAW
    if x <= qs[0]:
        return 0.0
    if x >= qs[-1]:
        return 1.0
    return float(np.interp(x, qs, np.linspace(0.0, 1.0, len(qs))))


def best_interval(centre: float, var: float, level: float, weight: float = 0.0,
                  seed_log2: float = 0.0, no_gain: float = 0.0) -> tuple[float, float]:
    """The best speedup's ``level`` interval, in log2: the world model's law (a t law of
    ``predictive_interval``'s, centred on ``centre``, its variance ``var``, widened by
    ``BEST_SCALE``) and, with ``weight``, ``seed_log2`` plus ``IMPROVEMENT_LAW``. A search
    that improves on nothing ends at its seed's speedup (``seed_log2``): where that is the
    chance ``no_gain``, at least (1 - level) / 2, the interval reaches down to it."""
    lo, hi = _mixture_interval(centre, var, level, weight, seed_log2)
    if no_gain >= (1 - level) / 2:
        lo = min(lo, seed_log2)
    return lo, hi


def _mixture_interval(centre, var, level, weight, seed_log2) -> tuple[float, float]:
    from scipy.stats import t as student

    from gfsim.simulator.predictive import ERROR_DF, ERROR_SCALE, _t

    if weight <= 0 or not math.isfinite(var):  # (a law without a finite spread: all of it)
        half = BEST_SCALE * ERROR_SCALE * _t(0.5 + level / 2, ERROR_DF) * math.sqrt(var)
        return centre - half, centre + half
    scale = BEST_SCALE * ERROR_SCALE * math.sqrt(var)

    def cdf(x: float) -> float:
        own = float(student.cdf((x - centre) / scale, ERROR_DF)) if scale > 0 else \
            float(x >= centre)
        return (1 - weight) * own + weight * _law_cdf(x - seed_log2)

    wide = scale * _t(0.9995, ERROR_DF) + 1.0
    lo_x = min(centre - wide, seed_log2 + IMPROVEMENT_LAW[0]) - 1.0
    hi_x = max(centre + wide, seed_log2 + IMPROVEMENT_LAW[-1]) + 1.0

    def quantile(u: float) -> float:
        a, b = lo_x, hi_x
        for _ in range(60):  # bisection: 2^-60 of the bracket
            m = 0.5 * (a + b)
            if cdf(m) < u:
                a = m
            else:
                b = m
        return 0.5 * (a + b)

    return quantile((1 - level) / 2), quantile((1 + level) / 2)


def improving_children(traces) -> dict:
    """What a log shows of improvement: its measured children, and those faster than their
    parent (the seed kernel for a child of the seed). The world model invents children from
    the log's own steps, so a log with few improving children cannot predict a search that
    finds much more: ``FEW_IMPROVING`` or fewer and the plan says so."""
    measured = improving = 0
    for t in traces:
        for i, outcome in enumerate(t.outcome):
            if outcome is None:
                continue
            measured += 1
            parent = t.seed_speedup if t.parent[i] < 0 else t.speedup[t.parent[i]]
            improving += outcome == "success" and t.speedup[i] > parent
    return {"measured_children": measured, "improving_children": improving,
            "few": improving <= FEW_IMPROVING}


@dataclass
class _PlanInputs:
    """What every (configuration, log) cell of a plan reads."""

    runs: list
    budget: PlanBudget
    seeds: list
    fresh_seeds: list
    children: str


def _plan_cell(inputs: _PlanInputs, item) -> tuple:
    """One configuration replayed on one log (``item``: the configuration's index, spec and
    search, the log's index): its per-replay figures on the log's seeds and on
    new searches, whether the budget stopped each new search, what it rests on, and (for the
    incumbent, index 0) the log's surprise."""
    from gfsim.simulator.predictive import fresh_children, log_surprise

    k, spec, search, j = item
    run = inputs.runs[j]
    setup = _with_candidates(run, search, inputs.budget)
    rq_res = setup.replay(spec, search, inputs.seeds)
    rq = _per_replay(rq_res, run.setup.model)
    fz_res = setup.replay(spec, search, inputs.fresh_seeds,
                          children=fresh_children(inputs.children))
    fz = _per_replay(fz_res, run.setup.model)
    surprise = float(log_surprise(float(rq["log2_best"].mean()), fz["log2_best"])) \
        if k == 0 else None  # the incumbent (the runs as they ran): the log's surprise
    return rq, fz, fz["stopped"], _rests_on(rq_res, rq), surprise


def _with_candidates(run: _LogRun, search, budget: PlanBudget):
    """The log's setup with a candidates budget as a step limit: each search's steps cut to
    ``candidates // (parents x samples x F)``, where that is fewer than it plans."""
    if budget.candidates is None:
        return run.setup
    from gfsim.simulator.shape import shapes_for

    shapes = [s for s, _ in shapes_for(run.log, run.traces, search)]
    per_step = {s.parents_per_step * s.samples_per_parent * s.overgen for s in shapes}
    if len(per_step) > 1:
        raise GfsimError(f"`budget` candidates: the log's searches draw different numbers of "
                         f"candidates per step ({sorted(per_step)}); give usd= or gpu_hours=, "
                         "or plan from one search's log")
    fit = budget.candidates // per_step.pop()
    if fit < 1:
        raise GfsimError(f"`budget` candidates={budget.candidates}: fewer than one step's "
                         "candidates")
    if fit >= max(s.steps for s in shapes):
        return run.setup
    return replace(run.setup, budget=replace(run.setup.budget, steps=fit))


def _rests_on(results, rq) -> dict:
    """What a configuration's figures rest on in one log: the replays' invented children (the
    centre; the new searches invent all theirs) and their dollars priced from priors."""
    from gfsim.simulator.replay import draw_shares

    shares = draw_shares(results)
    usd = float(rq["usd"].mean())
    return {"invented_share": shares.get("invented_share", 0.0),
            "usd_imputed_share": float(rq["usd_imputed"].mean()) / usd if usd > 0 else 0.0}


def _row(config, per_log, stops, rests, surprise, budget, level, incumbent,
         evidence: dict) -> dict:
    """One configuration's plan: each figure's centre and interval, pooled over the logs
    (``evidence``: the logs' measured and improving children, together)."""
    from gfsim.simulator.predictive import _t

    m = min(len(fz["usd"]) for _, fz in per_log)
    q_cost = _t(0.5 + level / 2, m - 1)
    out: dict = {"config": config.label, "policy": config.spec,
                 "search": config.search.as_dict(), "incumbent": incumbent}
    for name in _FIGURES:
        centre, var = _pooled([_centre_var(rq[name], fz[name]) for rq, fz in per_log])
        half = q_cost * COST_SCALE.get(name, 1.0) * math.sqrt(var)
        hi = centre + half
        if name == "usd" and math.isfinite(budget.budget.usd):
            hi = min(hi, budget.budget.usd)  # a USD limit is never exceeded
        out[name] = {"mean": centre, "lo": max(0.0, centre - half), "hi": hi,
                     "sd": math.sqrt(var)}
    centre, var = _pooled([_centre_var(rq["log2_best"], fz["log2_best"], s)
                           for (rq, fz), s in zip(per_log, surprise or [1.0] * len(per_log))])
    improvement = _improvement(per_log, evidence)
    lo, hi = best_interval(centre, var, level, improvement["prior_weight"],
                           improvement["seed_log2"], improvement["no_gain"])
    w = improvement["prior_weight"]
    mean = centre if w <= 0 else (1 - w) * centre + w * (improvement["seed_log2"] + _law_mean())
    out["best_speedup"] = {"mean": 2.0 ** mean, "lo": 2.0 ** lo, "hi": 2.0 ** hi,
                           "centre_log2": centre, "sd_log2": math.sqrt(var),
                           "improvement": improvement}
    parts = {p: out.pop(f"usd_{p}") for p in PARTS}
    out["usd"] = {**out.pop("usd"), "parts": parts}
    for name in ("gpu_hours", "wall_s", "best_speedup"):  # (the JSON's order: dollars first)
        out[name] = out.pop(name)
    stopped = np.concatenate(stops)
    out["p_budget_exhausted"] = float(stopped.mean())
    out["rests_on"] = {
        "invented_share": float(np.mean([r["invented_share"] for r in rests])),
        "usd_imputed_share": float(np.mean([r["usd_imputed_share"] for r in rests])),
        "new_searches": "every child invented by the world model fitted to the log",
        "best_speedup_prior_weight": w}
    return out


def _law_mean() -> float:
    """``IMPROVEMENT_LAW``'s mean (linear between its quantiles: each span's midpoint)."""
    qs = np.asarray(IMPROVEMENT_LAW)
    return float(np.mean((qs[1:] + qs[:-1]) / 2))


def _improvement(per_log, evidence: dict) -> dict:
    """How much of a configuration's best-speedup law the improvement prior carries: where
    the logs together hold ``FEW_IMPROVING`` or fewer improving children, the chance that a
    new search of theirs finds one (``p_improve``, with the new searches' evaluations) less
    the share of the world model's new searches that did, if positive; else nothing. And the
    chance that a new search improves on nothing (``no_gain``): the world model's searches
    that did not, of what the prior leaves them."""
    evals = float(np.mean([fz["gpu_evals"].mean() for _, fz in per_log]))
    model = float(np.mean([fz["improved"].mean() for _, fz in per_log]))
    seed = float(np.mean([fz["log2_seed"].mean() for _, fz in per_log]))
    chance = p_improve(evidence["measured_children"], evidence["improving_children"], evals)
    few = evidence["improving_children"] <= FEW_IMPROVING
    weight = max(0.0, chance - model) if few else 0.0
    return {"p_improve": chance, "model_improved": model, "seed_log2": seed,
            "prior_weight": weight, "no_gain": (1 - weight) * (1 - model)}


def _over(logs: int, seeds: int, fresh: int, level: float) -> str:
    """What the intervals are over, in words."""
    runs = (f"the {logs} past runs' spread (their centres' variance) added, " if logs > 1
            else "one past run: no run-to-run spread is known; ")
    return (f"one new search like the past runs, at {level:.0%}: each figure centred on "
            f"{seeds} replays of each log (its own children, seconds and tokens first) and "
            f"spread by {fresh} searches per log simulated wholly on the world model fitted "
            f"to it, plus the centre's error and the two's disagreement; {runs}the best "
            "speedup's quantile fitted on the counterfactual benchmark's dev worlds (times "
            f"the log's surprise, widened {BEST_SCALE}x for the plan, fitted there too), the "
            "others' a t quantile over the new searches (normal theory; the wall-clock's "
            "widened 1.12x, fitted there too); where the logs hold "
            f"{FEW_IMPROVING} or fewer improving children, the best speedup's law also holds "
            "what improving new searches found there (a prior: best_speedup.improvement); "
            "p_budget_exhausted: the share of the new searches a budget stopped before their "
            "planned steps")
