"""Many replays of one log: seeds, and bootstrap intervals that say what they resample.

Seeds resample *one log*: the draws a replay makes (random policies, the puct driver's draws,
calibration splits) change, the log does not. An interval here describes that replay
variability, not the spread of a new search on a new problem, and every output says so.
Intervals are percentile bootstraps over tasks, then seeds (a resample picks tasks with
replacement, then seeds with replacement); a comparison with the baseline resamples the same
(task, seed) pairs for both sides, so it is paired by seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gfsim.core.rng import stream

__all__ = ["SeedTable", "summarize_seeds", "interval", "NOTE", "no_spread", "POINT_WORDS"]

NOTE = ("seeds resample one log: intervals are bootstrap 95% intervals over tasks, then seeds, "
        "of this log's replay variability, not of a new search's spread")
# What a zero-width interval is said as: the replays gave one figure, so there is no interval.
POINT_WORDS = "the replays cannot differ: a point value, no interval"
METRICS = ("best_speedup", "usd", "wall_s", "joules", "gpu_evals")
# Under measurement noise: the raw best re-measured, and its noise-free speedup.
NOISE_METRICS = ("confirmed_speedup", "true_best_speedup")


@dataclass
class SeedTable:
    """One value per (seed, task) for each metric; rows are seeds, columns tasks."""

    seeds: list[int]
    tasks: list[str]
    values: dict[str, np.ndarray]  # metric -> (n_seeds, n_tasks)

    @classmethod
    def from_results(cls, seeds, results) -> "SeedTable":
        """``results[i]`` is the ReplayResult of ``seeds[i]`` (one search per task)."""
        tasks = [r.task_id for r in results[0].searches]
        metrics = METRICS + (NOISE_METRICS if results[0].measure_noise else ())
        values = {m: np.zeros((len(seeds), len(tasks))) for m in metrics}
        for i, res in enumerate(results):
            for j, s in enumerate(res.searches):
                tot = s.total
                row = {"best_speedup": s.best_speedup, "usd": tot.usd, "wall_s": s.wall_s,
                       "joules": tot.joules, "gpu_evals": s.gpu_evals,
                       "confirmed_speedup": s.confirmed_speedup,
                       "true_best_speedup": s.true_best_speedup}
                for m in metrics:
                    values[m][i, j] = row[m]
        return cls(list(seeds), tasks, values)


def _per_seed(metric: str, block: np.ndarray) -> np.ndarray:
    """Across tasks (columns): the geometric mean of speedups, the sum of costs."""
    if metric.endswith("speedup"):
        return np.exp(np.log(block).mean(axis=1))
    return block.sum(axis=1)


def _aggregate(metric: str, block: np.ndarray) -> float:
    """Across tasks, then the mean over seeds (rows)."""
    return float(_per_seed(metric, block).mean())


def _bootstrap(metric, a: np.ndarray, b: np.ndarray | None, n_boot: int, seed: int):
    rng = stream(seed, "bootstrap", metric)
    n_seeds, n_tasks = a.shape
    stats = np.empty(n_boot)
    for k in range(n_boot):
        tasks = rng.integers(0, n_tasks, n_tasks)
        seeds = rng.integers(0, n_seeds, n_seeds)
        value = _aggregate(metric, a[np.ix_(seeds, tasks)])
        if b is not None:
            value -= _aggregate(metric, b[np.ix_(seeds, tasks)])
        stats[k] = value
    return np.percentile(stats, [2.5, 97.5])


def summarize_seeds(policy: SeedTable, baseline: SeedTable, *, n_boot: int = 2000,
                    seed: int = 0) -> dict:
    """Point estimates and intervals for the policy, the baseline and their paired delta,
    overall and per task."""
    out: dict = {"seeds": len(policy.seeds), "tasks": policy.tasks, "note": NOTE,
                 "overall": {}, "per_task": {}}
    metrics = [m for m in policy.values if m in baseline.values]
    for m in metrics:
        a, b = policy.values[m], baseline.values[m]
        entry = {}
        for label, x, y in (("policy", a, None), ("baseline", b, None), ("delta", a, b)):
            point = _aggregate(m, x) - (_aggregate(m, y) if y is not None else 0.0)
            lo, hi = _bootstrap(m, x, y, n_boot, seed)
            per_seed = _per_seed(m, x)
            if y is not None:
                per_seed = per_seed - _per_seed(m, y)
            entry[label] = {"mean": point, "median": float(np.median(per_seed)),
                            "lo": float(lo), "hi": float(hi)}
            entry[label]["point"] = no_spread(entry[label])  # no interval: replays alike
        entry["delta"]["includes_zero"] = entry["delta"]["lo"] <= 0 <= entry["delta"]["hi"]
        out["overall"][m] = entry
    for j, task in enumerate(policy.tasks):
        out["per_task"][task] = {
            m: {"policy_mean": float(policy.values[m][:, j].mean()),
                "baseline_mean": float(baseline.values[m][:, j].mean()),
                "delta_mean": float((policy.values[m][:, j] - baseline.values[m][:, j]).mean())}
            for m in metrics}
    return out


def interval(values: np.ndarray, *, key: str, seed: int = 0, n_boot: int = 2000,
             log: bool = False) -> dict:
    """Mean over every (seed, task) cell of ``values`` (rows seeds, columns tasks) with a
    percentile-bootstrap 95% interval that resamples tasks, then seeds. ``log``: the geometric
    mean of positive values. NaN cells (e.g. not applicable) are left out."""
    x = np.log(values) if log else np.asarray(values, dtype=float)
    rng = stream(seed, "interval", key)
    n_seeds, n_tasks = x.shape
    point = float(np.nanmean(x))
    stats = np.empty(n_boot)
    for k in range(n_boot):
        cols = rng.integers(0, n_tasks, n_tasks)
        rows = rng.integers(0, n_seeds, n_seeds)
        stats[k] = np.nanmean(x[np.ix_(rows, cols)])
    lo, hi = np.nanpercentile(stats, [2.5, 97.5])
    if log:
        point, lo, hi = float(np.exp(point)), float(np.exp(lo)), float(np.exp(hi))
    zero = 1.0 if log else 0.0
    return {"mean": point, "lo": float(lo), "hi": float(hi),
            "includes_zero" if not log else "includes_one": bool(lo <= zero <= hi),
            "point": no_spread({"lo": lo, "hi": hi})}  # no interval: the replays alike


def no_spread(d: dict) -> bool:
    """Whether an interval ``{"lo", "hi", ...}`` has no width: every replay (or task) gave the
    same figure, so it is a point value, printed as one (``POINT_WORDS``), not as [x, x]."""
    lo, hi = float(d["lo"]), float(d["hi"])
    return lo == hi or math.isclose(lo, hi, rel_tol=1e-9, abs_tol=1e-12)
