"""The SimPy engine: one search replayed by the ``trace`` driver under a policy and a cost model.

Trace driver (open loop): the logged order is kept. Per step (a barrier, as in the reference's
standard mode), each parent batch is generated and, if the policy reads forecasts, forecast;
once the whole batch is in, the policy decides; chosen candidates are compiled, checked and
timed. Resources with capacities: generator slots, forecaster slots, CPU compile workers, GPUs.
A candidate whose parent this policy never measured is an *orphan*: it is replayed anyway
(``drop_orphans=False``) or not generated at all, with its descendants (``drop_orphans=True``).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import simpy

from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import STAGES, Cost, Usage
from gfsim.policies.base import Batch, Policy, SearchState
from gfsim.simulator.budget import Budget
from gfsim.simulator.results import SearchResult
from gfsim.simulator.trace import SearchTrace

__all__ = ["SearchSimulation", "CANDIDATE_STATES"]

# What happened to each candidate in a replay.
CANDIDATE_STATES = (
    "measured",  # sent to the GPU (any outcome)
    "skipped",  # the policy chose not to measure it
    "unmeasurable",  # chosen, but the log has no ground truth (a logged surrogate deferred it)
    "generation_failed",  # the mutator returned nothing
    "orphan_dropped",  # its parent was never measured, and orphans are dropped
    "budget_stopped",  # a budget ran out before it was generated or measured
)
_GPU_STAGES_WITH_COMPILE = ("cold_start", "compilation", "check", "timing")


class SearchSimulation:
    """Replays one ``SearchTrace``. Construct, then ``run()`` once."""

    def __init__(self, trace: SearchTrace, policy: Policy, model: PresetCostModel,
                 capacities: Capacities, budget: Budget, seed: int, drop_orphans: bool = False):
        self.trace = trace
        self.policy = policy
        self.model = model
        self.capacities = capacities
        self.budget = budget
        self.seed = seed
        self.drop_orphans = drop_orphans

    # -- bookkeeping ---------------------------------------------------------------------
    def _book(self, i: int, usage: Usage) -> None:
        cost = self.model.cost(usage)
        k = self._stage_index[usage.stage]
        self._stage_totals[k] = self._stage_totals[k] + cost
        self._usd += cost.usd
        self._joules += cost.joules
        self._cand_usd[i] += cost.usd
        if usage.stage in self._gpu_stages:
            self._gpu_busy_s += usage.seconds

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
        elif now >= b.seconds:
            reason = "seconds"
        elif not (math.isinf(b.usd) and math.isinf(b.joules)):
            usd, joules = self._spent(now)
            if usd >= b.usd:
                reason = "usd"
            elif joules >= b.joules:
                reason = "joules"
        self._stopped_by = reason
        return reason

    # -- processes -------------------------------------------------------------------------
    def _is_orphan(self, i: int) -> bool:
        p = self.trace.parent[i]
        return p >= 0 and self._state[p] != "measured"

    def _prepare(self, i: int):
        t = self.trace
        env = self.env
        self._reached[i] = True
        if self._is_orphan(i):
            self._orphan[i] = True
            if self.drop_orphans:
                self._state[i] = "orphan_dropped"
                return
        if self._exhausted():
            self._state[i] = "budget_stopped"
            return
        with self._gen.request() as req:
            yield req
            yield env.timeout(t.gen_s[i])
        self._book(i, Usage("generation", t.gen_s[i], t.gen_in[i], t.gen_out[i],
                            imputed=t.gen_imputed[i]))
        self._generated += 1
        if t.gen_failed[i]:
            self._state[i] = "generation_failed"
            return
        if self.policy.needs_forecast and t.has_forecast[i]:
            with self._fc.request() as req:
                yield req
                yield env.timeout(t.fc_s[i])
            self._book(i, Usage("forecasting", t.fc_s[i], t.fc_in[i], t.fc_out[i],
                                imputed=t.fc_imputed[i]))
            self._forecasts += 1
        self._ready[i] = True

    def _base_speedup(self, i: int) -> float:
        t = self.trace
        if t.forecast_frame == "reference":
            return 1.0
        if t.forecast_frame == "seed":
            return t.seed_speedup
        # Parent-relative: the parent's measured speedup, else the nearest measured ancestor's.
        p = t.parent[i]
        while p >= 0:
            s = self._measured_speedup[p]
            if s == s:  # not NaN
                return s
            p = t.parent[p]
        return t.seed_speedup

    def _batch(self, rows: list[int]) -> Batch:
        t = self.trace
        return Batch(
            candidate_ids=tuple(t.candidate_ids[i] for i in rows),
            probs=t.probs[rows],
            has_forecast=t.has_forecast[rows] if self.policy.needs_forecast
            else np.zeros(len(rows), bool),
            parse_failed=t.parse_failed[rows],
            base_speedup=np.array([self._base_speedup(i) for i in rows]),
            bin_edges=t.bin_edges,
            true_speedup=np.array([t.speedup[i] for i in rows]) if self.policy.needs_truth
            else None,
        )

    def _parent_batch(self, step: int, rows: list[int]):
        env = self.env
        yield env.all_of([env.process(self._prepare(i)) for i in rows])
        live = [i for i in rows if self._ready[i]]
        if not live:
            return
        state = SearchState(
            search_id=self.trace.search_id, task_id=self.trace.task_id, step=step,
            best_speedup=self._best, gpu_evals=self._evals, seed=self.seed,
            budget_left=self._budget_left(),
        )
        decisions = self.policy.decide(self._batch(live), state)
        measures = []
        for j, i in enumerate(live):
            self._action[i] = "measure" if decisions.measure[j] else "skip"
            self._score[i] = float(decisions.score[j])
            self._reason[i] = decisions.reason[j]
            if decisions.measure[j]:
                measures.append(env.process(self._measure(i)))
            else:
                self._state[i] = "skipped"
        if measures:
            yield env.all_of(measures)

    def _budget_left(self) -> dict[str, float]:
        b = self.budget
        usd, joules = self._spent(self.env.now)
        return {"usd": b.usd - usd, "seconds": b.seconds - self.env.now,
                "joules": b.joules - joules, "gpu_evals": b.gpu_evals - self._evals}

    def _measure(self, i: int):
        t = self.trace
        env = self.env
        if self._exhausted():
            self._state[i] = "budget_stopped"
            return
        outcome = t.outcome[i]
        if outcome is None:
            self._state[i] = "unmeasurable"
            self._unmeasurable += 1
            return
        self._evals += 1
        self._state[i] = "measured"
        self._t_start[i] = env.now
        stage_s = {k: v[i] for k, v in t.stage_s.items()}
        energy = self._split_energy(i, stage_s)
        if self.model.compile_on == "cpu":
            with self._cpu.request() as req:
                yield req
                yield env.timeout(stage_s["compilation"])
            self._book_stage(i, "compilation", stage_s, energy)
        if not (self.model.compile_on == "cpu" and outcome == "compile_failed"):
            with self._gpus.request() as req:
                yield req
                for stage in _GPU_STAGES_WITH_COMPILE:
                    if stage == "compilation" and self.model.compile_on == "cpu":
                        continue
                    if stage_s[stage] > 0:
                        yield env.timeout(stage_s[stage])
                        self._book_stage(i, stage, stage_s, energy)
        self._t_end[i] = env.now
        if outcome == "success":
            s = t.speedup[i]
            self._measured_speedup[i] = s
            if s > self._best:
                self._best = s
                self._best_id = t.candidate_ids[i]
        usd, joules = self._spent(env.now)
        self._anytime.append((env.now, usd, joules, self._evals, self._best))

    def _split_energy(self, i: int, stage_s: dict[str, float]) -> dict[str, float | None]:
        """A measured evaluation energy is shared among its GPU stages by their seconds."""
        total = self.trace.energy_j[i]
        if total is None:
            return dict.fromkeys(stage_s)
        gpu = [k for k in stage_s if k in self._gpu_stages]
        secs = sum(stage_s[k] for k in gpu)
        return {k: (total * stage_s[k] / secs if k in gpu and secs > 0 else None) for k in stage_s}

    def _book_stage(self, i, stage, stage_s, energy):
        self._book(i, Usage(stage, stage_s[stage], energy_j=energy[stage],
                            imputed=self.trace.stage_imputed[stage][i]))

    def _driver(self):
        env = self.env
        for n_done, (step, batches) in enumerate(self.trace.steps):
            if n_done >= self.budget.steps and self._stopped_by is None:
                self._stopped_by = "steps"
            if self._exhausted():
                break
            yield env.all_of([env.process(self._parent_batch(step, b)) for b in batches])
            self._steps_done += 1

    # -- run -------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        t = self.trace
        n = len(t)
        self.env = simpy.Environment()
        caps = self.capacities
        self._gen = simpy.Resource(self.env, caps.generator)
        self._fc = simpy.Resource(self.env, caps.forecaster)
        self._cpu = simpy.Resource(self.env, caps.compile_workers)
        self._gpus = simpy.Resource(self.env, caps.gpus)
        self._gpu_stages = {"cold_start", "check", "timing"} | (
            {"compilation"} if self.model.compile_on == "gpu_host" else set())
        self._stage_index = {s: k for k, s in enumerate(STAGES)}
        self._stage_totals = [Cost() for _ in STAGES]
        self._usd = self._joules = self._gpu_busy_s = 0.0
        self._cand_usd = [0.0] * n
        self._state = ["budget_stopped"] * n
        self._reached = [False] * n
        self._ready = [False] * n
        self._orphan = [False] * n
        self._action: list[str | None] = [None] * n
        self._score = [math.nan] * n
        self._reason: list[str | None] = [None] * n
        self._t_start = [math.nan] * n
        self._t_end = [math.nan] * n
        self._measured_speedup = [math.nan] * n
        self._best = t.seed_speedup
        self._best_id = None
        self._evals = self._forecasts = self._generated = self._unmeasurable = 0
        self._steps_done = 0
        self._stopped_by: str | None = None
        self._anytime = [(0.0, 0.0, 0.0, 0, self._best)]

        self.env.process(self._driver())
        self.env.run()
        return self._result()

    def _result(self) -> SearchResult:
        t = self.trace
        wall = self.env.now
        idle = self.model.idle(self.capacities.gpus * wall - self._gpu_busy_s)
        stages = dict(zip(STAGES, self._stage_totals))
        stages["idle"] = stages["idle"] + idle
        reached = sum(self._reached)
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
            "outcome": [o if s == "measured" else None for o, s in zip(t.outcome, self._state)],
            "speedup": self._measured_speedup,
            "measure_start_s": self._t_start,
            "measure_end_s": self._t_end,
            "usd": self._cand_usd,
        }
        digest = hashlib.sha256()
        for row in zip(t.candidate_ids, self._state, self._action, self._t_end):
            digest.update(repr(row).encode())
        return SearchResult(
            search_id=t.search_id,
            task_id=t.task_id,
            seed_speedup=t.seed_speedup,
            best_speedup=self._best,
            best_candidate_id=self._best_id,
            gpu_evals=self._evals,
            candidates=self._generated,
            forecasts=self._forecasts,
            unmeasurable=self._unmeasurable,
            orphans=sum(self._orphan),
            reached=reached,
            steps=self._steps_done,
            wall_s=wall,
            stages=stages,
            stopped_by=self._stopped_by,
            anytime=self._anytime,
            table=table,
            trace_hash=digest.hexdigest(),
        )
