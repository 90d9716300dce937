"""The fast path: the trace driver in closed form when no resource capacity binds.

If no step has more candidates than any resource has slots, nothing ever queues: a candidate's
stages end at its start time plus their durations, a parent batch decides when its slowest
member is ready, and a step ends when its slowest batch does. Durations then do not depend on
decisions, so they are computed once for the whole search, and decisions are made for many
steps in one vectorised ``Policy.decide_groups`` call. The only thing that carries from step to
step is the best measured speedup (and, for parent-relative forecasts, the parents' measured
speedups): a chunk of steps is decided with the current best, and kept up to the first step in
which a measurement beats it; that step is redone batch by batch in decision order, and the
next chunk starts after it. Decisions, states, best speedups and totals agree with the SimPy
engine (tests/test_fastpath.py, many random configurations); times agree to rounding.

The searches of a log run together, in lockstep (``run_fast_many``): their columns laid end to
end, one round deciding every search's next chunk in as few policy calls as the policy's state
allows (``Policy.state_fields``), each search keeping its own best, chunk and clock. Sums and
running sums per search are taken in numpy's own order, so that a search's figures are, to the
bit, those it gives replayed alone (tests/test_fastpath.py). A log of many small searches then
costs a few microseconds a search beyond its candidates (one policy call and a few numpy calls
a round instead of per search): their results are columns for the whole log
(``simulator.search_columns``), not an object per search.

Not covered (the event engine runs instead): budgets other than ``steps``, and a measurement
that improves the best ending at the instant (within 1e-9 s) a batch of its step decides, where
event order would matter.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gfsim.core import caches
from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import STAGES
from gfsim.policies.base import Batch, Policy, SearchState
from gfsim.simulator.budget import Budget
from gfsim.simulator.trace.engine import segments
from gfsim.simulator.pipeline import COST_STAGE, DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.results import SearchResult, no_cyclic_gc
from gfsim.simulator.search_columns import SearchColumns, SearchList
from gfsim.simulator.noise import MeasureNoise
from gfsim.simulator.traces import (SearchTrace, ancestor_speedup, columns_of,
                                   shared_floats)

__all__ = ["fast_path_blocker", "fast_path_blockers", "run_fast", "run_fast_many",
           "FastPathUnsafe", "LogTraces", "log_span"]

# Why a candidate stopped before the end of a pass.
_OK, _GEN_FAILED, _UNMEASURABLE, _FAILED = 0, 1, 2, 3
_ENDED_STATE = {_GEN_FAILED: "generation_failed", _UNMEASURABLE: "unmeasurable",
                _FAILED: "failed_before_decision"}
_UNBOUNDED = {"usd": math.inf, "seconds": math.inf, "joules": math.inf, "gpu_evals": math.inf,
              "gpu_hours": math.inf}
_LIMITS = ("usd", "seconds", "joules", "gpu_evals", "gpu_hours")  # any of them: the event engine

_KEEP_LAYOUT = 256  # a trace of at least this many candidates keeps its layout and widest
#                    step between runs


class LogTraces(list):
    """A log's traces as ``build_traces`` made them, with what the fast path reads of the
    list as a whole found once (a replay reads it several times; 10^5 searches: some 20 ms
    each): ``span``, ``columns_of`` of the list. Read-only, as the engines treat traces."""

    def __init__(self, traces):
        super().__init__(traces)
        self.span = columns_of(self)


def log_span(traces):
    """``columns_of(traces)``, found once for a ``LogTraces``."""
    return traces.span if isinstance(traces, LogTraces) else columns_of(traces)


class FastPathUnsafe(Exception):
    """A tie in time that only the event engine's ordering can settle."""


def fast_path_blocker(trace: SearchTrace, policy: Policy, model: PresetCostModel,
                      caps: Capacities, budget: Budget) -> str | None:
    """Why the fast path cannot replay this search, or None if it can."""
    if any(not math.isinf(getattr(budget, k)) for k in _LIMITS):
        return "a usd, seconds, joules, gpu_evals or gpu_hours budget"
    widest = caches.kept(trace, "_fast_widest")
    if widest is None:
        widest = max((sum(map(len, batches)) for _, batches in trace.steps), default=0)
        if len(trace) >= _KEEP_LAYOUT:
            caches.keep(trace, "_fast_widest", widest)
    slots = {"generator": caps.generator, "GPU": caps.gpus}
    if policy.needs_forecast:
        slots["forecaster"] = caps.forecaster
    if model.compile_on == "cpu":
        slots["compile worker"] = caps.compile_workers
    for name, n in slots.items():
        if widest > n:
            return f"{name} capacity binds ({n} slots, steps of up to {widest} candidates)"
    return None


def fast_path_blockers(traces: list[SearchTrace], policy: Policy, model: PresetCostModel,
                       caps: Capacities, budget: Budget) -> list[str | None]:
    """``fast_path_blocker`` of every trace, the settings checked once (10^5 searches: a few
    tens of milliseconds instead of a second)."""
    if any(not math.isinf(getattr(budget, k)) for k in _LIMITS):
        return ["a usd, seconds, joules, gpu_evals or gpu_hours budget"] * len(traces)
    slots = min(caps.generator, caps.gpus, caps.forecaster if policy.needs_forecast else
                math.inf, caps.compile_workers if model.compile_on == "cpu" else math.inf)
    out: list[str | None] = []
    for t in traces:
        widest = caches.kept(t, "_fast_widest")
        out.append(None if widest is not None and widest <= slots else
                   fast_path_blocker(t, policy, model, caps, budget))
    return out


@dataclass
class _Pass:
    """What one pass over some rows did: end times, why rows ended, and its bookings."""

    rows: np.ndarray
    end: np.ndarray
    ended: np.ndarray
    ran: list[tuple[str, np.ndarray]]  # (cost stage, rows that ran it)
    bookings: list[tuple]  # (rows, when, gpu seconds, usd, joules) per segment


