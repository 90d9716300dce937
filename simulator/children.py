"""Where a closed-loop search's children come from.

``LogChildren`` replays a logged search: an expansion of a node draws children *without
replacement*, in this order: the node's own logged children from the same expansion; its other
logged expansions; then a fallback pool of logged (parent, child) pairs of the same task whose
parent is in the node's speedup bin, the child's speedup carried over as the child/parent ratio.
Every draw says which (``draw_source``). A fallback child's speedup is held to what the log
supports (``held_to_log``): chained ratios must not compound into gains the log never showed.
``WorldChildren`` asks a world instead (the synthetic
landscape or any other ``gfsim.worlds.protocol.World``), which is what a replay is checked
against.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
from gfsim.cost_models.presets import PresetCostModel
from gfsim.simulator.traces import SearchTrace

from gfsim.core.caches import on_object
from gfsim.core.libm import log2
from gfsim.core.rng import transient_stream
from gfsim.forecasts.bins import speedup_to_bin

__all__ = ["Child", "ChildSource", "LogChildren", "WorldChildren",
           "LandscapeChildren", "finish_steps", "DRAW_SOURCES", "INVENTED", "shift_probs",
           "shift_probs_rows",
           "probs_cdf", "bin_grid", "shifted_cdf", "held_to_log",
           "INVENTED_HEADROOM", "log_frontier"]

DRAW_SOURCES = ("own", "other_expansion", "fallback", "model", "world")
INVENTED = ("fallback", "model")  # draws of children the log never held
# How far above the best speedup its log measured an invented child may go (at most): the log
# holds no evidence of kernels beyond its best, so a closed-loop replay that draws more or
# other children may find a little more, never a gain of its own making.
INVENTED_HEADROOM = 1.25


def held_to_log(speedup: float, frontier: float, headroom: float = INVENTED_HEADROOM) -> float:
    """An invented child's speedup held to what its log supports: unchanged up to
    ``frontier`` (the best speedup the log measured for the search); above it the excess, in
    log2, saturates (h (1 - exp(-excess / h)), h = log2 ``headroom``), so that no invented
    child passes ``frontier`` x ``headroom`` and a better draw still stays better. Ratios
    carried from one parent to another compound over a long search (a 1.6x log replayed at
    18x, or millions); this is where they stop."""
    if not speedup > frontier:  # NaN (a failure) too
        return speedup
    if not headroom > 1.0:
        return frontier
    h = math.log2(headroom)
    return frontier * 2.0 ** (-h * math.expm1(-math.log2(speedup / frontier) / h))


def log_frontier(trace: SearchTrace) -> float:
    """The best speedup a logged search measured (its seed kernel's included)."""
    s = np.asarray(trace.speedup, dtype=float)
    s = s[np.isfinite(s) & (s > 0)]
    return float(max(trace.seed_speedup, s.max())) if len(s) else float(trace.seed_speedup)


_EVAL_STAGES = ("cold_start", "compilation", "check", "timing")


@dataclass(slots=True)
class Child:
    """One drawn candidate, with every field the engine reads (durations in service seconds,
    prices per cost stage as (usd, joules, usd_imputed))."""

    candidate_id: str
    draw_source: str
    template: str | None  # the logged candidate it copies, if any
    code: str | None  # identity for the archive's duplicate check
    gen_s: float
    gen_in: float
    gen_out: float
    gen_imputed: bool
    gen_failed: bool
    has_forecast: bool
    probs: np.ndarray
    parse_failed: bool
    fc_s: float
    fc_in: float
    fc_out: float
    fc_imputed: bool
    outcome: str | None
    speedup: float
    stage_s: dict[str, float]
    price: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    # Children with the same plan key have the same stage times, tokens, prices, outcome and
    # generation failure (only their forecast fields may differ): engines may share what
    # they derive from those (``ChildSource.template_cache``). None: nothing shared.
    plan_key: object = None


def finish_steps(pending: list) -> None:
    """Finish the children of several searches' ``draw_step_open`` (their work left, not
    None), together: each kind of work (its class) finishes all of its at once."""
    kinds: dict = {}
    for work in pending:
        kinds.setdefault(type(work), []).append(work)
    for kind, works in kinds.items():
        kind.finish_all(works)


class ChildSource(ABC):
    """Draws the children of one expansion of an archive node; keyed, so the same (seed,
    node, expansion) always gives the same children."""

    @abstractmethod
    def root(self) -> tuple[str, float]:
        """The seed kernel's node id and measured speedup."""

    @abstractmethod
    def draw(self, node_id: str, node_speedup: float, expansion: int, n: int,
             seed: int) -> list[Child]:
        """``n`` children for expansion ``expansion`` of ``node_id``."""

    def draw_step(self, requests, seed: int) -> list[list[Child]]:
        """The children of every expansion of one search step: ``requests`` holds one
        (node_id, node_speedup, expansion, n) per parent, in the step's order, and the answer
        one list of children per request, the very ones a ``draw`` per request in that order
        gives (which is what this does; a source that can share work across a step's parents,
        as ``world_model.ModelChildren`` does, draws them together)."""
        return [self.draw(*r, seed) for r in requests]

    def draw_step_open(self, requests, seed: int):
        """``draw_step`` for a step drawn together with other searches' (the lockstepped fast
        path): (the children, work left to finish them, or None). A source whose children's
        last touches batch well across searches (``world_model.ModelChildren`` moves their
        forecasts) leaves that work to ``finish_steps`` of every search's at once; until then
        the children must not be read. This one finishes its own."""
        return self.draw_step(requests, seed), None

    def template_cache(self) -> dict | None:
        """A dict that lives as long as the data children are copied from, for engines to keep
        what they derive from a child with a given ``template`` (None: children share
        nothing, so nothing is kept)."""
        return None

    def observe_step(self, results) -> None:
        """What a step measured (``simulator.puct.ChildResult``s), told by the engine after
        the archive took it in: a source whose children's forecasts learn from the search
        (``simulator.learning.LearningChildren``) learns it; others ignore it."""


class _LogPool:
    """What ``LogChildren`` needs of a trace, worked out once per trace (``pool_of``): the
    logged expansions of every node, the fallback pool by parent speedup bin, and each logged
    candidate's fields as a child copies them (the stage and price dicts are shared, read-only,
    by every child drawn from the same candidate)."""

    def __init__(self, t: SearchTrace):
        speedup = np.asarray(t.speedup, dtype=float)
        self.speedup = speedup.tolist()
        # Logged expansions per node: parent index (-1: the seed kernel) -> children by step.
        groups: dict[int, dict[int, list[int]]] = {}
        for i, (p, s) in enumerate(zip(t.parent, t.step)):
            groups.setdefault(p, {}).setdefault(s, []).append(i)
        self.expansions = {p: [g[s] for s in sorted(g)] for p, g in groups.items()}
        # Fallback pool: children whose parent (or the seed) has a measured speedup, by bin.
        parent = np.asarray(t.parent, dtype=int)
        ps = np.where(parent < 0, t.seed_speedup, speedup[np.maximum(parent, 0)]) \
            if len(parent) else np.zeros(0)
        valid = np.flatnonzero(ps > 0)
        bins = speedup_to_bin(ps[valid]).tolist() if len(valid) else []
        self.pool: dict[int, list[int]] = {}
        self.pool_parent_speedup: dict[int, float] = {}
        for i, b in zip(valid.tolist(), bins):
            self.pool_parent_speedup[i] = float(ps[i])
            self.pool.setdefault(b, []).append(i)
        self.pool_bins = sorted(self.pool)
        self.frontier = log_frontier(t)  # invented children are held to it (held_to_log)
        # Each logged candidate as a child copies it: the fields before the speedup, then its
        # stage seconds and prices.
        self.head = [(t.gen_s[c], t.gen_in[c], t.gen_out[c], t.gen_imputed[c], t.gen_failed[c],
                      bool(t.has_forecast[c]), t.probs[c], bool(t.parse_failed[c]), t.fc_s[c],
                      t.fc_in[c], t.fc_out[c], t.fc_imputed[c], t.outcome[c])
                     for c in range(len(t))]
        self.stage_s = [{k: t.stage_s[k][c] for k in _EVAL_STAGES} for c in range(len(t))]
        price = {k: [tuple(map(float, col)) for col in cols] for k, cols in t.price.items()}
        self.price = [{k: (u[c], j[c], imp[c]) for k, (u, j, imp) in price.items()}
                      for c in range(len(t))]
        # What the archive's duplicate-code check compares: the code's hash where the log
        # records it (two logged candidates with the same code are one kernel, as the live
        # search saw them), else the logged candidate.
        sha = t.code_sha256 or [None] * len(t)
        self.identity = [sha[c] or t.candidate_ids[c] for c in range(len(t))]
        self.derived: dict = {}  # engines' per-candidate derivations (ChildSource.template_cache)


def pool_of(trace: SearchTrace) -> _LogPool:
    """The trace's ``_LogPool``, built on first use and kept on the trace (which engines never
    change): every replay of a log, and every seed and trial of a tuning run, shares it."""
    return on_object(trace, "_log_pool", lambda: _LogPool(trace))


def _bin_of(speedup: float) -> int:
    """``speedup_to_bin`` of one speedup (the same log2, without building arrays)."""
    if not speedup > 0:
        raise ValueError("speedup must be > 0 to have a bin")
    return int(min(max(np.floor(2.0 * np.log2(speedup)) + 4, 1), 8))


class LogChildren(ChildSource):
    """Children of a logged search (one ``SearchTrace``)."""

    def __init__(self, trace: SearchTrace):
        self.t = trace
        self._logged: dict[str, int] = {}  # replay node id -> logged index (exact draws)
        self._used: dict[str, set[int]] = {}

    def root(self) -> tuple[str, float]:
        self._logged["seed"] = -1
        return "seed", self.t.seed_speedup

    def picks(self, node_id, node_speedup, expansion, n, seed,
              fallback: bool = True) -> list[tuple[int, str, str, float]]:
        """The ``n`` draws of one expansion as (logged index, child id, draw source, speedup);
        without ``fallback`` only the exact ones (own and other expansions), maybe fewer."""
        pool = pool_of(self.t)
        used = self._used.setdefault(node_id, set())
        rng = None  # made only when a draw needs it: own children are taken in logged order
        picks: list[tuple[int, str]] = []
        j = self._logged.get(node_id)
        exps = pool.expansions.get(j, []) if j is not None else []
        own = exps[expansion] if expansion < len(exps) else []
        for c in own:
            if len(picks) < n and c not in used:
                picks.append((c, "own"))
                used.add(c)
        if len(picks) < n:
            other = [c for e, g in enumerate(exps) if e != expansion for c in g if c not in used]
            if other:
                rng = transient_stream(seed, self.t.task_id, node_id, expansion)
                for c in rng.permutation(other).tolist():
                    if len(picks) < n:
                        picks.append((c, "other_expansion"))
                        used.add(c)
        if fallback and len(picks) < n and pool.pool:
            if rng is None:
                rng = transient_stream(seed, self.t.task_id, node_id, expansion)
            picks += [(c, "fallback") for c in self._fallback(pool, node_speedup,
                                                              n - len(picks), used, rng)]
        out = []
        for slot, (c, source) in enumerate(picks):
            cid = f"{node_id}/{expansion}.{slot}"
            s = pool.speedup[c]
            if source == "fallback" and s == s:
                s = held_to_log(node_speedup * s / pool.pool_parent_speedup[c], pool.frontier)
            else:
                self._logged[cid] = c
            out.append((c, cid, source, float(s)))
        return out

    def template_cache(self) -> dict:
        return pool_of(self.t).derived

    def draw(self, node_id, node_speedup, expansion, n, seed):
        pool = pool_of(self.t)
        return [self._child(pool, c, cid, source, s)
                for c, cid, source, s in self.picks(node_id, node_speedup, expansion, n, seed)]

    @staticmethod
    def _fallback(pool: _LogPool, node_speedup, n, used, rng) -> list[int]:
        """Pool entries of the node's speedup bin (the nearest non-empty bin if it has none);
        without replacement per node while they last."""
        b = _bin_of(node_speedup)
        entries = pool.pool.get(b)
        if not entries:
            entries = pool.pool[min(pool.pool_bins, key=lambda k: (abs(k - b), k))]
        free = [c for c in entries if c not in used]
        order = rng.permutation(free).tolist()
        while len(order) < n:  # exhausted: draw again, with replacement
            order += rng.permutation(entries).tolist()
        used.update(order[:n])
        return order[:n]

    def _child(self, pool: _LogPool, c: int, cid: str, source: str, speedup: float) -> Child:
        return Child(cid, source, self.t.candidate_ids[c],
                     None if source == "fallback" else pool.identity[c], *pool.head[c],
                     speedup, pool.stage_s[c], pool.price[c])


_EDGES_LOG2 = log2((0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0))  # the C library's: gfsim.core.libm
_EXTENDED = np.concatenate([[_EDGES_LOG2[0] - 1.0], _EDGES_LOG2, [_EDGES_LOG2[-1] + 1.0]])


def _extended(edges_log2: np.ndarray) -> np.ndarray:
    """The bin edges with the open end bins closed one log2 beyond the outer edges."""
    return np.concatenate([[edges_log2[0] - 1.0], edges_log2, [edges_log2[-1] + 1.0]])


def shift_probs(probs: np.ndarray, delta_log2: float,
                edges_log2: np.ndarray | None = None) -> np.ndarray:
    """A forecast over 8 bins (the paper's unless ``edges_log2``, the 7 inner edges in log2)
    moved by ``delta_log2`` in log2 speedup: mass spread evenly in log2 within each bin (the
    open end bins taken as one log2 wide), then re-integrated over the bins. Zero
    probabilities (a failed parse) stay zero.

    Worked in Python floats, not numpy: a closed-loop replay moves some 60,000 forecasts of 8
    bins per tuning trial, where numpy's per-call overhead was nine tenths of the cost. The
    floats are numpy's ``cumsum`` / ``interp`` / ``diff`` / ``maximum`` ones, operation for
    operation (``shift_probs_rows`` gives the same for many rows at once; the tests hold
    both to the numpy form)."""
    if delta_log2 == 0 or not math.isfinite(delta_log2):
        return probs
    cdf = probs_cdf(probs)
    if cdf is None:
        return probs
    return np.array(shifted_cdf(cdf, delta_log2, bin_grid(edges_log2)))


def probs_cdf(probs) -> list[float] | None:
    """``np.cumsum`` of a forecast, from 0, as Python floats (None: no mass to move, which
    ``shift_probs`` leaves alone); a source that moves the same logged forecast many times
    keeps it."""
    p = (probs if isinstance(probs, np.ndarray) and probs.dtype == np.float64
         else np.asarray(probs, dtype=float)).tolist()
    cdf = [0.0] * (len(p) + 1)
    acc = cdf[1] = p[0]  # cumsum: sequential, starting from the first term
    for i in range(1, len(p)):
        acc = cdf[i + 1] = acc + p[i]
    return cdf if acc > 0 else None


_GRIDS: dict = {}


def bin_grid(edges_log2: np.ndarray | None = None) -> tuple[list, list, list]:
    """(inner edges, closed edges, their widths) as Python floats, for ``shifted_cdf``."""
    key = None if edges_log2 is None else np.asarray(edges_log2, dtype=float).tobytes()
    got = _GRIDS.get(key)
    if got is None:
        edges = _EDGES_LOG2 if edges_log2 is None else np.asarray(edges_log2, dtype=float)
        xp = (_EXTENDED if edges_log2 is None else _extended(edges)).tolist()
        got = (edges.tolist(), xp, [xp[j + 1] - xp[j] for j in range(len(xp) - 1)])
        if len(_GRIDS) > 64:
            _GRIDS.clear()
        _GRIDS[key] = got
    return got


def shifted_cdf(cdf: list[float], delta_log2: float, grid) -> list[float]:
    """The bins of ``shift_probs``: the forecast with cumulative sums ``cdf``
    (``probs_cdf``) moved by ``delta_log2`` (finite, not 0) over ``grid`` (``bin_grid``)."""
    edges, xp, dx = grid
    out = []
    prev = 0.0
    last = len(xp) - 1
    lo, hi = xp[0], xp[last]
    for e in edges:
        x = e - delta_log2
        if x < lo:  # np.interp: the end values beyond the ends
            at = cdf[0]
        elif x >= hi:
            at = cdf[last]
        else:
            j = bisect_right(xp, x) - 1  # xp[j] <= x < xp[j + 1]
            if xp[j] == x:
                at = cdf[j]
            else:
                slope = (cdf[j + 1] - cdf[j]) / dx[j]
                at = slope * (x - xp[j]) + cdf[j]
                if at != at:  # NaN one way: numpy tries the other
                    at = slope * (x - xp[j + 1]) + cdf[j + 1]
                    if at != at and cdf[j] == cdf[j + 1]:
                        at = cdf[j]
        d = at - prev
        out.append(d if d > 0.0 or d != d else 0.0)  # np.maximum(d, 0.0), NaN kept
        prev = at
    d = cdf[last] - prev
    out.append(d if d > 0.0 or d != d else 0.0)
    return out


def shift_probs_rows(probs: np.ndarray, delta_log2: np.ndarray,
                     edges_log2: np.ndarray | None = None) -> np.ndarray:
    """``shift_probs`` of every row of ``probs`` (m, 8) by its ``delta_log2`` (m,), in a few
    array operations: the same floats, row for row (a row that ``shift_probs`` leaves alone
    comes back unchanged)."""
    probs = np.asarray(probs, dtype=float)
    delta = np.asarray(delta_log2, dtype=float)
    m, nb = probs.shape
    if edges_log2 is None:
        edges, xp = _EDGES_LOG2, _EXTENDED
    else:
        edges, xp = np.asarray(edges_log2, dtype=float), _extended(edges_log2)
    cdf = np.zeros((m, nb + 1))
    np.cumsum(probs, axis=1, out=cdf[:, 1:])
    total = cdf[:, -1]
    moved = (delta != 0) & np.isfinite(delta) & (total > 0)
    x = edges[None, :] - delta[:, None]  # (m, 7)
    last = len(xp) - 1
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, last - 1)
    x0, x1 = xp[j], xp[j + 1]
    f0 = np.take_along_axis(cdf, j, axis=1)
    f1 = np.take_along_axis(cdf, j + 1, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (f1 - f0) / (x1 - x0)
        at = slope * (x - x0) + f0
        nan = np.isnan(at)
        if nan.any():  # np.interp: NaN one way, the other way, else the flat value
            other = slope * (x - x1) + f1
            at = np.where(nan, np.where(np.isnan(other) & (f0 == f1), f0, other), at)
    at = np.where(x0 == x, f0, at)
    at = np.where(x < xp[0], cdf[:, :1], np.where(x >= xp[last], cdf[:, last:], at))
    full = np.empty((m, nb + 1))
    full[:, 0] = 0.0
    full[:, 1:-1] = at
    full[:, -1] = total
    out = np.diff(full, axis=1)
    np.maximum(out, 0.0, out=out)
    return np.where(moved[:, None], out, probs)


class WorldChildren(ChildSource):
    """Children straight from a world (``gfsim.worlds.protocol``): the ground truth a replay
    is checked against. Slot k of expansion e in replicate r is the world's child index
    r * 1,000,000 + e * 1000 + k, so a search that draws more children per expansion sees the
    same first ones, and another replicate is a fresh set of draws from the same parents.

    ``cache`` (a dict, optional) keeps each drawn child by node id; pass the same dict to every
    run on one world, task, cost model and forecaster (as ``gfsim counterfactual`` does) and a
    child is built once. Children are read-only to the engines, so sharing them is safe."""

    def __init__(self, world, task_id: str, model: PresetCostModel,
                 forecaster: str = "synthetic", *, replicate: int = 0,
                 cache: dict | None = None, keep_records: bool = True):
        if isinstance(replicate, bool) or not isinstance(replicate, int) or not (
                0 <= replicate < 1000):
            raise ValueError(f"replicate must be a whole number in 0..999, got {replicate!r}")
        self.world = world
        self.task_id = task_id
        self.model = model
        self.forecaster = forecaster
        self.offset = replicate * 1_000_000
        self.cache = cache if cache is not None else {}
        self.nodes = {}
        self.keep_records = keep_records
        self.records: dict[str, tuple] = {}  # node id -> (generation, forecast, evaluation)

    def template_cache(self) -> dict | None:
        """What engines derive from a child, kept beside the shared child cache (a child's
        node id names it there: one id, one child, in one cache)."""
        return self.cache.setdefault(("derived",), {})

    def root(self) -> tuple[str, float]:
        node = self.world.root(self.task_id)
        self.nodes[node.node_id] = node
        return node.node_id, float(self.world.task(self.task_id).seed_speedup)

    def draw(self, node_id, node_speedup, expansion, n, seed):
        parent = self.nodes[node_id]
        base = self.offset + expansion * 1000
        out = []
        for k in range(n):
            key = (node_id, base + k)
            got = self.cache.get(key)
            if got is None:
                node = self.world.child(parent, base + k)
                got = self.cache[key] = (node, *self._child(node))
            node, child, records = got
            self.nodes[node.node_id] = node
            if self.keep_records:
                self.records[node.node_id] = records
            out.append(child)
        return out

    def _child(self, node) -> tuple[Child, tuple]:
        from gfsim.cost_models.usage import Usage

        w, m, pri = self.world, self.model, self.model.priors
        gen = w.generation(node)
        failed = "failed_reason" in gen
        fc = ev = None
        if not failed:
            fc = w.forecast(node, self.forecaster, 0)
            ev = w.evaluation(node)
        raw = np.asarray(fc["probs"], dtype=float) if fc else np.zeros(8)
        parse_failed = bool(fc and fc.get("parse_failed"))
        probs = raw / raw.sum() if raw.sum() > 0 else np.zeros(8)
        stage = {"cold_start": ev.get("cold_start_s", 0.0) if ev else 0.0,
                 "compilation": ev.get("compile_s", 0.0) if ev else 0.0,
                 "check": ev.get("check_s", 0.0) if ev else 0.0,
                 "timing": ev.get("timing_s", 0.0) if ev else 0.0}
        if m.billing != "serverless":
            stage["cold_start"] = 0.0
        gen_in, gen_out = gen.get("input_tokens"), gen.get("output_tokens")
        gen_imputed = gen_in is None or gen_out is None
        child = Child(
            candidate_id=node.node_id, draw_source="world", template=None,
            code=getattr(node, "code_id", None) or node.node_id, gen_s=gen.get("service_s", 0.0),
            gen_in=pri.gen_input_tokens if gen_in is None else float(gen_in),
            gen_out=pri.gen_output_tokens if gen_out is None else float(gen_out),
            gen_imputed=gen_imputed, gen_failed=failed,
            has_forecast=fc is not None, probs=probs, parse_failed=parse_failed,
            fc_s=fc.get("latency_s", 0.0) if fc else 0.0,
            fc_in=fc.get("input_tokens", 0.0) if fc else 0.0,
            fc_out=fc.get("output_tokens", 0.0) if fc else 0.0, fc_imputed=False,
            outcome=ev["outcome"] if ev else None,
            speedup=float(ev["speedup"]) if ev and ev["outcome"] == "success" else math.nan,
            stage_s=stage,
        )
        usages = {"generation": Usage("generation", child.gen_s, child.gen_in, child.gen_out,
                                      imputed=gen_imputed),
                  "forecasting": Usage("forecasting", child.fc_s, child.fc_in, child.fc_out)}
        usages.update({k: Usage(k, v) for k, v in stage.items()})
        for k, u in usages.items():
            c = m.cost(u)
            child.price[k] = (c.usd, c.joules, c.usd_imputed)
        return child, (gen, fc, ev)


LandscapeChildren = WorldChildren  # the name it had when the landscape was the only world
