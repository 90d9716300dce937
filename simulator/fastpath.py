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

Not covered (the event engine runs instead): budgets other than ``steps``, and a measurement
that improves the best ending at the instant (within 1e-9 s) a batch of its step decides, where
event order would matter.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import STAGES, Cost
from gfsim.policies.base import Batch, Policy, SearchState
from gfsim.simulator.budget import Budget
from gfsim.simulator.engine import segments
from gfsim.simulator.pipeline import COST_STAGE, DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.results import SearchResult
from gfsim.simulator.noise import MeasureNoise, confirm_best
from gfsim.simulator.trace import SearchTrace, ancestor_speedup, shared_floats

__all__ = ["fast_path_blocker", "run_fast", "FastPathUnsafe"]

# Why a candidate stopped before the end of a pass.
_OK, _GEN_FAILED, _UNMEASURABLE, _FAILED = 0, 1, 2, 3
_ENDED_STATE = {_GEN_FAILED: "generation_failed", _UNMEASURABLE: "unmeasurable",
                _FAILED: "failed_before_decision"}
_UNBOUNDED = {"usd": math.inf, "seconds": math.inf, "joules": math.inf, "gpu_evals": math.inf}


class FastPathUnsafe(Exception):
    """A tie in time that only the event engine's ordering can settle."""


def fast_path_blocker(trace: SearchTrace, policy: Policy, model: PresetCostModel,
                      caps: Capacities, budget: Budget) -> str | None:
    """Why the fast path cannot replay this search, or None if it can."""
    if any(not math.isinf(getattr(budget, k)) for k in ("usd", "seconds", "joules", "gpu_evals")):
        return "a usd, seconds, joules or gpu_evals budget"
    widest = max((sum(len(b) for b in batches) for _, batches in trace.steps), default=0)
    slots = {"generator": caps.generator, "GPU": caps.gpus}
    if policy.needs_forecast:
        slots["forecaster"] = caps.forecaster
    if model.compile_on == "cpu":
        slots["compile worker"] = caps.compile_workers
    for name, n in slots.items():
        if widest > n:
            return f"{name} capacity binds ({n} slots, steps of up to {widest} candidates)"
    return None


@dataclass
class _Pass:
    """What one pass over some rows did: end times, why rows ended, and its bookings."""

    rows: np.ndarray
    end: np.ndarray
    ended: np.ndarray
    ran: list[tuple[str, np.ndarray]]  # (cost stage, rows that ran it)
    bookings: list[tuple]  # (rows, when, gpu seconds, usd, joules) per segment


class _World:
    """The trace as arrays, and what the run has committed so far."""

    def __init__(self, t: SearchTrace, policy: Policy):
        n = len(t)
        a = t.arrays
        self.gen_failed = a["gen_failed"]
        self.forecast_runs = t.has_forecast & policy.needs_forecast
        outcome = a["outcome"]
        self.outcome = outcome
        self.no_eval = np.equal(outcome, None)
        self.success = outcome == "success"
        self.ends_after = {"compile": outcome == "compile_failed",
                           "check": ((outcome == "runtime_error") | (outcome == "incorrect"))
                           & ~(a["timing"] > 0)}  # failed after timing: timing ran
        self.secs = {k: a[k] for k in ("generation", "forecasting", *t.stage_s)}
        self.price = t.price
        # How many times each candidate ran each stage (a second GPU acquisition under
        # serverless billing pays a second cold start).
        self.ran = {s: np.zeros(n, int) for s in STAGES if s != "idle"}
        self.bookings: list[tuple] = []

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
            gpu = np.where(ran_any, total, 0.0) if res == "gpu" else np.zeros(len(rows))
            usd = np.zeros(len(rows))
            joules = np.zeros(len(rows))
            for stage, runs in runs_by_stage:
                usd += np.where(runs, self.price[stage][0][rows], 0.0)
                joules += np.where(runs, self.price[stage][1][rows], 0.0)
            bookings.append((rows[ran_any], now[ran_any], gpu[ran_any], usd[ran_any],
                             joules[ran_any]))
        return _Pass(rows, now, ended, ran, bookings)

    def commit(self, p: _Pass) -> None:
        for stage, rows in p.ran:
            np.add.at(self.ran[stage], rows, 1)
        self.bookings.extend(p.bookings)


