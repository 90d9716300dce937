"""Budgets that stop a search: ``--budget usd=40,seconds=3600,joules=1e7,gpu_evals=300,steps=40``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gfsim.core.errors import SpecError
from gfsim.core.specs import parse_kv

__all__ = ["Budget", "parse_budget"]


@dataclass(frozen=True)
class Budget:
    """Limits per search; ``inf`` means unbounded.

    Semantics: once a limit is reached no new work starts (no generation, forecast or
    measurement); work already running finishes and is counted, so a run can overshoot a
    money, energy or time limit by the work that was in flight, and says which limit stopped it.
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
