"""An example gfsim plug-in (docs/how-to/write-a-plugin.md): one policy, one cost model.

- ``budget-share:0.5``: measure a candidate only while the step's share of the budget left
  allows, the most promising first (by the forecast's expected bin index);
- ``spot-a100``: the ``serverless-a100`` preset with GPU-hours at a spot price (an assumed
  60% discount, not a quoted one).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gfsim.core.specs import Param
from gfsim.cost_models import PresetCostModel, load_cost_model
from gfsim.policies import Batch, Decisions, Policy, SearchState

__all__ = ["BudgetSharePolicy", "spot_a100"]


class BudgetSharePolicy(Policy):
    """Of each parent batch, measure the candidates with the highest expected bin, as many as
    ``share`` of the budget left (in measurements at the engine's estimate of one) affords."""

    name = "budget-share"
    summary = "measure the most promising candidates that a share of the budget left affords"
    params = (Param("share", float, 0.5, "the share of the USD budget left one batch may spend",
                    low=0.0, high=1.0, low_open=True),)
    needs_forecast = True
    state_fields = ("budget_left", "measure_usd")

    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        n = len(batch)
        usable = batch.usable
        score = np.where(usable, batch.probs @ np.arange(8.0), -np.inf)
        left = state.budget_left.get("usd", np.inf)
        price = state.measure_usd
        if not np.isfinite(left) or not price > 0:
            k = n  # no USD budget, or no price yet: measure every candidate
        else:
            k = int(self.share * left // price)
        order = np.argsort(-score, kind="stable")[:k]
        measure = np.zeros(n, bool)
        measure[order] = True
        reason = tuple("budget-share" if m else "over-share" for m in measure)
        return Decisions.build(measure, np.where(usable, score, np.nan), reason)


def spot_a100() -> PresetCostModel:
    """``serverless-a100`` with its GPU at 40% of the on-demand price (assumed)."""
    base = load_cost_model("serverless-a100")
    gpu = dataclasses.replace(base.gpu, usd_per_hour=0.4 * base.gpu.usd_per_hour)
    sources = {**base.sources,
               "gpu.usd_per_hour": "assumed: 40% of serverless-a100's (a spot discount)"}
    return dataclasses.replace(base, name="spot-a100", gpu=gpu, sources=sources)
