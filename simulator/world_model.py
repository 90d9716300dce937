"""Counterfactual children from a world model fitted to a log (``--children model``).

A closed-loop replay that measures other candidates than the log did expands parents the log
never expanded, and asks for more children than it logged. ``ModelChildren`` answers with the
log's exact children first (a node's own logged children, then its other logged expansions,
as ``LogChildren``) and *invents* the rest from a model fitted to the log alone (never to the
generative form of a world):

- **what the search knows of the parent** (the features): log2 of its speedup over the seed,
  log2 of its speedup over the best node expanded so far, its depth in the tree, and its own
  step (log2 of it over its parent; 0 for the seed). Parents are archive nodes, so they
  succeeded; failure is what the model predicts, per child.
- **the child's outcome and log2 step** given those features, by one of two families:

  - ``crb``, a conditional residual bootstrap: a child copies a logged (parent, child) pair
    among the ``K_NEAREST`` whose parent features are nearest the node's (its outcome and step
    over the parent); a child invented from logged child c draws c's own logged children first
    when it is expanded, so a logged lineage goes on;
  - ``gbm``, gradient-boosted trees (scikit-learn's histogram GBM): a classifier for the outcome
    and quantile regressions (10th, 50th, 90th percentile) for the step; a step is the median
    plus a standardised residual of the log's own, drawn at random, times the predicted spread,
    so that the tails are the log's and not a parametric guess. An invented child carries its
    features (speedup, depth, own step) into its own expansions.

- **repeats**: a mutation operator has a finite neighbourhood, so an LLM asked again for a child
  of the same parent often writes a kernel it wrote before (30-70% of children in the NK and
  Kernel Tuner worlds, 0% in the landscape). Per task the model fits a neighbourhood size N by
  maximum likelihood to the log's repeats among siblings (child j of a parent that has d
  distinct children so far repeats one with probability d / N); an invented child repeats an
  earlier sibling with that probability and is then that kernel again (same code identity,
  outcome and speedup: the archive drops it, its costs are paid).
- **forecasts that agree with the drawn speedup**: the forecast of an invented child is the
  logged forecast of a logged child with the same outcome whose truth (in the log's forecast
  frame) is among the ``K_NEAREST`` nearest the drawn one, moved by the difference
  (``shift_probs``). The logged forecaster's error about its own child (bias, spread,
  sharpness, and parse failures, which stay failures) is kept, as it depended on the truth.
- **stage times, tokens and prices**: those of a logged child with the same outcome (for
  ``crb``, the copied child's own).

**Per task, with shrinkage.** Features are relative to the task's seed, so tasks pool. A task
with at least ``TASK_MIN_PAIRS`` logged pairs gets its own fit, blended with the pooled fit with
weight n / (n + ``SHRINK_PAIRS``) (``gbm``: predicted outcome probabilities and quantiles;
``crb``: the share of neighbours drawn from the task's own pairs); a task with fewer pairs
uses the pooled fit alone. A log of one search and one task is its own pool.

**Uncertainty.** Each replay seed uses its own ensemble member: the model refitted on a
bootstrap resample of the log's parent expansions (the groups of children one expansion of one
parent gave), resampled within each search, so a log of one search still has an ensemble. The
spread of a replay's seeds therefore includes the model's uncertainty about the log, not only
the seed noise of the draws.

**Compiled.** Once a process has invented ``COMPILE_AFTER`` children, the loop over invented
children runs compiled (``simulator._invent_kernel``: Numba), seeding and drawing the same
keyed streams with numpy's algorithms and the C library's floats in the same order, so the
children are the same to the bit; the Python loop here stays its twin
(``GFSIM_COMPILED=off``), and ``tests/test_compiled_draws.py`` holds the two together.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np
from gfsim.simulator.children import (
    INVENTED_HEADROOM,
    Child,
    ChildSource,
    LogChildren,
    held_to_log,
    bin_grid,
    pool_of,
    probs_cdf,
    shift_probs_rows,
    shifted_cdf,
)
from gfsim.simulator.traces import SearchTrace

from gfsim.core.caches import on_object
from gfsim.core.errors import GfsimError
from gfsim.core.libm import log2
from gfsim.core.rng import key_words, keyed_state, stream, transient_stream

__all__ = ["ModelChildren", "OwnChildren", "WorldModel", "world_model", "child_sources",
           "check_children",
           "CHILDREN", "FAMILIES", "DEFAULT_FAMILY",
           "K_NEAREST", "TASK_MIN_PAIRS", "SHRINK_PAIRS", "fit_neighbourhood"]

FAMILIES = ("crb", "gbm")
DEFAULT_FAMILY = "crb"
K_NEAREST = 16  # crb neighbours, and forecast templates, per draw
TASK_MIN_PAIRS = 40  # a task with fewer logged pairs uses the pooled fit alone
SHRINK_PAIRS = 80  # a task's own fit weighs n / (n + SHRINK_PAIRS) against the pooled fit
_WEIGHTS = np.array([1.0, 0.5, 0.25, 0.5])  # crb distance: x, over best, depth, own step
_GEN_FAILED = "generation_failed"  # the outcome label of a child that was never generated
_QUANTILES = (0.1, 0.5, 0.9)
_Z90 = 2.0 * 1.2815515655446004  # q90 - q10 of a standard normal
_NEAR_KEPT = 1 << 14  # crb neighbours kept per member and task (features rows)


# --- the log's pairs ----------------------------------------------------------------------------

@dataclass
class _Pairs:
    """The logged (parent, child) pairs of one search with a measured parent, as arrays."""

    trace: SearchTrace
    child: np.ndarray  # child index in the trace
    group: np.ndarray  # expansion id: pairs with the same (parent, step)
    feats: np.ndarray  # (n, 4): x, over best, depth, own step
    outcome: np.ndarray  # object: outcome labels
    step: np.ndarray  # log2 child / parent (NaN unless success)
    target: np.ndarray  # the child's truth in the forecast frame, log2 (NaN unless success)
    parent_target: np.ndarray  # the parent's log2 speedup in the forecast frame's units
    repeats: list  # per parent: (distinct before, repeated?) per child, in logged order


def _frame_base(t: SearchTrace, parent_speedup: float) -> float:
    if t.forecast_frame == "seed":
        return t.seed_speedup
    if t.forecast_frame == "parent":
        return parent_speedup
    return 1.0


def _pairs_of(t: SearchTrace) -> _Pairs:
    pool = pool_of(t)
    n = len(t)
    speed = np.asarray(t.speedup, dtype=float)
    parent = np.asarray(t.parent, dtype=int)
    depth = np.zeros(n, dtype=int)
    own = np.zeros(n)
    for i in range(n):  # sorted by step: a parent comes before its children
        p = parent[i]
        depth[i] = 0 if p < 0 else depth[p] + 1
    ps = np.where(parent < 0, t.seed_speedup, speed[np.maximum(parent, 0)]) if n else np.zeros(0)
    gps = np.array([t.seed_speedup if p < 0 else (t.seed_speedup if parent[p] < 0
                                                  else speed[parent[p]]) for p in parent])
    for i in range(n):
        p = parent[i]
        own[i] = 0.0 if p < 0 else math.log2(ps[i] / gps[i]) if gps[i] > 0 and ps[i] > 0 else 0.0
    # The best node expanded so far (the seed included), at each expansion's step.
    best = np.full(n, t.seed_speedup)
    running = t.seed_speedup
    for s in sorted(set(t.step)):
        rows = [i for i in range(n) if t.step[i] == s]
        for i in rows:
            if ps[i] > 0:
                running = max(running, ps[i])
        best[rows] = running
    # A pair needs a measured parent and a known outcome: generated and evaluated, or a
    # generation that failed (a child generated but never evaluated tells nothing).
    known = np.array([o is not None or bool(g) for o, g in zip(t.outcome, t.gen_failed)],
                     dtype=bool)
    keep = np.flatnonzero(np.isfinite(ps) & (ps > 0) & known)
    feats = np.column_stack([log2(ps[keep] / t.seed_speedup), log2(ps[keep] / best[keep]),
                             depth[keep] - 1.0, own[keep]]) if len(keep) else np.zeros((0, 4))
    outcome = np.array([o if o is not None else _GEN_FAILED for o in t.outcome],
                       dtype=object)[keep]
    ok = (outcome == "success") & np.isfinite(speed[keep]) & (speed[keep] > 0)
    step = np.full(len(keep), np.nan)
    step[ok] = log2(speed[keep][ok] / ps[keep][ok])
    base = np.array([_frame_base(t, ps[i]) for i in keep])
    target = np.full(len(keep), np.nan)
    target[ok] = log2(speed[keep][ok] / base[ok])
    parent_target = log2(ps[keep] / base)
    group_of = {}
    group = np.array([group_of.setdefault((int(parent[i]), int(t.step[i])), len(group_of))
                      for i in keep], dtype=int)
    repeats = []
    for p in sorted({int(parent[i]) for i in keep}):
        seen: set = set()
        seq = []
        for i in keep:
            if parent[i] != p or t.gen_failed[i]:
                continue
            k = pool.identity[i]
            seq.append((len(seen), k in seen))
            seen.add(k)
        repeats.append(seq)
    return _Pairs(t, keep, group, feats, outcome, step, target, parent_target, repeats)


def fit_neighbourhood(repeats: list) -> float:
    """The neighbourhood size N that makes the logged repeats most likely (child j of a parent
    with d distinct children before it repeats one with probability d / N); ``inf`` when the
    log shows no repeat."""
    d = np.array([a for seq in repeats for a, _ in seq], dtype=float)
    r = np.array([b for seq in repeats for _, b in seq], dtype=bool)
    if not r.any():
        return math.inf
    lo = max(float(d.max()), 1.0)
    # The log-likelihood over a grid of N from the counts of each (d, repeated?) pair, in the
    # C library's logarithms (gfsim.core.libm: numpy's differ by CPU, and this is an argmax).
    counts: dict = {}
    for a, b in zip(d.tolist(), r.tolist()):
        counts[(a, b)] = counts.get((a, b), 0) + 1
    pairs = sorted(counts.items())
    best, best_ll = lo, -math.inf
    for i in range(400):
        n = lo * 10.0 ** (4.0 * i / 399)
        ll = 0.0
        for (a, b), c in pairs:
            q = min(a / n, 1.0 - 1e-12)
            ll += c * (math.log(max(q, 1e-300)) if b else math.log1p(-q))
        if ll > best_ll:
            best, best_ll = n, ll
    return best


# --- one ensemble member ------------------------------------------------------------------------

class _Member:
    """The model fitted to one (bootstrap) resample of the log's pairs."""

    def __init__(self, family: str, parts: list[_Pairs], tasks: list[str], rng):
        self.family = family
        # Resample expansion groups within each search, with replacement.
        rows = []
        for k, p in enumerate(parts):
            groups = np.unique(p.group)
            if rng is None or not len(groups):
                take = np.arange(len(p.group))
            else:
                chosen = rng.choice(groups, size=len(groups), replace=True)
                by = {g: np.flatnonzero(p.group == g) for g in groups}
                take = np.concatenate([by[g] for g in chosen])
            rows.append((k, take))
        self.parts = parts
        feats = np.concatenate([p.feats[r] for (k, r), p in zip(rows, parts)]) \
            if rows else np.zeros((0, 4))
        self.feats = feats
        self.outcome = np.concatenate([p.outcome[r] for (k, r), p in zip(rows, parts)])
        self.step = np.concatenate([p.step[r] for (k, r), p in zip(rows, parts)])
        self.part = np.concatenate([np.full(len(r), k) for k, r in rows])
        self.index = np.concatenate([r for _, r in rows])  # row within its part
        self.task = np.array([tasks[k] for k in self.part], dtype=object)
        self.classes = sorted(set(self.outcome.tolist())) or ["success"]
        # Neighbourhood size per task, from the resampled parents' repeats.
        self.neighbourhood = {}
        for task in set(tasks):
            reps = [seq for p, t in zip(parts, tasks) if t == task for seq in p.repeats]
            self.neighbourhood[task] = fit_neighbourhood(reps)
        scale = feats.std(axis=0) if len(feats) > 1 else np.ones(4)
        self.scale = np.where(scale > 1e-9, scale, 1.0)
        self.counts = {t: int((self.task == t).sum()) for t in set(tasks)}
        self._grids: dict = {}
        self._near: dict = {}  # crb: task -> features row -> neighbours (neighbours_many)
        self._near_arrays: dict = {}  # the same as arrays (neighbours_arrays)
        self._feats_c = np.ascontiguousarray(feats, dtype=float)
        self._own: dict = {}
        self._rows = None
        self._kernel_rows: dict = {}  # id(trace) -> kernel_rows(trace)
        self._gbm_draws: dict = {}  # gbm: (task, features row) -> gbm_draws
        if family == "gbm":
            self._fit_gbm(rng)

    def weight(self, task: str) -> float:
        n = self.counts.get(task, 0)
        return n / (n + SHRINK_PAIRS) if n >= TASK_MIN_PAIRS else 0.0

    # -- gbm -------------------------------------------------------------------------------
    def _fit_gbm(self, rng):
        seed = int(rng.integers(2**31)) if rng is not None else 0
        self.gbm = {None: _GbmFit(self.feats, self.outcome, self.step, self.classes, seed)}
        for task, n in self.counts.items():
            if n >= TASK_MIN_PAIRS and len(self.counts) > 1:
                m = self.task == task
                self.gbm[task] = _GbmFit(self.feats[m], self.outcome[m], self.step[m],
                                         self.classes, seed)

    def _grid_predict(self, task: str, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        probs, q = self.gbm[None].predict(z)
        if task in self.gbm:
            w = self.weight(task)
            tp, tq = self.gbm[task].predict(z)
            probs, q = (1 - w) * probs + w * tp, (1 - w) * q + w * tq
        return probs, q

    def gbm_predict(self, task: str, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(outcome probabilities over ``classes``, (q10, q50, q90)) at features ``z``: the
        fit evaluated once per task on a grid of features (``_GRID``), read at the nearest
        grid point (a tree ensemble is piecewise constant; one call per draw would cost a
        millisecond)."""
        got = self._grids.get(task)
        if got is None:
            axes = _grid_axes(self.feats)
            mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 4)
            probs, q = self._grid_predict(task, mesh)
            shape = tuple(len(a) for a in axes)
            got = self._grids[task] = (axes, probs.reshape(*shape, -1), q.reshape(*shape, 3))
        axes, probs, q = got
        at = tuple(_nearest_index(a, v) for a, v in zip(axes, z))
        return probs[at], q[at]

    def gbm_draws(self, task: str, z: tuple) -> tuple:
        """What a gbm draw at features ``z`` reads, kept per features row: the fit whose
        residuals it draws, the outcome probabilities as ``Generator.choice``'s cumulative
        ones (None: none positive), the residuals and the quantiles, as Python floats."""
        key = (task, z)
        got = self._gbm_draws.get(key)
        if got is None:
            probs, q = self.gbm_predict(task, np.array(z))
            probs = np.clip(probs, 0, None)
            probs = probs / probs.sum() if probs.sum() > 0 else None
            fit = self.gbm.get(task) or self.gbm[None]
            res = on_object(fit, "_residuals", fit.residuals.tolist)
            if len(self._gbm_draws) >= _NEAR_KEPT:
                self._gbm_draws.clear()
            got = self._gbm_draws[key] = (fit, _choice_cdf(probs) if probs is not None
                                          else None, res, tuple(q.tolist()))
        return got

    # -- crb -------------------------------------------------------------------------------
    def neighbours(self, task: str, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``K_NEAREST`` resampled rows nearest features ``z``: among the task's own rows,
        and among all (a draw takes the first with probability ``weight(task)``)."""
        d = (((self.feats - z) / self.scale) ** 2 * _WEIGHTS).sum(axis=1)
        own = np.flatnonzero(self.task == task) if self.weight(task) > 0 else np.zeros(0, int)
        return _k_smallest(d, np.arange(len(d))), _k_smallest(d[own], own)

    def neighbours_many(self, task: str, zs: list[tuple]) -> list[tuple[list, list]]:
        """``neighbours`` of every features row in ``zs``, as lists, from one distance
        computation (the same floats and the same order of rows as one call per row: an
        elementwise computation, and a stable sort row by row). Kept per features row: a
        search expands a node again with the features it had."""
        def find(new: list[tuple]) -> list[tuple[list, list]]:
            d = (((self.feats[None, :, :] - np.array(new)[:, None, :]) / self.scale) ** 2
                 * _WEIGHTS).sum(axis=2)
            own = self._own_rows(task)
            return list(zip(_k_smallest_rows(d, np.arange(d.shape[1])),
                            _k_smallest_rows(d[:, own], own)))

        return _kept_rows(self._near, task, zs, find)

    def neighbours_arrays(self, kernel, task: str, zs: list[tuple]) -> list[tuple]:
        """``neighbours_many``'s rows as arrays, found by the compiled kernel (the same rows
        in the same order; kept apart from the lists ``neighbours_many`` keeps)."""
        def find(new: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
            own = self._own_rows(task)
            n, k = len(self.feats), K_NEAREST
            every = np.empty((len(new), k if 0 < k < n else n), dtype=np.int64)
            mine = np.empty((len(new), k if 0 < k < len(own) else len(own)), dtype=np.int64)
            kernel.neighbours(self._feats_c, self.scale, _WEIGHTS, np.array(new, dtype=float),
                              own, k, every, mine)
            return list(zip(every, mine))

        return _kept_rows(self._near_arrays, task, zs, find)

    def _own_rows(self, task: str) -> np.ndarray:
        got = self._own.get(task)
        if got is None:
            got = self._own[task] = np.flatnonzero(self.task == task) \
                if self.weight(task) > 0 else np.zeros(0, int)
        return got

    def kernel_rows(self, trace: SearchTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rows`` for the compiled draws, drawn for ``trace``: the child copied (-1 where
        the row is another search's: its times are taken from one of the trace's own), the
        outcome's code, the step."""
        got = self._kernel_rows.get(id(trace))
        if got is None:
            mine = np.array([p.trace is trace for p in self.parts], dtype=bool)[self.part]
            child = np.concatenate([p.child for p in self.parts])[
                np.cumsum([0] + [len(p.child) for p in self.parts])[:-1][self.part]
                + self.index] if len(self.part) else _NO_INTS
            codes = np.array([_code(o) for o in self.classes], dtype=np.int64)
            at = {o: k for k, o in enumerate(self.classes)}
            got = self._kernel_rows[id(trace)] = (
                np.where(mine, child, -1).astype(np.int64),
                codes[[at[o] for o in self.outcome.tolist()]] if len(self.part) else _NO_INTS,
                self.step.astype(float))
        return got

    def kernel_classes(self) -> np.ndarray:
        """``classes`` as the compiled draws' outcome codes."""
        return on_object(self, "_kernel_classes", lambda: np.array(
            [_code(o) for o in self.classes], dtype=np.int64))

    def rows(self) -> list[tuple[int, str, float, int]]:
        """Per resampled row, what a crb draw copies: (its part, outcome, step, child)."""
        if self._rows is None:
            self._rows = [(int(k), p.outcome[j], float(p.step[j]), int(p.child[j]))
                          for k, j in zip(self.part.tolist(), self.index.tolist())
                          for p in (self.parts[k],)]
        return self._rows


def _kept_rows(store: dict, task: str, zs: list[tuple], find) -> list:
    """``find``'s answer for every features row of ``zs``, kept per task and row in ``store``
    (at most ``_NEAR_KEPT`` rows a task): ``find`` gets the rows not seen yet, once each."""
    seen = store.get(task)
    if seen is None:
        seen = store[task] = {}
    new = list(dict.fromkeys(z for z in zs if z not in seen))
    if new:
        if len(seen) + len(new) > _NEAR_KEPT:
            seen.clear()
        seen.update(zip(new, find(new)))
    return [seen[z] for z in zs]


def _k_smallest(d: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The ``K_NEAREST`` of ``rows`` with the smallest distances ``d``, nearest first, ties in
    row order. A stable sort, not ``argpartition``: which of tied rows argpartition keeps and
    the order it returns them in depend on the CPU (numpy picks an AVX-512 selection where
    the CPU has it), and a draw indexes this list, so the same replay gave other children on
    another machine."""
    k = min(K_NEAREST, len(rows))
    return rows[np.argsort(d, kind="stable")[:k]] if 0 < k < len(rows) else rows


def _k_smallest_rows(d: np.ndarray, rows: np.ndarray) -> list[list[int]]:
    """``_k_smallest`` of every row of ``d`` (m, len(rows)), as lists."""
    k = min(K_NEAREST, len(rows))
    if 0 < k < len(rows):
        return rows[np.argsort(d, axis=1, kind="stable")[:, :k]].tolist()
    return [rows.tolist()] * len(d)


def _grid_axes(feats: np.ndarray) -> list[np.ndarray]:
    """Grid points per feature: the span of the logged parents and beyond (a replay reaches
    speedups and depths the log did not)."""
    x, own = feats[:, 0], feats[:, 3]
    return [np.linspace(x.min() - 1.0, x.max() + 2.0, 49),
            np.array([-4.0, -2.0, -1.0, -0.5, -0.25, 0.0]),
            np.arange(0.0, max(feats[:, 2].max() + 4.0, 6.0)),
            np.unique(np.concatenate([np.quantile(own, np.linspace(0, 1, 7)), [0.0]]))]


def _nearest_index(axis: np.ndarray, v: float) -> int:
    i = int(np.searchsorted(axis, v))
    if i <= 0:
        return 0
    if i >= len(axis):
        return len(axis) - 1
    return i if axis[i] - v < v - axis[i - 1] else i - 1


class _GbmFit:
    """Outcome classifier and step quantile regressions on one set of pairs."""

    def __init__(self, feats, outcome, step, classes, seed):
        # A few hundred rows: OpenMP threads cost more than they give (and oversubscribe the
        # cores when replays run in several processes).
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="openmp"):
            self._fit(feats, outcome, step, classes, seed)

    def _fit(self, feats, outcome, step, classes, seed):
        from sklearn.ensemble import (
            HistGradientBoostingClassifier,
            HistGradientBoostingRegressor,
        )

        kw = dict(max_iter=40, learning_rate=0.1, max_depth=3, min_samples_leaf=15,
                  early_stopping=False, random_state=seed)
        self.classes = classes
        present = sorted(set(outcome.tolist()))
        self.base = np.array([(outcome == c).mean() if len(outcome) else float(c == "success")
                              for c in classes])
        self.clf = None
        if len(present) > 1 and len(outcome) >= 2 * kw["min_samples_leaf"]:
            self.clf = HistGradientBoostingClassifier(**kw).fit(feats, outcome)
            self.cols = [list(self.clf.classes_).index(c) if c in self.clf.classes_ else -1
                         for c in classes]
        ok = np.isfinite(step)
        y, x = step[ok], feats[ok]
        self.const = np.quantile(y, _QUANTILES) if len(y) else np.zeros(3)
        self.reg = None
        if len(y) >= 2 * kw["min_samples_leaf"]:
            self.reg = [HistGradientBoostingRegressor(loss="quantile", quantile=q, **kw).fit(x, y)
                        for q in _QUANTILES]
        q = self._predict(x)[1] if len(y) else np.zeros((0, 3))
        spread = np.maximum((q[:, 2] - q[:, 0]) / _Z90, 0.05) if len(y) else np.ones(0)
        self.residuals = (y - q[:, 1]) / spread if len(y) else np.zeros(1)

    def predict(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="openmp"):
            return self._predict(np.atleast_2d(z))

    def _predict(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.clf is None:
            probs = np.tile(self.base, (len(z), 1))
        else:
            raw = self.clf.predict_proba(z)
            probs = np.column_stack([raw[:, c] if c >= 0 else np.zeros(len(z))
                                     for c in self.cols])
        if self.reg is None:
            q = np.tile(self.const, (len(z), 1))
        else:
            q = np.column_stack([r.predict(z) for r in self.reg])
            q.sort(axis=1)  # quantile regressions fitted apart can cross
        return probs, q


# --- the model of a log -------------------------------------------------------------------------

class WorldModel:
    """The model of one log's searches (all traces of one replay), with an ensemble member
    per replay seed, fitted on first use."""

    def __init__(self, traces: list[SearchTrace], family: str = DEFAULT_FAMILY):
        if family not in FAMILIES:
            raise GfsimError(f"--model-family: unknown family {family!r}; valid: "
                             f"{', '.join(FAMILIES)}")
        self.family = family
        self.traces = traces
        self.parts = [_pairs_of(t) for t in traces]
        self.tasks = [t.task_id for t in traces]
        if not any(len(p.child) for p in self.parts):
            raise GfsimError("`children` model: the log has no (parent, child) pair with a "
                             "measured parent to fit a model to")
        self._members: dict[int, _Member] = {}
        self._part_of = {id(t): k for k, t in enumerate(traces)}

    def member(self, seed: int) -> _Member:
        got = self._members.get(seed)
        if got is None:
            rng = stream(seed, "world-model", self.family)
            got = self._members[seed] = _Member(self.family, self.parts, self.tasks, rng)
        return got

    def part(self, trace: SearchTrace) -> _Pairs:
        return self.parts[self._part_of[id(trace)]]


def world_model(traces: list[SearchTrace], family: str = DEFAULT_FAMILY) -> WorldModel:
    """The ``WorldModel`` of these traces, kept on the first one (every replay and seed of one
    log shares it, as they share the traces)."""
    key = ("world-model", family, tuple(id(t) for t in traces))
    cache = on_object(traces[0], "_world_models", dict)
    got = cache.get(key)
    if got is None:
        got = cache[key] = WorldModel(traces, family)
    return got


# --- the child source ---------------------------------------------------------------------------

class _Draws:
    """The draws of a PCG64 ``numpy.random.Generator`` that an invented child takes
    (``random()``, ``integers(k)``), the same numbers from the same stream, without numpy's
    per-call overhead (``integers`` costs some 4 microseconds a call, of which the bits take
    half of one): ``random`` is the top 53 bits of one 64-bit output, ``integers(k)`` Lemire's
    bounded method on 32-bit halves of outputs, the other half kept for the next one, as
    numpy draws them (``numpy/random/src/distributions``). Taken from the generator's state
    as it stands; the generator itself must not draw until these are done. ``_DRAWS_OK``
    says whether this numpy draws so (checked once, on a stream of its own); where it does
    not, the generator's own methods serve."""

    __slots__ = ("raw", "has", "half")

    def __init__(self, rng: np.random.Generator, fresh: bool = False):
        bg = rng.bit_generator
        self.raw = bg.random_raw
        if fresh:  # just keyed (transient_stream): no half output kept
            self.has = self.half = 0
        else:
            state = bg.state
            self.has, self.half = state["has_uint32"], state["uinteger"]

    def random(self) -> float:
        return (self.raw() >> 11) * _TWO_M53

    def _u32(self) -> int:
        if self.has:
            self.has = 0
            return self.half
        x = self.raw()
        self.has, self.half = 1, x >> 32
        return x & 0xFFFFFFFF

    def integers(self, k: int) -> int:
        if not 0 < k <= 0xFFFFFFFF:
            raise ValueError(f"integers: {k} out of range")
        if k == 1:
            return 0  # numpy draws nothing for a range of one
        m = self._u32() * k
        left = m & 0xFFFFFFFF
        if left < k:
            threshold = (0xFFFFFFFF - (k - 1)) % k
            while left < threshold:
                m = self._u32() * k
                left = m & 0xFFFFFFFF
        return m >> 32


_TWO_M53 = 1.0 / 9007199254740992.0


def _draws_agree() -> bool:
    """Whether ``_Draws`` gives this numpy's PCG64 draws (a mixed sequence, a permutation
    first as crb lineages draw one)."""
    try:
        a, b = np.random.default_rng(12345), np.random.default_rng(12345)
        if a.permutation(7).tolist() != b.permutation(7).tolist():
            return False
        d = _Draws(b)
        for k in (2, 1, 16, 3, 1000, 7, 5, 2**31 + 11, 1, 6, 16, 2**32 - 1, 9):
            if float(a.random()) != d.random() or int(a.integers(k)) != d.integers(k):
                return False
        return all(int(a.integers(k)) == d.integers(k) for k in range(1, 300))
    except Exception:  # noqa: BLE001 - any surprise: use the generator itself
        return False


_DRAWS_OK = isinstance(np.random.default_rng(0).bit_generator, np.random.PCG64) and \
    _draws_agree()


def _draws(rng: np.random.Generator, fresh: bool = False):
    """``rng``'s draws for invented children: ``_Draws`` where they agree with numpy
    (``fresh``: ``rng`` is just keyed and has drawn nothing yet)."""
    return _Draws(rng, fresh) if _DRAWS_OK and isinstance(rng.bit_generator, np.random.PCG64) \
        else rng


# --- the compiled draws (simulator._invent_kernel) -------------------------------------------

# Draw invented children with the compiled loop where it agrees with numpy (the same
# children either way); GFSIM_COMPILED=off keeps the Python loop (and Numba unloaded).
COMPILED = os.environ.get("GFSIM_COMPILED", "on").lower() not in ("off", "0", "no", "false")
# Loading Numba and the kernel costs a process some 0.5 s, which the kernel wins back after
# about 10^5 children: it takes over once the process has drawn this many in Python.
COMPILE_AFTER = 50_000
_DRAWN = [0]  # children invented by the Python loop in this process
_SEEDED_BELOW = 1 << 63  # seeds the kernel seeds a keyed stream from (int64)
_KERNEL: list = []  # the kernel module once loaded and checked; None where it cannot serve
_LABELS: list[str] = []  # outcome labels by their code in the compiled draws
_CODES: dict[str, int] = {}
_NO_INTS = np.zeros(0, dtype=np.int64)
_NO_FLOATS = np.zeros(0)
_MASK64 = (1 << 64) - 1


def _code(label: str) -> int:
    got = _CODES.get(label)
    if got is None:
        got = _CODES[label] = len(_LABELS)
        _LABELS.append(label)
    return got


_SUCCESS, _GEN_FAILED_CODE = _code("success"), _code(_GEN_FAILED)


def _state_words(state: int, inc: int, has_uint32: int = 0, uinteger: int = 0) -> np.ndarray:
    """A PCG64 state as the kernel's words: state and increment in 64-bit halves (high
    first), then numpy's buffered 32-bit half."""
    return np.array([state >> 64, state & _MASK64, inc >> 64, inc & _MASK64, has_uint32,
                     uinteger], dtype=np.uint64)


def _kernel():
    """``simulator._invent_kernel``, loaded (and compiled, or read from Numba's cache) on first
    use, where its PCG64 gives this numpy's draws; else None (the Python loop serves)."""
    if not _KERNEL:
        if _DRAWN[0] < COMPILE_AFTER:
            return None
        try:
            from gfsim.simulator import _invent_kernel as kernel
            ok = _kernel_agrees(kernel)
        except Exception:  # noqa: BLE001 - no Numba, or a surprise: the Python loop serves
            kernel, ok = None, False
        _KERNEL.append(kernel if ok else None)
    return _KERNEL[0]


def _kernel_agrees(kernel) -> bool:
    """Whether the kernel's PCG64 draws this numpy's stream: raw outputs, and ``random()``
    with ``integers(k)`` mixed (the half-outputs kept between them), from keyed states that
    it seeds as ``keyed_state`` does."""
    ks = np.array([2, 1, 16, 3, 1000, 7, 5, 2**31 + 11, 1, 6, 16, 2**32 - 1, 9,
                   *range(1, 300)], dtype=np.int64)
    for seed, key in ((0, ("a",)), (12345, ("task", "seed/0.1", 3, "model")),
                      (2**40 + 3, ("t", 0, 2**63 + 5, "model"))):
        state, inc = keyed_state(seed, *key)
        if not np.array_equal(kernel.seeded(seed, np.array(key_words(*key), dtype=np.uint64)),
                              _state_words(state, inc)):
            return False
        gen = np.random.Generator(np.random.PCG64(0))
        gen.bit_generator.state = {"bit_generator": "PCG64",
                                   "state": {"state": state, "inc": inc},
                                   "has_uint32": 0, "uinteger": 0}
        want = gen.bit_generator.random_raw(40)
        words = _state_words(state, inc)
        if not np.array_equal(kernel.raw(words, 40), want):
            return False
        expect = [x for k in ks.tolist() for x in (gen.random(), float(gen.integers(k)))]
        if kernel.mixed(words, ks).tolist() != expect:
            return False
    # compiled (or loaded) here, inside _kernel's guard, with the argument types of the draws
    ints, floats, rows = np.zeros(1, dtype=np.int64), np.zeros(1), np.empty((0, kernel.COLUMNS))
    kernel.invent(_state_words(1, 1), 0, 0, 1.0, np.zeros(0, dtype=np.int64), 1.0, 0, ints,
                  ints, 0.5, ints, ints, floats, floats, ints, floats, 0.0, 0.0, 0.0, ints,
                  ints, ints, ints, floats, np.zeros(1, dtype=bool), ints, floats, floats,
                  K_NEAREST, 1.0, 1.0, 2.0, INVENTED_HEADROOM, _SUCCESS, _GEN_FAILED_CODE, _Z90,
                  2.0, rows)
    kernel.neighbours(np.zeros((2, 4)), np.ones(4), _WEIGHTS, np.zeros((1, 4)), ints,
                      K_NEAREST, np.empty((1, 2), dtype=np.int64), np.empty((1, 1), np.int64))
    return True


class _Tables:
    """What the compiled draws read of one trace, as arrays (kept with its ``_Templates``)."""

    def __init__(self, fc: _Templates, t: SearchTrace, pool):
        n = len(t)
        self.outcome_of = np.array([_code(o if o is not None else _GEN_FAILED)
                                    for o in t.outcome], dtype=np.int64)
        self.speedup_of = np.asarray(pool.speedup, dtype=float)
        self.has_fc = np.array([bool(h[5]) for h in pool.head], dtype=bool)
        self.where = np.full(n, -1, dtype=np.int64)
        for c, j in fc.where.items():
            self.where[c] = j
        self.parent_target = np.asarray(fc.parent_target, dtype=float)
        self.fc_target = np.asarray(fc.target, dtype=float)
        self._by = fc.by_outcome
        self._bo: tuple | None = None

    def by_outcome(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per outcome code: the logged children ``_invent`` takes a template from (those of
        that outcome, else the successes, else the first candidate), as (start, length) in
        one flat array."""
        if self._bo is None or len(self._bo[0]) < len(_LABELS):
            start, length, flat = [], [], []
            for label in list(_LABELS):
                same = self._by.get(label) or self._by.get("success") or [0]
                start.append(len(flat))
                length.append(len(same))
                flat.extend(same)
            self._bo = (np.array(start, dtype=np.int64), np.array(length, dtype=np.int64),
                        np.array(flat, dtype=np.int64))
        return self._bo


def _tables(fc: _Templates, t: SearchTrace, pool) -> _Tables:
    return on_object(fc, "_tables", lambda: _Tables(fc, t, pool))


class _Templates:
    """What ``ModelChildren`` reads of one trace for every invented child, worked out once per
    trace and model (kept on its ``_Pairs``), as Python lists: forecast templates (logged
    successes with a forecast) sorted by their truth in the frame, and the logged children of
    each outcome."""

    def __init__(self, t: SearchTrace, p: _Pairs):
        ok = [i for i in range(len(t)) if t.outcome[i] == "success"]
        self.by_outcome: dict[str, list[int]] = {}
        for i in range(len(t)):
            o = t.outcome[i] if t.outcome[i] is not None else _GEN_FAILED
            self.by_outcome.setdefault(o, []).append(i)
        self.where = {int(c): j for j, c in enumerate(p.child)}
        where = self.where
        fc = [i for i in ok if i in where and bool(t.has_forecast[i])
              and np.isfinite(p.target[where[i]])]
        target = np.array([p.target[where[i]] for i in fc])
        order = np.argsort(target, kind="stable")
        self.rows = np.array(fc, dtype=int)[order].tolist()
        self.target = target[order].tolist()  # sorted
        self.parse_failed = [bool(t.parse_failed[f]) for f in self.rows]
        self.parent_target = p.parent_target.tolist()
        self.probs = t.probs
        self._cdf: dict[int, list | None] = {}

    def cdf(self, row: int) -> list | None:
        """``probs_cdf`` of logged candidate ``row``'s forecast, worked out once."""
        try:
            return self._cdf[row]
        except KeyError:
            got = self._cdf[row] = probs_cdf(self.probs[row])
            return got


def _templates(t: SearchTrace, p: _Pairs) -> _Templates:
    return on_object(p, "_templates", lambda: _Templates(t, p))


class _Shifts:
    """The forecasts a step's invented children take moved (``shift_probs`` of a logged
    candidate's forecast), collected while the step's children are drawn and moved together
    at its end; a repeat of a child whose forecast is still to move takes the moved one."""

    def __init__(self, fc: _Templates, edges: np.ndarray | None):
        self.fc, self.edges = fc, edges
        self.moves: list[tuple[Child, int, float]] = []  # (child, logged row, log2 move)
        self.repeats: list[tuple[Child, Child]] = []

    def apply(self) -> None:
        _Shifts.finish_all([self])

    @staticmethod
    def finish_all(shifts: list[_Shifts]) -> None:
        """Move the forecasts of every ``_Shifts`` given (of one search or of several drawing
        a step together): in one array call per bin grid once there are enough of them,
        else one row at a time; the same floats either way (``shift_probs_rows``). Then the
        repeats take their moved forecasts."""
        by_grid: dict = {}
        for sh in shifts:
            if sh.moves:
                key = None if sh.edges is None else sh.edges.tobytes()
                by_grid.setdefault(key, []).append(sh)
        for group in by_grid.values():
            if sum(len(sh.moves) for sh in group) >= _ROWS_AT_ONCE:
                probs = np.concatenate([sh.fc.probs[[r for _, r, _ in sh.moves]]
                                        for sh in group])
                delta = np.array([d for sh in group for _, _, d in sh.moves])
                moved = iter(shift_probs_rows(probs, delta, group[0].edges))
                for sh in group:
                    fc = sh.fc
                    for (child, r, _), row in zip(sh.moves, moved):
                        child.probs = row if fc.cdf(r) is not None else fc.probs[r]
            else:
                grid = bin_grid(group[0].edges)
                for sh in group:
                    fc = sh.fc
                    for child, r, delta in sh.moves:
                        cdf = fc.cdf(r)
                        child.probs = fc.probs[r] if cdf is None else np.array(
                            shifted_cdf(cdf, delta, grid))
        for sh in shifts:
            for child, again in sh.repeats:
                child.probs = again.probs
            sh.moves.clear()
            sh.repeats.clear()


# Moved forecasts per step from which one array call (shift_probs_rows) beats a Python loop
# over cached cumulative sums (shifted_cdf): some 25 numpy calls against 8 floats a row.
_ROWS_AT_ONCE = 64


class ModelChildren(ChildSource):
    """A logged search's children: exact ones first, then ones invented by a ``WorldModel``
    (module doc). ``seed`` of ``draw`` picks the ensemble member.

    ``draw_step`` draws a whole step's expansions at once, with the same children as one
    ``draw`` per expansion in order (``draw`` is ``draw_step`` of one): every expansion still
    draws from its own keyed stream, in the same order, and what is shared across the step is
    only what draws no random number (the crb neighbours of every parent in one distance
    computation, every invented forecast moved in one array call)."""

    def __init__(self, trace: SearchTrace, model: WorldModel | None = None,
                 fresh: bool = False):
        self.t = trace
        self.fresh = fresh  # every child invented: a new search like the logged one
        self.model = model if model is not None else world_model([trace])
        self.part = self.model.part(trace)
        self.log = LogChildren(trace)
        self._template: dict[str, int] = {}  # crb: invented node id -> the logged child copied
        self._used: dict[str, set[int]] = {}
        self._speedup: dict[str, float] = {"seed": trace.seed_speedup}
        # Per node: its distinct kernels drawn so far, by code identity, and in the order
        # first drawn (a repeat picks one of them by its place in that order).
        self._distinct: dict[str, tuple[dict, list]] = {}
        self._best = trace.seed_speedup
        self._pool = pool_of(trace)
        self._fc = _templates(trace, self.part)
        self._by_outcome = self._fc.by_outcome
        self._where = self._fc.where
        edges = np.asarray(trace.bin_edges, dtype=float)
        self._edges = log2(edges) if len(edges) == 7 and np.all(edges > 0) else None

    def root(self) -> tuple[str, float]:
        return self.log.root()

    def template_cache(self) -> dict:
        return self._pool.derived  # protos by plan key (Child.plan_key): (template, outcome)

    def _features(self, node_id: str, s: float, best: float | None = None,
                  speedup: dict | None = None) -> tuple[float, float, float, float]:
        """The parent's features (module doc), with the search's best and known speedups as
        they stand now (or as given: ``draw_step`` works out a step's ahead)."""
        best = self._best if best is None else best
        speedup = self._speedup if speedup is None else speedup
        parent = node_id.rsplit("/", 1)[0] if "/" in node_id else None
        own = math.log2(s / speedup[parent]) if parent in speedup else 0.0
        return (math.log2(s / self.t.seed_speedup), math.log2(s / best),
                float(node_id.count("/")), own)

    def draw(self, node_id, node_speedup, expansion, n, seed):
        return self.draw_step([(node_id, node_speedup, expansion, n)], seed)[0]

    def draw_step(self, requests, seed) -> list[list[Child]]:
        outs, shifts = self.draw_step_open(requests, seed)
        shifts.apply()
        return outs

    def draw_step_open(self, requests, seed):
        """The step's children with their forecasts still to move (``_Shifts``: until
        ``finish_steps`` moves them, an invented child's ``probs`` is None)."""
        requests = list(requests)
        shifts = _Shifts(self._fc, self._edges)
        near = _StepNeighbours(self, requests, _kernel() if COMPILED else None)  # the step's
        outs = [self._expand(i, *r, seed, near, shifts) for i, r in enumerate(requests)]
        return outs, shifts

    def _expand(self, i, node_id, node_speedup, expansion, n, seed, near, shifts):
        """Expansion ``expansion`` of ``node_id`` (request ``i`` of its step)."""
        pool = self._pool
        self._best = max(self._best, node_speedup)
        self._speedup.setdefault(node_id, node_speedup)
        out = []
        logged = () if self.fresh else self.log.picks(node_id, node_speedup, expansion, n,
                                                      seed, fallback=False)
        for c, cid, src, s in logged:
            child = self.log._child(pool, c, cid, src, s)
            child.plan_key = c  # the logged candidate's own plan, as LogChildren's protos
            out.append(child)
        distinct, kinds = self._distinct.setdefault(node_id, ({}, []))
        for c in out:
            _count_kind(c, distinct, kinds)
        if len(out) >= n:
            self._remember(out)
            return out
        member = self.model.member(seed)
        task = self.t.task_id
        z = self._features(node_id, node_speedup)
        size = member.neighbourhood.get(task, math.inf)
        crb = member.family == "crb"
        kernel = near.kernel
        if kernel is not None:
            self._compiled(kernel, out, kinds, distinct, node_id, node_speedup, expansion, n,
                           seed, member, z, size, i, near, shifts)
            self._remember(out)
            return out
        _DRAWN[0] += n - len(out)
        rng = transient_stream(seed, self.t.task_id, node_id, expansion, "model")
        lineage = self._lineage(node_id, n - len(out), rng) if crb else []
        # The stream's next draws, cheaper; rng itself draws no more.
        rng = _draws(rng, fresh=not lineage and self._template.get(node_id) is None)
        weight = member.weight(task)
        rows_of = member.rows() if crb else None
        base = _frame_base(self.t, node_speedup)
        prefix = f"{node_id}/{expansion}."
        cdf = fit = got = None
        while len(out) < n:
            cid = prefix + str(len(out))
            if kinds and rng.random() < min(len(kinds) / size, 1.0):
                again = kinds[int(rng.integers(len(kinds)))]
                child = self._repeat(again, cid)
                if again.probs is None:  # its forecast moves at the step's end
                    shifts.repeats.append((child, again))
            elif lineage:
                c, parent_speedup = lineage.pop(0)
                child = self._copy(c, cid, node_speedup, base, parent_speedup, rng, shifts)
                self._template[cid] = c
            elif crb:
                if got is None:
                    got = near.of(i, z, member)
                rows = got[1] if got[1] and rng.random() < weight else got[0]
                k, outcome, step, c = rows_of[rows[int(rng.integers(len(rows)))]]
                if member.parts[k].trace is not self.t:
                    c = None
                child = self._invent(cid, node_speedup, base, outcome, step, c, rng, shifts)
                if c is not None:
                    self._template[cid] = c
            else:
                if fit is None:
                    fit, cdf, residuals, (q0, q1, q2) = member.gbm_draws(task, z)
                # rng.choice(len(classes), p=probs), as numpy draws it: one uniform, the
                # first class whose cumulative probability passes it
                k = bisect_right(cdf, rng.random()) if cdf is not None else 0
                outcome = member.classes[k]
                step = math.nan
                if outcome == "success":
                    r = residuals[rng.integers(len(residuals))]
                    step = q1 + r * max((q2 - q0) / _Z90, 0.05)
                child = self._invent(cid, node_speedup, base, outcome, step, None, rng, shifts)
            out.append(child)
            _count_kind(child, distinct, kinds)
        self._remember(out)
        return out

    def _compiled(self, kernel, out, kinds, distinct, node_id, node_speedup, expansion, n,
                  seed, member, z, size, i, near, shifts) -> None:
        """The rest of ``_expand``'s loop, drawn by ``_invent_kernel.invent`` (the same
        children, to the bit), each child then built here."""
        need = n - len(out)
        task = self.t.task_id
        crb = member.family == "crb"
        template = self._template.get(node_id) if crb else None
        if template is not None:  # a crb lineage: the kernel shuffles these first (_lineage)
            used, lineage = self._lineage_kids(node_id, template)
            kids = np.array(lineage, dtype=np.int64)
            parent_speedup = float(self._pool.speedup[template])
        else:
            kids, parent_speedup = np.zeros(0, dtype=np.int64), math.nan
        if 0 <= seed < _SEEDED_BELOW:  # the keyed stream's state, seeded by the kernel
            words = kernel.seeded(seed, np.array(key_words(task, node_id, expansion, "model"),
                                                 dtype=np.uint64))
        else:
            words = _state_words(*keyed_state(seed, task, node_id, expansion, "model"))
        tables = _tables(self._fc, self.t, self._pool)
        bo_start, bo_len, bo_flat = tables.by_outcome()
        if crb:
            near_all, near_own = near.of(i, z, member) if need > len(kids) \
                else (_NO_INTS, _NO_INTS)
            weight = member.weight(task)
            row_c, row_outcome, row_step = member.kernel_rows(self.t)
            cdf, classes, residuals, q = _NO_FLOATS, _NO_INTS, _NO_FLOATS, (0.0, 0.0, 0.0)
        else:
            near_all = near_own = _NO_INTS
            weight = 0.0
            row_c = row_outcome = _NO_INTS
            row_step = _NO_FLOATS
            fit, cdf, _, q = member.gbm_draws(task, z)
            cdf = _NO_FLOATS if cdf is None else np.array(cdf)
            classes = member.kernel_classes()
            residuals = on_object(fit, "_residual_array", lambda: np.asarray(fit.residuals,
                                                                              dtype=float))
        rows = np.empty((need, kernel.COLUMNS))
        kernel.invent(
            words, need, len(kinds), float(size), kids, parent_speedup, 0 if crb else 1,
            near_all, near_own,
            float(weight), row_c, row_outcome, row_step, cdf, classes, residuals,
            float(q[0]), float(q[1]), float(q[2]), bo_start, bo_len, bo_flat,
            tables.outcome_of, tables.speedup_of, tables.has_fc, tables.where,
            tables.parent_target, tables.fc_target, K_NEAREST, float(node_speedup),
            float(_frame_base(self.t, node_speedup)), float(self._pool.frontier),
            INVENTED_HEADROOM, _SUCCESS, _GEN_FAILED_CODE, _Z90, 2.0, rows)
        if template is not None:
            used.update(kids[:need].tolist())
        prefix = f"{node_id}/{expansion}."
        repeat = kernel.REPEAT
        for kind, a, oc, speedup, j, move, keep in rows.tolist():
            cid = prefix + str(len(out))
            if kind == repeat:
                again = kinds[int(a)]
                child = self._repeat(again, cid)
                if again.probs is None:  # its forecast moves at the step's end
                    shifts.repeats.append((child, again))
            else:
                c = int(a)
                child = self._build(cid, c, _LABELS[int(oc)], speedup, int(j), move, shifts)
                if keep:
                    self._template[cid] = c
            out.append(child)
            _count_kind(child, distinct, kinds)

    def _remember(self, out: list[Child]) -> None:
        for c in out:
            if c.speedup == c.speedup:
                self._speedup[c.candidate_id] = c.speedup

    def _lineage(self, node_id: str, n: int, rng) -> list[tuple[int, float]]:
        """crb: an invented node copied from logged child c first draws c's logged children."""
        template = self._template.get(node_id)
        if template is None:
            return []
        used, kids = self._lineage_kids(node_id, template)
        out = []
        for c in rng.permutation(kids).tolist()[:n]:
            used.add(c)
            out.append((c, self._pool.speedup[template]))
        return out

    def _lineage_kids(self, node_id: str, template: int) -> tuple[set, list[int]]:
        """The node's lineage so far (logged children it drew) and the ones still to draw."""
        used = self._used.setdefault(node_id, set())
        return used, [c for g in self._pool.expansions.get(template, ()) for c in g
                      if c not in used]

    def _repeat(self, again: Child, cid: str) -> Child:
        """The same kernel once more: a repeat of an earlier sibling."""
        return Child(cid, "model", again.template, again.code or again.candidate_id, again.gen_s,
                     again.gen_in, again.gen_out, again.gen_imputed, again.gen_failed,
                     again.has_forecast, again.probs, again.parse_failed, again.fc_s,
                     again.fc_in, again.fc_out, again.fc_imputed, again.outcome, again.speedup,
                     again.stage_s, again.price, again.plan_key)

    def _copy(self, c: int, cid: str, node_speedup: float, base: float,
              parent_speedup: float, rng, shifts: _Shifts) -> Child:
        """crb lineage: logged child c of a logged parent, its step carried onto this node."""
        s = self._pool.speedup[c]
        step = math.log2(s / parent_speedup) if s == s and s > 0 else math.nan
        outcome = self.t.outcome[c] if self.t.outcome[c] is not None else _GEN_FAILED
        return self._invent(cid, node_speedup, base, outcome, step, c, rng, shifts)

    def _invent(self, cid: str, node_speedup: float, base: float, outcome: str, step: float,
                c, rng, shifts: _Shifts) -> Child:
        """A new child: ``outcome`` and ``step``; times, tokens and prices from logged child
        ``c`` (or one with the same outcome), its forecast from a logged child whose truth is
        near the drawn one, moved onto it (in ``shifts``, at the step's end); ``base`` is the
        forecast frame's speedup at this parent."""
        pool, fc = self._pool, self._fc
        if c is None:
            same = self._by_outcome.get(outcome) or self._by_outcome.get("success") or [0]
            c = int(same[int(rng.integers(len(same)))])
        head = pool.head[c]
        speedup = node_speedup * 2.0 ** step if outcome == "success" else math.nan
        if outcome == "success" and not math.isfinite(speedup):
            speedup = math.nan
        if speedup > pool.frontier:
            speedup = held_to_log(speedup, pool.frontier)  # no gain the log cannot support
        j, move = -1, 0.0
        if head[5]:  # it has a forecast: move a logged one onto this child's truth
            if outcome == "success" and fc.rows:
                truth = math.log2(speedup / base)
                m = len(fc.target)  # the K_NEAREST nearest: a window of the sorted truths
                k = min(K_NEAREST, m)
                at = bisect_left(fc.target, truth) if truth == truth else m  # searchsorted
                lo = min(max(at - k // 2, 0), m - k)
                j = lo + int(rng.integers(k))
                move = truth - fc.target[j]
            else:  # a failure: its forecast about where its parent stood, moved with it
                w = self._where.get(c)
                if w is not None:
                    move = math.log2(node_speedup / base) - fc.parent_target[w]
        return self._build(cid, c, outcome, speedup, j, move, shifts)

    def _build(self, cid: str, c: int, outcome: str, speedup: float, j: int, move: float,
               shifts: _Shifts) -> Child:
        """The invented child: logged child ``c``'s times, tokens and prices, the forecast of
        template ``j`` (-1: ``c``'s own) moved by ``move`` in log2 at the step's end."""
        t, pool, fc = self.t, self._pool, self._fc
        head = pool.head[c]
        moved = move != 0 and math.isfinite(move)  # (shift_probs leaves the others alone)
        if j >= 0:
            row = fc.rows[j]
            probs, parse_failed = None if moved else t.probs[row], fc.parse_failed[j]
        else:
            row, probs, parse_failed = c, None if moved else head[6], head[7]
        gen_failed = outcome == _GEN_FAILED
        # Its own code identity, so that a later repeat of it is the same kernel to the archive;
        # a forecast to move is None until the step's end.
        child = Child(cid, "model", t.candidate_ids[c], cid, head[0], head[1], head[2],
                      head[3], gen_failed, head[5], probs, parse_failed, head[8], head[9],
                      head[10], head[11], None if gen_failed else outcome, speedup,
                      pool.stage_s[c], pool.price[c], ("model", c, outcome))
        if moved:
            shifts.moves.append((child, row, move))
        return child


def _count_kind(child: Child, distinct: dict, kinds: list) -> None:
    """A node's distinct kernels so far (by code identity, in the order first drawn): a
    generated child whose kernel is new joins them."""
    if not child.gen_failed:
        key = child.code or child.candidate_id
        if key not in distinct:
            distinct[key] = child
            kinds.append(child)


def _choice_cdf(p: np.ndarray) -> list[float]:
    """``Generator.choice``'s cumulative probabilities for ``p`` (its cumsum over its last)."""
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf.tolist()


class _Overlay:
    """Known speedups with a step's later parents' added, without copying the search's."""

    def __init__(self, known: dict, added: dict):
        self.known, self.added = known, added

    def __contains__(self, key) -> bool:
        return key in self.known or key in self.added

    def __getitem__(self, key):
        return self.known[key] if key in self.known else self.added[key]


class _StepNeighbours:
    """crb: the neighbours of every parent of a step, from one distance computation over the
    parents that draw (on first need, for that parent and the ones after it); a parent whose
    features have moved since (they cannot, within a step) is worked out alone."""

    def __init__(self, source: ModelChildren, requests, kernel=None):
        self.source, self.requests = source, requests
        self.kernel = kernel  # found by the compiled kernel, as arrays (None: numpy's lists)
        self.got: dict[int, tuple] = {}

    def of(self, i: int, z: tuple, member) -> tuple[list, list]:
        got = self.got.get(i)
        if got is not None and got[0] == z:
            return got[1]
        src = self.source
        task = src.t.task_id
        # The features of this parent and the later ones, with the best and the known
        # speedups as their draws will find them.
        best, known, added, zs = src._best, src._speedup, {}, {}
        for k, (node_id, s, _, _) in enumerate(self.requests[i:], i):
            if k > i:
                best = max(best, s)
                if node_id not in known:
                    added.setdefault(node_id, s)
                zs[k] = src._features(node_id, s, best, _Overlay(known, added))
            else:
                zs[k] = z
        found = member.neighbours_many(task, list(zs.values())) if self.kernel is None \
            else member.neighbours_arrays(self.kernel, task, list(zs.values()))
        self.got.update({k: (zk, nk) for (k, zk), nk in zip(zs.items(), found)})
        return self.got[i][1]


# --- choosing a child source --------------------------------------------------------------------

CHILDREN = ("own", "fallback", "model", *(f"model:{f}" for f in FAMILIES),
            "fresh", *(f"fresh:{f}" for f in FAMILIES))


class OwnChildren(LogChildren):
    """Only the log's own children: an expansion gets what the log holds for that node (its
    own expansion, then its other ones) and nothing is invented, so a parent the log never
    expanded has no children and an expansion may be short."""

    def picks(self, node_id, node_speedup, expansion, n, seed, fallback: bool = False):
        return super().picks(node_id, node_speedup, expansion, n, seed, fallback=False)


def check_children(children: str) -> str:
    """``children`` if it names a child source (``CHILDREN``), else a one-line error."""
    if children not in CHILDREN:
        raise GfsimError(f"`children`: unknown child source {children!r:.80}; valid: "
                         f"{', '.join(CHILDREN)}")
    return children


def child_sources(children: str, traces: list[SearchTrace]):
    """trace -> its ``ChildSource`` for ``--children`` (own, fallback, model, model:FAMILY,
    fresh, fresh:FAMILY: the world model inventing every child, the logged ones too, so that
    replays with other seeds are new searches like the logged one)."""
    check_children(children)
    if children == "own":
        return OwnChildren
    if children == "fallback":
        return LogChildren
    kind, _, family = children.partition(":")
    model = world_model(traces, family or DEFAULT_FAMILY)
    fresh = kind == "fresh"
    return lambda t: ModelChildren(t, model, fresh=fresh)
