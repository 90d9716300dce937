"""The SimPy discrete-event simulator: traces, the engine, budgets and results."""

from gfsim.simulator.budget import Budget, parse_budget
from gfsim.simulator.engine import CANDIDATE_STATES, SearchSimulation
from gfsim.simulator.replay import comparison_json, replay, replay_with_baseline
from gfsim.simulator.results import ReplayResult, SearchResult, geometric_mean
from gfsim.simulator.trace import SearchTrace, build_traces

__all__ = [
    "Budget",
    "CANDIDATE_STATES",
    "ReplayResult",
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
