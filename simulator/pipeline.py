"""The order of a candidate's stages (``--pipeline``), e.g. ``generate,compile,forecast,decide,
check,time``: a cheap CPU compile before the forecast, so that candidates that do not compile
are never forecast or timed.

Stages before ``decide`` run for every generated candidate; stages after it only for the ones
the policy measures. Rules: ``generate`` comes first; ``compile`` < ``check`` < ``time``;
``forecast`` < ``decide`` < ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gfsim.core.errors import SpecError

__all__ = ["Pipeline", "DEFAULT_PIPELINE", "parse_pipeline", "PIPELINE_STAGES"]

PIPELINE_STAGES = ("generate", "forecast", "decide", "compile", "check", "time")
# Which cost stage each pipeline stage books.
COST_STAGE = {"generate": "generation", "forecast": "forecasting", "compile": "compilation",
              "check": "check", "time": "timing"}


@dataclass(frozen=True)
class Pipeline:
    before: tuple[str, ...]  # stages run for every candidate, in order (generate first)
    after: tuple[str, ...]  # stages run for measured candidates, in order

    @property
    def order(self) -> tuple[str, ...]:
        return (*self.before, "decide", *self.after)

    def __str__(self) -> str:
        return ",".join(self.order)


def parse_pipeline(text: str | None) -> Pipeline:
    if not text:
        return DEFAULT_PIPELINE
    order = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in order if s not in PIPELINE_STAGES]
    if unknown:
        raise SpecError(f"pipeline: unknown stage {unknown[0]!r}; valid: "
                        f"{', '.join(PIPELINE_STAGES)}")
    if sorted(order) != sorted(PIPELINE_STAGES):
        missing = [s for s in PIPELINE_STAGES if s not in order]
        twice = sorted({s for s in order if order.count(s) > 1})
        what = f"missing {', '.join(missing)}" if missing else f"repeats {', '.join(twice)}"
        raise SpecError(f"pipeline: {what}; it needs each of {', '.join(PIPELINE_STAGES)} once")
    pos = {s: i for i, s in enumerate(order)}
    rules = [("generate", "forecast"), ("generate", "compile"), ("generate", "decide"),
             ("compile", "check"), ("check", "time"), ("forecast", "decide"), ("decide", "time")]
    for a, b in rules:
        if pos[a] > pos[b]:
            raise SpecError(f"pipeline: {a} must come before {b} (got {text!r})")
    d = pos["decide"]
    return Pipeline(tuple(order[:d]), tuple(order[d + 1:]))


DEFAULT_PIPELINE = Pipeline(("generate", "forecast"), ("compile", "check", "time"))
