"""Budgets that stop a search: ``--budget usd=40,seconds=3600,joules=1e7,gpu_evals=300,gpu_hours=2,
steps=40``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gfsim.core.errors import SpecError
from gfsim.core.specs import parse_kv

__all__ = ["Budget", "HOUR_S", "parse_budget", "unaffordable", "limits_money_or_time",
           "stop_reason", "stop_note"]

HOUR_S = 3600.0  # seconds in a GPU-hour (``gpu_hours``)


@dataclass(frozen=True)
class Budget:
    """Limits per search; ``inf`` means unbounded.

    Semantics: a limit is never exceeded. Before a step starts, the engine prices it as if
    every candidate of it were generated, forecast and measured, at the prices the trace holds
    for each candidate (``unaffordable``); a step that does not fit in what is left is not
    started, and the search stops, saying which limit stopped it. Under reserved billing the
    step's idle GPU time is bounded by every GPU idling for the sum of the step's seconds, and
    the step's wall-clock by that sum too (an upper bound: nothing waits on nothing).
    ``gpu_evals`` and ``gpu_hours`` (the GPU time of the evaluations finished so far: cold
    starts, checks and timings) are checked before each measurement, so no evaluation starts
    once either is spent and those in flight finish; ``steps`` is checked before each step.
    """

    usd: float = math.inf
    seconds: float = math.inf
    joules: float = math.inf
    gpu_evals: float = math.inf
    gpu_hours: float = math.inf
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


_LIMIT_WORDS = {
    "usd": "the USD budget: the next step could not be afforded",
    "joules": "the energy budget: the next step could not be afforded",
    "seconds": "the wall-clock budget: the next step could not be afforded",
    "gpu_evals": "the gpu_evals budget: no GPU evaluation left",
    "gpu_hours": "the gpu_hours budget: the GPU time was spent",
    "steps": "the steps budget",
}


def stop_reason(result) -> dict:
    """Why one search (a ``SearchResult``) ended: ``{"code", "text"}``. Codes: ``budget:KEY``
    (a limit stopped it), ``out_of_children`` (a closed-loop search whose steps drew fewer
    children than asked: its source held no more), ``steps_done`` (every step it was asked
    for, or every logged step, ran)."""
    if result.stopped_by:
        return {"code": f"budget:{result.stopped_by}",
                "text": f"stopped after {result.steps} step{'' if result.steps == 1 else 's'} "
                        f"by {_LIMIT_WORDS[result.stopped_by]}"}
    search = result.extra.get("search")
    if not search:
        return {"code": "steps_done", "text": f"all {result.steps} logged steps replayed"}
    per_parent = search["samples_per_parent"] * search["overgen"]
    drawn = [0] * result.steps
    parents: list[set] = [set() for _ in range(result.steps)]
    for step, parent in zip(result.table["step"], result.table.get("parent_node", ())):
        if 0 <= step < result.steps:
            drawn[step] += 1
            parents[step].add(parent)
    # A step is short where it drew nothing, or fewer than its parents asked for.
    short = sum(n == 0 or n < per_parent * len(p) for n, p in zip(drawn, parents))
    if short:
        empty = sum(n == 0 for n in drawn)
        return {"code": "out_of_children",
                "text": f"out of children: {short} of its {result.steps} steps drew fewer "
                        f"children than asked ({per_parent} per parent; {empty} steps drew "
                        f"none, {result.gpu_evals} GPU evaluations in all): the log holds no "
                        "more children of the parents the search chose"}
    return {"code": "steps_done", "text": f"all {result.steps} steps done"}


def stop_note(results, reasons=None) -> str | None:
    """One line on why the searches of a replay stopped, where any ended other than by running
    every step with every child it asked for (None otherwise). ``reasons``: their
    ``stop_reason``s where already known."""
    reasons = [stop_reason(r) for r in results] if reasons is None else reasons
    if all(r["code"] == "steps_done" for r in reasons):
        return None
    if len(reasons) == 1:
        return f"why the search stopped: {reasons[0]['text']}"
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r["code"]] = counts.get(r["code"], 0) + 1
    words = {"out_of_children": "out of children", "steps_done": "every step done",
             **{f"budget:{k}": _LIMIT_WORDS[k].split(":")[0] for k in _LIMIT_WORDS}}
    parts = ", ".join(f"{n} by {words[code]}" if code.startswith("budget") else
                      f"{n} {words[code]}" for code, n in counts.items())
    return (f"why the {len(reasons)} searches stopped: {parts} (per search: "
            "searches[].stop_reason in --json)")
