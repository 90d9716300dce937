"""The cost-model extension point."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from gfsim.cost_models.usage import Cost, Usage

__all__ = ["CostModel"]


class CostModel(ABC):
    """Turns a stage's ``Usage`` into a ``Cost`` (seconds, USD, joules).

    Contract, checked by tests/test_conformance.py for every registered model:
    - ``cost`` is pure and deterministic; it never does I/O.
    - zero usage costs zero; costs are non-negative and additive (linear in seconds and tokens);
    - ``cost(u).seconds == u.seconds``: the model prices time, it does not change it;
    - ``idle(s)`` prices ``s`` idle GPU-seconds: zero under serverless billing (scale to zero),
      the hourly rate under reserved billing, so that stage costs sum to the run's total;
    - ``usd_imputed <= usd``, and is all of it when ``usage.imputed``.
    """

    billing: ClassVar[str]  # "serverless" | "reserved"
    compile_on: str  # "cpu" | "gpu_host"

    @abstractmethod
    def cost(self, usage: Usage) -> Cost:
        """Price one stage's usage."""

    @abstractmethod
    def idle(self, idle_gpu_s: float) -> Cost:
        """Price GPU-seconds that were provisioned but not used."""

    def price_many(self, stage: str, seconds, input_tokens=None, output_tokens=None,
                   energy_j=None, imputed=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``cost`` for many usages of one stage at once: arrays of usd, joules, usd_imputed.

        ``energy_j`` may hold NaN where no energy was measured. The default loops over
        ``cost``; a model may vectorise it, and the conformance suite checks they agree.
        """
        seconds = np.asarray(seconds, dtype=float)
        n = len(seconds)
        zeros = np.zeros(n)
        tin = zeros if input_tokens is None else np.asarray(input_tokens, dtype=float)
        tout = zeros if output_tokens is None else np.asarray(output_tokens, dtype=float)
        energy = np.full(n, np.nan) if energy_j is None else np.asarray(energy_j, dtype=float)
        imp = np.zeros(n, bool) if imputed is None else np.asarray(imputed, dtype=bool)
        out = np.zeros((3, n))
        for i in range(n):
            e = None if np.isnan(energy[i]) else float(energy[i])
            c = self.cost(Usage(stage, float(seconds[i]), float(tin[i]), float(tout[i]), e,
                                bool(imp[i])))
            out[:, i] = (c.usd, c.joules, c.usd_imputed)
        return out[0], out[1], out[2]

    @abstractmethod
    def describe(self) -> dict:
        """Every figure the model uses, each with its source or the word 'assumption'."""
