"""The discrete-event simulator: a log's searches as traces (``traces``), one sub-package per
driver with its SimPy reference engine beside its fast engine (``trace``: the logged order;
``closed``: the closed loop, PUCT or evolutionary selection), the children a closed loop draws
(``children``, ``world_model``, ``learning``), budgets, measurement noise, and the results a
replay returns. It reads logs, cost models, forecasts and policies; it must not import
worlds, tuning, analysis, live mode or the CLI.
"""

from gfsim.simulator.budget import Budget, parse_budget
from gfsim.simulator.trace.engine import CANDIDATE_STATES, SearchSimulation
from gfsim.simulator.replay import comparison_json, replay, replay_with_baseline
from gfsim.simulator.results import ReplayResult, SearchResult, geometric_mean
from gfsim.simulator.settings import ReplaySettings
from gfsim.simulator.traces import SearchTrace, build_traces

__all__ = [
    "Budget",
    "CANDIDATE_STATES",
    "ReplayResult",
    "ReplaySettings",
    "SearchResult",
    "SearchSimulation",
    "SearchTrace",
    "build_traces",
    "comparison_json",
    "geometric_mean",
    "parse_budget",
    "replay",
    "replay_with_baseline",
]
