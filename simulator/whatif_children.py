"""A what-if forecaster's forecasts for the children a closed-loop replay invents.

A closed-loop replay of a log read by a what-if forecaster (``gfsim.forecasts.whatif``) draws
children the log never held (``draw_source`` fallback or model). A surrogate in that search
would read each of them, so each gets a forecast drawn by the same what-if model the log's
candidates were forecast with: from the child's invented speedup when it succeeds, else by the
forecaster's failure assumption (``failed``: its parent's speedup, or the low bins). It is
charged as any forecast: the forecasting seconds, tokens and price of the logged candidate the
child copies (the cost model's priors where the log recorded none). Children copied exactly
(own, other_expansion) keep the logged candidate's forecast; a child never generated has no
code to read and stays unforecast.

The draw is keyed by (forecaster seed, child id, replay seed): the same seed gives the same
forecasts, and another replay seed, whose children are other draws, other forecasts.
"""

from __future__ import annotations

import math

import numpy as np

from gfsim.simulator.children import INVENTED, Child, ChildSource
from gfsim.simulator.traces import SearchTrace

__all__ = ["WhatIfChildren"]

_NO_PROBS = np.zeros(8)


class WhatIfChildren(ChildSource):
    """``inner``'s children, those it invents forecast by ``forecaster`` (a
    ``WhatIfForecaster``) in the frame of ``trace``'s forecasts."""

    def __init__(self, inner: ChildSource, forecaster, trace: SearchTrace):
        self.inner, self.forecaster, self.t = inner, forecaster, trace

    def root(self) -> tuple[str, float]:
        return self.inner.root()

    def template_cache(self) -> dict | None:
        """The inner source's, under this forecaster's own key: children of one plan key
        (``Child.plan_key``, set here for every child) share their plans."""
        cache = self.inner.template_cache()
        return None if cache is None else cache.setdefault(("whatif", self.forecaster), {})

    def observe_step(self, results) -> None:
        self.inner.observe_step(results)

    def draw(self, node_id, node_speedup, expansion, n, seed) -> list[Child]:
        return self.draw_step([(node_id, node_speedup, expansion, n)], seed)[0]

    def draw_step(self, requests, seed) -> list[list[Child]]:
        requests = list(requests)
        drawn = self.inner.draw_step(requests, seed)
        for (_, node_speedup, _, _), kids in zip(requests, drawn):
            for child in kids:
                if child.draw_source in INVENTED and not child.gen_failed:
                    self._forecast(child, node_speedup, seed)
                # Plans are shared by key: a logged copy's key is its template and whether it
                # shows a forecast (its id names other children in other replays).
                child.plan_key = ("whatif", child.plan_key if child.plan_key is not None
                                  else child.template, child.has_forecast)
        return drawn

    def _forecast(self, child: Child, node_speedup: float, seed: int) -> None:
        """Draw ``child``'s forecast from its invented truth (in the trace's frame)."""
        frame = self.t.forecast_frame
        base = (node_speedup if frame == "parent" else
                self.t.seed_speedup if frame == "seed" else 1.0)
        s = child.speedup
        key = f"{child.candidate_id}\x1f{seed}"
        if child.outcome == "success" and s > 0 and math.isfinite(s):
            x = math.log2(s / base)
        else:  # failed, or copying a candidate the log never evaluated
            parent = math.log2(node_speedup / base) if node_speedup > 0 else 0.0
            x = float(self.forecaster.failure_log2([key], [parent])[0])
        probs, parse_failed = self.forecaster.distribution_one(x, key)
        child.has_forecast = True
        child.parse_failed = parse_failed
        child.probs = _NO_PROBS if probs is None else np.array(probs)