class _World:
    """The searches' columns end to end (row r of search i is ``off[i] + r``), and how a
    pass of stages runs over any rows of them."""

    def __init__(self, traces: list[SearchTrace], policy: Policy):
        chain = itertools.chain.from_iterable
        self.span = span = log_span(traces)
        self.n = n = span[2] - span[1] if span is not None else sum(map(len, traces))
        if span is not None:  # consecutive searches of one log: its columns, sliced once
            cols, a, b = span
            whole = cols.whole()
            self.gen_failed, outcome = whole["gen_failed"][a:b], whole["outcome"][a:b]
            stage_s = {k: whole[k][a:b] for k in cols.stage_s}
            gen_s, fc_s = whole["generation"][a:b], whole["forecasting"][a:b]
            self.speedup = whole["speedup"][a:b]
            self.parent = np.where(cols.parent_row[a:b] >= 0, cols.parent_row[a:b] - a, -1)
        elif len(traces) == 1:  # one search: the trace's own arrays, converted once per trace
            a = traces[0].arrays
            self.gen_failed, outcome = a["gen_failed"], a["outcome"]
            stage_s = {k: a[k] for k in traces[0].stage_s}
            gen_s, fc_s = a["generation"], a["forecasting"]
            self.speedup, self.parent = a["speedup"], a["parent"]
        else:
            def floats(get):
                return np.fromiter(chain(map(get, traces)), dtype=float, count=n)

            self.gen_failed = np.fromiter(chain(t.gen_failed for t in traces), dtype=bool,
                                          count=n)
            outcome = np.empty(n, dtype=object)
            outcome[:] = list(chain(t.outcome for t in traces))
            stage_s = {k: floats(lambda t, k=k: t.stage_s[k]) for k in traces[0].stage_s}
            gen_s, fc_s = floats(lambda t: t.gen_s), floats(lambda t: t.fc_s)
            self.speedup = floats(lambda t: t.speedup)
            self.parent = None  # trace-local parents, made global by the caller
        has_forecast = span[0].arrays["has_forecast"][span[1]:span[2]] if span else \
            np.concatenate([t.has_forecast for t in traces])
        self.has_forecast = has_forecast
        self.forecast_runs = has_forecast & policy.needs_forecast
        self.outcome = outcome
        self.no_eval = np.equal(outcome, None)
        self.success = outcome == "success"
        self.ends_after = {"compile": outcome == "compile_failed",
                           "check": ((outcome == "runtime_error") | (outcome == "incorrect"))
                           & ~(stage_s["timing"] > 0)}  # failed after timing: timing ran
        self.secs = {"generation": gen_s, "forecasting": fc_s, **stage_s}
        self.price = {s: tuple(x[span[1]:span[2]] for x in v)
                      for s, v in span[0].price.items()} if span else \
            traces[0].price if len(traces) == 1 else {
            s: tuple(np.concatenate([t.price[s][j] for t in traces]) for j in range(3))
            for s in traces[0].price}

    def run_pass(self, rows: np.ndarray, start: np.ndarray, segs) -> _Pass:
        """Rows from ``start`` through ``segs``, adding durations in the event engine's order."""
        now = start.copy()
        ended = np.full(len(rows), _OK)
        ran: list[tuple[str, np.ndarray]] = []
        bookings = []
        for res, stages in segs:
            alive = ended == _OK
            runs_by_stage = []
            for s in stages:
                if s == "forecast":
                    runs = alive & self.forecast_runs[rows]
                elif s != "generate":
                    lacking = alive & self.no_eval[rows]
                    ended[lacking] = _UNMEASURABLE
                    alive = alive & ~lacking
                    runs = alive.copy()
                else:
                    runs = alive.copy()
                runs_by_stage.append((COST_STAGE[s], runs))
                stop = None
                if s == "generate":
                    stop, code = alive & self.gen_failed[rows], _GEN_FAILED
                elif s in self.ends_after:
                    stop, code = alive & self.ends_after[s][rows], _FAILED
                if stop is not None:
                    ended[stop] = code
                    alive = alive & ~stop
            ran_any = np.zeros(len(rows), bool)
            for _, runs in runs_by_stage:
                ran_any |= runs
            total = np.zeros(len(rows))
            if res == "gpu":  # a fresh container per acquisition under serverless billing
                cold = np.where(ran_any, self.secs["cold_start"][rows], 0.0)
                total = total + cold
                runs_by_stage.insert(0, ("cold_start", ran_any & (cold > 0)))
            for stage, runs in runs_by_stage:
                if stage != "cold_start":
                    total = total + np.where(runs, self.secs[stage][rows], 0.0)
            now = np.where(ran_any, now + total, now)
            ran.extend((stage, rows[runs]) for stage, runs in runs_by_stage)
            usd = np.zeros(len(rows))
            joules = np.zeros(len(rows))
            for stage, runs in runs_by_stage:
                usd += np.where(runs, self.price[stage][0][rows], 0.0)
                joules += np.where(runs, self.price[stage][1][rows], 0.0)
            k = int(np.count_nonzero(ran_any))
            # (a segment off the GPU books no GPU-seconds: one shared zero, no column of them)
            gpu = total[ran_any] if res == "gpu" else np.broadcast_to(0.0, (k,))
            bookings.append((rows[ran_any], now[ran_any], gpu, usd[ran_any], joules[ran_any]))
        return _Pass(rows, now, ended, ran, bookings)


_TIE_S = 1e-9
_SKIP_MEASURE = np.array(["skip", "measure"], dtype=object)
_FIRST_CHUNK = 4  # steps decided at once after a new best; doubles while no new best comes
_NONE = np.iinfo(np.int64).max  # no record step


def _local_layout(steps) -> tuple:
    """A search's steps flattened in batch order: (trace rows, batch sizes, batches per step,
    logged step numbers)."""
    batches = [b for _, bs in steps for b in bs]
    sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    rows = np.fromiter(itertools.chain.from_iterable(batches), dtype=np.int64,
                       count=int(sizes.sum()))
    per_step = np.fromiter((len(bs) for _, bs in steps), dtype=np.int64, count=len(steps))
    return rows, sizes, per_step, np.array([s for s, _ in steps], dtype=np.int64)


def _columns_layout(cols, a: int, b: int, sizes: np.ndarray, cut: int | None) -> tuple:
    """``_Layout``'s (rows, batch sizes, batches per step, step numbers, steps per search) for
    the rows a:b of ``cols`` in one numpy pass: a step is a run of equal step numbers in a
    search, a batch its candidates of one parent, in order of their first appearance."""
    n = b - a
    step = cols.whole()["step"][a:b]
    search = np.repeat(np.arange(len(sizes)), sizes)
    new = np.ones(n, bool)
    new[1:] = step[1:] != step[:-1]
    new[_offsets(sizes)[:-1]] = True
    group = np.cumsum(new) - 1
    heads = np.flatnonzero(new)
    groups_of = np.bincount(search[heads], minlength=len(sizes))
    in_search = np.arange(len(heads)) - np.repeat(_offsets(groups_of)[:-1], groups_of)
    keep_group = in_search < cut if cut is not None else np.ones(len(heads), bool)
    steps_of = np.bincount(search[heads][keep_group], minlength=len(sizes))
    kept = np.flatnonzero(keep_group[group])
    parent = cols.parent_row[a:b]
    key = group[kept] * (n + 1) + np.where(parent[kept] >= 0, parent[kept] - a + 1, 0)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    first_row = first[inverse.reshape(-1)]
    order = np.lexsort((kept, first_row))
    rows = kept[order]
    first_row = first_row[order]
    starts = _starts(first_row)
    sizes_a = np.diff(np.append(starts, len(rows)))
    per_step = np.bincount(group[rows[starts]], minlength=len(heads))[keep_group]
    return rows, sizes_a, per_step, step[heads[keep_group]], steps_of, groups_of


