"""Cost models: a stage's Usage -> (seconds, USD, joules), with sourced presets."""

from gfsim.cost_models.base import CostModel
from gfsim.cost_models.presets import (
    PRESETS,
    Capacities,
    PresetCostModel,
    Priors,
    load_cost_model,
)
from gfsim.cost_models.usage import STAGES, ZERO_COST, Cost, Usage

__all__ = [
    "PRESETS",
    "STAGES",
    "ZERO_COST",
    "Capacities",
    "Cost",
    "CostModel",
    "PresetCostModel",
    "Priors",
    "Usage",
    "load_cost_model",
]
