"""The counterfactual benchmark: does a replay of a log rank (policy, F) as the world does?

For each world seed w of a world (``gfsim.worlds.protocol``):

1. the standard search (paper-standard, every child measured, ``steps`` steps) is run on world
   w and written as an ordinary log, then read back through the validating reader;
2. the per-search USD budget is what that standard search spent (mean over the log's
   searches); every cell below runs under it, and under the same step limit;
3. each (policy, F) is *replayed* from the log with ``replay_seeds`` seeds (the seeds change
   the draws of borrowed children), and run *directly* on world w with ``direct_reps``
   replicates: fresh sets of the world's draws (replicate r asks the world for child index
   r * 1,000,000 + ...; replicate 0, the log's own draws, is never used as truth). A policy that
   must be fitted (``threshold:coverage=..``) is fitted on the log's forecasts in both.

A cell's value for world seed w is the mean over the world's tasks of log2 best speedup. From
the matrix of cells x world seeds:

- per cell: replay and direct means with 95% t-intervals over world seeds; the bias (replay -
  direct, paired by world seed) with its 95% t-interval; draw shares; GPU evaluations and USD;
  standard errors over world seeds, each world's mean over cells removed (rankings compare
  cells within a world, so the between-world level cancels), flagged above 0.04 log2;
- the *noise ceiling*: Kendall tau-b between the cell means of two independent halves of the
  direct runs (odd and even replicates);
- Kendall tau-b against the direct cell means, and the share of cell pairs whose direct
  difference exceeds 0.1 log2 ordered the same way, of two rankings: the recommendation's
  (``ranking_gain``: the mean of the expected gain and the replays' gain, averaged over world
  seeds; what the targets score) and the replays' alone;
- *regret*: for each log (world seed w) the replay's recommendation (``recommend``: among the
  cells whose expected gain over the incumbent, always F = 1 ``all`` (``expected_gain`` of the
  fresh searches where there are, the replay seeds' otherwise), is adoptable (above 0 at
  one-sided 90%, or at least ``LARGE_GAIN`` and above 0 at ``LARGE_LEVEL``), the one with the
  largest mean of it and the replays' mean gain; else the incumbent), scored by the direct means of
  the *other* world seeds (held out from that pick): 1 - 2 ** (direct(pick) - max over cells
  of direct), beside the same for the plain argmax of the replay means and for always F = 1
  ``all``;
- *coverage*: for each (world seed, cell) the replay's predictive interval for a new search (a
  prediction interval from its replay seeds, mean +- t * sd * sqrt(1 + 1/n); with a world model
  each replay seed is another ensemble member, so the spread holds the model's uncertainty as
  well as the seed noise) and whether it covers each direct run of that world seed (each is
  one new search): at 50, 80, 90 and 95% (the calibration curve), the 90% one's share per
  world seed, median width and mean interval score (width + 20 x the miss, Gneiting and
  Raftery's score at alpha = 0.1); beside it, the 90% interval's coverage of the direct mean
  (what it measured before issue 40) and the coverage of the 90% interval of each cell's gain
  over the incumbent, paired by replay seed, against the direct runs' gains, paired by
  replicate;
- the two gain intervals' calibration curves (50/80/90/95%): each cell's expected-gain
  interval against the other world seeds' mean gain, one new search's gain interval against
  each direct run's gain.

Everything but the Kernel Tuner worlds' runtimes is SYNTHETIC, and says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from gfsim.core.durable import temporary
from gfsim.core.errors import GfsimError
from gfsim.simulator.predictive import (
    expected_gain,
    log2_best,
    log_surprise,
    new_search_gain,
    predictive_interval,
    ranking_gain,
    recommend,
)

__all__ = ["BenchSpec", "run_world_seed", "summarize_world", "targets", "compare_sources",
           "INCUMBENT", "LEVELS",
           "DEFAULT_POLICIES",
           "DEFAULT_OVERGENS", "SE_TARGET", "PAIR_MARGIN"]

DEFAULT_POLICIES = ("all", "topk:4", "threshold:0.7", "threshold:coverage=0.5", "ev:10")
DEFAULT_OVERGENS = (1, 2, 4, 8)
SE_TARGET = 0.04  # log2: a cell's standard error should not exceed this
PAIR_MARGIN = 0.1  # log2: pairs whose direct difference exceeds this must be ordered right
_T_CRIT: dict[int, float] = {}


@dataclass(frozen=True)
class BenchSpec:
    """What one benchmark run does (the CLI's options)."""

    policies: tuple[str, ...] = DEFAULT_POLICIES
    overgens: tuple[int, ...] = DEFAULT_OVERGENS
    steps: int = 40
    cost: str = "serverless-a100"
    replay_seeds: int = 4
    direct_reps: int = 2
    # child sources, each replayed against one truth (a comma-separated string is split)
    children: tuple[str, ...] | str = ("model",)
    # New searches simulated wholly on the world model (--children fresh) per cell: the spread
    # of a new search's outcome for the predictive intervals (0: the replay seeds' alone)
    fresh_seeds: int = 6
    # None: policies read the world's what-if forecasts; the learned forecaster's spec
    # (learned[:k=v], alias costmodel): they read its forecasts, learned in each search (direct
    # and replayed) as it measures
    forecaster: str | None = None

    def __post_init__(self):
        if self.forecaster is not None:
            from gfsim.forecasts.registry import kind_of, make_forecaster

            if kind_of(self.forecaster) != "learned":
                raise GfsimError(f"`forecaster` {self.forecaster!r}: a world's searches read "
                                 "its own what-if forecasts, or the learned forecaster's "
                                 "(learned[:k=v,...])")
            make_forecaster(self.forecaster)
        if isinstance(self.children, str):
            object.__setattr__(self, "children",
                               tuple(c.strip() for c in self.children.split(",") if c.strip()))
        if not self.children or len(set(self.children)) != len(self.children):
            raise GfsimError("`children`: name one or more child sources, each once")
        from gfsim.simulator.world_model import check_children

        for c in self.children:
            check_children(c)
        for name, v, lo in (("`steps`", self.steps, 1), ("`replay_seeds`", self.replay_seeds, 1),
                            ("`direct_reps`", self.direct_reps, 2),
                            ("`fresh_seeds`", self.fresh_seeds, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise GfsimError(f"{name} must be a whole number >= {lo}, got {v!r}")
        if self.direct_reps > 999:
            raise GfsimError("`direct_reps` must be at most 999")
        if not self.policies or not self.overgens:
            raise GfsimError("`policies` and `overgen` must name at least one each")
        for f in self.overgens:
            if isinstance(f, bool) or not isinstance(f, int) or not 1 <= f <= 64:
                raise GfsimError(f"`overgen`: factors are whole numbers in 1..64, got {f!r}")
        if len(set(self.cells)) != len(self.cells):
            raise GfsimError("`policies` / `overgen`: a configuration is given twice")
        if len(self.cells) < 2:
            raise GfsimError("need at least two (policy, F) configurations to rank")

    @property
    def cells(self) -> list[tuple[str, int]]:
        return [(p, f) for p in self.policies for f in self.overgens]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["policies"], d["overgens"] = list(self.policies), list(self.overgens)
        d["children"] = list(self.children)
        return d


@dataclass
class _Cell:
    # Per child source: per replay seed, the mean over tasks of log2 best; draws and sums.
    replay: dict = field(default_factory=dict)
    direct: list = field(default_factory=list)  # per replicate
    draws: dict = field(default_factory=dict)
    replay_evals: dict = field(default_factory=dict)
    direct_evals: float = 0.0
    replay_usd: dict = field(default_factory=dict)
    direct_usd: float = 0.0
    fresh: list = field(default_factory=list)  # per fresh seed (BenchSpec.fresh_seeds)


def _search_config(steps: int, overgen: int):
    from gfsim.simulator.closed.engine import SEARCH_PRESETS

    return replace(SEARCH_PRESETS["paper-standard"], steps=steps, overgen=overgen)


def _log_of(world, world_seed: int, steps: int, name: str):
    from gfsim.replay_logs import LogWriter, load_log
    from gfsim.worlds.synth_puct import world_log_records

    records = world_log_records(world, seed=world_seed, steps=steps,
                                log_id=f"counterfactual-seed{world_seed}",
                                command=f"gfsim synth --world {name} --seed {world_seed} "
                                        f"--driver puct --steps {steps}")
    with temporary("gfsim-cf-") as tmp:  # (a killed run's is removed by the next)
        path = Path(tmp) / f"world-{world_seed}.jsonl"
        with LogWriter(path) as w:
            w.append_many(records)
        return load_log(path, cache=False)


def run_world_seed(world_spec: str, world_seed: int, spec: BenchSpec) -> dict:
    """Every cell of one world seed: the log, its replays and the direct runs (module doc)."""
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy
    from gfsim.simulator import Budget, build_traces
    from gfsim.simulator.replay import calibration_batch, replay_many
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import run_on_world_many

    name, factory, _ = resolve_world(world_spec)
    world = factory(world_seed)
    log = _log_of(world, world_seed, spec.steps, name)
    model = load_cost_model(spec.cost)
    std = replay_many(log, [make_policy("all")], model, [0], driver="puct",
                      search=_search_config(spec.steps, 1))[0]
    usd = float(np.mean([s.total.usd for s in std.searches]))
    budget = Budget(usd=usd)
    learning, forecaster = None, None
    if spec.forecaster is not None:  # the log's own prequential forecasts fit the policies
        from gfsim.forecasts.registry import make_forecaster

        learning = make_forecaster(spec.forecaster)
        log, forecaster = learning.attach(log), learning.name
    batch = calibration_batch(build_traces(log, model, forecaster))
    cells = {c: _Cell() for c in spec.cells}
    tasks = [t.task_id for t in world.tasks]
    reps = list(range(spec.replay_seeds))
    for children in spec.children:
        for f in spec.overgens:
            config = _search_config(spec.steps, f)
            policies = [make_policy(p) for p in spec.policies for _ in reps]
            seeds = [q for _ in spec.policies for q in reps]
            results = replay_many(log, policies, model, seeds, budget=budget, driver="puct",
                                  search=config, children=children, forecaster=forecaster,
                                  learning=learning)
            for k, res in enumerate(results):
                cell = cells[(spec.policies[k // len(reps)], f)]
                cell.replay.setdefault(children, []).append(log2_best(res))
                draws = cell.draws.setdefault(children, {})
                for s in res.searches:
                    for src, n in s.extra["draws"].items():
                        draws[src] = draws.get(src, 0) + n
                n_s = len(res.searches)
                cell.replay_evals[children] = cell.replay_evals.get(children, 0.0) + \
                    sum(s.gpu_evals for s in res.searches) / n_s / len(reps)
                cell.replay_usd[children] = cell.replay_usd.get(children, 0.0) + \
                    sum(s.total.usd for s in res.searches) / n_s / len(reps)
    fresh = list(range(spec.fresh_seeds))
    for f in spec.overgens if fresh else ():  # new searches on the world model
        config = _search_config(spec.steps, f)
        results = replay_many(log, [make_policy(p) for p in spec.policies for _ in fresh], model,
                              [q for _ in spec.policies for q in fresh], budget=budget,
                              driver="puct", search=config, children="fresh",
                              forecaster=forecaster, learning=learning)
        for k, res in enumerate(results):
            cells[(spec.policies[k // len(fresh)], f)].fresh.append(log2_best(res))
    caches = {t: {} for t in tasks}
    for r in range(1, spec.direct_reps + 1):
        # Every direct search of this replicate stepped together (run_on_world_many).
        searches, of = [], []
        for p in spec.policies:
            policy = make_policy(p)
            policy.fit(batch, r)
            for f in spec.overgens:
                config = _search_config(spec.steps, f)
                searches += [(t, config, policy) for t in tasks]
                of += [(p, f)] * len(tasks)
        results = run_on_world_many(world, searches, seed=r, cost=spec.cost, budget=budget,
                                    capacities=model.capacities, replicate=r, caches=caches,
                                    keep_records=False, learning=learning)
        by_cell: dict = {}
        for key, res in zip(of, results):
            by_cell.setdefault(key, []).append(res)
        for key, done in by_cell.items():
            cell = cells[key]
            cell.direct.append(float(np.mean([math.log2(x.best_speedup) for x in done])))
            cell.direct_evals += sum(x.gpu_evals for x in done) / len(tasks)
            cell.direct_usd += sum(x.total.usd for x in done) / len(tasks)
    out = {"world": name, "world_seed": world_seed, "usd_budget": usd,
           "tasks": tasks, "kind": world.provenance().get("kind", "synthetic"), "cells": []}
    for (p, f), c in cells.items():
        shares = {}
        for children, draws in c.draws.items():
            total = sum(draws.values()) or 1
            shares[children] = {k: v / total for k, v in draws.items()}
        out["cells"].append({
            "policy": p, "overgen": f, "replay": c.replay, "direct": c.direct,
            "draw_shares": shares, "replay_evals": c.replay_evals,
            "direct_evals": c.direct_evals / spec.direct_reps,
            "replay_usd": c.replay_usd, "direct_usd": c.direct_usd / spec.direct_reps,
            "fresh": c.fresh,
        })
    return out


# --- the measures -------------------------------------------------------------------------------

def _t(n: int) -> float:
    """The two-sided 95% Student-t critical value for n - 1 degrees of freedom."""
    if n not in _T_CRIT:
        from scipy.stats import t

        _T_CRIT[n] = float(t.ppf(0.975, n - 1)) if n > 1 else math.nan
    return _T_CRIT[n]


def _mean_ci(x: np.ndarray) -> dict:
    n = len(x)
    m = float(np.mean(x))
    se = float(np.std(x, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    h = _t(n) * se if n > 1 else math.nan
    return {"mean": m, "lo": m - h, "hi": m + h, "se": se}


def _tau(a, b) -> float:
    from scipy.stats import kendalltau

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(kendalltau(a, b).statistic)


def _pairs_ordered(a: np.ndarray, direct: np.ndarray) -> tuple[int, int]:
    """(the cell pairs whose direct means differ by more than ``PAIR_MARGIN``, how many of
    them ``a`` orders the same way)."""
    pairs = correct = 0
    for i in range(len(direct)):
        for j in range(i + 1, len(direct)):
            d = direct[i] - direct[j]
            if abs(d) > PAIR_MARGIN:
                pairs += 1
                correct += int(np.sign(a[i] - a[j]) == np.sign(d))
    return pairs, correct


def summarize_world(rows: list[dict], spec: BenchSpec, children: str | None = None) -> dict:
    """The benchmark's measures for one world and one child source (the first of the spec's
    unless ``children``) from its ``run_world_seed`` rows (module doc)."""
    children = children or spec.children[0]
    rows = sorted(rows, key=lambda r: r["world_seed"])
    cells = spec.cells
    n_w, n_c = len(rows), len(cells)
    index = {c: i for i, c in enumerate(cells)}
    rq = np.full((n_w, n_c, spec.replay_seeds), np.nan)
    dr = np.full((n_w, n_c, spec.direct_reps), np.nan)
    n_f = min((len(c.get("fresh") or ()) for row in rows for c in row["cells"]), default=0)
    fz = np.full((n_w, n_c, n_f), np.nan) if n_f >= 2 else None  # new searches on the model
    extra = [[None] * n_c for _ in range(n_w)]
    for w, row in enumerate(rows):
        for c in row["cells"]:
            i = index[(c["policy"], c["overgen"])]
            rq[w, i] = c["replay"][children]
            dr[w, i] = c["direct"]
            if fz is not None:
                fz[w, i] = c["fresh"][:n_f]
            extra[w][i] = {**c, "draw_shares": c["draw_shares"][children],
                           "replay_evals": c["replay_evals"][children],
                           "replay_usd": c["replay_usd"][children]}
    rp = rq.mean(axis=2)  # replay value per (world seed, cell)
    dm = dr.mean(axis=2)  # direct mean per (world seed, cell)
    out_cells = []
    warnings = []
    for i, (p, f) in enumerate(cells):
        bias = rp[:, i] - dm[:, i]
        centred_d = dm[:, i] - dm.mean(axis=1)
        centred_r = rp[:, i] - rp.mean(axis=1)
        se = {k: float(np.std(v, ddof=1) / math.sqrt(n_w)) if n_w > 1 else math.nan
              for k, v in (("direct", centred_d), ("replay", centred_r), ("bias", bias))}
        shares: dict = {}
        for w in range(n_w):
            for k, v in extra[w][i]["draw_shares"].items():
                shares[k] = shares.get(k, 0.0) + v / n_w
        out_cells.append({
            "policy": p, "overgen": f,
            "replay_log2": _mean_ci(rp[:, i]), "direct_log2": _mean_ci(dm[:, i]),
            "bias_log2": _mean_ci(bias), "se": se,
            "draw_shares": {k: round(v, 6) for k, v in shares.items() if v > 0},
            "fallback_share": shares.get("fallback", 0.0),
            "invented_share": shares.get("fallback", 0.0) + shares.get("model", 0.0),
            "replay_gpu_evals": float(np.mean([extra[w][i]["replay_evals"] for w in range(n_w)])),
            "direct_gpu_evals": float(np.mean([extra[w][i]["direct_evals"] for w in range(n_w)])),
            "replay_usd": float(np.mean([extra[w][i]["replay_usd"] for w in range(n_w)])),
            "direct_usd": float(np.mean([extra[w][i]["direct_usd"] for w in range(n_w)])),
        })
    replay_mean, direct_mean = rp.mean(axis=0), dm.mean(axis=0)
    half_a = dr[:, :, 0::2].mean(axis=2).mean(axis=0)
    half_b = dr[:, :, 1::2].mean(axis=2).mean(axis=0)
    pairs, correct = _pairs_ordered(replay_mean, direct_mean)
    base = index.get(INCUMBENT)
    gain = _gains(rq, base)  # per (world seed, cell): the replay's gain over the incumbent
    fresh_gain = _gains(fz, base) if fz is not None else None
    # What the recommendation ranks the cells by (the mean of the expected gain and the
    # replays' gain), averaged over world seeds; the replays' means without an incumbent.
    if base is None:
        ranked = replay_mean
    else:
        ranked = ranking_gain(expected_gain(gain, fresh_gain).mean, gain).mean(axis=0)
    _, ranked_correct = _pairs_ordered(ranked, direct_mean)
    regret, regret_argmax, regret_base, picks = [], [], [], []
    if n_w > 1:
        for w in range(n_w):
            held = np.delete(dm, w, axis=0).mean(axis=0)
            pick = recommend(gain[w], base, fresh=None if fresh_gain is None else
                             fresh_gain[w]) if base is not None else int(np.argmax(rp[w]))
            top = int(np.argmax(rp[w]))
            picks.append(cells[pick])
            regret.append(1.0 - 2.0 ** (held[pick] - held.max()))
            regret_argmax.append(1.0 - 2.0 ** (held[top] - held.max()))
            if base is not None:
                regret_base.append(1.0 - 2.0 ** (held[base] - held.max()))
    # Predictive intervals against each direct run (a new search), at every level. The log is
    # the world's standard search: the incumbent's replays are the log, and its fresh searches
    # the model's new searches of it (the log's surprise, per world seed).
    surprise = 1.0
    if fz is not None and base is not None:
        surprise = log_surprise(rq[:, base].mean(axis=-1), fz[:, base])[:, None]
    curve, curve_replay = {}, {}
    for level in LEVELS:
        for into, f in ((curve, fz), (curve_replay, None)):
            lo_l, hi_l = predictive_interval(rq, f, level, surprise=surprise)
            into[f"{level:.2f}"] = float(((lo_l[..., None] <= dr)
                                          & (dr <= hi_l[..., None])).mean())
    lo, hi = predictive_interval(rq, fz, surprise=surprise)
    covered = (lo[..., None] <= dr) & (dr <= hi[..., None])  # (world seed, cell, direct run)
    miss = np.maximum(lo[..., None] - dr, 0.0) + np.maximum(dr - hi[..., None], 0.0)
    score = (hi - lo)[..., None] + (2.0 / 0.1) * miss
    per_seed_cov = covered.mean(axis=(1, 2))
    of_mean = (lo <= dm) & (dm <= hi)
    gain_curve = {f"{lv:.2f}": _difference_coverage(rq, dr, base, fz, lv) for lv in LEVELS}
    expected_curve = {f"{lv:.2f}": _expected_coverage(rq, dm, base, fz, lv) for lv in LEVELS}
    worst = max(max(c["se"]["direct"], c["se"]["replay"], c["se"]["bias"]) for c in out_cells)
    worst_direct = max(c["se"]["direct"] for c in out_cells)
    if not worst <= SE_TARGET:
        if math.isfinite(worst):
            need = math.ceil(n_w * (worst / SE_TARGET) ** 2)
            need_d = math.ceil(n_w * (worst_direct / SE_TARGET) ** 2)
            warnings.append(
                f"a cell's standard error reaches {worst:.3f} log2 (direct runs alone: "
                f"{worst_direct:.3f}), above {SE_TARGET}: about {need} world seeds would bring "
                f"every cell under ({max(need_d, n_w)} the direct runs alone)")
        else:
            warnings.append("too few world seeds to estimate a standard error")
    best = int(np.argmax(direct_mean))
    measures = {
        "world_seeds": n_w,
        "noise_ceiling_tau": _tau(half_a, half_b),
        "tau": _tau(replay_mean, direct_mean),
        "pairs_over_margin": pairs,
        "pairs_ordered": (correct / pairs) if pairs else math.nan,
        "ranking_tau": _tau(ranked, direct_mean),
        "ranking_pairs_ordered": (ranked_correct / pairs) if pairs else math.nan,
        "regret_of_replay_pick": float(np.mean(regret)) if regret else math.nan,
        "regret_of_argmax": float(np.mean(regret_argmax)) if regret_argmax else math.nan,
        "regret_of_all_f1": float(np.mean(regret_base)) if regret_base else math.nan,
        "replay_picks": {f"{p} F={f}": picks.count((p, f)) for p, f in dict.fromkeys(picks)},
        "direct_best": {"policy": cells[best][0], "overgen": cells[best][1],
                        "log2": float(direct_mean[best])},
        "coverage_90": float(covered.mean()),
        "log_surprise": ({"median": float(np.median(surprise)), "max": float(np.max(surprise))}
                         if np.ndim(surprise) else None),
        "coverage_curve": curve,
        "coverage_curve_replay_spread": curve_replay,
        "fresh_seeds": n_f if fz is not None else 0,
        "coverage_90_of_direct_mean": float(of_mean.mean()),
        "coverage_90_difference": gain_curve["0.90"],
        "new_search_gain_curve": gain_curve,
        "expected_gain_curve": expected_curve,
        "coverage_90_per_seed": {"min": float(per_seed_cov.min()),
                                 "median": float(np.median(per_seed_cov)),
                                 "max": float(per_seed_cov.max())},
        "interval_width_median": float(np.median(hi - lo)),
        "interval_score_mean": float(score.mean()),
        "max_cell_se": worst,
        "max_direct_se": worst_direct,
    }
    measures["targets"] = targets(measures, out_cells)
    first = rows[0]
    return {"world": first["world"], "children": children, "kind": first["kind"],
            "tasks": first["tasks"],
            "world_seeds": [r["world_seed"] for r in rows],
            "usd_budget_mean": float(np.mean([r["usd_budget"] for r in rows])),
            "cells": out_cells, "measures": measures, "warnings": warnings}


# The incumbent a recommendation is judged against: measure every child at F = 1.
INCUMBENT = ("all", 1)
LEVELS = (0.5, 0.8, 0.9, 0.95)  # the predictive intervals' levels on the calibration curve


def _gains(rq: np.ndarray, base: int | None) -> np.ndarray:
    """Per (world seed, cell), the replay seeds' gains over the incumbent (log2), paired by
    replay seed (common random numbers: the same seed draws the same children where the two
    searches meet the same nodes); NaN without an incumbent among the cells."""
    if base is None:
        return np.full(rq.shape, np.nan)
    return rq - rq[:, base:base + 1, :]


def _difference_coverage(rq: np.ndarray, dr: np.ndarray, base: int | None,
                         fz: np.ndarray | None = None, level: float = 0.9) -> float:
    """How often the ``level`` predictive interval of one new search's gain over the incumbent
    (``new_search_gain``: centred on the expected gain, spread by one search's variance; the
    replay seeds' own interval without fresh searches) covers a direct run's gain (the same
    replicate of both: the world's common draws), over world seeds, cells other than the
    incumbent and direct runs; NaN without an incumbent."""
    if base is None or rq.shape[1] < 2:
        return math.nan
    _, lo, hi = new_search_gain(_gains(rq, base),
                                None if fz is None else _gains(fz, base), level)
    truth = dr - dr[:, base:base + 1, :]
    covered = (lo[..., None] <= truth) & (truth <= hi[..., None])
    return float(np.delete(covered, base, axis=1).mean())


def _expected_coverage(rq: np.ndarray, dm: np.ndarray, base: int | None,
                       fz: np.ndarray | None, level: float) -> float:
    """How often the ``level`` interval of a cell's expected gain over the incumbent
    (``expected_gain``, from each log) covers the world's mean gain measured by the direct
    runs of the *other* world seeds (the truth the recommendation's regret is scored on),
    over world seeds and cells other than the incumbent; NaN without an incumbent or with
    fewer than two world seeds."""
    n_w = rq.shape[0]
    if base is None or rq.shape[1] < 2 or n_w < 2:
        return math.nan
    got = expected_gain(_gains(rq, base), None if fz is None else _gains(fz, base), level)
    covered = []
    for w in range(n_w):
        held = np.delete(dm, w, axis=0).mean(axis=0)
        truth = held - held[base]
        covered.append(np.delete((got.lo[w] <= truth) & (truth <= got.hi[w]), base))
    return float(np.mean(covered))


# The world model's targets (issue 21, then issue 40): each is met, or missed by the stated
# amount.
TAU_SHARE = 0.8  # the recommendation's ranking: tau >= this x the noise ceiling
PAIRS_TARGET = 0.9  # share of clear pairs it orders right
BIAS_BOUND = 0.15  # log2: every cell's 95% bias interval inside +- this
REGRET_TARGET = 0.05
REGRET_SLACK = 0.005  # the recommendation may lose this much to always F = 1 all
COVERAGE_RANGE = (0.85, 0.95)
CALIBRATION_SLACK = 0.05  # the 50, 80 and 95% intervals' coverage within this of nominal
_EPS = 1e-9  # a share of 1.0 is 0.05 from 0.95 (not 0.05000000000000004 away)


def targets(m: dict, cells: list[dict]) -> dict:
    """Each target as {"met": bool or None (not measurable), "value", "target", "miss"}; "miss"
    is how far the value is from the target (0 when met)."""
    def check(value, ok, target, miss):
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return {"met": None, "value": None, "target": target, "miss": None}
        return {"met": bool(ok), "value": value, "target": target,
                "miss": 0.0 if ok else float(miss)}

    out = {}
    # The ranking targets score what the recommendation ranks by (``ranking_tau``: the mean of
    # the expected gain and the replays' gain); the replays' own order rides along.
    ceiling = m["noise_ceiling_tau"]
    tau = m.get("ranking_tau", m["tau"])
    if math.isfinite(ceiling) and math.isfinite(tau):
        want = TAU_SHARE * ceiling
        out["tau"] = check(tau, tau >= want, f">= {want:.2f}", want - tau)
    else:
        out["tau"] = check(None, False, f">= {TAU_SHARE} x ceiling", None)
    out["tau"]["replays"] = m["tau"]
    p = m.get("ranking_pairs_ordered", m["pairs_ordered"])
    out["pairs_ordered"] = check(p, math.isfinite(p) and p >= PAIRS_TARGET,
                                 f">= {PAIRS_TARGET:.0%}", PAIRS_TARGET - p)
    out["pairs_ordered"]["replays"] = m["pairs_ordered"]
    outside = [max(c["bias_log2"]["hi"] - BIAS_BOUND, -BIAS_BOUND - c["bias_log2"]["lo"], 0.0)
               for c in cells]
    outside = [x for x in outside if math.isfinite(x)]
    out["bias_interval"] = check(
        float(sum(x > 0 for x in outside)) if outside else None, not any(x > 0 for x in outside),
        f"every cell's 95% interval within +-{BIAS_BOUND} log2 (value: cells outside)",
        max(outside, default=0.0))
    r = m["regret_of_replay_pick"]
    base = m["regret_of_all_f1"]
    bound = min(REGRET_TARGET, base + REGRET_SLACK) if math.isfinite(base) else REGRET_TARGET
    out["regret"] = check(r, r <= bound,
                          f"<= {REGRET_TARGET:.0%} and <= always F=1 all ({base:.1%}) + "
                          f"{REGRET_SLACK:.1%}", r - bound)
    cov = m["coverage_90"]
    lo, hi = COVERAGE_RANGE
    out["coverage"] = check(cov, lo - _EPS <= cov <= hi + _EPS, f"{lo:.0%}-{hi:.0%}",
                            max(lo - cov, cov - hi, 0.0))
    curve = m.get("coverage_curve", {})
    off = [abs(v - float(k)) for k, v in curve.items() if k != "0.90" and math.isfinite(v)]
    out["calibration"] = check(max(off) if off else None,
                               bool(off) and max(off) <= CALIBRATION_SLACK + _EPS,
                               f"50/80/95% within {CALIBRATION_SLACK:.0%} of nominal "
                               "(value: the largest gap)",
                               (max(off) - CALIBRATION_SLACK) if off else None)
    for key, name in (("expected_gain_curve", "expected_gain"),
                      ("new_search_gain_curve", "new_search_gain")):
        gaps = [abs(v - float(k)) for k, v in m.get(key, {}).items() if math.isfinite(v)]
        out[name] = check(max(gaps) if gaps else None,
                          bool(gaps) and max(gaps) <= CALIBRATION_SLACK + _EPS,
                          f"50/80/90/95% each within {CALIBRATION_SLACK:.0%} of nominal "
                          "(value: the largest gap)",
                          (max(gaps) - CALIBRATION_SLACK) if gaps else None)
    return out


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def compare_sources(results: list[dict], reference: str = "fallback") -> dict:
    """Per world, whether each other child source beats ``reference`` on the headline measures
    (tau, pairs ordered, regret, worst cell bias, interval score; higher or lower as better);
    ``better`` is None where the two are even or a measure is not finite for either."""
    by = {}
    for w in results:
        by.setdefault(w["world"], {})[w["children"]] = w
    out = {}
    for world, sources in by.items():
        ref = sources.get(reference)
        if ref is None:
            continue
        for name, w in sources.items():
            if name == reference:
                continue
            a, b = w["measures"], ref["measures"]
            worst = {k: max(abs(c["bias_log2"]["mean"]) for c in v["cells"])
                     for k, v in (("a", w), ("b", ref))}
            # (this source's value, the reference's, whether higher is better)
            rows = {
                "tau": (a["tau"], b["tau"], True),
                "pairs_ordered": (a["pairs_ordered"], b["pairs_ordered"], True),
                "regret_of_replay_pick": (a["regret_of_replay_pick"],
                                          b["regret_of_replay_pick"], False),
                "max_abs_bias": (worst["a"], worst["b"], False),
                "interval_score": (a["interval_score_mean"], b["interval_score_mean"], False),
            }
            out.setdefault(world, {})[name] = {
                k: {"value": v, reference: r,
                    # None: even, or not measurable here (no pair clearly apart, say)
                    "better": ((v > r) if up else (v < r))
                    if _finite(v) and _finite(r) and v != r else None}
                for k, (v, r, up) in rows.items()}
    return out


def default_jobs() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def _job(spec: BenchSpec, item) -> dict:
    """One (world, seed) of the benchmark, with no cyclic garbage collection until it is done:
    its searches make hundreds of thousands of acyclic objects (children, plans, rows), and
    every collection walked all of them alive; each replay's own pause ended as it returned,
    so the next replay's first allocations paid a walk over the last one's survivors. Per
    job, 5-12% less time (nk-heavy 7.9 -> 7.3 s, kt-a100 4.1 -> 3.6 s), the same peak
    memory: a job leaves no cycles (a collection after one found none)."""
    from gfsim.core.memory import no_cyclic_gc

    world_spec, seed = item
    with no_cyclic_gc():
        return run_world_seed(world_spec, seed, spec)


def run_benchmark(worlds: list[str], seeds: list[int], spec: BenchSpec, *, jobs: int = 1,
                  executor=None, progress=None, rows_out: dict | None = None) -> list[dict]:
    """``summarize_world`` of every world and child source (world by world, sources in the
    spec's order), its seeds run on ``jobs`` processes, or by ``executor`` (a
    ``gfsim.core.executor.Executor`` whose shared input is ``spec``: a Ray cluster's);
    ``progress(done, total)`` after each (world, seed). The rows are the same, seed for seed,
    wherever they ran."""
    from gfsim.core.executor import make_executor

    work = [(w, s) for w in worlds for s in seeds]
    rows: dict[str, list[dict]] = {w: [] for w in worlds}
    own = executor is None
    if own:
        executor = make_executor(min(jobs, len(work)), shared=spec)
    try:
        for (world, _), row in zip(work, executor.map(_job, work, progress=progress)):
            rows[world].append(row)
    finally:
        if own:
            executor.close()
    if rows_out is not None:  # the raw rows, for measures recomputed later
        rows_out.update(rows)
    return [summarize_world(rows[w], spec, c) for w in worlds for c in spec.children]
