"""The cost-model extension point."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

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

    @abstractmethod
    def describe(self) -> dict:
        """Every figure the model uses, each with its source or the word 'assumption'."""
