"""Cost models: a stage's ``Usage`` (tokens, seconds of service) -> (seconds, USD, joules), with
sourced presets for the LLMs and GPUs (``presets``, ``catalog``) and token priors for logs that
lack them (``gen_tokens``). It imports only ``gfsim.core``: nothing of logs, the simulator or
above.
"""

from gfsim.cost_models.base import CostModel
from gfsim.cost_models.gen_tokens import parse_gen_tokens, with_gen_tokens
from gfsim.cost_models.model import figures, source_of, with_prices
from gfsim.cost_models.presets import (
    LLMS,
    PRESETS,
    SPEC_PARAMS,
    Capacities,
    PresetCostModel,
    Priors,
    load_cost_model,
    register_cost_model,
)
from gfsim.cost_models.usage import STAGES, ZERO_COST, Cost, Usage

__all__ = [
    "LLMS",
    "PRESETS",
    "SPEC_PARAMS",
    "STAGES",
    "ZERO_COST",
    "Capacities",
    "Cost",
    "CostModel",
    "PresetCostModel",
    "Priors",
    "Usage",
    "figures",
    "load_cost_model",
    "register_cost_model",
    "parse_gen_tokens",
    "source_of",
    "with_prices",
    "with_gen_tokens",
]