_TIE_S = 1e-9
_SKIP_MEASURE = np.array(["skip", "measure"], dtype=object)
_FIRST_CHUNK = 4  # steps decided at once after a new best; doubles while no new best comes


class _Layout:
    """The search's steps flattened in batch order: positions 0..m-1, each a trace row."""

    def __init__(self, steps):
        batches = [b for _, bs in steps for b in bs]
        sizes = np.fromiter(map(len, batches), dtype=int, count=len(batches))
        self.rows = np.fromiter(itertools.chain.from_iterable(batches), dtype=int,
                                count=int(sizes.sum()))
        self.batch = np.repeat(np.arange(len(batches)), sizes)
        self.batch_start = np.r_[0, np.cumsum(sizes)]
        per_step = [len(bs) for _, bs in steps]
        self.step_of_batch = np.repeat(np.arange(len(steps)), per_step)
        self.step_first_batch = np.r_[0, np.cumsum(per_step)]
        self.step_start = self.batch_start[self.step_first_batch]  # position of each step
        self.step = self.step_of_batch[self.batch] if len(self.batch) else np.zeros(0, int)
        self.step_numbers = [s for s, _ in steps]


def _layout(t: SearchTrace) -> _Layout:
    cached = t.__dict__.get("_fast_layout")
    if cached is None:
        cached = t.__dict__["_fast_layout"] = _Layout(t.steps)
    return cached


def _per_row(n: int, p: _Pass) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """How often each trace row ran each stage in a pass, and its GPU-seconds."""
    counts = {s: np.zeros(n, int) for s in STAGES if s != "idle"}
    for stage, rows in p.ran:
        np.add.at(counts[stage], rows, 1)
    gpu = np.zeros(n)
    for rows, _, g, _, _ in p.bookings:
        np.add.at(gpu, rows, g)
    return counts, gpu


