"""The closed-loop fast path: the puct search replayed without SimPy, with the same answers.

``PuctSimulation`` runs each candidate as a SimPy process; much of its time goes to the event
machinery (processes, events, callbacks), not to the search. This module keeps the search
(archive, child draws, policy, per-parent cap, budgets) and replaces the machinery by a lean
loop over a heap of timed callbacks, ordered exactly as SimPy orders its events: by time, then
by the order in which they were scheduled (SimPy's event id). SimPy's *urgent* events (a new
process starting) run before anything else at their instant, in creation order, so they are
run inline, right after the callback that creates them; what they schedule gets the ids SimPy
would give it. Resources are first come, first served with a slot passed straight to the next
in line, as ``simulator.slots.Slots``. Because the order of events is SimPy's, so are the
order of bookings, the budget checks, the live best a batch decides with, and the anytime
rows, at ties too (a child drawn twice from the same logged candidate times exactly alike).

Every capacity, budget, pipeline and noise setting is covered; ``tests/test_puct_fast.py``
checks decisions, states, best speedups, counts, times and totals against the SimPy engine on
random logs and configurations, bit for bit.

**Compiled.** Once a process has run ``world_model.COMPILE_AFTER`` children's events here, a
search whose plans are kept runs each step's events by ``_events_kernel.run`` (Numba) instead of
``_run_events``: the same event order, bookings and budget checks on the same floats, its
children's outcomes kept in arrays until ``result``; a batch whose best moved, or that must be
capped per parent, is decided in Python as ``_decide`` decides it. ``tests/test_puct_fast.py``
compares both loops with SimPy.

Two things make it cheap besides the missing machinery:
- what a child does is planned once per logged candidate it copies (``_Proto``: its stages,
  their seconds and prices, what the policy reads), kept with the log's trace, so a tuning run
  that draws the same logged candidates thousands of times plans each once;
- a step's parent batches are all decided at the step's start (which children reach the
  decision is known from their plans), in one ``decide_groups`` call for every search run in
  lockstep whose policy state agrees (``run_lockstep``, ``Policy.state_fields``); a batch
  that sees a new best by the time it decides is decided again, alone, as the engine does.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import replace

import numpy as np

from gfsim.cost_models.model import _HOUR as _MODEL_HOUR
from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.core.memory import no_cyclic_gc
from gfsim.cost_models.usage import STAGES, Cost
from gfsim.policies.base import Batch, Decisions, Policy, SearchState
from gfsim.simulator.budget import HOUR_S, Budget, limits_money_or_time, unaffordable
from gfsim.simulator.children import Child, ChildSource, LogChildren, finish_steps, pool_of
from gfsim.simulator.trace.engine import segments
from gfsim.simulator.noise import MeasureNoise, confirm_best
from gfsim.simulator.pipeline import COST_STAGE, DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.progress import tick
from gfsim.simulator.closed.puct import ArchiveNode, ChildResult
from gfsim.simulator.closed.evolution import make_bank
from gfsim.simulator.closed.engine import SearchConfig, cap_per_parent, puct_extra
from gfsim.simulator.results import SearchResult

__all__ = ["run_puct_fast", "fast_search", "run_lockstep"]

_K = {s: k for k, s in enumerate(STAGES)}
_GEN, _FC, _COLD, _TIMING = _K["generation"], _K["forecasting"], _K["cold_start"], _K["timing"]
_ENDS_AFTER = {"compile": {"compile_failed"}, "check": {"runtime_error", "incorrect"}}
_MEASURE_STAGES = ("cold_start", "compilation", "check", "timing")
_NO_PRICE = (0.0, 0.0, 0.0)
_RESOURCES = {"gen": 0, "fc": 1, "cpu": 2, "gpu": 3}
# Callback kinds on the heap: a segment's service ended, a queued slot granted, a batch decides.
_PRE_END, _POST_END, _PRE_GRANT, _POST_GRANT, _DECIDE = range(5)


class _Proto:
    """What a child does and shows, whatever its id and speedup: per part (before and after
    the decision) its segments as (resource, seconds it holds it, bookings as (stage index,
    seconds, usd, joules, usd_imputed), whether on the GPU) and how the part ends (None: it
    went through); what measuring it costs; what the policy reads of it."""

    __slots__ = ("pre", "pre_ended", "post", "post_ended", "measure_usd", "probs",
                 "has_forecast", "parse_failed", "outcome", "step_cost", "pack")

    def __init__(self, child: Child, before, after, reads_forecasts: bool):
        self.pre, self.pre_ended = _plan_part(child, before, reads_forecasts)
        self.post, self.post_ended = _plan_part(child, after, reads_forecasts)
        # What the child costs run to its logged end (usd, joules, seconds), summed in the
        # order ``affords_step`` summed them child by child.
        u = j = sec = 0.0
        for part in ((self.pre,) if self.pre_ended is not None else (self.pre, self.post)):
            for _, _, bookings, _ in part:
                for _, v, bu, bj, _ in bookings:
                    u += bu
                    j += bj
                    sec += v
        self.step_cost = (u, j, sec)
        musd = 0.0
        for k in _MEASURE_STAGES:  # the engine's mean_measure_usd summand, same order
            musd = musd + child.price.get(k, _NO_PRICE)[0]
        self.measure_usd = musd
        self.probs = child.probs
        self.has_forecast = child.has_forecast
        self.parse_failed = child.parse_failed
        self.outcome = child.outcome
        self.pack = None

    def packed(self) -> np.ndarray:
        """The plan as the compiled step reads it (``_events_kernel``'s module doc), made
        once."""
        if self.pack is None:
            segs: list = []
            books: list = []
            for part in (self.pre, self.post):
                for res, total, bookings, on_gpu in part:
                    segs += (res, 1.0 if on_gpu else 0.0, total, len(books) // 5, len(bookings))
                    for booking in bookings:
                        books += booking
            self.pack = np.array([len(self.pre), len(self.post), _code(self.pre_ended),
                                  _code(self.outcome), len(segs) // 5, len(books) // 5,
                                  *segs, *books], dtype=float)
        return self.pack


# Outcomes as the compiled step codes them (-1: None); the first three are fixed.
_CODES: dict[str, int] = {}
_LABELS: list[str] = []
_DECODED: list = [np.array([None], dtype=object)]  # code + 1 -> its label


def _code(label: str | None) -> int:
    if label is None:
        return -1
    code = _CODES.get(label)
    if code is None:
        code = _CODES[label] = len(_LABELS)
        _LABELS.append(label)
        _DECODED[0] = np.array([None, *_LABELS], dtype=object)
    return code


for _label in ("success", "generation_failed", "unmeasurable"):
    _code(_label)
# The compiled step's codes of a child's state and action and of what stopped a search.
_STATES = np.array(["budget_stopped", "measured", "skipped", "unmeasurable", "generation_failed",
                    "failed_before_decision"], dtype=object)
_ACTIONS = np.array([None, "skip", "measure"], dtype=object)
_STOPS = [None, "gpu_evals", "gpu_hours", "seconds", "usd", "joules", "steps"]
_STOP_CODES = {name: k for k, name in enumerate(_STOPS)}
_EVENTS: list = []  # the compiled step, once loaded ([None]: it could not be)
_STEPPED = [0]  # children whose events the Python loop ran in this process


def _events_kernel():
    """``_events_kernel``, loaded (compiled, or read from Numba's cache) once this process has
    run ``world_model.COMPILE_AFTER`` children's events in Python (loading Numba costs a
    process about half a second), unless ``GFSIM_COMPILED`` is off; None: the Python loop."""
    from gfsim.simulator import world_model as wm

    if not wm.COMPILED:
        return None
    if not _EVENTS:
        if _STEPPED[0] < wm.COMPILE_AFTER:
            return None
        try:
            from gfsim.simulator.closed import _events_kernel as kernel
            _warm(kernel)
        except Exception:  # noqa: BLE001 - no Numba, or a surprise: the Python loop serves
            kernel = None
        _EVENTS.append(kernel)
    return _EVENTS[0]


def _warm(kernel) -> None:
    """Compile (or load) ``kernel.run`` for the argument types ``run_step`` gives it."""
    ints, floats = np.zeros(1, dtype=np.int64), np.zeros(1)
    ist = np.zeros(kernel.IST, dtype=np.int64)
    ist[kernel.RESUME] = kernel.START
    kernel.run(np.zeros(kernel.FS), ist, np.zeros((4, len(STAGES))), np.zeros(kernel.CFG_F),
               np.zeros(kernel.CFG_I, dtype=np.int64), np.ones(4, dtype=np.int64), floats[:0],
               floats[:0], floats[:0], ints, ints, np.zeros(0, dtype=np.int8), np.zeros((0, 4)),
               np.zeros((0, 3), dtype=np.int64), np.zeros((1, 5)), 0, floats,
               np.zeros((1, 4), dtype=np.int64), np.zeros((4, 1, 3), dtype=np.int64),
               np.zeros((4, 2), dtype=np.int64), np.zeros(4, dtype=np.int64), ints[:0],
               ints[:0], ints[:0], ints[:0])


_NO_FLOATS = np.zeros(0)
_NO_BYTES = np.zeros(0, dtype=np.int8)


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with room for ``size`` rows, its rows kept."""
    out = np.empty((size, *a.shape[1:]), dtype=a.dtype)
    out[:len(a)] = a
    return out


def _plan_part(child: Child, segs, reads_forecasts: bool):
    """The engine's ``_plan`` and ``_run`` for one part (before or after the decision)."""
    secs = {_K[k]: v for k, v in child.stage_s.items()}
    out = []
    for res, stages in segs:
        plan: list[tuple[int, float]] = []
        ended = None
        for s in stages:
            if s == "generate":
                plan.append((_GEN, child.gen_s))
                if child.gen_failed:
                    ended = "generation_failed"
                    break
            elif s == "forecast":
                if reads_forecasts and child.has_forecast:
                    plan.append((_FC, child.fc_s))
            else:
                if child.outcome is None:
                    ended = "unmeasurable"
                    break
                k = _K[COST_STAGE[s]]
                plan.append((k, secs.get(k, 0.0)))
                if child.outcome in _ENDS_AFTER.get(s, ()) and not (
                        s == "check" and secs.get(_TIMING, 0.0) > 0):
                    ended = child.outcome  # (a failure found after timing: timing ran)
                    break
        if plan:
            on_gpu = res == "gpu"
            cold = secs.get(_COLD, 0.0)
            if on_gpu and cold > 0:
                plan.insert(0, (_COLD, cold))
            total = 0.0
            for _, v in plan:
                total += v
            bookings = tuple((k, v, *child.price.get(STAGES[k], _NO_PRICE)) for k, v in plan)
            out.append((_RESOURCES[res], total, bookings, on_gpu))
        if ended:
            return tuple(out), ended
    return tuple(out), None


class _FastPuct:
    """One closed-loop search, run a step at a time (``start``; per step ``begin_step``,
    ``draw_step`` with the parents its archive row chose, ``pending``/``predecided``,
    ``run_step``, the bank's update, ``finish_step``; then ``result``). Names follow
    ``SearchSimulation`` where they mean the same thing."""

    def __init__(self, source: ChildSource, config: SearchConfig, policy: Policy,
                 model: PresetCostModel, caps: Capacities, budget: Budget, seed: int,
                 search_id: str, task_id: str, forecast_frame: str, bin_edges: tuple,
                 pipeline: Pipeline, noise: MeasureNoise | None, selection=None):
        self.source, self.config, self.policy, self.model = source, config, policy, model
        self.selection = selection  # an EvolutionConfig, or None: PUCT
        self.caps, self.budget, self.seed, self.noise = caps, budget, seed, noise
        self.search_id, self.task_id = search_id, task_id
        self.forecast_frame, self.bin_edges = forecast_frame, tuple(bin_edges)
        self.before = tuple(segments(pipeline.before, model.compile_on))
        self.after = tuple(segments(pipeline.after, model.compile_on))
        self.reads = policy.needs_forecast
        self.money_limited = not (math.isinf(budget.usd) and math.isinf(budget.joules))
        self.prices_steps = limits_money_or_time(budget)
        self.cap = [caps.generator, caps.forecaster, caps.compile_workers, caps.gpus]
        # Children copied from a logged candidate share its proto, kept with the log's trace
        # (every replay, seed and trial of that log shares them).
        self.logged = isinstance(source, LogChildren)
        if self.logged:
            self.protos: dict = pool_of(source.t).derived.setdefault(
                ("fast-protos", self.before, self.after, self.reads), {})
        else:  # a source that keeps its children (WorldChildren's cache) keeps their protos
            derived = source.template_cache()
            self.protos = None if derived is None else derived.setdefault(
                ("fast-protos", self.before, self.after, self.reads), {})

    # -- budgets (as SearchSimulation) -----------------------------------------------------
    def _spent(self) -> tuple[float, float]:
        usd, joules = self.usd, self.joules
        if self.model.billing == "reserved":
            idle = self.model.idle(self.caps.gpus * self.now - self.gpu_busy)
            usd, joules = usd + idle.usd, joules + idle.joules
        return usd, joules

    def _exhausted(self) -> str | None:
        if self.stopped_by is not None:
            return self.stopped_by
        b = self.budget
        reason = None
        if self.evals >= b.gpu_evals:
            reason = "gpu_evals"
        elif self.gpu_busy >= b.gpu_hours * HOUR_S:
            reason = "gpu_hours"
        elif self.now >= b.seconds:
            reason = "seconds"
        elif self.money_limited:
            usd, joules = self._spent()
            if usd >= b.usd:
                reason = "usd"
            elif joules >= b.joules:
                reason = "joules"
        self.stopped_by = reason
        return reason

    def _budget_left(self) -> dict[str, float]:
        b = self.budget
        usd, joules = self._spent()
        return {"usd": b.usd - usd, "seconds": b.seconds - self.now,
                "joules": b.joules - joules, "gpu_evals": b.gpu_evals - self.evals,
                "gpu_hours": b.gpu_hours - self.gpu_busy / HOUR_S}

    def affords_step(self) -> bool:
        """The engine's ``_cannot_afford`` once a step's children are drawn: False, and the
        search stops (its drawn children stay budget_stopped, not reached), when the step, every
        child run to its logged end, would break a usd, joules or seconds limit."""
        if not self.prices_steps:
            return True
        usd = joules = secs = 0.0
        proto = self.proto
        for rows in self.batches:
            for i in rows:
                u, j, s = proto[i].step_cost
                usd, joules, secs = usd + u, joules + j, secs + s
        spent_usd, spent_joules = self._spent()
        reason = unaffordable(self.budget, spent_usd, spent_joules, self.now, usd, joules, secs,
                              self.model, self.caps.gpus)
        if reason is None:
            return True
        if self.stopped_by is None:
            self.stopped_by = reason
        self.unreached += len(self.cid) - self._lo
        return False

    def _measure_usd(self) -> float:
        n = self.n_musd
        return float(np.mean(self.musd[:n])) if n else math.nan

    # -- the event loop ------------------------------------------------------------------------
    def _acquire(self, i: int, s: int, post: bool) -> None:
        """Segment ``s`` of candidate i's part asks for its resource."""
        p = self.proto[i]
        res, total = (p.post if post else p.pre)[s][:2]
        if self.in_use[res] < self.cap[res] and not self.waiting[res]:
            self.in_use[res] += 1
            heapq.heappush(self.heap, (self.now + total, next(self.eid),
                                       _POST_END if post else _PRE_END, i, s))
        else:
            self.waiting[res].append((_POST_GRANT if post else _PRE_GRANT, i, s))

    def _prepared(self, i: int) -> None:
        """The engine's ``_prepare`` after its stages: count it, and decide once the batch
        is in."""
        self.generated += 1
        ended = self.proto[i].pre_ended
        if ended == "generation_failed" or ended == "unmeasurable":
            self.state[i] = ended
            self.unmeasurable += ended == "unmeasurable"
        elif ended is not None:  # (None: it reaches the decision)
            self.state[i] = "failed_before_decision"
            self.outcome[i] = ended
        b = self.batch_of[i]
        self.remaining[b] -= 1
        if self.remaining[b] == 0:
            heapq.heappush(self.heap, (self.now, next(self.eid), _DECIDE, b, 0))

    def _measured(self, i: int) -> None:
        """The engine's ``_measure`` after its stages."""
        proto = self.proto[i]
        self.t_end[i] = self.now
        self.outcome[i] = proto.outcome
        if proto.outcome == "success":
            s = self.speedup[i] * self.noise_f[i]
            self.measured_speedup[i] = s
            if s > self.best:
                self.best = s
                self.best_id = self.cid[i]
        usd, joules = self._spent()
        self.anytime.append((self.now, usd, joules, self.evals, self.best))

    def _run_events(self) -> None:
        heap, pop, push, eid = self.heap, heapq.heappop, heapq.heappush, self.eid
        in_use, cap, waiting, proto = self.in_use, self.cap, self.waiting, self.proto
        stage_s, stage_usd, stage_j, stage_imp = (self.stage_s, self.stage_usd, self.stage_j,
                                                  self.stage_imp)
        cand_usd = self.cand_usd
        while heap:
            t, _, kind, i, s = pop(heap)
            self.now = t
            if kind <= _POST_END:  # a segment ends: release, book, go on
                p = proto[i]
                part = p.pre if kind == _PRE_END else p.post
                res, total, bookings, on_gpu = part[s]
                queue = waiting[res]
                if queue:  # the slot passes straight to the next in line
                    k2, j, s2 = queue.popleft()
                    push(heap, (t, next(eid), k2, j, s2))
                else:
                    in_use[res] -= 1
                usd = self.usd
                joules = self.joules
                spent = cand_usd[i]
                for k, secs, u, jl, imp in bookings:
                    stage_s[k] += secs
                    stage_usd[k] += u
                    stage_j[k] += jl
                    stage_imp[k] += imp
                    usd += u
                    joules += jl
                    spent += u
                    if k == _FC:
                        self.forecasts += 1
                cand_usd[i] = spent
                self.usd, self.joules = usd, joules
                if on_gpu:
                    self.gpu_busy += total
                s += 1
                if s < len(part):  # the next segment asks for its resource (``_acquire``)
                    res, total = part[s][:2]
                    if in_use[res] < cap[res] and not waiting[res]:
                        in_use[res] += 1
                        push(heap, (t + total, next(eid), kind, i, s))
                    else:
                        waiting[res].append((kind + 2, i, s))
                elif kind == _PRE_END:
                    self._prepared(i)
                else:
                    self._measured(i)
            elif kind == _DECIDE:
                self._decide(i)
            else:  # a queued request got its slot: the process resumes and holds it
                p = proto[i]
                push(heap, (t + (p.pre if kind == _PRE_GRANT else p.post)[s][1], next(eid),
                            kind - 2, i, s))

    # -- decisions -----------------------------------------------------------------------------
    def _batch(self, rows: list[int]) -> Batch:
        protos = [self.shows[i] for i in rows]
        n = len(rows)
        if self.forecast_frame == "reference":
            base = np.ones(n)
        elif self.forecast_frame == "seed":
            base = np.full(n, self.seed_speedup)
        else:  # parents are archive nodes: always measured
            base = np.array([self.parent_reward[i] for i in rows])
        return Batch(
            candidate_ids=tuple([self.cid[i] for i in rows]),
            probs=np.array([p.probs for p in protos], dtype=float).reshape(n, 8),
            has_forecast=np.array([p.has_forecast for p in protos], dtype=bool) if self.reads
            else np.zeros(n, bool),
            parse_failed=np.array([p.parse_failed for p in protos], dtype=bool),
            base_speedup=base, bin_edges=self.bin_edges,
            true_speedup=np.array([self.speedup[i] for i in rows]) if self.policy.needs_truth
            else None,
        )

    def pending(self):
        """The step's children that reach the decision, as one batch with a group per parent
        batch (None if none does). Which do is known from their plans, so every batch of a
        step can be decided at its start, with the best as it is then."""
        proto = self.proto
        live = [[i for i in rows if proto[i].pre_ended is None] for rows in self.batches]
        self.live = live
        rows = [i for part in live for i in part]
        if not rows:
            return None
        return self._batch(rows), np.repeat(np.arange(len(live)), [len(p) for p in live])

    def predecided(self, batch: Batch | None, decisions) -> None:
        """Keep a step's early decisions: policies are pure, so a parent batch whose best is
        unchanged when it decides gets exactly these (the contract of ``decide_groups``);
        one that sees a new best is decided again, alone, as the engine decides it."""
        if batch is None:
            self.early = None
            return
        bounds = [0]
        for part in self.live:
            bounds.append(bounds[-1] + len(part))
        self.early = (self.best, batch, decisions, bounds)

    def _decide(self, b: int) -> None:
        """The engine's ``_parent_batch`` once its batch is in: decide, cap, start measuring."""
        live = self.live[b]
        if not live:
            return
        early_best, early_batch, d, bounds = self.early
        k = self.config.k_per_parent
        if self.best == early_best:
            lo, hi = bounds[b], bounds[b + 1]
            measure, score, reason = d.measure[lo:hi], d.score[lo:hi], d.reason[lo:hi]
            if np.count_nonzero(measure) > k:  # the cap reads the batch (else it keeps all)
                measure = cap_per_parent(early_batch.take(slice(lo, hi)), measure, k)
        else:
            batch = self._batch(live)
            d = self.policy.decide(batch, replace(self.step_state, best_speedup=self.best))
            measure = cap_per_parent(batch, d.measure, k)
            score, reason = d.score, d.reason
        measure = np.asarray(measure, dtype=bool).tolist()
        score = score.tolist()
        chosen = []
        for j, i in enumerate(live):
            self.score[i] = score[j]
            self.reason[i] = reason[j]
            if not measure[j]:
                self.action[i] = "skip"
                self.state[i] = "skipped"
                continue
            self.action[i] = "measure"
            if self._exhausted():
                pass  # stays budget_stopped
            elif self.proto[i].outcome is None:
                self.state[i] = "unmeasurable"
                self.unmeasurable += 1
            else:
                self.evals += 1
                self.state[i] = "measured"
                self.t_start[i] = self.now
                chosen.append(i)
        for i in chosen:  # each a new process: SimPy starts them now, before anything else
            if self.proto[i].post:
                self._acquire(i, 0, True)
            else:
                self._measured(i)

    # -- the search ------------------------------------------------------------------------------
    def _draw(self, parents: list[ArchiveNode], n: int):
        """Draw the step's children of every parent (one ``draw_step_open`` call); returns
        their indices per parent, added (a logged source's), or the children drawn for
        ``_take`` once the source's work left (returned too, or None) is finished."""
        requests = []
        for p in parents:
            e = self.expanded.get(p.node_id, 0)
            self.expanded[p.node_id] = e + 1
            requests.append((p.node_id, self.true_speedup[p.node_id], e, n))
        batches = []
        if self.logged:
            src = self.source
            pool = pool_of(src.t)
            protos = self.protos
            for b, (parent, (node_id, speedup, e, _)) in enumerate(zip(parents, requests)):
                rows = []
                for c, cid, source, s in src.picks(node_id, speedup, e, n, self.seed):
                    proto = protos.get(c)
                    if proto is None:
                        proto = protos[c] = _Proto(src._child(pool, c, cid, source, s),
                                                   self.before, self.after, self.reads)
                    rows.append(self._add(cid, proto, s, None if source == "fallback"
                                          else pool.identity[c], source,
                                          src.t.candidate_ids[c], parent, b))
                batches.append(rows)
            return batches, None
        return self.source.draw_step_open(requests, self.seed)

    def _take(self, parents: list[ArchiveNode], drawn) -> list[list[int]]:
        """Add the step's children drawn (``_draw``) per parent; returns their indices. A
        child whose plan key has a plan shares it; what the policy reads of it (``shows``) is
        then the child itself (children of one plan key differ only in their forecasts)."""
        protos = self.protos
        get = (lambda key: None) if protos is None else protos.get
        cids = self.cid
        plan, show, musd_of = self.proto.append, self.shows.append, []
        musd = musd_of.append
        batches = []
        for b, (parent, children) in enumerate(zip(parents, drawn)):
            lo = len(cids)
            for child in children:
                key = child.plan_key
                shared = key is not None
                proto = get(key if shared else child.candidate_id)
                if proto is None:
                    proto = _Proto(child, self.before, self.after, self.reads)
                    if protos is not None:
                        protos[key if shared else child.candidate_id] = proto
                    show(proto)
                else:
                    show(child if shared else proto)
                plan(proto)
                if proto.outcome is not None:
                    musd(proto.measure_usd)
            cids += [c.candidate_id for c in children]
            self.speedup += [c.speedup for c in children]
            self.code += [c.code for c in children]
            self.draw_source += [c.draw_source for c in children]
            self.template += [c.template for c in children]
            n = len(cids) - lo
            self.parent_node.extend([parent.node_id] * n)
            self.parent_reward.extend([parent.reward] * n)
            self.step.extend([self.steps_done] * n)
            self.batch_of.extend([b] * n)
            batches.append(list(range(lo, lo + n)))
        self._add_musd(musd_of)
        return batches

    def _add(self, cid, proto, speedup, code, draw_source, template, parent, b) -> int:
        i = len(self.cid)
        self.cid.append(cid)
        self.proto.append(proto)
        self.shows.append(proto)
        self.speedup.append(speedup)
        self.code.append(code)
        self.draw_source.append(draw_source)
        self.template.append(template)
        self.parent_node.append(parent.node_id)
        self.parent_reward.append(parent.reward)
        self.step.append(self.steps_done)
        self.batch_of.append(b)
        if proto.outcome is not None:
            self._add_musd((proto.measure_usd,))
        return i

    def _add_musd(self, values) -> None:
        """Each measurable child's measuring cost, for ``_measure_usd``."""
        n, m = self.n_musd, len(values)
        while n + m > len(self.musd):
            self.musd = np.concatenate([self.musd, np.zeros(len(self.musd))])
        self.musd[n:n + m] = values
        self.n_musd = n + m

    def start(self) -> None:
        root_id, self.seed_speedup = self.source.root()
        self.root = ArchiveNode(root_id, self.seed_speedup, (), is_seed=True)
        n_stages = len(STAGES)
        self.stage_s, self.stage_usd = [0.0] * n_stages, [0.0] * n_stages
        self.stage_j, self.stage_imp = [0.0] * n_stages, [0.0] * n_stages
        self.usd = self.joules = self.gpu_busy = 0.0
        self.now = 0.0
        self.heap: list = []
        self.eid = itertools.count()
        self.in_use = [0] * len(self.cap)
        self.waiting = [deque() for _ in self.cap]
        self.cid, self.proto, self.shows, self.speedup, self.code = [], [], [], [], []
        self.draw_source, self.template = [], []
        self.parent_node, self.parent_reward, self.step, self.batch_of = [], [], [], []
        self.state, self.outcome, self.action, self.score, self.reason = [], [], [], [], []
        self.cand_usd, self.t_start, self.t_end = [], [], []
        self.measured_speedup, self.noise_f = [], []
        self.musd, self.n_musd = np.zeros(64), 0
        self.best, self.best_id = self.seed_speedup, None
        self.evals = self.forecasts = self.generated = self.unmeasurable = 0
        self.stopped_by = None
        self.unreached = 0  # children drawn for a step the budget could not afford
        self.anytime = [(0.0, 0.0, 0.0, 0, self.best)]
        self.expanded: dict[str, int] = {}
        self.true_speedup = {root_id: self.seed_speedup}
        self.steps_done = 0
        # The compiled step, where plans are kept (a source that makes a plan per child would
        # pack each once) and idle GPUs are priced as the preset prices them.
        self.kernel = _events_kernel() if self.protos is not None and (
            type(self.model).idle is PresetCostModel.idle) else None
        if self.kernel is not None:
            self._compiled_settings()

    def begin_step(self) -> bool:
        """The driver's start of a step: budgets and steps (False: the search is over)."""
        step = self.steps_done
        if step >= self.config.steps:
            return False
        if step >= self.budget.steps and self.stopped_by is None:
            self.stopped_by = "steps"
        return not self._exhausted()

    def draw_step(self, parents: list[ArchiveNode]):
        """The step's parents (chosen by the archive bank) and their children; returns the
        source's work left on them (None: none), which ``finish_steps`` must do before
        ``take_step``."""
        self.parents = parents
        self.step_state = SearchState(
            search_id=self.search_id, task_id=self.task_id, step=self.steps_done,
            best_speedup=self.best, gpu_evals=self.evals, seed=self.seed,
            budget_left=self._budget_left(), measure_usd=self._measure_usd())
        self._lo = len(self.cid)
        self._drawn, work = self._draw(parents, self.config.children_per_parent)
        return work

    def take_step(self) -> None:
        """The step's children, finished, added to the search."""
        drawn, self._drawn = self._drawn, None
        self.batches = drawn if self.logged else self._take(self.parents, drawn)
        self._extend(self._lo)

    def run_step(self) -> None:
        """The step's events (``predecided`` first); ``results`` what it measured, for the
        archive, then ``finish_step``."""
        if self.kernel is not None:
            self._run_step_compiled()
        else:
            self._run_step_python()
        results = []
        measured = self.measured_speedup if self.kernel is None else \
            self.out_f[:, self.kernel.MEASURED_SPEEDUP]
        for i in self._measured_rows():
            ok = self.proto[i].outcome == "success"
            if ok:
                self.true_speedup[self.cid[i]] = self.speedup[i]
            else:  # a failed parent (evolution) draws around its parent's speedup
                self.true_speedup[self.cid[i]] = self.true_speedup[self.parent_node[i]]
            results.append(ChildResult(self.parent_node[i], self.cid[i],
                                       float(measured[i]) if ok else None, self.code[i]))
        self.results = results

    def _run_step_python(self) -> None:
        # Every batch is admitted together at the step's start (nothing is exhausted now,
        # and nothing changes between the admissions), then each child's process starts.
        self.remaining = [len(rows) for rows in self.batches]
        _STEPPED[0] += len(self.cid) - self._lo
        proto, in_use, cap, waiting = self.proto, self.in_use, self.cap, self.waiting
        heap, eid, now = self.heap, self.eid, self.now
        for rows in self.batches:
            for i in rows:
                pre = proto[i].pre
                if pre:  # its first segment asks for its resource (``_acquire``)
                    res, total = pre[0][:2]
                    if in_use[res] < cap[res] and not waiting[res]:
                        in_use[res] += 1
                        heapq.heappush(heap, (now + total, next(eid), _PRE_END, i, 0))
                    else:
                        waiting[res].append((_PRE_GRANT, i, 0))
                else:
                    self._prepared(i)
        self._run_events()

    def _compiled_settings(self) -> None:
        """What the compiled step reads of this search's budget, prices and slots, and the
        arrays it keeps its state and every child's outcome in (``_events_kernel``)."""
        k, b, model = self.kernel, self.budget, self.model
        cfg_f = np.zeros(k.CFG_F)
        cfg_f[[k.B_USD, k.B_JOULES, k.B_SECONDS, k.B_GPU_EVALS, k.B_GPU_HOURS]] = (
            b.usd, b.joules, b.seconds, b.gpu_evals, b.gpu_hours)
        cfg_f[k.IDLE_USD_PER_HOUR] = model.gpu.usd_per_hour
        cfg_f[k.IDLE_W] = model.gpu.idle_w_context
        cfg_f[k.HOUR] = _MODEL_HOUR
        cfg_f[k.BUDGET_HOUR] = HOUR_S
        cfg_i = np.zeros(k.CFG_I, dtype=np.int64)
        cfg_i[k.MONEY_LIMITED] = self.money_limited
        cfg_i[k.RESERVED] = model.billing == "reserved"
        cfg_i[k.GPUS] = self.caps.gpus
        cfg_i[k.FC_STAGE] = _FC
        cfg_i[k.K_SUCCESS] = _code("success")
        cfg_i[k.K_GENERATION_FAILED] = _code("generation_failed")
        cfg_i[k.K_UNMEASURABLE] = _code("unmeasurable")
        cfg_i[k.K_PER_PARENT] = self.config.k_per_parent
        self.cfg_f, self.cfg_i = cfg_f, cfg_i
        self.cap_a = np.array(self.cap, dtype=np.int64)
        self.fs = np.zeros(k.FS)
        self.fs[k.BEST] = self.best
        self.ist = np.zeros(k.IST, dtype=np.int64)
        self.stages = np.zeros((4, len(STAGES)))
        self.out_f = np.empty((0, 4))
        self.out_i = np.empty((0, 3), dtype=np.int64)
        self.k_speedup = self.k_noise = np.empty(0)
        self.k_anytime = np.empty((64, 5))
        self.k_anytime[0] = self.anytime[0]
        self.ist[k.N_ANYTIME] = 1
        self.scratch: tuple = ()

    def _extend_compiled(self, lo: int) -> None:
        """``_extend`` for the compiled step: the new children's rows of its arrays."""
        n = len(self.cid)
        if n > len(self.out_f):
            size = max(64, 2 * n)
            self.out_f = _grown(self.out_f, size)
            self.out_i = _grown(self.out_i, size)
            self.k_speedup = _grown(self.k_speedup, size)
            self.k_noise = _grown(self.k_noise, size)
        k = self.kernel
        self.out_f[lo:n] = (0.0, math.nan, math.nan, math.nan)  # CAND_USD, T_START, ...
        self.out_i[lo:n] = (k.BUDGET_STOPPED, -1, k.NO_ACTION)
        self.k_speedup[lo:n] = self.speedup[lo:]
        self.k_noise[lo:n] = 1.0 if self.noise is None else self.noise.factors(
            self.seed, self.search_id, self.cid[lo:])
        self.score.extend([math.nan] * (n - lo))
        self.reason.extend([None] * (n - lo))

    def _run_step_compiled(self) -> None:
        """``_run_step_python`` by ``_events_kernel.run``: the same events, bookings and
        decisions; a batch whose best moved before it decides is decided again here."""
        k = self.kernel
        lo, hi = self._lo, len(self.cid)
        n = hi - lo
        batch_lo = [0]
        for rows in self.batches:
            batch_lo.append(batch_lo[-1] + len(rows))
        nb = len(self.batches)
        packed = np.concatenate([p.pack if p.pack is not None else p.packed()
                                 for p in self.proto[lo:hi]]) if n else _NO_FLOATS
        fs, ist = self.fs, self.ist
        if self.early is not None:
            early_best, early_batch, early, bounds = self.early
            live_lo = np.array(bounds, dtype=np.int64)
            measure = np.asarray(early.measure, dtype=bool).astype(np.int8)
            fs[k.EARLY_BEST] = early_best
        else:
            live_lo = np.zeros(nb + 1, dtype=np.int64)
            measure = _NO_BYTES
        ist[k.STOPPED] = _STOP_CODES[self.stopped_by]
        ist[k.BEST_I] = -1
        ist[k.RESUME] = k.START
        if len(self.k_anytime) < ist[k.N_ANYTIME] + n + 1:
            self.k_anytime = _grown(self.k_anytime, 2 * (ist[k.N_ANYTIME] + n + 1))
        heap = n + nb + 1
        if not self.scratch or len(self.scratch[0]) < heap:
            size = max(64, 2 * heap)
            self.scratch = (np.empty(size), np.empty((size, 4), dtype=np.int64),
                            np.empty((4, size, 3), dtype=np.int64),
                            np.zeros((4, 2), dtype=np.int64), np.zeros(4, dtype=np.int64),
                            np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64),
                            np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64))
        args = (fs, ist, self.stages, self.cfg_f, self.cfg_i, self.cap_a, packed,
                self.k_speedup[lo:hi], self.k_noise[lo:hi], np.array(batch_lo, dtype=np.int64),
                live_lo, measure, self.out_f[lo:hi], self.out_i[lo:hi], self.k_anytime, lo,
                *self.scratch)
        again: dict = {}
        per_parent = self.config.k_per_parent
        while (b := k.run(*args)) >= 0:  # as _decide: capped, or decided again alone
            best = float(fs[k.BEST])
            if best == early_best:
                at = slice(bounds[b], bounds[b + 1])
                m = cap_per_parent(early_batch.take(at), early.measure[at], per_parent)
            else:
                batch = self._batch(self.live[b])
                d = self.policy.decide(batch, replace(self.step_state, best_speedup=best))
                m = cap_per_parent(batch, d.measure, per_parent)
                again[b] = (d.score, d.reason)
            measure[live_lo[b]:live_lo[b + 1]] = m
            ist[k.RESUME] = b
        self.now, self.usd, self.joules, self.gpu_busy, self.best = fs[:k.EARLY_BEST].tolist()
        (self.evals, self.forecasts, self.generated, self.unmeasurable, stop,
         best_i) = ist[:k.N_ANYTIME].tolist()
        self.stopped_by = _STOPS[stop]
        if best_i >= 0:
            self.best_id = self.cid[best_i]
        for b, live in enumerate(self.live if self.early is not None else ()):
            if not live:
                continue
            if b in again:
                score, reason = again[b]
            else:
                score = early.score[bounds[b]:bounds[b + 1]]
                reason = early.reason[bounds[b]:bounds[b + 1]]
            score = score.tolist()
            for j, i in enumerate(live):
                self.score[i] = score[j]
                self.reason[i] = reason[j]

    def _measured_rows(self) -> list[int]:
        """The step's measured children, in order."""
        lo = self._lo
        if self.kernel is None:
            state = self.state
            return [i for i in range(lo, len(self.cid)) if state[i] == "measured"]
        return (np.flatnonzero(self.out_i[lo:len(self.cid), self.kernel.STATE]
                               == self.kernel.MEASURED) + lo).tolist()

    def finish_step(self) -> None:
        """After the archive took the step in: the source learns it, the step is done."""
        self.source.observe_step(self.results)
        self.steps_done += 1

    def _extend(self, lo: int) -> None:
        if self.kernel is not None:
            self._extend_compiled(lo)
            return
        new = len(self.cid) - lo
        self.state.extend(["budget_stopped"] * new)
        self.outcome.extend([None] * new)
        self.action.extend([None] * new)
        self.score.extend([math.nan] * new)
        self.reason.extend([None] * new)
        self.cand_usd.extend([0.0] * new)
        self.t_start.extend([math.nan] * new)
        self.t_end.extend([math.nan] * new)
        self.measured_speedup.extend([math.nan] * new)
        self.noise_f.extend([1.0] * new if self.noise is None else self.noise.factors(
            self.seed, self.search_id, self.cid[lo:]).tolist())

    def result(self) -> SearchResult:
        n = len(self.cid)
        wall = self.now
        if self.kernel is not None:  # its arrays, as the lists of the Python loop
            k = self.kernel
            out_f, out_i = self.out_f[:n], self.out_i[:n]
            self.stage_s, self.stage_usd, self.stage_j, self.stage_imp = self.stages.tolist()
            self.state = _STATES[out_i[:, k.STATE]].tolist()
            self.outcome = _DECODED[0][out_i[:, k.OUTCOME] + 1].tolist()
            self.action = _ACTIONS[out_i[:, k.ACTION]].tolist()
            self.cand_usd = out_f[:, k.CAND_USD].tolist()
            self.t_start = out_f[:, k.T_START].tolist()
            self.t_end = out_f[:, k.T_END].tolist()
            self.measured_speedup = out_f[:, k.MEASURED_SPEEDUP].tolist()
            anytime = self.k_anytime[:self.ist[k.N_ANYTIME]].copy()
        else:
            anytime = np.array(self.anytime, dtype=float)
        stages = {s: Cost(self.stage_s[k], self.stage_usd[k], self.stage_j[k],
                          self.stage_imp[k]) for k, s in enumerate(STAGES)}
        stages["idle"] = stages["idle"] + self.model.idle(self.caps.gpus * wall - self.gpu_busy)
        table = {
            "candidate_id": self.cid, "search_id": [self.search_id] * n,
            "task_id": [self.task_id] * n, "step": self.step, "parent_index": [-1] * n,
            "state": self.state, "orphan": [False] * n, "action": self.action,
            "score": self.score, "reason": self.reason, "outcome": self.outcome,
            "speedup": self.measured_speedup, "measure_start_s": self.t_start,
            "measure_end_s": self.t_end, "usd": self.cand_usd,
            "draw_source": self.draw_source, "template": self.template,
            "parent_node": self.parent_node,
        }
        result = SearchResult(
            search_id=self.search_id, task_id=self.task_id, seed_speedup=self.seed_speedup,
            best_speedup=self.best, best_candidate_id=self.best_id, gpu_evals=self.evals,
            candidates=self.generated, forecasts=self.forecasts,
            unmeasurable=self.unmeasurable, orphans=0, reached=n - self.unreached,
            steps=self.steps_done,
            wall_s=wall, stages=stages, stopped_by=self.stopped_by,
            anytime=anytime, table=table, engine="fast",
            extra=puct_extra(self.config, self.best_id, self.cid, self.draw_source,
                             self.parent_node, self.bank.size(self.row), self.selection))
        confirm_best(result, self.cid, self.speedup, self.noise, self.seed)
        return result


