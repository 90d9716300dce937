"""What a stage used (``Usage``) and what it cost (``Cost``).

Every stage of the pipeline books a Usage; a cost model turns it into seconds, USD and joules.
Units are in the names: seconds, USD, joules, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STAGES", "GPU_STAGES", "Usage", "Cost", "ZERO_COST"]

# The order in which stages are reported; "idle" is the reserved GPUs' unused wall-clock.
STAGES = ("generation", "forecasting", "cold_start", "compilation", "check", "timing", "idle")
GPU_STAGES = ("cold_start", "check", "timing")  # compilation too when it runs on the GPU host


@dataclass(frozen=True, slots=True)
class Usage:
    """One stage's consumption for one candidate.

    ``seconds`` is service time on the stage's resource (not queueing). ``energy_j`` is a
    measured energy when the log has one, else None and the model estimates it. ``imputed``
    marks usage that came from a prior (a token count or stage time the log did not record).
    """

    stage: str
    seconds: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    energy_j: float | None = None
    imputed: bool = False

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r}; valid: {', '.join(STAGES)}")


@dataclass(frozen=True, slots=True)
class Cost:
    """Seconds of resource time, USD and joules; ``usd_imputed`` is the part of ``usd`` that rests
    on imputed usage. Costs add."""

    seconds: float = 0.0
    usd: float = 0.0
    joules: float = 0.0
    usd_imputed: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.seconds + other.seconds,
            self.usd + other.usd,
            self.joules + other.joules,
            self.usd_imputed + other.usd_imputed,
        )

    def as_dict(self) -> dict[str, float]:
        return {"s": self.seconds, "usd": self.usd, "joules": self.joules}


ZERO_COST = Cost()
