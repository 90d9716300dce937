"""The SimPy engine: one search replayed by the ``trace`` driver under a policy and a cost model.

Trace driver (open loop): the logged order is kept. Per step (a barrier, as in the reference's
standard mode), each parent batch runs the pipeline's pre-decision stages for every candidate
(by default: generate, then forecast if the policy reads forecasts); once the whole batch is in,
the policy decides; chosen candidates run the post-decision stages (by default compile, check,
time). Resources with capacities: generator slots, forecaster slots, CPU compile workers, GPUs.
Consecutive stages on one resource share one acquisition; under serverless billing every GPU
acquisition starts a fresh container and pays its cold start. Costs are booked when a resource
is released.

A candidate whose parent this policy never measured is an *orphan*: it is replayed anyway
(``drop_orphans=False``) or not generated at all, with its descendants (``drop_orphans=True``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import simpy

from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import STAGES, Cost
from gfsim.policies.base import Batch, Policy, SearchState
from gfsim.simulator.budget import HOUR_S, Budget, limits_money_or_time, unaffordable
from gfsim.simulator.noise import MeasureNoise, confirm_best
from gfsim.simulator.pipeline import COST_STAGE, DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.progress import tick
from gfsim.simulator.results import SearchResult
from gfsim.simulator.slots import Countdown, Slots
from gfsim.simulator.traces import SearchTrace, ancestor_speedup

__all__ = ["SearchSimulation", "CANDIDATE_STATES", "segments"]

# What happened to each candidate in a replay.
CANDIDATE_STATES = (
    "measured",  # the policy chose it and its measurement ran (any outcome)
    "skipped",  # the policy chose not to measure it
    "failed_before_decision",  # a pre-decision stage (e.g. an early compile) failed
    "unmeasurable",  # needed ground truth the log does not have (a logged surrogate deferred it)
    "generation_failed",  # the mutator returned nothing
    "orphan_dropped",  # its parent was never measured, and orphans are dropped
    "budget_stopped",  # a budget ran out before it was generated or measured
)
# Outcomes that end a candidate after a stage.
_ENDS_AFTER = {"compile": {"compile_failed"}, "check": {"runtime_error", "incorrect"}}
_K = {s: k for k, s in enumerate(STAGES)}
_K_GENERATION, _K_FORECASTING, _K_COLD_START = _K["generation"], _K["forecasting"], _K["cold_start"]
_K_TIMING = _K["timing"]


def _as_list(values) -> list:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def segments(stages: tuple[str, ...], compile_on: str) -> list[tuple[str, tuple[str, ...]]]:
    """Group consecutive stages that hold the same resource: [(resource, stages), ...]."""
    resource = {"generate": "gen", "forecast": "fc", "check": "gpu", "time": "gpu",
                "compile": "gpu" if compile_on == "gpu_host" else "cpu"}
    out: list[tuple[str, list[str]]] = []
    for s in stages:
        if out and out[-1][0] == resource[s]:
            out[-1][1].append(s)
        else:
            out.append((resource[s], [s]))
    return [(r, tuple(ss)) for r, ss in out]


class SearchSimulation:
    """Replays one ``SearchTrace``. Construct, then ``run()`` once."""

    def __init__(self, trace: SearchTrace, policy: Policy, model: PresetCostModel,
                 capacities: Capacities, budget: Budget, seed: int, drop_orphans: bool = False,
                 pipeline: Pipeline = DEFAULT_PIPELINE, noise: MeasureNoise | None = None):
        self.trace = trace
        self.noise = noise
        self.policy = policy
        self.model = model
        self.capacities = capacities
        self.budget = budget
        self.seed = seed
        self.drop_orphans = drop_orphans
        self.pipeline = pipeline

    # -- bookkeeping ---------------------------------------------------------------------
    def _book(self, i: int, k: int, seconds: float) -> None:
        """Book stage ``k`` (index into STAGES) of candidate i, priced in advance."""
        usd = self._p_usd[k][i]
        joules = self._p_j[k][i]
        self._stage_s[k] += seconds
        self._stage_usd[k] += usd
        self._stage_j[k] += joules
        self._stage_imp[k] += self._p_imp[k][i]
        self._usd += usd
        self._joules += joules
        self._cand_usd[i] += usd

    def _spent(self, now: float) -> tuple[float, float]:
        usd, joules = self._usd, self._joules
        if self.model.billing == "reserved":
            idle = self.model.idle(self.capacities.gpus * now - self._gpu_busy_s)
            usd, joules = usd + idle.usd, joules + idle.joules
        return usd, joules

    def _exhausted(self) -> str | None:
        if self._stopped_by is not None:
            return self._stopped_by
        b = self.budget
        now = self.env.now
        reason = None
        if self._evals >= b.gpu_evals:
            reason = "gpu_evals"
        elif self._gpu_busy_s >= b.gpu_hours * HOUR_S:
            reason = "gpu_hours"
        elif now >= b.seconds:
            reason = "seconds"
        elif self._money_limited:
            usd, joules = self._spent(now)
            if usd >= b.usd:
                reason = "usd"
            elif joules >= b.joules:
                reason = "joules"
        self._stopped_by = reason
        return reason

    def _step_price(self, rows) -> tuple[float, float, float]:
        """USD, joules and seconds of candidates ``rows`` if each were generated, forecast and
        measured to its logged end (cold starts included): an upper bound of a step's cost."""
        usd = joules = secs = 0.0
        for i in rows:
            u = j = s = 0.0
            for segs in (self._before, self._after):
                ended = None
                for res_name, stages in segs:
                    plan, ended = self._plan(i, stages)
                    if plan and res_name == "gpu" and self._cold_start[i] > 0:
                        plan.insert(0, (_K_COLD_START, self._cold_start[i]))
                    for k, v in plan:
                        u += self._p_usd[k][i]
                        j += self._p_j[k][i]
                        s += v
                    if ended:
                        break
                if ended:
                    break
            usd, joules, secs = usd + u, joules + j, secs + s
        return usd, joules, secs

    def _cannot_afford(self, rows) -> bool:
        """Whether the step of candidates ``rows`` would break a usd, joules or seconds limit;
        if so the search stops before it, saying which (``budget.unaffordable``)."""
        if not self._prices_steps:
            return False
        usd, joules = self._spent(self.env.now)
        reason = unaffordable(self.budget, usd, joules, self.env.now, *self._step_price(rows),
                              self.model, self.capacities.gpus)
        if reason is not None and self._stopped_by is None:
            self._stopped_by = reason
        return reason is not None

    # -- stages ----------------------------------------------------------------------------
    def _plan(self, i: int, stages: tuple[str, ...]) -> tuple[list[tuple[int, float]], str | None]:
        """The (stage index, seconds) that run for candidate i, and why it ends early, if so."""
        t = self.trace
        plan: list[tuple[int, float]] = []
        for s in stages:
            if s == "generate":
                plan.append((_K_GENERATION, t.gen_s[i]))
                if t.gen_failed[i]:
                    return plan, "generation_failed"
            elif s == "forecast":
                if self._reads_forecasts and t.has_forecast[i]:
                    plan.append((_K_FORECASTING, t.fc_s[i]))
            else:
                outcome = t.outcome[i]
                if outcome is None:
                    return plan, "unmeasurable"
                k = _K[COST_STAGE[s]]
                plan.append((k, self._secs[k][i]))
                if outcome in _ENDS_AFTER.get(s, ()) and not (
                        s == "check" and self._secs[_K_TIMING][i] > 0):
                    return plan, outcome  # (a failure found after timing: timing ran)
        return plan, None

    def _run(self, i: int, segs):
        """Run candidate i through segments; returns why it ended early (or None)."""
        env = self.env
        for res_name, stages in segs:
            plan, ended = self._plan(i, stages)
            if plan:
                res = self._resources[res_name]
                on_gpu = res_name == "gpu"
                if on_gpu and self._cold_start[i] > 0:
                    plan.insert(0, (_K_COLD_START, self._cold_start[i]))
                total = 0.0
                for _, secs in plan:
                    total += secs
                wait = res.acquire()
                if wait is not None:
                    yield wait
                yield env.timeout(total)
                res.release()
                for k, secs in plan:
                    self._book(i, k, secs)
                    if k == _K_FORECASTING:
                        self._forecasts += 1
                if on_gpu:
                    self._gpu_busy_s += total
            if ended:
                return ended
        return None

    def _admit(self, i: int) -> bool:
        """Whether candidate i is generated: not a dropped orphan, and budget left."""
        self._reached[i] = True
        p = self.trace.parent[i]
        if p >= 0 and self._state[p] != "measured":
            self._orphan[i] = True
            if self.drop_orphans:
                self._state[i] = "orphan_dropped"
                return False
        return not self._exhausted()  # else it stays budget_stopped

    def _prepare(self, i: int, joined: Countdown):
        ended = yield from self._run(i, self._before)
        self._generated += 1
        if ended is None:
            self._ready[i] = True
        elif ended == "generation_failed" or ended == "unmeasurable":
            self._state[i] = ended
            self._unmeasurable += ended == "unmeasurable"
        else:
            self._state[i] = "failed_before_decision"
            self._outcome[i] = ended
        joined.done()

    def _start_measuring(self, i: int) -> bool:
        """Whether candidate i's measurement starts now (budget left, ground truth logged)."""
        if self._exhausted():
            return False  # stays budget_stopped
        if self.trace.outcome[i] is None:
            self._state[i] = "unmeasurable"
            self._unmeasurable += 1
            return False
        self._evals += 1
        self._state[i] = "measured"
        self._t_start[i] = self.env.now
        return True

    def _measure(self, i: int, joined: Countdown):
        t = self.trace
        yield from self._run(i, self._after)
        self._t_end[i] = self.env.now
        self._outcome[i] = t.outcome[i]
        if t.outcome[i] == "success":
            s = t.speedup[i] * self._noise[i]
            self._measured_speedup[i] = s
            if s > self._best:
                self._best = s
                self._best_id = t.candidate_ids[i]
        usd, joules = self._spent(self.env.now)
        self._anytime.append((self.env.now, usd, joules, self._evals, self._best))
        joined.done()

    # -- decisions -------------------------------------------------------------------------
    def _base_speedup(self, i: int) -> float:
        t = self.trace
        if t.forecast_frame == "reference":
            return 1.0
        if t.forecast_frame == "seed":
            return t.seed_speedup
        return self._parent_speedup(i)

    def _parent_speedup(self, i: int) -> float:
        """For parent-relative forecasts: the parent's measured speedup, else the nearest
        measured ancestor's, else the seed kernel's."""
        t = self.trace
        return ancestor_speedup(t.parent, i, self._measured_speedup, t.seed_speedup)

    def _batch(self, rows: list[int]) -> Batch:
        t = self.trace
        reads = self.policy.needs_forecast
        return Batch(
            candidate_ids=tuple(t.candidate_ids[i] for i in rows),
            probs=t.probs[rows],
            has_forecast=t.has_forecast[rows] if reads else np.zeros(len(rows), bool),
            parse_failed=t.parse_failed[rows],
            base_speedup=np.array([self._base_speedup(i) for i in rows]),
            bin_edges=t.bin_edges,
            true_speedup=np.array([t.speedup[i] for i in rows]) if self.policy.needs_truth
            else None,
        )

    def _cap(self, batch: Batch, decisions) -> np.ndarray:
        """Which of the policy's choices are measured; the trace driver takes them all."""
        return decisions.measure

    def _budget_left(self) -> dict[str, float]:
        b = self.budget
        usd, joules = self._spent(self.env.now)
        return {"usd": b.usd - usd, "seconds": b.seconds - self.env.now,
                "joules": b.joules - joules, "gpu_evals": b.gpu_evals - self._evals,
                "gpu_hours": b.gpu_hours - self._gpu_busy_s / HOUR_S}

    def _parent_batch(self, step: int, rows: list[int]):
        env = self.env
        admitted = [i for i in rows if self._admit(i)]
        if admitted:
            joined = Countdown(env, len(admitted))
            for i in admitted:
                env.process(self._prepare(i, joined))
            yield joined.event
        live = [i for i in admitted if self._ready[i]]
        if not live:
            return
        # Only the best speedup is live; counts and budget are as of the step's start, so that
        # batches deciding at the same instant see the same state in any event order.
        state = replace(self._step_state, best_speedup=self._best)
        batch = self._batch(live)
        decisions = self.policy.decide(batch, state)
        measure = self._cap(batch, decisions)
        chosen = []
        for j, i in enumerate(live):
            self._action[i] = "measure" if measure[j] else "skip"
            self._score[i] = float(decisions.score[j])
            self._reason[i] = decisions.reason[j]
            if not measure[j]:
                self._state[i] = "skipped"
            elif self._start_measuring(i):
                chosen.append(i)
        if chosen:
            joined = Countdown(env, len(chosen))
            for i in chosen:
                env.process(self._measure(i, joined))
            yield joined.event

    def _driver(self):
        env = self.env
        for n_done, (step, batches) in enumerate(self.trace.steps):
            if n_done >= self.budget.steps and self._stopped_by is None:
                self._stopped_by = "steps"
            if self._exhausted() or self._cannot_afford([i for b in batches for i in b]):
                break
            self._step_state = SearchState(
                search_id=self.trace.search_id, task_id=self.trace.task_id, step=step,
                best_speedup=self._best, gpu_evals=self._evals, seed=self.seed,
                budget_left=self._budget_left(), measure_usd=self.trace.measure_usd,
            )
            yield env.all_of([env.process(self._parent_batch(step, b)) for b in batches])
            self._steps_done += 1
            tick()

    # -- run -------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        self._setup()
        self._extend(len(self.trace))
        self.env.process(self._driver())
        self.env.run()
        result = self._result()
        confirm_best(result, self.trace.candidate_ids, self.trace.speedup, self.noise, self.seed)
        return result

    def _setup(self) -> None:
        """The environment, resources and run-wide accumulators."""
        t = self.trace
        self.env = simpy.Environment()
        caps = self.capacities
        self._resources = {
            "gen": Slots(self.env, caps.generator),
            "fc": Slots(self.env, caps.forecaster),
            "cpu": Slots(self.env, caps.compile_workers),
            "gpu": Slots(self.env, caps.gpus),
        }
        self._before = segments(self.pipeline.before, self.model.compile_on)
        self._after = segments(self.pipeline.after, self.model.compile_on)
        self._reads_forecasts = self.policy.needs_forecast
        self._money_limited = not (math.isinf(self.budget.usd) and math.isinf(self.budget.joules))
        self._prices_steps = limits_money_or_time(self.budget)
        self._stage_s = [0.0] * len(STAGES)
        self._stage_usd = [0.0] * len(STAGES)
        self._stage_j = [0.0] * len(STAGES)
        self._stage_imp = [0.0] * len(STAGES)
        self._usd = self._joules = self._gpu_busy_s = 0.0
        # Per stage index: prices and seconds as lists (scalar access to lists is fastest).
        self._p_usd: list[list[float]] = [[] for _ in STAGES]
        self._p_j: list[list[float]] = [[] for _ in STAGES]
        self._p_imp: list[list[float]] = [[] for _ in STAGES]
        self._secs: list[list[float]] = [[] for _ in STAGES]
        self._cold_start = self._secs[_K_COLD_START]
        for name in ("_cand_usd", "_state", "_outcome", "_reached", "_ready", "_orphan",
                     "_action", "_score", "_reason", "_t_start", "_t_end", "_measured_speedup",
                     "_noise"):
            setattr(self, name, [])
        self._best = t.seed_speedup
        self._best_id = None
        self._evals = self._forecasts = self._generated = self._unmeasurable = 0
        self._steps_done = 0
        self._stopped_by: str | None = None
        self._anytime = [(0.0, 0.0, 0.0, 0, self._best)]

    def _extend(self, n: int) -> None:
        """Make room for the trace's candidates from index len(self._state) to n."""
        t = self.trace
        lo = len(self._state)
        new = n - lo
        if new <= 0:
            return
        for k, s in enumerate(STAGES):
            if s in t.price:
                for lst, values in zip((self._p_usd[k], self._p_j[k], self._p_imp[k]),
                                       t.price[s]):
                    lst.extend(_as_list(values[lo:n]))
            else:
                for lst in (self._p_usd[k], self._p_j[k], self._p_imp[k]):
                    lst.extend([0.0] * new)
            self._secs[k].extend(t.stage_s[s][lo:n] if s in t.stage_s else [0.0] * new)
        self._cand_usd.extend([0.0] * new)
        self._state.extend(["budget_stopped"] * new)
        self._outcome.extend([None] * new)
        self._reached.extend([False] * new)
        self._ready.extend([False] * new)
        self._orphan.extend([False] * new)
        self._action.extend([None] * new)
        self._score.extend([math.nan] * new)
        self._reason.extend([None] * new)
        self._t_start.extend([math.nan] * new)
        self._t_end.extend([math.nan] * new)
        self._measured_speedup.extend([math.nan] * new)
        self._noise.extend([1.0] * new if self.noise is None else self.noise.factors(
            self.seed, t.search_id, t.candidate_ids[lo:n]).tolist())

    def _result(self) -> SearchResult:
        t = self.trace
        wall = self.env.now
        stages = {s: Cost(self._stage_s[k], self._stage_usd[k], self._stage_j[k],
                          self._stage_imp[k]) for k, s in enumerate(STAGES)}
        stages["idle"] = stages["idle"] + self.model.idle(
            self.capacities.gpus * wall - self._gpu_busy_s)
        table = {
            "candidate_id": t.candidate_ids,
            "search_id": [t.search_id] * len(t),
            "task_id": [t.task_id] * len(t),
            "step": t.step,
            "parent_index": t.parent,
            "state": self._state,
            "orphan": self._orphan,
            "action": self._action,
            "score": self._score,
            "reason": self._reason,
            "outcome": self._outcome,
            "speedup": self._measured_speedup,
            "measure_start_s": self._t_start,
            "measure_end_s": self._t_end,
            "usd": self._cand_usd,
        }
        return SearchResult(
            search_id=t.search_id, task_id=t.task_id, seed_speedup=t.seed_speedup,
            best_speedup=self._best, best_candidate_id=self._best_id, gpu_evals=self._evals,
            candidates=self._generated, forecasts=self._forecasts,
            unmeasurable=self._unmeasurable, orphans=sum(self._orphan),
            reached=sum(self._reached), steps=self._steps_done, wall_s=wall, stages=stages,
            stopped_by=self._stopped_by, anytime=np.array(self._anytime, dtype=float), table=table,
        )
