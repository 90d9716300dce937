"""The forecaster protocol: what every forecaster of candidates' speedups is.

A forecaster turns a candidate into a distribution over the 8 speedup bins. gfsim's own are
the what-if models (``paper:PRESET``, ``synthetic:k=v``: ``gfsim.forecasts.whatif``), the learned
surrogate (``learned``, alias ``costmodel``: ``gfsim.forecasts.learned``), the forecasts a log
already holds under a name (``LoggedForecaster``: an LLM's answers, imported ones) and the live
LLM forecasters (``vllm:URL,...``: ``gfsim.live.llm.forecaster``). Plug-ins add their own
(``gfsim.forecasts.registry``). Each is a ``Forecaster`` and offers one or both of:

- ``forecast(request)``: one candidate, from what a search knows before it measures it (its
  code, its task, its parent); what ``gfsim live``, the gates inside OpenEvolve and
  ShinkaEvolve and ``gfsim forecast`` call;
- ``attach(log)``: the log with this forecaster's forecasts of its candidates added in memory,
  under ``name``; what a replay's policy reads (``gfsim replay --forecaster``).

A forecaster that offers neither refuses with a ``ForecasterError`` that says what to do
instead. ``kind`` says what its forecasts rest on (``gfsim.forecasts.provenance``): ``llm``,
``whatif``, ``learned``, ``imported`` or a plug-in's own word.
"""

from __future__ import annotations

import threading
from abc import ABC
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gfsim.core.errors import GfsimError

__all__ = ["Forecaster", "ForecastRequest", "Forecast", "ForecasterError", "LoggedForecaster"]


class ForecasterError(GfsimError):
    """A forecaster that cannot work at all (bad labels, a server that rejects the request
    format): raised, unlike per-candidate failures, which are recorded."""


@dataclass(frozen=True)
class ForecastRequest:
    """What a forecaster is shown about one candidate."""

    candidate_id: str
    candidate_code: str
    reference_code: str
    task: str = ""  # the task's description
    hardware: dict = field(default_factory=dict)  # header hardware: device_name, ...
    # What a forecaster that learns from the search (gfsim.live.llm.learned) also reads:
    search_id: str = ""
    task_name: str = ""
    meta: dict = field(default_factory=dict)  # the candidate's source_meta (variant, params)
    parent_speedup: float | None = None  # the parent's measured speedup (the seed's: its own)


@dataclass
class Forecast:
    """One forecast, or the record of why there is none."""

    candidate_id: str
    forecaster: str
    mode: str
    probs: list[float]  # renormalised; all zero on a parse failure or an error
    raw_probability_sum: float | None = None
    predicted_bin: int | None = None
    parse_failed: bool = False
    parse_error: str | None = None
    error: str | None = None  # no answer at all: the candidate is unforecast
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    attempts: int = 0
    prompt_truncated: bool = False
    reasoning: str | None = None
    repeat: int = 0
    # Further fields a forecaster records beside the schema's (e.g. what a cost model read and
    # predicted); they never replace a schema field.
    extra: dict | None = None

    def record(self) -> dict:
        """The schema-v1 ``forecast`` record (extra fields are kept by readers)."""
        rec = {"kind": "forecast", "candidate_id": self.candidate_id,
               "forecaster": self.forecaster, "mode": self.mode,
               "probs": [float(p) for p in self.probs],
               "raw_probability_sum": self.raw_probability_sum,
               "predicted_bin": self.predicted_bin, "parse_failed": self.parse_failed,
               "input_tokens": int(self.input_tokens), "output_tokens": int(self.output_tokens),
               "latency_s": float(self.latency_s), "repeat": self.repeat,
               "attempts": self.attempts}
        for k in ("parse_error", "error", "reasoning"):
            if getattr(self, k) is not None:
                rec[k] = getattr(self, k)
        if self.prompt_truncated:
            rec["prompt_truncated"] = True
        for k, v in (self.extra or {}).items():
            rec.setdefault(k, v)
        return {k: v for k, v in rec.items() if v is not None}



class Forecaster(ABC):
    """Turns candidates into forecasts (see the module doc). ``name`` goes into every record
    its forecasts make; ``mode`` is how it answers (``logprobs``, ``tool``, ``whatif``,
    ``costmodel``, or a plug-in's word), ``kind`` what its answers rest on."""

    name: str
    mode: str
    kind: str = "unknown"
    concurrency: int = 1

    def forecast(self, request: ForecastRequest) -> Forecast:
        """The forecast of one candidate before it is measured."""
        raise ForecasterError(
            f"forecaster {self.name}: it forecasts a log's candidates (a replay), not one "
            "candidate before it is measured (a live run, a gate, gfsim forecast)")

    def attach(self, log: Any) -> Any:
        """``log`` with this forecaster's forecasts of its candidates added (in memory)."""
        raise ForecasterError(
            f"forecaster {self.name}: it forecasts one candidate at a time from its code, which "
            "a replay does not hold: write its forecasts into the log first (gfsim forecast "
            f"LOG {self.name} -o OUT), then replay OUT with `forecaster` NAME")

    def forecast_many(self, requests, on_result=None) -> list[Forecast]:
        """Forecasts in request order, ``concurrency`` at a time; ``on_result(forecast)`` is
        called (from one thread at a time) as each one completes."""
        requests = list(requests)
        lock = threading.Lock()

        def one(req):
            f = self.forecast(req)
            if on_result is not None:
                with lock:
                    on_result(f)
            return f

        if self.concurrency <= 1 or len(requests) <= 1:
            return [one(r) for r in requests]
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, requests))

    def describe(self) -> dict:
        return {"name": self.name, "mode": self.mode}

    def prepare(self) -> None:  # noqa: B027 - optional
        """One-time set-up before the first forecast (a live run calls it before its clock
        starts, so that no candidate's forecast carries it)."""

    def close(self) -> None:  # noqa: B027 - optional
        pass


class LoggedForecaster(Forecaster):
    """The forecasts a log already holds under ``name`` (an LLM's recorded answers, imported
    ones, an earlier ``gfsim forecast``'s): ``attach`` keeps them as they are."""

    mode = "logged"

    def __init__(self, name: str):
        self.name = name

    def attach(self, log: Any) -> Any:
        return log

    def __repr__(self) -> str:
        return f"LoggedForecaster({self.name!r})"