class _Layout:
    """Every search's kept steps, flattened in batch order and laid end to end: positions
    0..m-1, each a row of the world; batches and steps numbered across searches."""

    def __init__(self, traces: list[SearchTrace], off: np.ndarray, budget_steps: float,
                 span=None):
        cut = None if math.isinf(budget_steps) else int(budget_steps)
        if span is not None:
            *layout, all_steps = _columns_layout(*span, np.diff(off), cut)
            self.all_steps = all_steps.tolist()  # each search's steps, kept or not
            self._finish(*layout, len(traces))
            return
        self.all_steps = [len(t.steps) for t in traces]
        parts: list[tuple] = []  # (rows, sizes, per_step, step numbers) runs, in order
        rows: list[int] = []
        sizes: list[int] = []
        per_step: list[int] = []
        numbers: list[int] = []
        steps_of = np.zeros(len(traces), np.int64)

        def flush():
            if sizes:
                parts.append((np.array(rows, np.int64), np.array(sizes, np.int64),
                              np.array(per_step, np.int64), np.array(numbers, np.int64)))
                for x in (rows, sizes, per_step, numbers):
                    x.clear()

        for i, t in enumerate(traces):
            steps = t.steps if cut is None or cut >= len(t.steps) else t.steps[:cut]
            steps_of[i] = len(steps)
            base = int(off[i])
            if len(t) >= _KEEP_LAYOUT:  # a big search keeps its flattened steps
                layout = caches.kept(t, "_fast_layout_rows") if steps is t.steps else None
                if layout is None:
                    layout = _local_layout(steps)
                    if steps is t.steps:
                        caches.keep(t, "_fast_layout_rows", layout)
                flush()
                parts.append((layout[0] + base, *layout[1:]))
                continue
            for s, bs in steps:
                numbers.append(s)
                per_step.append(len(bs))
                for batch in bs:
                    sizes.append(len(batch))
                    rows.extend(r + base for r in batch)
        flush()
        empty = np.zeros(0, np.int64)

        def cat(j):
            return np.concatenate([q[j] for q in parts]) if parts else empty

        self._finish(cat(0), cat(1), cat(2), cat(3), steps_of, len(traces))

    def _finish(self, rows, sizes_a, per_step_a, step_numbers, steps_of, searches: int):
        self.rows, self.step_numbers = rows, step_numbers
        self.batch = np.repeat(np.arange(len(sizes_a)), sizes_a)
        self.batch_start = _offsets(sizes_a)
        self.step_of_batch = np.repeat(np.arange(len(per_step_a)), per_step_a)
        self.step_first_batch = _offsets(per_step_a)
        self.step_start = self.batch_start[self.step_first_batch]  # position of each step
        self.step = self.step_of_batch[self.batch] if len(self.batch) else np.zeros(0, int)
        self.search_step = _offsets(steps_of)  # each search's first step
        self.search_of_step = np.repeat(np.arange(searches), steps_of)
        self.single_batch = per_step_a == 1
        self.kept_steps = steps_of


def _sizes(traces: list[SearchTrace], span) -> np.ndarray:
    """Each trace's candidates: from the log's columns where the traces are their views."""
    if span is not None:
        cols, a, b = span
        i, j = np.searchsorted(cols.starts, [a, b])
        sizes = (cols.ends[i:j] - cols.starts[i:j]).astype(np.int64)
        # one view a search, in order (with no empty search, the searches of rows a:b)
        if j - i == len(traces) and len(sizes) and sizes.sum() == b - a and sizes.all():
            return sizes
    return np.fromiter(map(len, traces), dtype=np.int64, count=len(traces))


def _per_row(n: int, p: _Pass) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """How often each row ran each stage in a pass, and its GPU-seconds; the pass's rows per
    stage are let go once counted (read nowhere else). The stages the pass never runs share
    one column of zeros (read only). A count is a byte (a row runs a stage at most once a
    pass): a million candidates' counts were 100 MB as 64-bit integers, 8 times what they
    need; products with them give the same floats."""
    none = np.zeros(n, np.int8)
    counts = {s: none for s in STAGES if s != "idle"}
    for stage, rows in p.ran:
        if counts[stage] is none:
            counts[stage] = np.zeros(n, np.int8)
        np.add.at(counts[stage], rows, 1)
    p.ran = []
    gpu = np.zeros(n)
    for rows, _, g, _, _ in p.bookings:
        np.add.at(gpu, rows, g)
    return counts, gpu


def _starts(x: np.ndarray) -> np.ndarray:
    """Positions where a run of equal values begins (0 first); np.r_ costs 10 us a call."""
    if len(x) == 0:
        return np.zeros(0, np.int64)
    edge = np.empty(len(x), bool)
    edge[0] = True
    np.not_equal(x[1:], x[:-1], out=edge[1:])
    return np.flatnonzero(edge)


def _offsets(counts: np.ndarray) -> np.ndarray:
    """0, then the running sums of ``counts``: where each of them starts, and the end."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The integers of [starts[i], ends[i]) for every i, in order."""
    if len(starts) == 1:
        return np.arange(starts[0], ends[0])
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.repeat(starts - _offsets(lens)[:-1], lens)
    return first + np.arange(total)


# Segments at least this long are reduced one by one with numpy's own call; shorter ones
# together, a position at a time, in the order numpy's call would take.
_LONG = 64


