"""Budgets that stop a search: ``--budget usd=40,seconds=3600,joules=1e7,gpu_evals=300,steps=40``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gfsim.core.errors import SpecError
from gfsim.core.specs import parse_kv

__all__ = ["Budget", "parse_budget", "unaffordable", "limits_money_or_time"]


@dataclass(frozen=True)
class Budget:
    """Limits per search; ``inf`` means unbounded.

    Semantics: a limit is never exceeded. Before a step starts, the engine prices it as if
    every candidate of it were generated, forecast and measured, at the prices the trace holds
    for each candidate (``unaffordable``); a step that does not fit in what is left is not
    started, and the search stops, saying which limit stopped it. Under reserved billing the
    step's idle GPU time is bounded by every GPU idling for the sum of the step's seconds, and
    the step's wall-clock by that sum too (an upper bound: nothing waits on nothing).
    ``gpu_evals`` is checked before each measurement, ``steps`` before each step.
    """

    usd: float = math.inf
    seconds: float = math.inf
    joules: float = math.inf
    gpu_evals: float = math.inf
    steps: float = math.inf

    def as_dict(self) -> dict[str, float | None]:
        return {f.name: (None if math.isinf(getattr(self, f.name)) else getattr(self, f.name))
                for f in fields(self)}


def parse_budget(text: str | None) -> Budget:
    if text is None or not text.strip():
        return Budget()
    valid = [f.name for f in fields(Budget)]
    values: dict[str, float] = {}
    for key, raw in parse_kv(text, "budget"):
        if key is None:
            raise SpecError(f"budget: expected key=value, got {raw!r}; keys: {', '.join(valid)}")
        if key not in valid:
            raise SpecError(f"budget: unknown key {key!r}; valid: {', '.join(valid)}")
        try:
            value = float(raw)
        except ValueError:
            raise SpecError(f"budget: {key}={raw!r} is not a number") from None
        if not value > 0 or math.isnan(value):
            raise SpecError(f"budget: {key} must be > 0, got {raw!r}")
        if key in ("gpu_evals", "steps") and value != int(value):
            raise SpecError(f"budget: {key} must be a whole number, got {raw!r}")
        values[key] = value
    return Budget(**values)


def unaffordable(budget: Budget, spent_usd: float, spent_joules: float, now_s: float,
                 step_usd: float, step_joules: float, step_s: float, model,
                 gpus: int) -> str | None:
    """The limit (``usd``, ``joules`` or ``seconds``) that a step would break, or None.

    ``step_*`` are the step's prices with every candidate run to its logged end; ``spent_*``
    and ``now_s`` are the search's so far (nothing is in flight between steps). Under reserved
    billing every GPU may idle for the whole step: ``model.idle(gpus * step_s)`` is added.
    """
    if model.billing == "reserved":
        idle = model.idle(gpus * step_s)
        step_usd, step_joules = step_usd + idle.usd, step_joules + idle.joules
    if spent_usd + step_usd > budget.usd:
        return "usd"
    if spent_joules + step_joules > budget.joules:
        return "joules"
    if now_s + step_s > budget.seconds:
        return "seconds"
    return None


def limits_money_or_time(budget: Budget) -> bool:
    """Whether a step must be priced before it starts (a usd, joules or seconds limit)."""
    return not (math.isinf(budget.usd) and math.isinf(budget.joules)
                and math.isinf(budget.seconds))