class _Sharing:
    """Which searches' batches one ``decide_groups`` call may decide together: the same policy
    (class, parameters, learned state), forecasts binned alike, and the same value of every
    state field the policy reads (``Policy.state_fields``; all of them when it does not say)."""

    def __init__(self, policy: Policy, bin_edges: tuple):
        learned = tuple(sorted((k, repr(v)) for k, v in vars(policy).items()
                               if k.endswith("_")))
        self.static = (type(policy), repr(sorted(policy.get_params().items())), learned,
                       bin_edges)
        fields = policy.state_fields
        self.fields = fields if fields is not None else tuple(
            f for f in SearchState.__dataclass_fields__ if f != "best_speedup")

    def key(self, state: SearchState) -> tuple:
        return self.static + tuple(repr(getattr(state, f)) for f in self.fields)


def _decide_together(runs: list[_FastPuct]) -> None:
    """One ``decide_groups`` call per set of searches that may share it (``_Sharing``)."""
    sets: dict = {}
    for run in runs:
        got = run.pending()
        if got is None:
            run.predecided(None, None)
            continue
        sets.setdefault(run.sharing.key(run.step_state), []).append((run, *got))
    for members in sets.values():
        run0 = members[0][0]
        state = replace(run0.step_state, best_speedup=run0.best)
        if len(members) == 1:
            _, batch, group = members[0]
            run0.predecided(batch, run0.policy.decide_groups(
                batch, group, np.full(len(group), run0.best), state))
            continue
        batches = [m[1] for m in members]
        offsets = np.cumsum([0] + [int(m[2][-1]) + 1 for m in members[:-1]])
        group = np.concatenate([m[2] + off for m, off in zip(members, offsets)])
        best = np.repeat([m[0].best for m in members], [len(b) for b in batches])
        truth = None if batches[0].true_speedup is None else np.concatenate(
            [b.true_speedup for b in batches])
        together = Batch(tuple(itertools.chain.from_iterable(b.candidate_ids for b in batches)),
                         np.concatenate([b.probs for b in batches]),
                         np.concatenate([b.has_forecast for b in batches]),
                         np.concatenate([b.parse_failed for b in batches]),
                         np.concatenate([b.base_speedup for b in batches]),
                         batches[0].bin_edges, truth)
        d = run0.policy.decide_groups(together, group, best, state)
        lo = 0
        for run, batch, _ in members:
            hi = lo + len(batch)
            run.predecided(batch, Decisions(d.measure[lo:hi], d.score[lo:hi],
                                            d.reason[lo:hi]))
            lo = hi


