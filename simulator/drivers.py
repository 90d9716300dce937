"""Which search a closed-loop replay re-runs for each logged search.

``puct`` forces the reference search (PUCT) on every search. ``closed`` re-runs each search
with the algorithm its own run used, read from its run record (``driver``): an OpenEvolve or
ShinkaEvolve run gets the evolutionary driver (``simulator.closed.evolution``) with the settings its
run recorded (``configuration.<tool>.selection``) and the tool's documented defaults for the
rest; any other run (PUCT logs, live and synthesised searches, logs with no run record) gets
PUCT. ``evolution`` forces the evolutionary driver (OpenEvolve's rules and defaults where a
run names no tool).
"""

from __future__ import annotations

from dataclasses import replace

from gfsim.core.drivers import CLOSED_LOOP, is_closed_loop
from gfsim.simulator.closed.evolution import TOOL_DEFAULTS, EvolutionConfig

__all__ = ["CLOSED_LOOP", "is_closed_loop", "run_record", "selection_for", "chosen_driver",
           "evolution_note"]

def run_record(log, search_id: str) -> dict:
    """The run record of ``search_id`` ({} when the log has none)."""
    for run in log.runs:
        if str(run.get("search_id")) == str(search_id):
            return run
    return {}


def selection_for(log, search_id: str, driver: str) -> EvolutionConfig | None:
    """The evolutionary settings a search is re-run with under ``driver``, or None for PUCT."""
    if driver == "puct":
        return None
    run = run_record(log, search_id)
    tool = str(run.get("driver") or "")
    if tool not in TOOL_DEFAULTS:
        if driver != "evolution":
            return None
        # a log of no evolutionary tool: its first step is no initial program's evaluation
        return replace(EvolutionConfig.for_tool("openevolve"), seed_step=False)
    recorded = ((run.get("configuration") or {}).get(tool) or {}).get("selection") or {}
    values = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in recorded.items()}
    return EvolutionConfig.for_tool(tool, values)


def chosen_driver(selections) -> str:
    """The driver a closed-loop replay ran, in words for its header: ``puct``, ``evolution
    (openevolve)``, or both with counts when the searches differ."""
    names = ["puct" if s is None else f"evolution ({s.tool})" if s.strategy == s.tool
             else f"evolution ({s.tool}, {s.strategy})" for s in selections]
    kinds = dict.fromkeys(names)
    if len(kinds) == 1:
        return names[0]
    return ", ".join(f"{k} x{names.count(k)}" for k in kinds)


def evolution_note(selection: dict, searches: int, total: int) -> str:
    """The note of a replay whose parents an evolutionary archive chose: which rules, which
    settings the run recorded and which are the tool's defaults (assumed)."""
    recorded = ", ".join(selection["from_config"]) or "none"
    assumed = ", ".join(selection["defaults"]) or "none"
    return (f"evolution driver on {searches} of {total} searches: parents chosen as "
            f"{selection['tool']} does ({selection['strategy']}, {selection['islands']} "
            f"islands, migration every {selection['migration_interval']} island "
            f"generations), not by PUCT; settings from the run's configuration: {recorded}; "
            f"{selection['tool']}'s documented defaults (assumed): {assumed}")
