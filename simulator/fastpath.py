"""The fast path: the trace driver in closed form when no resource capacity binds.

If no step has more candidates than any resource has slots, nothing ever queues: a
candidate's stages end at its start time plus their durations, a parent batch decides when its
slowest member is ready, and a step ends when its slowest batch does. Each step is then a few
vectorised array operations and one ``Policy.decide_groups`` call instead of thousands of SimPy
events. The arithmetic follows the event engine's order of additions, so times, decisions and
trace hashes agree exactly (tests/test_fastpath.py checks this on many random configurations).

Not covered (the event engine runs instead): budgets other than ``steps``, and a measurement
that improves the best ending at exactly the instant a batch of its step decides (event order
would matter).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import STAGES, Cost
from gfsim.policies.base import Batch, Policy, SearchState, group_bounds
from gfsim.simulator.budget import Budget
from gfsim.simulator.engine import segments
from gfsim.simulator.pipeline import COST_STAGE, DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.results import SearchResult
from gfsim.simulator.trace import SearchTrace

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
        self.gen_failed = np.asarray(t.gen_failed, dtype=bool)
        self.forecast_runs = t.has_forecast & policy.needs_forecast
        outcome = np.array([o or "" for o in t.outcome], dtype=object)
        self.no_eval = outcome == ""
        self.success = outcome == "success"
        self.ends_after = {"compile": outcome == "compile_failed",
                           "check": (outcome == "runtime_error") | (outcome == "incorrect")}
        self.secs = {"generation": np.asarray(t.gen_s, float),
                     "forecasting": np.asarray(t.fc_s, float),
                     **{k: np.asarray(v, float) for k, v in t.stage_s.items()}}
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


class _Run:
    """Per-candidate outcome columns of one fast replay (the same columns as the engine's)."""

    def __init__(self, t: SearchTrace):
        n = len(t)
        self.state = np.full(n, "budget_stopped", dtype=object)
        self.outcome = np.full(n, None, dtype=object)
        self.action = np.full(n, None, dtype=object)
        self.reason = np.full(n, None, dtype=object)
        self.score = np.full(n, np.nan)
        self.reached = np.zeros(n, bool)
        self.orphan = np.zeros(n, bool)
        self.measured = np.zeros(n, bool)
        self.t_start = np.full(n, np.nan)
        self.t_end = np.full(n, np.nan)
        self.generated = self.unmeasurable = self.evals = self.steps = 0


def run_fast(trace: SearchTrace, policy: Policy, model: PresetCostModel, caps: Capacities,
             budget: Budget, seed: int, drop_orphans: bool = False,
             pipeline: Pipeline = DEFAULT_PIPELINE) -> SearchResult:
    """Replay one search in closed form. Raises FastPathUnsafe on a tie the event order
    would settle; check ``fast_path_blocker`` first for the other conditions."""
    t = trace
    w = _World(t, policy)
    run = _Run(t)
    before = segments(pipeline.before, model.compile_on)
    after = segments(pipeline.after, model.compile_on)
    parent = np.asarray(t.parent, dtype=int)
    speedup = np.asarray(t.speedup, dtype=float)
    best = t.seed_speedup
    now = 0.0
    stopped_by = None
    for k, (step, batches) in enumerate(t.steps):
        if k >= budget.steps:
            stopped_by = "steps"
            break
        rows = np.concatenate([np.asarray(b, dtype=int) for b in batches])
        group = np.repeat(np.arange(len(batches)), [len(b) for b in batches])
        run.reached[rows] = True
        p = parent[rows]
        is_orphan = (p >= 0) & ~run.measured[np.maximum(p, 0)]
        run.orphan[rows] = is_orphan
        go = ~is_orphan if drop_orphans else np.ones(len(rows), bool)
        run.state[rows[~go]] = "orphan_dropped"
        prep = w.run_pass(rows[go], np.full(int(go.sum()), now), before)
        w.commit(prep)
        run.generated += int(go.sum())
        ready_at = np.full(len(rows), now)
        ready_at[go] = prep.end
        ended = np.full(len(rows), -1)
        ended[go] = prep.ended
        for code, name in _ENDED_STATE.items():
            run.state[rows[ended == code]] = name
        run.unmeasurable += int((ended == _UNMEASURABLE).sum())
        failed = rows[ended == _FAILED]
        run.outcome[failed] = [t.outcome[i] for i in failed]
        decide_at = np.maximum.reduceat(ready_at, group_bounds(group)[:-1])
        step_end = max(now, float(decide_at.max()))
        live = ended == _OK
        if live.any():
            state = SearchState(t.search_id, t.task_id, step, best, run.evals, seed, _UNBOUNDED)
            ends = _decide_and_measure(t, w, run, policy, rows[live], group[live], decide_at,
                                       state, after, speedup)
            if len(ends):
                step_end = max(step_end, float(ends.max()))
            ok = run.measured & w.success & np.isin(np.arange(len(t)), rows)
            if ok.any():
                best = max(best, float(speedup[ok].max()))
        now = step_end
        run.steps += 1
    return _result(t, w, run, model, caps, now, speedup, stopped_by)


def _decide_and_measure(t, w, run, policy, rows, group, decide_at, state, after, speedup):
    """Decide the step's live rows and measure the chosen ones; returns measurement ends.

    First every batch decides at once with the step's starting best. If a success measured in
    this step, better than that best, ends before some batch decides, that batch would have
    seen it: the step is then redone batch by batch in order of decision time.
    """
    batch = _batch(t, policy, rows, np.where(run.measured & w.success, speedup, np.nan))
    groups = np.unique(group)
    results = [_decide(w, policy, batch, rows, group, groups, decide_at, state, state.best_speedup,
                       after)]
    m_rows, ends = results[0][1:3]
    better = w.success[m_rows] & (speedup[m_rows] > state.best_speedup)
    if len(groups) > 1 and better.any() and (decide_at[groups] > ends[better].min()).any():
        results = []
        done_rows, done_ends = np.zeros(0, int), np.zeros(0)
        for g in groups[np.argsort(decide_at[groups], kind="stable")]:
            seen = w.success[done_rows] & (done_ends < decide_at[g])
            best_g = max([state.best_speedup, *speedup[done_rows[seen]]])
            res = _decide(w, policy, batch, rows, group, np.array([g]), decide_at, state,
                          best_g, after)
            results.append(res)
            done_rows = np.r_[done_rows, res[1]]
            done_ends = np.r_[done_ends, res[2]]
    all_ends = np.concatenate([r[2] for r in results])
    all_rows = np.concatenate([r[1] for r in results])
    # Only a better success changes what a batch sees; if one ends at the very instant a
    # batch decides, which comes first is up to the event queue: leave it to the engine.
    better = w.success[all_rows] & (speedup[all_rows] > state.best_speedup)
    if np.isin(all_ends[better], decide_at[groups]).any():
        raise FastPathUnsafe("a better measurement ends at the instant a batch decides")
    for (sel, m_rows, ends, d, p) in results:
        w.commit(p)
        r = rows[sel]
        m = d.measure
        run.action[r] = np.where(m, "measure", "skip")
        run.score[r] = d.score
        run.reason[r] = np.array(d.reason, dtype=object)
        run.state[r[~m]] = "skipped"
        lacking = r[m & w.no_eval[r]]
        run.state[lacking] = "unmeasurable"
        run.unmeasurable += len(lacking)
        run.state[m_rows] = "measured"
        run.measured[m_rows] = True
        run.evals += len(m_rows)
        run.t_start[m_rows] = decide_at[group[sel]][m & ~w.no_eval[r]]
        run.t_end[m_rows] = ends
        run.outcome[m_rows] = [t.outcome[i] for i in m_rows]
    return all_ends


def _decide(w, policy, batch, rows, group, chosen, decide_at, state, best, after):
    sel = np.isin(group, chosen)
    idx = np.flatnonzero(sel)
    d = policy.decide_groups(batch.take(idx), group[sel], np.full(len(idx), best), state)
    r = rows[sel]
    go = d.measure & ~w.no_eval[r]
    p = w.run_pass(r[go], decide_at[group[sel]][go], after)
    return sel, r[go], p.end, d, p


def _batch(t: SearchTrace, policy: Policy, rows: np.ndarray, measured_speedup) -> Batch:
    base = np.ones(len(rows))
    if t.forecast_frame == "seed":
        base[:] = t.seed_speedup
    elif t.forecast_frame == "parent":
        base = np.array([_ancestor_speedup(t, i, measured_speedup) for i in rows])
    reads = policy.needs_forecast
    return Batch(
        candidate_ids=tuple(t.candidate_ids[i] for i in rows), probs=t.probs[rows],
        has_forecast=t.has_forecast[rows] if reads else np.zeros(len(rows), bool),
        parse_failed=t.parse_failed[rows], base_speedup=base, bin_edges=t.bin_edges,
        true_speedup=np.asarray(t.speedup, float)[rows] if policy.needs_truth else None,
    )


def _ancestor_speedup(t: SearchTrace, i: int, measured_speedup: np.ndarray) -> float:
    p = t.parent[i]
    while p >= 0:
        if not np.isnan(measured_speedup[p]):
            return float(measured_speedup[p])
        p = t.parent[p]
    return t.seed_speedup


def _result(t, w, run, model, caps, wall, speedup, stopped_by) -> SearchResult:
    stages = {}
    for s in STAGES:
        if s == "idle":
            continue
        times = w.ran[s]
        usd, joules, imp = (float((x * times).sum()) for x in t.price[s])
        stages[s] = Cost(float((w.secs[s] * times).sum()), usd, joules, imp)
    gpu_busy = float(sum(b[2].sum() for b in w.bookings))
    stages["idle"] = model.idle(caps.gpus * wall - gpu_busy)
    stages = {s: stages[s] for s in STAGES}
    cand_usd = np.zeros(len(t))
    for s in w.ran:
        cand_usd += t.price[s][0] * w.ran[s]
    measured = np.flatnonzero(run.measured)
    best_id = None
    best = t.seed_speedup
    ok = measured[w.success[measured]]
    if len(ok):
        # The first to reach the maximum in time (the engine updates best on strict gains).
        top = ok[speedup[ok] == speedup[ok].max()]
        first = top[np.argmin(run.t_end[top])]
        if speedup[first] > best:
            best, best_id = float(speedup[first]), t.candidate_ids[first]
    anytime = _anytime(t, w, run, model, caps, best_floor=t.seed_speedup, speedup=speedup)
    table = {
        "candidate_id": t.candidate_ids, "search_id": [t.search_id] * len(t),
        "task_id": [t.task_id] * len(t), "step": t.step, "parent_index": t.parent,
        "state": run.state.tolist(), "orphan": run.orphan.tolist(),
        "action": run.action.tolist(), "score": run.score.tolist(),
        "reason": run.reason.tolist(), "outcome": run.outcome.tolist(),
        "speedup": np.where(run.measured & w.success, speedup, np.nan).tolist(),
        "measure_start_s": run.t_start.tolist(), "measure_end_s": run.t_end.tolist(),
        "usd": cand_usd.tolist(),
    }
    digest = hashlib.sha256()
    for row in zip(t.candidate_ids, table["state"], table["action"], table["measure_end_s"]):
        digest.update(repr(row).encode())
    return SearchResult(
        search_id=t.search_id, task_id=t.task_id, seed_speedup=t.seed_speedup,
        best_speedup=best, best_candidate_id=best_id, gpu_evals=run.evals,
        candidates=run.generated, forecasts=int(w.ran["forecasting"].sum()),
        unmeasurable=run.unmeasurable, orphans=int(run.orphan.sum()),
        reached=int(run.reached.sum()), steps=run.steps, wall_s=wall, stages=stages,
        stopped_by=stopped_by, anytime=anytime, table=table, trace_hash=digest.hexdigest(),
    )


def _anytime(t, w, run, model, caps, best_floor, speedup):
    """(seconds, usd, joules, gpu_evals, best) after each measurement, from the bookings
    (a resource's costs are booked when it is released, as in the event engine)."""
    rows = [(0.0, 0.0, 0.0, 0, best_floor)]
    measured = np.flatnonzero(run.measured)
    if not len(measured):
        return rows
    when, gpu, usd, joules = (np.concatenate([b[k] for b in w.bookings]) for k in (1, 2, 3, 4))
    order = np.argsort(when, kind="stable")
    when = when[order]
    cum = {k: np.cumsum(v[order]) for k, v in (("gpu", gpu), ("usd", usd), ("j", joules))}
    ends = run.t_end[measured]
    o = np.argsort(ends, kind="stable")
    starts = np.sort(run.t_start[measured])
    best = best_floor
    for i, e in zip(measured[o], ends[o]):
        if w.success[i] and speedup[i] > best:
            best = float(speedup[i])
        k = int(np.searchsorted(when, e, "right")) - 1
        spent_usd, spent_j, busy = (float(cum[c][k]) if k >= 0 else 0.0 for c in ("usd", "j",
                                                                                  "gpu"))
        if model.billing == "reserved":
            idle = model.idle(caps.gpus * e - busy)
            spent_usd, spent_j = spent_usd + float(idle.usd), spent_j + float(idle.joules)
        rows.append((float(e), spent_usd, spent_j, int(np.searchsorted(starts, e, "right")),
                     best))
    return rows