def _segmented(accumulate, x: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``accumulate`` (np.cumsum or np.maximum.accumulate) of each segment
    ``x[starts[i]:starts[i] + lens[i]]`` on its own, equal to the bit to what the call gives
    on the segment alone (both run from the segment's first element, left to right)."""
    if len(starts) == 1:
        out = np.empty_like(x)
        a, n = int(starts[0]), int(lens[0])
        out[a:a + n] = accumulate(x[a:a + n])
        return out
    out = np.empty_like(x)
    long = lens >= _LONG
    for a, n in zip(starts[long].tolist(), lens[long].tolist()):
        out[a:a + n] = accumulate(x[a:a + n])
    s, m = starts[~long & (lens > 0)], lens[~long & (lens > 0)]
    if len(s):
        out[s] = x[s]
        op = np.add if accumulate is np.cumsum else np.maximum
        for r in range(1, int(m.max())):
            at = s[m > r] + r
            out[at] = op(out[at - 1], x[at])
    return out


def _sums(x: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``x[a:a + n].sum()`` for every segment, equal to the bit: numpy adds fewer than 8
    values left to right from 0, and 8 to 128 in eight interleaved partial sums (its pairwise
    summation's block); longer segments are summed by numpy one by one."""
    if len(starts) == 1:
        return np.array([x[int(starts[0]):int(starts[0]) + int(lens[0])].sum()])
    out = np.zeros(len(starts))
    big = lens > 128
    for i in np.flatnonzero(big).tolist():
        out[i] = x[starts[i]:starts[i] + lens[i]].sum()
    small = np.flatnonzero(~big & (lens < 8))
    for r in range(int(lens[small].max()) if len(small) else 0):
        at = small[lens[small] > r]
        out[at] = out[at] + x[starts[at] + r]
    mid = np.flatnonzero(~big & (lens >= 8))
    if len(mid):
        a, n = starts[mid], lens[mid]
        acc = [x[a + j].copy() for j in range(8)]
        blocks = n - n % 8
        for i in range(8, int(blocks.max()), 8):
            on = blocks > i
            for j in range(8):
                acc[j][on] = acc[j][on] + x[a[on] + i + j]
        res = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        for r in range(7):
            on = n % 8 > r
            res[on] = res[on] + x[a[on] + blocks[on] + r]
        out[mid] = res
    return out


# Values and probes _counts_at_or_below sorts together at most, where both come grouped in
# order: its sort holds seven arrays of their length (a million candidates' six million
# bookings: 300 MB at once; in slices of this many, some 50 MB).
_COUNT_SLICE = 1 << 20


def _counts_at_or_below(values, vgroup, probes, pgroup, n_groups) -> np.ndarray:
    """For each probe, how many ``values`` of its own group are <= it (``searchsorted(sorted
    values of the group, probe, "right")``, for every group at once)."""
    if n_groups == 1:
        return np.searchsorted(np.sort(values), probes, "right")
    if (len(values) + len(probes) > _COUNT_SLICE and _grouped(vgroup)
            and _grouped(pgroup)):
        return _counts_in_slices(values, vgroup, probes, pgroup, n_groups)
    return _counts_together(values, vgroup, probes, pgroup, n_groups)


def _grouped(group: np.ndarray) -> bool:
    return bool(len(group) < 2 or np.all(group[1:] >= group[:-1]))


def _counts_in_slices(values, vgroup, probes, pgroup, n_groups) -> np.ndarray:
    """``_counts_together`` over runs of whole groups (values and probes both in group
    order), each run at most about ``_COUNT_SLICE`` values and probes: the same counts."""
    v_end = np.searchsorted(vgroup, np.arange(n_groups), "right")
    p_end = np.searchsorted(pgroup, np.arange(n_groups), "right")
    both = v_end + p_end
    out = []
    g0 = v0 = p0 = 0
    while g0 < n_groups:
        # the last group whose run stays within the slice (at least one group)
        g1 = max(int(np.searchsorted(both, v0 + p0 + _COUNT_SLICE, "right")), g0 + 1)
        g1 = min(g1, n_groups)
        v1, p1 = int(v_end[g1 - 1]), int(p_end[g1 - 1])
        if p1 > p0:
            out.append(_counts_together(values[v0:v1], vgroup[v0:v1] - g0, probes[p0:p1],
                                        pgroup[p0:p1] - g0, g1 - g0))
        g0, v0, p0 = g1, v1, p1
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _counts_together(values, vgroup, probes, pgroup, n_groups) -> np.ndarray:
    key_g = np.concatenate([vgroup, pgroup])
    key_v = np.concatenate([values, probes])
    kind = np.concatenate([np.zeros(len(values), np.int8), np.ones(len(probes), np.int8)])
    order = np.lexsort((kind, key_v, key_g))
    is_value = kind[order] == 0
    seen = np.cumsum(is_value)
    before = _offsets(np.bincount(vgroup, minlength=n_groups))[:-1]
    at = np.empty(len(order), np.int64)
    at[order] = seen - before[key_g[order]]
    return at[len(values):]


class _FastRuns:
    """Fast replays of several searches at once, in lockstep: each search keeps its own best,
    chunk and clock, and a round decides every search's next chunk in as few policy calls as
    the policy's state allows (``Policy.state_fields``). Every figure is what the search
    replayed alone gives, to the bit."""

    def __init__(self, traces: list[SearchTrace], policy: Policy, model: PresetCostModel,
                 caps: Capacities, budget: Budget, seed: int, drop_orphans: bool,
                 pipeline: Pipeline, noise: MeasureNoise | None = None):
        self.traces, self.policy, self.model, self.caps = traces, policy, model, caps
        self.seed, self.drop, self.noise = seed, drop_orphans, noise
        # (views of one log's columns share its forecast frame and bin edges: build_traces)
        frames = {(t.forecast_frame, t.bin_edges) for t in
                  (traces[:1] if isinstance(traces, LogTraces) and traces.span else traces)}
        if len(frames) > 1:
            raise ValueError("searches replayed together share a forecast frame and bin edges")
        self.frame = traces[0].forecast_frame
        S = self.S = len(traces)
        self.w = w = _World(traces, policy)
        sizes = _sizes(traces, w.span)
        self.off = off = _offsets(sizes)
        self.sizes = sizes
        n = w.n
        self.search_of = np.repeat(np.arange(S), sizes)
        self.lay = lay = _Layout(traces, off, budget.steps, w.span)
        self.stopped_by = ["steps" if k < n_steps else None
                           for k, n_steps in zip(lay.kept_steps.tolist(), lay.all_steps)]
        rows = lay.rows
        # Durations do not depend on decisions: price every stage of every row once.
        zero = np.zeros(len(rows))
        self.pre = w.run_pass(rows, zero, segments(pipeline.before, model.compile_on))
        self.post = w.run_pass(rows, zero, segments(pipeline.after, model.compile_on))
        self.pre_rel = np.full(n, np.nan)
        self.pre_rel[rows] = self.pre.end
        self.pre_ended = np.full(n, -1)
        self.pre_ended[rows] = self.pre.ended
        self.post_rel = np.full(n, np.nan)
        self.post_rel[rows] = self.post.end
        self.pre_count, self.pre_gpu = _per_row(n, self.pre)
        self.post_count, self.post_gpu = _per_row(n, self.post)
        if w.parent is not None:
            self.parent = w.parent
        else:
            local = np.fromiter(itertools.chain.from_iterable(t.parent for t in traces),
                                dtype=np.int64, count=n)
            self.parent = np.where(local >= 0, local + np.repeat(off[:-1], sizes), -1)
        # What a measurement reports (noisy, if asked); the oracle reads the logged truth.
        self.true_speedup = w.speedup
        self.speedup = self.true_speedup if noise is None else self.true_speedup * np.concatenate(
            [noise.factors(seed, t.search_id, t.candidate_ids) for t in traces])
        self.has_eval = ~w.no_eval
        self.seed_speedup = np.fromiter((t.seed_speedup for t in traces), dtype=float, count=S)
        # Outcome columns (rows of the world).
        self.state = np.full(n, "budget_stopped", dtype=object)
        self.action = np.full(n, None, dtype=object)
        self.reason = np.full(n, None, dtype=object)
        self.score = np.full(n, np.nan)
        self.measured = np.zeros(n, bool)
        self.dropped = np.zeros(n, bool)
        # Each search's step clock: the absolute start of each of its steps, then its end,
        # at k + search for step k (so search i's end is at lay.search_step[i + 1] + i).
        self.step_t = np.zeros(len(lay.step_numbers) + S)
        self.decide_rel = np.zeros(len(lay.batch_start) - 1)  # per batch, from its step start
        self.best = self.seed_speedup.copy()
        self.evals = np.zeros(S, np.int64)  # measurements so far, per search
        self.unsafe: dict[int, str] = {}
        self.batch_all: Batch | None = None
        fields = policy.state_fields
        # Searches whose batches one policy call may decide together: those that agree on
        # every state field the policy reads (each search alone where it may read them all,
        # or the step or the evaluations so far, which differ from decision to decision).
        if fields is None or {"step", "gpu_evals", "budget_left"} & set(fields):
            self.together = np.arange(S)
        elif set(fields) <= {"seed"}:  # one seed for all: every search decides together
            self.together = np.zeros(S, np.int64)
        else:
            ids: dict = {}
            self.together = np.fromiter(
                (ids.setdefault(tuple(self._state_value(t, f) for f in fields), len(ids))
                 for t in traces), dtype=np.int64, count=S)
        # A record step of one batch decides as the chunk did, unless the policy may read
        # the step or the evaluations so far, which differ there.
        self.exact_chunks = fields is not None and not ({"step", "gpu_evals"} & set(fields))

    def _state_value(self, t: SearchTrace, field: str):
        return {"search_id": t.search_id, "task_id": t.task_id,
                "seed": self.seed}.get(field) if field != "measure_usd" else t.measure_usd

    # -- decisions ---------------------------------------------------------------------------
    def _state(self, i: int, step: int, best: float) -> SearchState:
        t = self.traces[i]
        reads = self.policy.state_fields
        usd = t.measure_usd if reads is None or "measure_usd" in reads else math.nan
        return SearchState(t.search_id, t.task_id, int(step), float(best),
                           int(self.evals[i]), self.seed, _UNBOUNDED, measure_usd=usd)

    def _batch(self, pos: np.ndarray) -> Batch:
        w = self.w
        if self.batch_all is None:  # every row once, sliced per call
            reads = self.policy.needs_forecast
            frame = self.frame
            base = np.repeat(self.seed_speedup, self.sizes) if frame == "seed" \
                else np.ones(w.n)
            if w.span is not None:
                cols, a, b = w.span
                ids = cols.whole()["candidate_ids"][a:b]
                probs, parse = (cols.arrays[k][a:b] for k in ("probs", "parse_failed"))
            else:
                ids = np.empty(w.n, dtype=object)
                ids[:] = list(itertools.chain.from_iterable(t.candidate_ids
                                                            for t in self.traces))
                probs = np.concatenate([t.probs for t in self.traces])
                parse = np.concatenate([t.parse_failed for t in self.traces])
            self.batch_all = Batch(
                candidate_ids=ids, probs=probs,
                has_forecast=w.has_forecast if reads else np.zeros(w.n, bool),
                parse_failed=parse, base_speedup=base, bin_edges=self.traces[0].bin_edges,
                true_speedup=self.true_speedup if self.policy.needs_truth else None)
        rows = self.lay.rows[pos]
        batch = self.batch_all.take(rows)
        if self.frame == "parent":  # chunks are one step: parents are settled
            measured_speedup = np.where(self.measured & w.success, self.speedup, np.nan)
            seeds = self.seed_speedup[self.search_of[rows]]
            base = np.array([ancestor_speedup(self.parent, r, measured_speedup, s)
                             for r, s in zip(rows.tolist(), seeds.tolist())])
            batch = Batch(batch.candidate_ids, batch.probs, batch.has_forecast,
                          batch.parse_failed, base, batch.bin_edges, batch.true_speedup)
        return batch

    def _decide(self, pos: np.ndarray, step_of_search: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(measure, score, reason as an object array) for positions ``pos`` (whole batches,
        ascending), each seeing its search's current best; ``step_of_search``: the step
        number each search's state shows."""
        srch = self.search_of[self.lay.rows[pos]]
        best = self.best[srch]
        group = self.together[srch]
        cuts = _starts(group)
        if len(cuts) == 1:  # one policy call
            i = int(srch[0])
            d = self.policy.decide_groups(self._batch(pos), self.lay.batch[pos], best,
                                          self._state(i, step_of_search[i], self.best[i]))
            reason = np.empty(len(pos), dtype=object)
            reason[:] = d.reason
            return d.measure, d.score, reason
        if len(np.unique(group[cuts])) == len(cuts):  # each group one run of positions
            order = None
            runs = np.append(cuts, len(pos))
        else:
            order = np.argsort(group, kind="stable")
            runs = np.append(_starts(group[order]), len(pos))
        measure = np.zeros(len(pos), bool)
        score = np.zeros(len(pos))
        reason = np.empty(len(pos), dtype=object)
        for a, b in zip(runs[:-1].tolist(), runs[1:].tolist()):
            idx = np.arange(a, b) if order is None else order[a:b]
            i = int(srch[idx[0]])
            state = self._state(i, step_of_search[i], self.best[i])
            d = self.policy.decide_groups(self._batch(pos[idx]), self.lay.batch[pos[idx]],
                                          best[idx], state)
            measure[idx], score[idx] = d.measure, d.score
            reason[idx] = d.reason
        return measure, score, reason

    def _resolve_drops(self, pos: np.ndarray, wants: np.ndarray,
                       first_step: np.ndarray) -> np.ndarray:
        """Which positions' candidates are dropped orphans, step by step (a child of a dropped
        or unmeasured parent is dropped); ``wants`` is what would be measured otherwise;
        ``first_step``: each position's chunk's first step."""
        rows = self.lay.rows[pos]
        p = self.parent[rows]
        dropped = np.zeros(len(pos), bool)
        if not self.drop or not (p >= 0).any():
            return dropped
        measured = self.measured.copy()
        rel = self.lay.step[pos] - first_step
        for k in range(int(rel.max()) + 1):
            at = rel == k
            pk = p[at]
            d = (pk >= 0) & ~measured[np.maximum(pk, 0)]
            dropped[at] = d
            measured[rows[at]] = wants[at] & ~d
        return dropped

    # -- chunks --------------------------------------------------------------------------------
    def run(self) -> SearchColumns:
        lay = self.lay
        k = lay.search_step[:-1].copy()
        end = lay.search_step[1:]
        chunk = np.full(self.S, 1 if self.frame == "parent" else _FIRST_CHUNK)
        active = np.flatnonzero(k < end)
        while len(active):
            k0 = k[active]
            k1 = np.minimum(k0 + chunk[active], end[active])
            pos = _ranges(lay.step_start[k0], lay.step_start[k1])
            record = self._chunk(pos, active, k0)
            kept = record == _NONE
            k[active[kept]] = k1[kept]
            if self.frame != "parent":
                chunk[active[kept]] *= 2
                chunk[active[~kept]] = _FIRST_CHUNK
            k[active[~kept]] = record[~kept] + 1
            active = active[k[active] < end[active]]
            active = np.array([i for i in active.tolist() if i not in self.unsafe],
                              dtype=np.int64) if self.unsafe else active
        self.batch_all = None  # every decision is made (its forecasts: 80 MB a million rows)
        return self._results()

    def _chunk(self, pos: np.ndarray, active: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Decide ``pos`` (the chunks of the ``active`` searches, from their steps ``first``)
        with each search's current best; commit the steps before the first one in which a
        measurement beats it, redo that step batch by batch, and return it per active search
        (``_NONE`` where every step was committed)."""
        w, lay = self.w, self.lay
        rows = lay.rows[pos]
        srch = self.search_of[rows]
        first_of = np.zeros(self.S, np.int64)
        first_of[active] = first
        step_no = np.zeros(self.S, np.int64)
        step_no[active] = lay.step_numbers[first]
        ready = self.pre_ended[rows] == _OK
        live_pos = pos[ready]
        if len(live_pos):
            d_measure, d_score, d_reason = self._decide(live_pos, step_no)
        else:
            d_measure, d_score, d_reason = np.zeros(0, bool), np.zeros(0), np.zeros(0, object)
        wants = np.zeros(len(pos), bool)
        wants[ready] = d_measure & self.has_eval[rows[ready]]
        steps = lay.step[pos]
        dropped = self._resolve_drops(pos, wants, first_of[srch])
        measured = wants & ~dropped
        better = measured & w.success[rows] & (self.speedup[rows] > self.best[srch])
        record = np.full(self.S, _NONE)
        np.minimum.at(record, srch[better], steps[better])
        # Steps before the record step are committed as decided, then (on its own, as the
        # step alone would be) a record step of one batch, which the chunk decided as the
        # step alone would (nothing measured in it before its only batch decides).
        has = record != _NONE
        one = np.zeros(self.S, bool)
        if self.exact_chunks:
            one[has] = lay.single_batch[record[has]]
        redo = has & ~one
        for keep in (steps < record[srch], one[srch] & (steps == record[srch])):
            if not keep.any():
                continue
            # Dropped batches were decided too (whole batches drop together, so the others'
            # decisions do not depend on them); only the rest count.
            sub = ready & keep & ~dropped
            live_keep = np.flatnonzero(sub[ready])  # rows of d to keep
            self._commit(pos[keep], dropped[keep], pos[sub], d_measure[live_keep],
                         d_score[live_keep], d_reason[live_keep])
        for i in np.flatnonzero(redo).tolist():
            try:
                self._record_step(i, int(record[i]))
            except FastPathUnsafe as exc:
                self.unsafe[i] = str(exc)
        return record[active]

    def _record_step(self, i: int, k: int) -> None:
        """Step k of search i holds a new best: decide its batches one by one in order of
        decision time, each seeing the successes that ended before it decided."""
        lay, w = self.lay, self.w
        b0, b1 = lay.step_first_batch[k], lay.step_first_batch[k + 1]
        pos = np.arange(lay.batch_start[b0], lay.batch_start[b1])
        rows = lay.rows[pos]
        p = self.parent[rows]
        dropped = ((p >= 0) & ~self.measured[np.maximum(p, 0)]) if self.drop \
            else np.zeros(len(pos), bool)
        ready_rel = np.where(dropped, 0.0, self.pre_rel[rows])
        decide_rel = np.maximum.reduceat(ready_rel, lay.batch_start[b0:b1] - lay.batch_start[b0])
        order = np.argsort(decide_rel, kind="stable")
        ends: list[float] = []
        speeds: list[float] = []
        live_pos, measure, score, reason = [], [], [], []
        step_no = np.zeros(self.S, np.int64)
        step_no[i] = lay.step_numbers[k]
        best = float(self.best[i])
        for j in order:
            sel = lay.batch[pos] == b0 + j
            live = sel & ~dropped & (self.pre_ended[rows] == _OK)
            if not live.any():
                continue
            at = decide_rel[j]
            seen = [s for e, s in zip(ends, speeds) if e < at]
            if any(abs(e - at) <= _TIE_S and s > best for e, s in zip(ends, speeds)):
                raise FastPathUnsafe("a better measurement ends at the instant a batch decides")
            self.best[i] = max([best, *seen])
            try:
                d_measure, d_score, d_reason = self._decide(pos[live], step_no)
            finally:
                self.best[i] = best
            r = rows[live]
            go = d_measure & self.has_eval[r]
            for m in r[go]:
                if w.success[m]:
                    ends.append(at + self.post_rel[m])
                    speeds.append(self.speedup[m])
            live_pos.append(pos[live])
            measure.append(d_measure)
            score.append(d_score)
            reason.append(d_reason)
        lp = _concat(live_pos, int)
        # Restore position order: _commit expects live positions in ascending order.
        o = np.argsort(lp, kind="stable")
        self._commit(pos, dropped, lp[o], _concat(measure, bool)[o], _concat(score, float)[o],
                     _concat(reason, object)[o])

    def _commit(self, pos, dropped, live_pos, measure, score, reason) -> None:
        """Record decisions and times for whole steps: positions ``pos`` (ascending), of
        which ``live_pos`` (ascending) were decided."""
        lay, w = self.lay, self.w
        rows = lay.rows[pos]
        self.dropped[rows] = dropped
        self.state[rows[dropped]] = "orphan_dropped"
        gen = rows[~dropped]
        ended = self.pre_ended[gen]
        for code, name in _ENDED_STATE.items():
            self.state[gen[ended == code]] = name
        lrows = lay.rows[live_pos]
        self.action[lrows] = _SKIP_MEASURE[measure.astype(np.intp)]
        self.score[lrows] = score
        self.reason[lrows] = reason
        self.state[lrows[~measure]] = "skipped"
        go = measure & self.has_eval[lrows]
        self.state[lrows[measure & ~go]] = "unmeasurable"
        mrows = lrows[go]
        self.state[mrows] = "measured"
        self.measured[mrows] = True
        self.evals += np.bincount(self.search_of[mrows], minlength=self.S)
        # Times: a batch decides when its slowest (non-dropped) member is ready; a step ends
        # when its last batch has decided and its last measurement has ended.
        ready_rel = np.where(dropped, 0.0, self.pre_rel[rows])
        batches = lay.batch[pos]
        first = _starts(batches)
        self.decide_rel[batches[first]] = np.maximum.reduceat(ready_rel, first)
        span = ready_rel.copy()
        mpos = np.zeros(len(pos), bool)
        mpos[np.searchsorted(pos, live_pos[go])] = True
        span[mpos] = self.decide_rel[batches[mpos]] + self.post_rel[rows[mpos]]
        steps = lay.step[pos]
        sfirst = _starts(steps)
        dur = np.maximum(np.maximum.reduceat(span, sfirst), 0.0)
        ks = steps[sfirst]
        sk = lay.search_of_step[ks]
        # Each search's steps here follow one another: its clock runs on from its first.
        seg = _starts(sk)
        lens = np.diff(np.append(seg, len(ks)))
        cum = _segmented(np.cumsum, dur, seg, lens)
        start = self.step_t[ks[seg] + sk[seg]]
        self.step_t[ks + sk + 1] = np.repeat(start, lens) + cum
        ok = mrows[w.success[mrows]]
        if len(ok):
            np.maximum.at(self.best, self.search_of[ok], self.speedup[ok])

    # -- results ------------------------------------------------------------------------------
    def _results(self) -> SearchColumns:
        lay, w, model, S = self.lay, self.w, self.model, self.S
        n, off, sizes = w.n, self.off, self.sizes
        starts = off[:-1]
        reached = np.zeros(n, bool)
        reached[lay.rows] = True
        gen = reached & ~self.dropped
        abs_step = np.full(n, np.nan)
        abs_step[lay.rows] = self.step_t[lay.step + lay.search_of_step[lay.step]]
        decide_abs = np.full(n, np.nan)
        decide_abs[lay.rows] = abs_step[lay.rows] + self.decide_rel[lay.batch]
        t_start = np.where(self.measured, decide_abs, np.nan)
        t_end = np.where(self.measured, decide_abs + self.post_rel, np.nan)
        wall = self.step_t[lay.search_step[1:] + np.arange(S)]
        counts = {s: self.pre_count[s] * gen + self.post_count[s] * self.measured
                  for s in self.pre_count}
        sums = {}
        cand_usd = np.zeros(n)
        for s, c in counts.items():
            usd, joules, imp = w.price[s]
            sums[s] = [_sums(x * c, starts, sizes) for x in (w.secs[s], usd, joules, imp)]
            cand_usd += usd * c
        busy = _sums(self.pre_gpu * gen, starts, sizes) + _sums(
            self.post_gpu * self.measured, starts, sizes)
        p = self.parent
        orphan = reached & (p >= 0) & ~self.measured[np.maximum(p, 0)]
        outcome = np.full(n, None, dtype=object)
        shown = self.measured | (self.state == "failed_before_decision")
        outcome[shown] = w.outcome[shown]
        ok_speed = np.where(self.measured & w.success, self.speedup, np.nan)
        # The best: the highest measured speedup, the first to reach it by end time.
        ok = np.flatnonzero(self.measured & w.success)
        top = np.full(S, -1)
        if len(ok):
            so = self.search_of[ok]
            o = np.lexsort((ok, t_end[ok], -self.speedup[ok], so))
            firsts = o[_starts(so[o])]
            top[so[firsts]] = ok[firsts]
        anytime = self._anytime(abs_step, decide_abs, t_end, gen)
        per_search = np.bincount(self.search_of[self.measured], minlength=S)

        def per(mask):
            return np.bincount(self.search_of[mask], minlength=S)

        n_gen, n_unmeasurable = per(gen), per(self.state == "unmeasurable")
        n_orphan, n_reached = per(orphan), per(reached)
        n_forecasts = np.bincount(self.search_of, weights=counts["forecasting"],
                                  minlength=S).astype(np.int64)
        tables = _Tables(self.traces, off, self.w.span, {
            "state": self.state, "orphan": orphan, "action": self.action, "reason": self.reason,
            "outcome": outcome}, {
            "score": self.score, "speedup": ok_speed, "measure_start_s": t_start,
            "measure_end_s": t_end, "usd": cand_usd})
        unforecast = np.bincount(self.search_of[self.reason == "unforecast"], minlength=S)
        idle_s = self.caps.gpus * wall - busy
        stages = {s: _idle_rows(idle_s, model) if s == "idle" else np.column_stack(sums[s])
                  for s in STAGES}
        seed = self.seed_speedup
        best = seed.copy()
        has = top >= 0
        better = np.zeros(S, bool)
        better[has] = self.speedup[top[has]] > seed[has]
        best[better] = self.speedup[top[better]]
        best_ids: list = [None] * S
        for i, j in zip(np.flatnonzero(better).tolist(), top[better].tolist()):
            best_ids[i] = tables.candidate_id(j)
        true_best, confirmed = self._confirmed(best, better, top, best_ids)
        return SearchColumns(
            ints={"gpu_evals": np.asarray(per_search, np.int64),
                  "candidates": np.asarray(n_gen, np.int64),
                  "forecasts": np.asarray(n_forecasts, np.int64),
                  "unmeasurable": np.asarray(n_unmeasurable, np.int64),
                  "orphans": np.asarray(n_orphan, np.int64),
                  "reached": np.asarray(n_reached, np.int64),
                  "steps": np.asarray(lay.kept_steps, np.int64)},
            floats={"seed_speedup": seed, "best_speedup": best, "wall_s": wall,
                    "confirmed_speedup": confirmed, "true_best_speedup": true_best},
            ids={"best_candidate_id": best_ids, "stopped_by": list(self.stopped_by)},
            stages=stages, anytime=anytime, unforecast=unforecast, tables=tables,
            traces=self.traces)

    def _confirmed(self, best, better, top, best_ids) -> tuple[np.ndarray, np.ndarray]:
        """``noise.confirm_best`` of every search: the best's noise-free speedup and its one
        re-measurement (the best itself where nothing beat the seed kernel)."""
        true_best, confirmed = best.copy(), best.copy()
        at = np.flatnonzero(better)
        true_best[at] = self.true_speedup[top[at]]
        factor = np.ones(len(at)) if self.noise is None else np.array([
            float(self.noise.factors(self.seed, self.traces[i].search_id, [best_ids[i]],
                                     purpose="confirm")[0]) for i in at.tolist()])
        confirmed[at] = true_best[at] * factor
        return true_best, confirmed

    def _bookings(self, abs_step, decide_abs, gen, lo: int, hi: int) -> list[np.ndarray]:
        """The bookings of rows ``lo:hi`` whose candidate ran the stage, stage by stage:
        (search, seconds at its release, GPU seconds, usd, joules), as concatenating each
        stage's would give them (the same values, order and types)."""
        search_of = self.search_of
        stages = [(rows, origin, mask, when, gpu, usd, joules)
                  for p, origin, mask in ((self.pre, abs_step, gen),
                                          (self.post, decide_abs, self.measured))
                  for rows, when, gpu, usd, joules in p.bookings]
        if not stages:
            return [np.zeros(0) for _ in range(5)]
        whole = lo == 0 and hi == len(search_of)
        keeps = [mask[rows] if whole else mask[rows] & (rows >= lo) & (rows < hi)
                 for rows, _, mask, *_ in stages]
        n = sum(int(np.count_nonzero(keep)) for keep in keeps)
        types = [search_of.dtype,
                 np.result_type(*[np.result_type(o, w) for _, o, _, w, *_ in stages]),
                 *(np.result_type(*[st[k] for st in stages]) for k in (4, 5, 6))]
        out = [np.empty(n, t) for t in types]
        at = 0
        for (rows, origin, _, when, gpu, usd, joules), keep in zip(stages, keeps):
            r = rows[keep]
            b = at + len(r)
            out[0][at:b] = search_of[r]
            out[1][at:b] = origin[r] + when[keep]
            out[2][at:b], out[3][at:b], out[4][at:b] = gpu[keep], usd[keep], joules[keep]
            at = b
        return out

    def _anytime(self, abs_step, decide_abs, t_end, gen) -> tuple:
        """Per search, (seconds, usd, joules, gpu_evals, best) after each measurement, from the
        bookings (a resource's costs are booked when it is released, as in the engine): one
        array of every search's rows, its start row first (each search takes a slice), and
        each search's first and end row in it. Worked out for runs of whole searches of at
        most about ``_ANYTIME_ROWS`` candidates (a search's rows depend on its own bookings
        alone): a million candidates' six million bookings, sorted and summed at once, were
        this replay's peak memory."""
        off = self.off
        cuts = [0]
        if not self.S:
            return self._anytime_of(0, 0, abs_step, decide_abs, t_end, gen)
        while cuts[-1] < self.S:  # the last search whose run stays within the rows allowed
            s0 = cuts[-1]
            s1 = int(np.searchsorted(off, off[s0] + _ANYTIME_ROWS, "right")) - 1
            cuts.append(min(max(s1, s0 + 1), self.S))
        parts = [self._anytime_of(a, b, abs_step, decide_abs, t_end, gen)
                 for a, b in zip(cuts[:-1], cuts[1:])]
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0] + [len(t) for t, _, _ in parts[:-1]])
        return (np.concatenate([t for t, _, _ in parts]),
                np.concatenate([h + d for (_, h, _), d in zip(parts, shift)]),
                np.concatenate([e + d for (_, _, e), d in zip(parts, shift)]))

    def _anytime_of(self, s0: int, s1: int, abs_step, decide_abs, t_end, gen) -> tuple:
        """``_anytime`` of searches ``s0:s1`` alone (their rows' bookings and measurements)."""
        S = s1 - s0
        lo, hi = int(self.off[s0]), int(self.off[s1])
        search_of = self.search_of
        m = np.flatnonzero(self.measured[lo:hi]) + lo
        # A booking row per stage a candidate ran, each stage's written into place, and each
        # copy dropped once read: the peak is a few such columns.
        bs, when, gpu, usd, joules = self._bookings(abs_step, decide_abs, gen, lo, hi)
        bs = bs.astype(np.int64) - s0
        o = np.lexsort((when, bs))
        bs, when = bs[o], when[o]
        b_count = np.bincount(bs, minlength=S)
        b_start = _offsets(b_count)[:-1]
        gpu, usd, joules = gpu[o], usd[o], joules[o]
        del o
        cum_gpu = _segmented(np.cumsum, gpu, b_start, b_count)
        del gpu
        cum_usd = _segmented(np.cumsum, usd, b_start, b_count)
        del usd
        cum_j = _segmented(np.cumsum, joules, b_start, b_count)
        del joules
        ms = search_of[m] - s0
        ends = t_end[m]
        om = np.lexsort((ends, ms))
        m, ends, ms = m[om], ends[om], ms[om]
        k = _counts_at_or_below(when, bs, ends, ms, S) - 1
        del when, bs
        idx = b_start[ms] + np.maximum(k, 0)

        def take(c):
            return np.where(k >= 0, c[np.minimum(idx, len(c) - 1)], 0.0) if len(c) \
                else np.zeros(len(k))

        spent_usd, spent_j, busy = take(cum_usd), take(cum_j), take(cum_gpu)
        if self.model.billing == "reserved":
            idle_s = np.maximum(self.caps.gpus * ends - busy, 0.0)
            spent_usd = spent_usd + idle_s * self.model.gpu.usd_per_hour / 3600
            spent_j = spent_j + idle_s * self.model.gpu.idle_w_context
        seed_speedup = self.seed_speedup[s0:s1]
        gains = np.where(self.w.success[m], self.speedup[m], -np.inf)
        m_count = np.bincount(ms, minlength=S)
        m_start = _offsets(m_count)[:-1]
        best = np.maximum(_segmented(np.maximum.accumulate, gains, m_start, m_count),
                          seed_speedup[ms])
        evals = _counts_at_or_below(decide_abs[m], ms, ends, ms, S)
        table = np.empty((len(m) + S, 5))
        at = np.arange(len(m)) + np.repeat(np.arange(S), m_count) + 1
        table[at] = np.column_stack([ends, spent_usd, spent_j, evals, best])
        heads = m_start + np.arange(S)
        table[heads] = 0.0
        table[heads, 4] = seed_speedup
        return table, heads, heads + 1 + m_count


# Candidates (rows) whose anytime rows _anytime works out at once, in runs of whole searches:
# its sort and sums hold some ten arrays of six bookings a candidate.
_ANYTIME_ROWS = 1 << 16


def _idle_rows(idle_s: np.ndarray, model: PresetCostModel) -> np.ndarray:
    """``model.idle`` of each search's idle GPU-seconds as rows (seconds, usd, joules,
    usd_imputed): one call per distinct value, bit for bit."""
    bits = np.ascontiguousarray(idle_s, dtype=float).view(np.int64)
    distinct, first, code = np.unique(bits, return_index=True, return_inverse=True)
    rows = np.array([dataclasses.astuple(model.idle(x)) for x in idle_s[first].tolist()],
                    dtype=float).reshape(len(distinct), 4)
    return rows[code.reshape(-1)]


class _Tables:
    """The per-candidate tables of a fast replay's searches, from its columns: search i's is
    built when its result's ``table`` is first read, as a dict of lists."""

    def __init__(self, traces, off: np.ndarray, span, objects: dict, floats: dict):
        self.traces, self.off, self.span = traces, off, span  # span: columns_of(traces)
        self.objects, self.floats = objects, floats
        self.lists: dict[str, list] = {}

    def candidate_id(self, row: int):
        if self.span is not None:
            return self.span[0].lists["candidate_ids"][self.span[1] + row]
        i = int(np.searchsorted(self.off, row, "right")) - 1
        return self.traces[i].candidate_ids[row - int(self.off[i])]

    def _list(self, name: str) -> list:
        if name not in self.lists:
            source = self.objects.get(name)
            self.lists[name] = (source if source is not None else self.floats[name]).tolist()
        return self.lists[name]

    def table(self, i: int) -> dict[str, list]:
        t = self.traces[i]
        a, b = int(self.off[i]), int(self.off[i + 1])
        whole = len(self.traces) == 1  # one search's columns are the lists, not copies
        n = b - a
        table = {"candidate_id": t.candidate_ids, "search_id": [t.search_id] * n,
                 "task_id": [t.task_id] * n, "step": t.step, "parent_index": t.parent}
        for k in ("state", "orphan", "action", "score", "reason", "outcome", "speedup",
                  "measure_start_s", "measure_end_s", "usd"):
            if k in self.objects:
                got = self._list(k)
                table[k] = got if whole else got[a:b]
            elif n < 64:  # a table of fewer values holds them as they come
                table[k] = self._list(k)[a:b]
            else:
                table[k] = shared_floats(self.floats[k][a:b])
        return table


def run_fast_many(traces: list[SearchTrace], policy: Policy, model: PresetCostModel,
                  caps: Capacities, budget: Budget, seed: int, drop_orphans: bool = False,
                  pipeline: Pipeline = DEFAULT_PIPELINE, noise: MeasureNoise | None = None
                  ) -> Sequence[SearchResult | FastPathUnsafe]:
    """Replay several searches in closed form, in lockstep (a search's figures are those it
    gives alone): one result per trace, or the ``FastPathUnsafe`` that stopped it (a tie the
    event order would settle). Check ``fast_path_blocker`` first for each trace. Searches
    that share a forecast frame and all run here come back as one ``SearchList`` (the
    replay's columns); otherwise a list of results."""
    groups: dict = {}
    if isinstance(traces, LogTraces) and traces.span:  # one log's columns: one frame
        groups[None] = range(len(traces))
    else:
        for j, t in enumerate(traces):
            groups.setdefault((t.forecast_frame, t.bin_edges), []).append(j)
    with no_cyclic_gc():  # results hold no cycles (see no_cyclic_gc)
        runs = [(idx, _FastRuns(traces if len(idx) == len(traces) else
                                [traces[j] for j in idx], policy, model, caps, budget, seed,
                                drop_orphans, pipeline, noise)) for idx in groups.values()]
        got = [(idx, r, r.run()) for idx, r in runs]
        if len(got) == 1 and not got[0][1].unsafe:
            return SearchList(got[0][2])
        out: list = [None] * len(traces)
        for idx, r, columns in got:
            for i, j in enumerate(idx):
                out[j] = FastPathUnsafe(r.unsafe[i]) if i in r.unsafe else columns.result(i)
    return out


def run_fast(trace: SearchTrace, policy: Policy, model: PresetCostModel, caps: Capacities,
             budget: Budget, seed: int, drop_orphans: bool = False,
             pipeline: Pipeline = DEFAULT_PIPELINE, noise: MeasureNoise | None = None
             ) -> SearchResult:
    """Replay one search in closed form. Raises FastPathUnsafe on a tie the event order
    would settle; check ``fast_path_blocker`` first for the other conditions."""
    (result,) = run_fast_many([trace], policy, model, caps, budget, seed, drop_orphans,
                              pipeline, noise)
    if isinstance(result, FastPathUnsafe):
        raise result
    return result


def _concat(parts: list, dtype) -> np.ndarray:
    """The arrays in ``parts`` end to end (an empty one of ``dtype`` for none)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype)
