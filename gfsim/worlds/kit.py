"""Parts that worlds other than the landscape share: a task and node type, the timing and token
assumptions a world without an LLM or a GPU of its own must make, and the log records built
from them (forecasts from a what-if forecaster of stated quality, ``gfsim.forecasts.whatif``).

Every prior here is an ASSUMPTION taken from ``LandscapeParams``' defaults (so that worlds are
priced alike) and is written into the world's provenance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream
from gfsim.forecasts.whatif import WhatIfForecaster
from gfsim.worlds.landscape import (
    GENERATION_FAILED,
    STAGES,
    STAGES_RUN,
    LandscapeParams,
)

__all__ = ["KitTask", "KitNode", "KitWorld", "Priors", "node_id_of", "whatif_of"]

_LP = LandscapeParams()


@dataclass(frozen=True)
class KitTask:
    task_id: str
    description: str
    reference_runtime_ns: float
    seed_speedup: float
    extra: dict = field(default_factory=dict)

    def header_entry(self) -> dict:
        return {"task_id": self.task_id, "description": self.description,
                "reference_runtime_ns": self.reference_runtime_ns,
                "seed_speedup": self.seed_speedup, **self.extra}


@dataclass(frozen=True, slots=True)
class KitNode:
    """A kernel of a kit world. ``log2_speedup`` is the latent (noise-free) log2 speedup over the
    reference, what a forecast is centred on; ``speedup`` the measured one of a success."""

    node_id: str
    task_id: str
    parent_id: str | None
    depth: int
    code_id: str
    state: tuple
    log2_speedup: float
    parent_log2_speedup: float | None
    outcome: str
    speedup: float | None
    stage_s: tuple = (0.0, 0.0, 0.0, 0.0)
    generation_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome != "success"


def node_id_of(task_id: str, parent_id: str, index: int) -> str:
    digest = hashlib.blake2b(f"{parent_id}/{index}".encode(), digest_size=6).hexdigest()
    return f"{task_id}-{digest}"


def whatif_of(spec: dict, seed: int) -> WhatIfForecaster:
    """A what-if forecaster from a world spec's ``forecaster`` entry (sigma, beta, temp,
    parse_fail), keyed by the world seed."""
    name = "whatif:" + ",".join(f"{k}={spec[k]:g}" for k in ("sigma", "beta", "temp",
                                                             "parse_fail") if k in spec)
    return WhatIfForecaster(name, seed=seed, **{k: float(v) for k, v in spec.items()
                                                if k in ("sigma", "beta", "temp",
                                                         "parse_fail")})


@dataclass(frozen=True)
class Priors:
    """Stage times, generation times and forecast tokens and latency of a world that has no
    LLM or GPU of its own: ASSUMPTIONS, the landscape's defaults unless a world overrides
    them (a measured world overrides the stage times with its measurements)."""

    generation_median_s: float = _LP.generation_median_s
    generation_sigma: float = _LP.generation_sigma
    cold_start_median_s: float = _LP.cold_start_median_s
    compile_median_s: float = _LP.compile_median_s
    check_median_s: float = _LP.check_median_s
    timing_median_s: float = _LP.timing_median_s
    stage_sigma: float = _LP.stage_sigma
    timeout_s: float = _LP.timeout_s
    forecast_input_tokens_median: float = _LP.forecast_input_tokens_median
    forecast_output_tokens_median: float = _LP.forecast_output_tokens_median
    forecast_tokens_sigma: float = _LP.forecast_output_tokens_sigma
    forecast_latency_median_s: float = _LP.forecast_latency_median_s

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def draw_times(self, seed: int, key: str) -> tuple[float, tuple]:
        """(generation seconds, (cold start, compile, check, timing) seconds), keyed."""
        z = stream(seed, "kit-times", key).standard_normal(5)
        gen = self.generation_median_s * math.exp(self.generation_sigma * z[0])
        medians = (self.cold_start_median_s, self.compile_median_s, self.check_median_s,
                   self.timing_median_s)
        return gen, tuple(float(m * math.exp(self.stage_sigma * zz))
                          for m, zz in zip(medians, z[1:]))

    # --- records -------------------------------------------------------------------------

    def generation(self, node: KitNode, failed_reason: str) -> dict:
        gen = {"service_s": round(node.generation_s, 3)}
        if node.outcome == GENERATION_FAILED:
            gen["failed_reason"] = failed_reason
        return gen

    def forecast(self, seed: int, node: KitNode, fc: WhatIfForecaster, forecaster: str,
                 repeat: int) -> dict:
        if node.outcome == GENERATION_FAILED:
            raise ValueError(f"{node.node_id} was never generated; there is nothing to forecast")
        # A forecaster reads code, not outcomes: a failed kernel is forecast like its parent.
        target = node.log2_speedup if not node.failed or node.parent_log2_speedup is None \
            else node.parent_log2_speedup
        probs, failed = fc.distribution_one(target, node.node_id, repeat)
        z = stream(seed, "kit-forecast", node.node_id, forecaster, int(repeat)).standard_normal(2)
        out_tok = int(round(self.forecast_output_tokens_median
                            * math.exp(self.forecast_tokens_sigma * z[0])))
        in_tok = int(round(self.forecast_input_tokens_median * math.exp(0.3 * z[1])))
        latency = self.forecast_latency_median_s * out_tok / self.forecast_output_tokens_median
        rec = {"kind": "forecast", "candidate_id": node.node_id, "forecaster": forecaster,
               "mode": "synthetic"}
        if failed:
            rec.update(probs=[0.0] * 8, raw_probability_sum=0.0, predicted_bin=None,
                       parse_failed=True)
        else:
            p = [round(x, 6) for x in probs]
            rec.update(probs=p, raw_probability_sum=round(math.fsum(p), 6),
                       predicted_bin=1 + max(range(8), key=p.__getitem__), parse_failed=False)
        rec.update(input_tokens=max(in_tok, 1), output_tokens=max(out_tok, 1),
                   latency_s=round(latency, 3), repeat=int(repeat))
        return rec

    def evaluation(self, node: KitNode, reference_runtime_ns: float) -> dict:
        if node.outcome == GENERATION_FAILED:
            raise ValueError(f"{node.node_id} was never generated; there is nothing to evaluate")
        ran = STAGES_RUN[node.outcome]
        stages = {k: (round(v, 6) if k in ran else 0.0) for k, v in zip(STAGES, node.stage_s)}
        wall = round(math.fsum(stages.values()), 6)
        if node.outcome == "timeout":
            before = stages["cold_start_s"] + stages["compile_s"] + stages["check_s"]
            stages["timing_s"] = round(max(self.timeout_s - before, 0.0), 6)
            wall = round(max(self.timeout_s, before), 6)
        rec = {"kind": "evaluation", "candidate_id": node.node_id, "outcome": node.outcome}
        if node.outcome == "success":
            rec.update(speedup=node.speedup,
                       runtime_ns=round(reference_runtime_ns / node.speedup, 6))
        rec.update(ref_runtime_ns=reference_runtime_ns, **stages, wall_s=wall, service_s=wall)
        return rec


class KitWorld:
    """What the kit worlds share: tasks by id, roots, the argument checks of ``child`` and the
    records built by ``Priors``. A subclass sets ``seed``, ``priors``, ``whatif``, ``tasks``,
    ``_roots`` (task id -> root node) and ``_failed_reason``, calls ``_index_tasks()``, and
    defines ``child`` and ``provenance``."""

    seed: int
    priors: Priors
    whatif: WhatIfForecaster
    tasks: list
    _roots: dict
    _failed_reason = "the mutator returned no kernel"

    @staticmethod
    def _check_seed(seed) -> int:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise GfsimError(f"seed must be a whole number >= 0, got {seed!r}")
        return int(seed)

    def _index_tasks(self) -> None:
        self._by_id = {t.task_id: t for t in self.tasks}

    def task(self, task_id) -> KitTask:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise KeyError(f"unknown task {task_id!r}; valid: {', '.join(self._by_id)}") from None

    def root(self, task_id) -> KitNode:
        self.task(task_id)
        return self._roots[task_id]

    @staticmethod
    def _check_child(parent: KitNode, index) -> int:
        if parent.outcome == GENERATION_FAILED:
            raise ValueError(f"{parent.node_id} was never generated; it has no children")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"a child index is a whole number >= 0, got {index!r}")
        return int(index)

    def generation(self, node: KitNode) -> dict:
        return self.priors.generation(node, self._failed_reason)

    def forecast(self, node: KitNode, forecaster: str = "synthetic", repeat: int = 0) -> dict:
        return self.priors.forecast(self.seed, node, self.whatif, forecaster, repeat)

    def evaluation(self, node: KitNode) -> dict:
        return self.priors.evaluation(node, self._by_id[node.task_id].reference_runtime_ns)