def run_lockstep(runs: list[_FastPuct]) -> list[SearchResult]:
    """Several searches, step by step together, so that a step's decisions of all of them
    take one policy call where the policy allows (``_Sharing``); each search's result is what
    it would be alone. No cyclic garbage collection meanwhile: a step makes thousands of
    acyclic objects (children, heap rows), and each collection walked every object alive
    (the log's tables, every search's children); without them a replay of ``gfsim
    recommend``'s takes a tenth to a third less CPU time."""
    with no_cyclic_gc():
        return _run_lockstep(runs)


def _run_lockstep(runs: list[_FastPuct]) -> list[SearchResult]:
    for k, run in enumerate(runs):
        run.start()
        run.sharing = _Sharing(run.policy, run.bin_edges)
        run.row = k
    bank = make_bank(runs)
    for run in runs:
        run.bank = bank
    active = runs
    while active:
        active = [run for run in active if run.begin_step()]
        chosen = bank.select([run.row for run in active],
                             [run.config.parents_per_step for run in active])
        work = [run.draw_step(parents) for run, parents in zip(active, chosen)]
        finish_steps([w for w in work if w is not None])  # e.g. forecasts moved in one call
        for run in active:
            run.take_step()
        active = [run for run in active if run.affords_step()]
        _decide_together(active)
        for run in active:
            run.run_step()
        bank.complete([(run.row, run.parents, run.results) for run in active])
        for run in active:
            run.finish_step()
        tick(len(active))
    return [run.result() for run in runs]


def fast_search(source: ChildSource, config: SearchConfig, policy: Policy,
                model: PresetCostModel, capacities: Capacities, budget: Budget, seed: int, *,
                search_id: str, task_id: str, forecast_frame: str = "reference",
                bin_edges: tuple = (), pipeline: Pipeline = DEFAULT_PIPELINE,
                noise: MeasureNoise | None = None, selection=None) -> _FastPuct:
    """A closed-loop search for ``run_lockstep`` (arguments as ``PuctSimulation``'s)."""
    return _FastPuct(source, config, policy, model, capacities, budget, seed, search_id,
                     task_id, forecast_frame, bin_edges, pipeline, noise, selection)


def run_puct_fast(source: ChildSource, config: SearchConfig, policy: Policy,
                  model: PresetCostModel, capacities: Capacities, budget: Budget, seed: int,
                  **kwargs) -> SearchResult:
    """One closed-loop search, as ``PuctSimulation(...).run()`` computes it, without SimPy."""
    return run_lockstep([fast_search(source, config, policy, model, capacities, budget, seed,
                                     **kwargs)])[0]