class _FastRun:
    """One fast replay of a search."""

    def __init__(self, t: SearchTrace, policy: Policy, model: PresetCostModel, caps: Capacities,
                 budget: Budget, seed: int, drop_orphans: bool, pipeline: Pipeline,
                 noise: MeasureNoise | None = None):
        self.noise = noise
        self.t, self.policy, self.model, self.caps = t, policy, model, caps
        self.seed, self.drop = seed, drop_orphans
        n = len(t)
        kept = t.steps if math.isinf(budget.steps) else t.steps[: int(budget.steps)]
        self.stopped_by = "steps" if len(kept) < len(t.steps) else None
        # The layout depends only on the steps: built once per trace, unless a budget cuts them.
        self.lay = lay = _layout(t) if len(kept) == len(t.steps) else _Layout(kept)
        self.w = w = _World(t, policy)
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
        self.parent = t.arrays["parent"]
        # What a measurement reports (noisy, if asked); the oracle reads the logged truth.
        self.true_speedup = t.arrays["speedup"]
        self.speedup = self.true_speedup if noise is None else (
            self.true_speedup * noise.factors(seed, t.search_id, t.candidate_ids))
        self.has_eval = ~w.no_eval
        # Outcome columns (trace rows).
        self.state = np.full(n, "budget_stopped", dtype=object)
        self.action = np.full(n, None, dtype=object)
        self.reason = np.full(n, None, dtype=object)
        self.score = np.full(n, np.nan)
        self.measured = np.zeros(n, bool)
        self.dropped = np.zeros(n, bool)
        self.step_t = np.zeros(len(kept) + 1)  # absolute start of each step, then the end
        self.decide_rel = np.zeros(len(lay.batch_start) - 1)  # per batch, from its step start
        self.best = t.seed_speedup
        self.batch_cache: Batch | None = None

    # -- decisions ---------------------------------------------------------------------------
    def _batch(self, pos: np.ndarray) -> Batch:
        t = self.t
        if self.batch_cache is None:  # every row once, sliced per chunk
            reads = self.policy.needs_forecast
            base = np.full(len(t), t.seed_speedup if t.forecast_frame == "seed" else 1.0)
            self.batch_cache = Batch(
                candidate_ids=np.array(t.candidate_ids, dtype=object), probs=t.probs,
                has_forecast=t.has_forecast if reads else np.zeros(len(t), bool),
                parse_failed=t.parse_failed, base_speedup=base, bin_edges=t.bin_edges,
                true_speedup=self.true_speedup if self.policy.needs_truth else None)
        rows = self.lay.rows[pos]
        batch = self.batch_cache.take(rows)
        if t.forecast_frame == "parent":  # chunks are one step: parents are settled
            measured_speedup = np.where(self.measured & self.w.success, self.speedup, np.nan)
            base = np.array([ancestor_speedup(t.parent, i, measured_speedup, t.seed_speedup)
                             for i in rows])
            batch = Batch(batch.candidate_ids, batch.probs, batch.has_forecast,
                          batch.parse_failed, base, batch.bin_edges, batch.true_speedup)
        return batch

    def _decide(self, pos: np.ndarray, best: float, step: int):
        """Decisions for positions ``pos`` (whole batches), all seeing ``best``."""
        state = SearchState(self.t.search_id, self.t.task_id, step, best,
                            int(self.measured.sum()), self.seed, _UNBOUNDED,
                            measure_usd=self.t.measure_usd)
        return self.policy.decide_groups(self._batch(pos), self.lay.batch[pos],
                                         np.full(len(pos), best), state)

    def _resolve_drops(self, pos: np.ndarray, wants: np.ndarray) -> np.ndarray:
        """Which positions' candidates are dropped orphans, step by step (a child of a dropped
        or unmeasured parent is dropped); ``wants`` is what would be measured otherwise."""
        rows = self.lay.rows[pos]
        p = self.parent[rows]
        dropped = np.zeros(len(pos), bool)
        if not self.drop or not (p >= 0).any():
            return dropped
        measured = self.measured.copy()
        steps = self.lay.step[pos]
        for k in np.unique(steps):
            at = steps == k
            pk = p[at]
            d = (pk >= 0) & ~measured[np.maximum(pk, 0)]
            dropped[at] = d
            measured[rows[at]] = wants[at] & ~d
        return dropped

    # -- chunks --------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        lay = self.lay
        n_steps = len(lay.step_numbers)
        k = 0
        chunk = 1 if self.t.forecast_frame == "parent" else _FIRST_CHUNK
        while k < n_steps:
            k_end = min(k + chunk, n_steps)
            pos = np.arange(lay.step_start[k], lay.step_start[k_end])
            record = self._chunk(pos, k)
            if record is None:
                k = k_end
                if self.t.forecast_frame != "parent":
                    chunk *= 2
            else:
                self._record_step(record)
                k = record + 1
                if self.t.forecast_frame != "parent":
                    chunk = _FIRST_CHUNK
        return self._result()

    def _chunk(self, pos: np.ndarray, first_step: int) -> int | None:
        """Decide ``pos`` with the current best; commit the steps before the first one in which
        a measurement beats it and return that step (or commit all and return None)."""
        w, rows = self.w, self.lay.rows[pos]
        ready = self.pre_ended[rows] == _OK
        live_pos = pos[ready]
        d = self._decide(live_pos, self.best, self.lay.step_numbers[first_step]) \
            if len(live_pos) else None
        wants = np.zeros(len(pos), bool)
        if d is not None:
            wants[ready] = d.measure & self.has_eval[rows[ready]]
        dropped = self._resolve_drops(pos, wants)
        measured = wants & ~dropped
        better = measured & w.success[rows] & (self.speedup[rows] > self.best)
        record = int(self.lay.step[pos][better].min()) if better.any() else None
        keep = self.lay.step[pos] < record if record is not None else np.ones(len(pos), bool)
        if keep.any():
            # Dropped batches were decided too (whole batches drop together, so the others'
            # decisions do not depend on them); only the rest count.
            sub = ready & keep & ~dropped
            live_keep = np.flatnonzero(sub[ready])  # rows of d to keep
            self._commit(pos[keep], dropped[keep], pos[sub],
                         d.measure[live_keep] if d is not None else np.zeros(0, bool),
                         d.score[live_keep] if d is not None else np.zeros(0),
                         np.asarray(d.reason, dtype=object)[live_keep] if d is not None
                         else [])
        return record

    def _record_step(self, k: int) -> None:
        """Step k holds a new best: decide its batches one by one in order of decision time,
        each seeing the successes that ended before it decided."""
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
        step_no = lay.step_numbers[k]
        for j in order:
            sel = lay.batch[pos] == b0 + j
            live = sel & ~dropped & (self.pre_ended[rows] == _OK)
            if not live.any():
                continue
            at = decide_rel[j]
            seen = [s for e, s in zip(ends, speeds) if e < at]
            if any(abs(e - at) <= _TIE_S and s > self.best for e, s in zip(ends, speeds)):
                raise FastPathUnsafe("a better measurement ends at the instant a batch decides")
            d = self._decide(pos[live], max([self.best, *seen]), step_no)
            r = rows[live]
            go = d.measure & self.has_eval[r]
            for i in r[go]:
                if w.success[i]:
                    ends.append(at + self.post_rel[i])
                    speeds.append(self.speedup[i])
            live_pos.append(pos[live])
            measure.append(d.measure)
            score.append(d.score)
            reason.extend(d.reason)
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
        lp = cat(live_pos, int)
        # Restore position order: _commit expects live positions in ascending order.
        o = np.argsort(lp, kind="stable")
        self._commit(pos, dropped, lp[o], cat(measure, bool)[o], cat(score, float)[o],
                     [reason[i] for i in o])

    def _commit(self, pos, dropped, live_pos, measure, score, reason) -> None:
        """Record decisions and times for whole steps: positions ``pos``, of which
        ``live_pos`` (ascending) were decided."""
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
        self.reason[lrows] = np.array(reason, dtype=object) if len(reason) else []
        self.state[lrows[~measure]] = "skipped"
        go = measure & self.has_eval[lrows]
        self.state[lrows[measure & ~go]] = "unmeasurable"
        mrows = lrows[go]
        self.state[mrows] = "measured"
        self.measured[mrows] = True
        # Times: a batch decides when its slowest (non-dropped) member is ready; a step ends
        # when its last batch has decided and its last measurement has ended.
        ready_rel = np.where(dropped, 0.0, self.pre_rel[rows])
        batches = lay.batch[pos]
        first = np.flatnonzero(np.concatenate(([True], batches[1:] != batches[:-1])))
        decide_rel = np.maximum.reduceat(ready_rel, first)
        self.decide_rel[batches[first]] = decide_rel
        span = ready_rel.copy()
        mpos = np.zeros(len(pos), bool)
        mpos[live_pos[go] - pos[0]] = True  # pos is a contiguous range of positions
        span[mpos] = self.decide_rel[batches[mpos]] + self.post_rel[rows[mpos]]
        steps = lay.step[pos]
        sfirst = np.flatnonzero(np.concatenate(([True], steps[1:] != steps[:-1])))
        dur = np.maximum(np.maximum.reduceat(span, sfirst), 0.0)
        ks = steps[sfirst]
        start = self.step_t[ks[0]]
        self.step_t[ks + 1] = start + np.cumsum(dur)
        ok = mrows[w.success[mrows]]
        if len(ok):
            self.best = max(self.best, float(self.speedup[ok].max()))

    # -- result -------------------------------------------------------------------------------
    def _result(self) -> SearchResult:
        t, lay, w, model = self.t, self.lay, self.w, self.model
        n = len(t)
        reached = np.zeros(n, bool)
        reached[lay.rows] = True
        gen = reached & ~self.dropped
        abs_step = np.full(n, np.nan)
        abs_step[lay.rows] = self.step_t[lay.step]
        decide_abs = np.full(n, np.nan)
        decide_abs[lay.rows] = abs_step[lay.rows] + self.decide_rel[lay.batch]
        t_start = np.where(self.measured, decide_abs, np.nan)
        t_end = np.where(self.measured, decide_abs + self.post_rel, np.nan)
        wall = float(self.step_t[len(lay.step_numbers)]) if len(lay.step_numbers) else 0.0
        counts = {s: self.pre_count[s] * gen + self.post_count[s] * self.measured
                  for s in self.pre_count}
        stages = {}
        cand_usd = np.zeros(n)
        for s, c in counts.items():
            usd, joules, imp = t.price[s]
            stages[s] = Cost(float((w.secs[s] * c).sum()), float((usd * c).sum()),
                             float((joules * c).sum()), float((imp * c).sum()))
            cand_usd += usd * c
        busy = float((self.pre_gpu * gen).sum() + (self.post_gpu * self.measured).sum())
        stages["idle"] = model.idle(self.caps.gpus * wall - busy)
        stages = {s: stages[s] for s in STAGES}
        p = self.parent
        orphan = reached & (p >= 0) & ~self.measured[np.maximum(p, 0)]
        outcome = np.full(n, None, dtype=object)
        shown = self.measured | (self.state == "failed_before_decision")
        outcome[shown] = w.outcome[shown]
        best, best_id = t.seed_speedup, None
        ok = np.flatnonzero(self.measured & w.success)
        if len(ok) and self.speedup[ok].max() > best:
            top = ok[self.speedup[ok] == self.speedup[ok].max()]
            first = top[np.argmin(t_end[top])]  # the engine keeps the first to reach it
            best, best_id = float(self.speedup[first]), t.candidate_ids[first]
        anytime = self._anytime(abs_step, decide_abs, t_end, gen)
        table = {
            "candidate_id": t.candidate_ids, "search_id": [t.search_id] * n,
            "task_id": [t.task_id] * n, "step": t.step, "parent_index": t.parent,
            "state": self.state.tolist(), "orphan": orphan.tolist(),
            "action": self.action.tolist(), "score": shared_floats(self.score),
            "reason": self.reason.tolist(), "outcome": outcome.tolist(),
            "speedup": shared_floats(np.where(self.measured & w.success, self.speedup,
                                              np.nan)),
            "measure_start_s": shared_floats(t_start), "measure_end_s": shared_floats(t_end),
            "usd": shared_floats(cand_usd),
        }
        return SearchResult(
            search_id=t.search_id, task_id=t.task_id, seed_speedup=t.seed_speedup,
            best_speedup=best, best_candidate_id=best_id, gpu_evals=int(self.measured.sum()),
            candidates=int(gen.sum()), forecasts=int(counts["forecasting"].sum()),
            unmeasurable=int((self.state == "unmeasurable").sum()),
            orphans=int(orphan.sum()), reached=int(reached.sum()),
            steps=len(lay.step_numbers), wall_s=wall, stages=stages,
            stopped_by=self.stopped_by, anytime=anytime, table=table,
        )

    def _anytime(self, abs_step, decide_abs, t_end, gen):
        """(seconds, usd, joules, gpu_evals, best) after each measurement, from the bookings
        (a resource's costs are booked when it is released, as in the engine)."""
        t, w = self.t, self.w
        rows0 = np.array([[0.0, 0.0, 0.0, 0, t.seed_speedup]])
        m = np.flatnonzero(self.measured)
        if not len(m):
            return rows0
        parts = []
        for p, origin, mask in ((self.pre, abs_step, gen), (self.post, decide_abs,
                                                             self.measured)):
            for rows, when, gpu, usd, joules in p.bookings:
                keep = mask[rows]
                r = rows[keep]
                parts.append((origin[r] + when[keep], gpu[keep], usd[keep], joules[keep]))
        when, gpu, usd, joules = (np.concatenate([x[i] for x in parts]) for i in range(4))
        o = np.argsort(when, kind="stable")
        when = when[o]
        cum_gpu, cum_usd, cum_j = (np.cumsum(x[o]) for x in (gpu, usd, joules))
        ends = t_end[m]
        om = np.argsort(ends, kind="stable")
        m, ends = m[om], ends[om]
        k = np.searchsorted(when, ends, "right") - 1
        take = (lambda c: np.where(k >= 0, c[np.maximum(k, 0)], 0.0))
        spent_usd, spent_j, busy = take(cum_usd), take(cum_j), take(cum_gpu)
        if self.model.billing == "reserved":
            idle_s = np.maximum(self.caps.gpus * ends - busy, 0.0)
            spent_usd = spent_usd + idle_s * self.model.gpu.usd_per_hour / 3600
            spent_j = spent_j + idle_s * self.model.gpu.idle_w_context
        gains = np.where(w.success[m], self.speedup[m], -np.inf)
        best = np.maximum(np.maximum.accumulate(gains), t.seed_speedup)
        evals = np.searchsorted(np.sort(decide_abs[m]), ends, "right")
        return np.vstack([rows0, np.column_stack([ends, spent_usd, spent_j, evals, best])])


def run_fast(trace: SearchTrace, policy: Policy, model: PresetCostModel, caps: Capacities,
             budget: Budget, seed: int, drop_orphans: bool = False,
             pipeline: Pipeline = DEFAULT_PIPELINE, noise: MeasureNoise | None = None
             ) -> SearchResult:
    """Replay one search in closed form. Raises FastPathUnsafe on a tie the event order
    would settle; check ``fast_path_blocker`` first for the other conditions."""
    result = _FastRun(trace, policy, model, caps, budget, seed, drop_orphans, pipeline,
                      noise).run()
    confirm_best(result, trace.candidate_ids, trace.arrays["speedup"], noise, seed)
    return result
