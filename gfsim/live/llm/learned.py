"""The learned forecaster in a live run (``gfsim live --forecaster learned``).

The same model as ``gfsim.forecasts.learned``, trained online: the live driver tells it every
evaluation of its search as it is recorded (``observe``), and a candidate's forecast, made
before its decision, is fitted on what the search has measured until then and nothing after.
One model per search.

Features come from the candidate's ``source_meta`` (variant and parameters, which the mutator
sources write) and, where the code is exactly what the task suite renders for that variant and
those parameters (so it is gfsim's own, trusted code), from its ahead-of-time compile for the
GPU's architecture (``gfsim.live.tasks.aot.binary_features``, in this process, cached by code).
Code from anywhere else is never executed here: such a candidate is forecast from its
parameters, or from the prior alone.
"""

from __future__ import annotations

import math
import threading
import time

from gfsim.forecasts.learned import (
    LearnedModel,
    MODE,
    LearnedForecaster,
    distribution,
    encode,
    parse_learned,
)
from gfsim.live.llm.forecaster import Forecast, Forecaster, ForecastRequest

__all__ = ["LiveLearnedForecaster", "make_learned"]


def make_learned(spec: str) -> LiveLearnedForecaster:
    return LiveLearnedForecaster(parse_learned(spec))


class LiveLearnedForecaster(Forecaster):
    """The learned forecaster (``spec``) in a live run: one model per search, fitted on what
    that search has measured before each forecast."""

    mode = MODE
    kind = "learned"
    concurrency = 1

    def __init__(self, spec: LearnedForecaster = LearnedForecaster(), arch: int = 90):
        self.spec = spec
        self.name = spec.name
        self.arch = arch
        self._models: dict[str, LearnedModel] = {}
        self._features: dict[str, dict] = {}  # code -> compile features (or {})
        self._pending: dict[str, tuple[str, dict, float | None]] = {}  # cid -> (search, x, c)
        self._lock = threading.Lock()
        self.compiled = 0  # candidates whose binaries were compiled for features

    def describe(self) -> dict:
        from dataclasses import asdict

        return {"name": self.name, "mode": self.mode, "params": asdict(self.spec),
                "arch": self.arch}

    def _binary(self, request: ForecastRequest) -> dict:
        meta = request.meta or {}
        code = request.candidate_code
        if code in self._features:
            return self._features[code]
        feats: dict = {}
        try:
            from gfsim.live.tasks import get_task

            task = get_task(request.task_name)
            variant = meta.get("variant")
            trusted = (variant in task.space and task.render(
                variant, task.complete(variant, dict(meta.get("params") or {}))) == code)
        except Exception:  # noqa: BLE001 - unknown task or parameters: not the suite's code
            trusted = False
        if trusted:
            from gfsim.live.candidates import CodeCandidate
            from gfsim.live.tasks.aot import FEATURES, binary_features

            got = binary_features(CodeCandidate(request.task_name, code), arch=self.arch)
            if got.get("ok"):
                feats = {k: got[k] for k in FEATURES}
                feats["seconds"] = got["seconds"]
            self.compiled += 1
        self._features[code] = feats
        return feats

    def features(self, request: ForecastRequest) -> dict[str, float]:
        meta = dict(request.meta or {})
        meta["features"] = self._binary(request)
        p = request.parent_speedup
        return encode(meta, math.log2(p) if p and p > 0 else None)

    def forecast(self, request: ForecastRequest) -> Forecast:
        t0 = time.perf_counter()
        x = self.features(request)
        with self._lock:
            model = self._models.setdefault(request.search_id, LearnedModel(self.spec))
            centre, width, learned = model.predict([x])
            trained = len(model.y)
            self._pending[request.candidate_id] = (request.search_id, x,
                                                   float(centre[0]) if learned else None)
        p = distribution(centre, width)[0]
        f = Forecast(request.candidate_id, self.name, self.mode, [float(v) for v in p],
                     raw_probability_sum=1.0, predicted_bin=int(p.argmax()) + 1,
                     latency_s=time.perf_counter() - t0, attempts=1)
        f.reasoning = (f"log2 speedup {centre[0]:+.3f} +- {width:.3f} "
                       + (f"(trees on {trained} measured successes)" if learned else
                          "(the prior: the parent's speedup)"))
        # What it read and predicted, so that a replay's cost model can read the same compile
        # features (gfsim.forecasts.learned.prequential_records) and the log says how each
        # forecast was made.
        f.extra = {"features": dict(self._features.get(request.candidate_code) or {}),
                   "centre_log2": round(float(centre[0]), 6), "width_log2": round(width, 6),
                   "trained_on": trained, "learned": bool(learned)}
        return f

    def observe(self, request: ForecastRequest, evaluation: dict) -> None:
        """An evaluation of a candidate this forecaster was (or, on resume, would have been)
        asked about: a success trains the search's model from now on."""
        with self._lock:
            pending = self._pending.pop(request.candidate_id, None)
        if pending is None:
            pending = (request.search_id, self.features(request), None)
        sid, x, predicted = pending
        if evaluation.get("outcome") != "success" or not evaluation.get("speedup"):
            return
        y = math.log2(float(evaluation["speedup"]))
        with self._lock:
            model = self._models.setdefault(sid, LearnedModel(self.spec))
            if predicted is not None:
                model.score(predicted, y)
            model.observe(x, y)
