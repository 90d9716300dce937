"""The closed-loop fast path: the puct search replayed without SimPy, with the same answers.

``PuctSimulation`` runs each candidate as a SimPy process; most of its time goes to the event
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
random logs and configurations.

Per child the pipeline's stages are planned once (``_Plan``), and for children copied from a
logged candidate the plan is kept per candidate, so a tuning run that draws the same logged
candidates thousands of times plans each once.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import STAGES, Cost
from gfsim.policies.base import Batch, Policy, SearchState
from gfsim.simulator.budget import Budget
from gfsim.simulator.children import DRAW_SOURCES, Child, ChildSource
from gfsim.simulator.engine import segments
from gfsim.simulator.noise import MeasureNoise, confirm_best
from gfsim.simulator.pipeline import COST_STAGE, DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.puct import ArchiveNode, ChildResult, PuctArchive
from gfsim.simulator.puct_engine import EXTRAPOLATED_SHARE, SearchConfig, cap_per_parent
from gfsim.simulator.results import SearchResult

__all__ = ["run_puct_fast"]

_K = {s: k for k, s in enumerate(STAGES)}
_GEN, _FC, _COLD, _TIMING = _K["generation"], _K["forecasting"], _K["cold_start"], _K["timing"]
_ENDS_AFTER = {"compile": {"compile_failed"}, "check": {"runtime_error", "incorrect"}}
_MEASURE_STAGES = ("cold_start", "compilation", "check", "timing")
_NO_PRICE = (0.0, 0.0, 0.0)
# Callback kinds on the heap: a queued slot granted, a segment's service ended, a batch decides.
_PRE_GRANT, _PRE_END, _POST_GRANT, _POST_END, _DECIDE = range(5)


@dataclass(frozen=True)
class _Plan:
    """What one child does before and after the decision: per segment (resource, seconds it
    holds the resource, bookings as (stage index, seconds, usd, joules, usd_imputed), whether
    it is a GPU segment), and how the part ends (None: it went through)."""

    pre: tuple
    pre_ended: str | None
    post: tuple
    post_ended: str | None
    measure_usd: float  # what measuring it costs (the engine's mean_measure_usd summand)


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
            out.append((res, total, bookings, on_gpu))
        if ended:
            return tuple(out), ended
    return tuple(out), None


class _FastPuct:
    """One closed-loop search. Attribute names follow ``SearchSimulation`` where they mean
    the same thing."""

    def __init__(self, source: ChildSource, config: SearchConfig, policy: Policy,
                 model: PresetCostModel, caps: Capacities, budget: Budget, seed: int,
                 search_id: str, task_id: str, forecast_frame: str, bin_edges: tuple,
                 pipeline: Pipeline, noise: MeasureNoise | None):
        self.source, self.config, self.policy, self.model = source, config, policy, model
        self.caps, self.budget, self.seed, self.noise = caps, budget, seed, noise
        self.search_id, self.task_id = search_id, task_id
        self.forecast_frame, self.bin_edges = forecast_frame, tuple(bin_edges)
        self.before = tuple(segments(pipeline.before, model.compile_on))
        self.after = tuple(segments(pipeline.after, model.compile_on))
        self.reads = policy.needs_forecast
        self.money_limited = not (math.isinf(budget.usd) and math.isinf(budget.joules))
        self.cap = {"gen": caps.generator, "fc": caps.forecaster, "cpu": caps.compile_workers,
                    "gpu": caps.gpus}
        # Plans of children copied from a logged candidate, by that candidate, kept as long
        # as the source's data (a log's trace: every replay, seed and trial shares them).
        cache = source.template_cache()
        self.plans: dict | None = None if cache is None else cache.setdefault(
            ("fast-plans", self.before, self.after, self.reads), {})

    # -- per child ---------------------------------------------------------------------------
    def _plan(self, child: Child) -> _Plan:
        key = child.template if self.plans is not None else None
        plan = self.plans.get(key) if key is not None else None
        if plan is None:
            pre, pre_ended = _plan_part(child, self.before, self.reads)
            post, post_ended = _plan_part(child, self.after, self.reads)
            musd = 0.0
            for k in _MEASURE_STAGES:
                musd = musd + child.price.get(k, _NO_PRICE)[0]
            plan = _Plan(pre, pre_ended, post, post_ended, musd)
            if key is not None:
                self.plans[key] = plan
        return plan

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
                "joules": b.joules - joules, "gpu_evals": b.gpu_evals - self.evals}

    def _measure_usd(self) -> float:
        n = self.n_musd
        return float(np.mean(self.musd[:n])) if n else math.nan

    # -- the event loop ------------------------------------------------------------------------
    def _push(self, t: float, kind: int, i: int, s: int) -> None:
        self.eid += 1
        heapq.heappush(self.heap, (t, self.eid, kind, i, s))

    def _acquire(self, i: int, s: int, post: bool) -> None:
        seg = (self.plan[i].post if post else self.plan[i].pre)[s]
        res = seg[0]
        if self.in_use[res] < self.cap[res] and not self.waiting[res]:
            self.in_use[res] += 1
            self._push(self.now + seg[1], _POST_END if post else _PRE_END, i, s)
        else:
            self.waiting[res].append((_POST_GRANT if post else _PRE_GRANT, i, s))

    def _end_segment(self, i: int, seg) -> None:
        res, total, bookings, on_gpu = seg
        waiting = self.waiting[res]
        if waiting:  # the slot passes straight to the next in line
            kind, j, s = waiting.popleft()
            self._push(self.now, kind, j, s)
        else:
            self.in_use[res] -= 1
        for k, secs, usd, joules, imp in bookings:
            self.stage_s[k] += secs
            self.stage_usd[k] += usd
            self.stage_j[k] += joules
            self.stage_imp[k] += imp
            self.usd += usd
            self.joules += joules
            self.cand_usd[i] += usd
            if k == _FC:
                self.forecasts += 1
        if on_gpu:
            self.gpu_busy += total

    def _start_pre(self, i: int) -> None:
        if self.plan[i].pre:
            self._acquire(i, 0, False)
        else:
            self._prepared(i)

    def _prepared(self, i: int) -> None:
        """The engine's ``_prepare`` after its stages: count it, and decide once the batch
        is in."""
        self.generated += 1
        ended = self.plan[i].pre_ended
        if ended is None:
            self.ready[i] = True
        elif ended == "generation_failed" or ended == "unmeasurable":
            self.state[i] = ended
            self.unmeasurable += ended == "unmeasurable"
        else:
            self.state[i] = "failed_before_decision"
            self.outcome[i] = ended
        b = self.batch_of[i]
        self.remaining[b] -= 1
        if self.remaining[b] == 0:
            self._push(self.now, _DECIDE, b, 0)

    def _predecide(self) -> None:
        """Every batch of the step decided in one ``decide_groups`` call with the best as the
        step starts. Which children reach the decision is known from their plans, and policies
        are pure, so a batch whose best is unchanged when it decides gets exactly these
        decisions (the contract of ``decide_groups``); one that sees a new best is decided
        again, alone, as the engine decides it."""
        live = [[i for i in rows if self.plan[i].pre_ended is None] for rows in self.batches]
        self.live = live
        rows = [i for part in live for i in part]
        self.early = None
        if not rows:
            return
        sizes = [len(part) for part in live]
        batch = self._batch(rows)
        group = np.repeat(np.arange(len(sizes)), sizes)
        state = replace(self.step_state, best_speedup=self.best)
        d = self.policy.decide_groups(batch, group, np.full(len(rows), self.best), state)
        bounds = np.r_[0, np.cumsum(sizes)].tolist()
        self.early = (self.best, batch, d, bounds)

    def _decide(self, b: int) -> None:
        """The engine's ``_parent_batch`` once its batch is in: decide, cap, start measuring."""
        live = self.live[b]
        if not live:
            return
        early_best, early_batch, d, bounds = self.early
        if self.best == early_best:
            lo, hi = bounds[b], bounds[b + 1]
            batch = early_batch.take(slice(lo, hi))
            measure, score, reason = d.measure[lo:hi], d.score[lo:hi], d.reason[lo:hi]
        else:
            batch = self._batch(live)
            d = self.policy.decide(batch, replace(self.step_state, best_speedup=self.best))
            measure, score, reason = d.measure, d.score, d.reason
        measure = cap_per_parent(batch, measure, self.config.k_per_parent)
        chosen = []
        for j, i in enumerate(live):
            self.action[i] = "measure" if measure[j] else "skip"
            self.score[i] = float(score[j])
            self.reason[i] = reason[j]
            if not measure[j]:
                self.state[i] = "skipped"
            elif self._exhausted():
                pass  # stays budget_stopped
            elif self.children[i].outcome is None:
                self.state[i] = "unmeasurable"
                self.unmeasurable += 1
            else:
                self.evals += 1
                self.state[i] = "measured"
                self.t_start[i] = self.now
                chosen.append(i)
        for i in chosen:  # each a new process: SimPy starts them now, before anything else
            if self.plan[i].post:
                self._acquire(i, 0, True)
            else:
                self._measured(i)

    def _measured(self, i: int) -> None:
        """The engine's ``_measure`` after its stages."""
        child = self.children[i]
        self.t_end[i] = self.now
        self.outcome[i] = child.outcome
        if child.outcome == "success":
            s = child.speedup * self.noise_f[i]
            self.measured_speedup[i] = s
            if s > self.best:
                self.best = s
                self.best_id = child.candidate_id
        usd, joules = self._spent()
        self.anytime.append((self.now, usd, joules, self.evals, self.best))

    def _run_events(self) -> None:
        heap, pop = self.heap, heapq.heappop
        while heap:
            t, _, kind, i, s = pop(heap)
            self.now = t
            if kind == _PRE_END:
                pre = self.plan[i].pre
                self._end_segment(i, pre[s])
                if s + 1 < len(pre):
                    self._acquire(i, s + 1, False)
                else:
                    self._prepared(i)
            elif kind == _POST_END:
                post = self.plan[i].post
                self._end_segment(i, post[s])
                if s + 1 < len(post):
                    self._acquire(i, s + 1, True)
                else:
                    self._measured(i)
            elif kind == _DECIDE:
                self._decide(i)
            elif kind == _PRE_GRANT:
                self._push(t + self.plan[i].pre[s][1], _PRE_END, i, s)
            else:  # _POST_GRANT
                self._push(t + self.plan[i].post[s][1], _POST_END, i, s)

    # -- decisions -----------------------------------------------------------------------------
    def _batch(self, rows: list[int]) -> Batch:
        kids = [self.children[i] for i in rows]
        n = len(kids)
        if self.forecast_frame == "reference":
            base = np.ones(n)
        elif self.forecast_frame == "seed":
            base = np.full(n, self.seed_speedup)
        else:  # parents are archive nodes: always measured
            base = np.array([self.parent_reward[i] for i in rows])
        return Batch(
            candidate_ids=tuple(k.candidate_id for k in kids),
            probs=np.array([k.probs for k in kids], dtype=float).reshape(n, 8),
            has_forecast=np.array([k.has_forecast for k in kids], dtype=bool) if self.reads
            else np.zeros(n, bool),
            parse_failed=np.array([k.parse_failed for k in kids], dtype=bool),
            base_speedup=base, bin_edges=self.bin_edges,
            true_speedup=np.array([k.speedup for k in kids]) if self.policy.needs_truth
            else None,
        )

    # -- the search ------------------------------------------------------------------------------
    def _add(self, kids: list[Child], parent: ArchiveNode, step: int, b: int) -> list[int]:
        rows = []
        for child in kids:
            i = len(self.children)
            plan = self._plan(child)
            self.children.append(child)
            self.plan.append(plan)
            self.parent_node.append(parent.node_id)
            self.parent_reward.append(parent.reward)
            self.step.append(step)
            self.batch_of.append(b)
            if child.outcome is not None:
                if self.n_musd == len(self.musd):
                    self.musd = np.concatenate([self.musd, np.zeros(len(self.musd))])
                self.musd[self.n_musd] = plan.measure_usd
                self.n_musd += 1
            rows.append(i)
        return rows

    def run(self) -> SearchResult:
        cfg = self.config
        root_id, self.seed_speedup = self.source.root()
        archive = PuctArchive(ArchiveNode(root_id, self.seed_speedup, (), is_seed=True),
                              k_per_parent=cfg.k_per_parent, capacity=cfg.capacity,
                              c_puct=cfg.c_puct)
        n_stages = len(STAGES)
        self.stage_s, self.stage_usd = [0.0] * n_stages, [0.0] * n_stages
        self.stage_j, self.stage_imp = [0.0] * n_stages, [0.0] * n_stages
        self.usd = self.joules = self.gpu_busy = 0.0
        self.now = 0.0
        self.heap: list = []
        self.eid = 0
        self.in_use = {r: 0 for r in self.cap}
        self.waiting = {r: deque() for r in self.cap}
        self.children: list[Child] = []
        self.plan: list[_Plan] = []
        self.parent_node, self.parent_reward, self.step, self.batch_of = [], [], [], []
        self.state, self.outcome, self.action, self.score, self.reason = [], [], [], [], []
        self.ready, self.cand_usd, self.t_start, self.t_end = [], [], [], []
        self.measured_speedup, self.noise_f = [], []
        self.musd, self.n_musd = np.zeros(64), 0
        self.best, self.best_id = self.seed_speedup, None
        self.evals = self.forecasts = self.generated = self.unmeasurable = 0
        self.stopped_by = None
        self.anytime = [(0.0, 0.0, 0.0, 0, self.best)]
        expanded: dict[str, int] = {}
        true_speedup = {root_id: self.seed_speedup}
        steps_done = 0
        for step in range(cfg.steps):
            if step >= self.budget.steps and self.stopped_by is None:
                self.stopped_by = "steps"
            if self._exhausted():
                break
            parents = archive.select_parents(cfg.parents_per_step)
            self.step_state = SearchState(
                search_id=self.search_id, task_id=self.task_id, step=step,
                best_speedup=self.best, gpu_evals=self.evals, seed=self.seed,
                budget_left=self._budget_left(), measure_usd=self._measure_usd())
            lo = len(self.children)
            self.batches = []
            for b, p in enumerate(parents):
                e = expanded.get(p.node_id, 0)
                expanded[p.node_id] = e + 1
                kids = self.source.draw(p.node_id, true_speedup[p.node_id], e,
                                        cfg.children_per_parent, self.seed)
                self.batches.append(self._add(kids, p, step, b))
            self._extend(lo)
            # Every batch is admitted together at the step's start (nothing is exhausted now,
            # and nothing changes between the admissions), then each child's process starts.
            self.remaining = [len(rows) for rows in self.batches]
            self._predecide()
            for rows in self.batches:
                for i in rows:
                    self._start_pre(i)
            self._run_events()
            results = []
            for rows in self.batches:
                for i in rows:
                    if self.state[i] != "measured":
                        continue
                    child = self.children[i]
                    ok = child.outcome == "success"
                    if ok:
                        true_speedup[child.candidate_id] = child.speedup
                    results.append(ChildResult(self.parent_node[i], child.candidate_id,
                                               self.measured_speedup[i] if ok else None,
                                               child.code))
            archive.complete_step(parents, results)
            steps_done += 1
        return self._result(archive, steps_done)

    def _extend(self, lo: int) -> None:
        new = len(self.children) - lo
        self.state.extend(["budget_stopped"] * new)
        self.outcome.extend([None] * new)
        self.action.extend([None] * new)
        self.score.extend([math.nan] * new)
        self.reason.extend([None] * new)
        self.ready.extend([False] * new)
        self.cand_usd.extend([0.0] * new)
        self.t_start.extend([math.nan] * new)
        self.t_end.extend([math.nan] * new)
        self.measured_speedup.extend([math.nan] * new)
        self.noise_f.extend([1.0] * new if self.noise is None else self.noise.factors(
            self.seed, self.search_id,
            [c.candidate_id for c in self.children[lo:]]).tolist())

    def _result(self, archive: PuctArchive, steps_done: int) -> SearchResult:
        n = len(self.children)
        wall = self.now
        stages = {s: Cost(self.stage_s[k], self.stage_usd[k], self.stage_j[k],
                          self.stage_imp[k]) for k, s in enumerate(STAGES)}
        stages["idle"] = stages["idle"] + self.model.idle(self.caps.gpus * wall - self.gpu_busy)
        ids = [c.candidate_id for c in self.children]
        table = {
            "candidate_id": ids, "search_id": [self.search_id] * n,
            "task_id": [self.task_id] * n, "step": self.step, "parent_index": [-1] * n,
            "state": self.state, "orphan": [False] * n, "action": self.action,
            "score": self.score, "reason": self.reason, "outcome": self.outcome,
            "speedup": self.measured_speedup, "measure_start_s": self.t_start,
            "measure_end_s": self.t_end, "usd": self.cand_usd,
        }
        draws = {s: 0 for s in DRAW_SOURCES}
        for c in self.children:
            draws[c.draw_source] += 1
        share = draws["fallback"] / max(n, 1)
        table["draw_source"] = [c.draw_source for c in self.children]
        table["template"] = [c.template for c in self.children]
        table["parent_node"] = list(self.parent_node)
        result = SearchResult(
            search_id=self.search_id, task_id=self.task_id, seed_speedup=self.seed_speedup,
            best_speedup=self.best, best_candidate_id=self.best_id, gpu_evals=self.evals,
            candidates=self.generated, forecasts=self.forecasts,
            unmeasurable=self.unmeasurable, orphans=0, reached=n, steps=steps_done,
            wall_s=wall, stages=stages, stopped_by=self.stopped_by,
            anytime=np.array(self.anytime, dtype=float), table=table, engine="fast",
            extra={"driver": "puct", "search": self.config.as_dict(), "draws": draws,
                   "fallback_share": share, "extrapolated": share > EXTRAPOLATED_SHARE,
                   "archive_size": len(archive.nodes)})
        confirm_best(result, ids, [c.speedup for c in self.children], self.noise, self.seed)
        return result


def run_puct_fast(source: ChildSource, config: SearchConfig, policy: Policy,
                  model: PresetCostModel, capacities: Capacities, budget: Budget, seed: int, *,
                  search_id: str, task_id: str, forecast_frame: str = "reference",
                  bin_edges: tuple = (), pipeline: Pipeline = DEFAULT_PIPELINE,
                  noise: MeasureNoise | None = None) -> SearchResult:
    """One closed-loop search, as ``PuctSimulation(...).run()`` computes it, without SimPy."""
    return _FastPuct(source, config, policy, model, capacities, budget, seed, search_id,
                     task_id, forecast_frame, bin_edges, pipeline, noise).run()
