"""The simulator checked against reality: replay a live log with the live run's own capacities
and compare wall-clock and GPU-busy time, search by search (docs/concepts/design.md: within 5% and
2%).

The replay is the ``puct`` driver re-running the logged search: the logged policy, search shape,
seed and budget (from the run record), children drawn from each node's own logged expansions,
capacities as the live run had them (generator and forecaster slots, compilation on the GPU
host, one GPU), reserved billing (no cold starts: the live worker stays warm); a run whose
live forecaster forecast every candidate has the forecast stage replayed even where its policy
does not read forecasts. The live side is
what the run recorded on its step records: each step's wall-clock and the seconds its GPU was
held. Both sides cover the same steps: the steps every search completed, minus any step that a
resumed session finished (its live wall-clock is partial).
"""

from __future__ import annotations

import dataclasses
import math

from gfsim.core.errors import GfsimError

__all__ = ["fidelity", "live_cost_model", "WALL_TOLERANCE", "GPU_BUSY_TOLERANCE"]

WALL_TOLERANCE = 0.05
GPU_BUSY_TOLERANCE = 0.02
_GPU_STAGES = ("cold_start", "compilation", "check", "timing")


def _live_steps(log, search_id: str) -> dict[int, dict]:
    return {int(r["step"]): r.get("live") or {} for r in log.steps
            if r["search_id"] == search_id}


def fidelity(log) -> dict:
    """{"searches": [one comparison per live search], "total": {...}, "notes": [...]}: each
    search replayed with its own run record's configuration over the steps it completed."""
    from gfsim.replay_logs.log import ReplayLog, load_log

    if not isinstance(log, ReplayLog):
        log = load_log(log)
    live_runs = [r for r in log.runs if (r.get("configuration") or {}).get("live")]
    if not live_runs:
        raise GfsimError(f"{log.display_name}: no live run records (configuration.live); fidelity "
                         "compares a live run with its replay")
    rows, notes = [], []
    for run in live_runs:
        row, note = _compare(log, run)
        rows.append(row)
        notes += note
    tot = {k: sum(x[k] for x in rows) for k in ("live_wall_s", "replay_wall_s",
                                                 "live_gpu_busy_s", "replay_gpu_busy_s",
                                                 "gpu_evals")}
    tot["wall_error"] = tot["replay_wall_s"] / tot["live_wall_s"] - 1.0
    tot["gpu_busy_error"] = tot["replay_gpu_busy_s"] / tot["live_gpu_busy_s"] - 1.0 \
        if tot["live_gpu_busy_s"] > 0 else math.nan
    worst_wall = max(abs(x["wall_error"]) for x in rows)
    worst_busy = max((abs(x["gpu_busy_error"]) for x in rows
                      if not math.isnan(x["gpu_busy_error"])), default=0.0)
    cfg = live_runs[0]["configuration"]
    return {"log": log.name, "searches": rows, "total": tot,
            "capacities": cfg["capacities"], "policy": cfg["policy"], "search": cfg["search"],
            "within_tolerance": bool(worst_wall <= WALL_TOLERANCE
                                     and worst_busy <= GPU_BUSY_TOLERANCE),
            "worst_wall_error": worst_wall, "worst_gpu_busy_error": worst_busy,
            "tolerance": {"wall": WALL_TOLERANCE, "gpu_busy": GPU_BUSY_TOLERANCE},
            "notes": notes}


def live_cost_model(configuration: dict):
    """The cost model a live run is replayed under: reserved H200 billing (no cold starts: the
    live worker stays warm), compilation on the GPU host, and the run's own capacities
    (``configuration``: a live run record's)."""
    from gfsim.cost_models.model import Capacities
    from gfsim.cost_models.presets import load_cost_model

    caps = configuration["capacities"]
    return dataclasses.replace(
        load_cost_model("reserved-h200"), compile_on="gpu_host",
        capacities=Capacities(generator=caps["generator"], forecaster=caps["forecaster"],
                              compile_workers=caps.get("compile_workers", 1),
                              gpus=caps.get("gpus", 1)))


def _one_search(log, search_id: str):
    """A copy of ``log`` holding one search (tables filtered; the header and runs shared)."""
    import copy

    out = copy.copy(log)
    ids = set(log.candidates.loc[log.candidates["search_id"] == search_id, "candidate_id"])
    out.path = f"{log.path}#{search_id}"  # a distinct key for the trace cache
    out.runs = [r for r in log.runs if r["search_id"] == search_id]
    out.steps = [r for r in log.steps if r["search_id"] == search_id]
    for name in ("candidates", "forecasts", "decisions", "evaluations"):
        table = getattr(log, name)
        setattr(out, name, table[table["candidate_id"].isin(ids)].reset_index(drop=True))
    return out


def _compare(log, run: dict) -> tuple[dict, list[str]]:
    """Replay one live search with its own configuration; compare with what it recorded."""
    from gfsim.policies import make_policy
    from gfsim.simulator.budget import Budget
    from gfsim.simulator.closed.engine import SearchConfig
    from gfsim.simulator.replay import replay

    sid = run["search_id"]
    cfg = run["configuration"]
    live = _live_steps(log, sid)
    n_steps = 0
    while n_steps in live:
        n_steps += 1
    if n_steps == 0:
        raise GfsimError(f"{log.display_name}: search {sid} completed no step; nothing to compare")
    model = live_cost_model(cfg)
    budget = dict(cfg.get("budget") or {})
    budget["steps"] = min(budget.get("steps", math.inf), n_steps)
    one = _one_search(log, sid)
    policy = make_policy(cfg["policy"])
    if not policy.needs_forecast and (one.forecasts["mode"] != "whatif").any():
        # The live driver asked its (non-what-if) forecaster about every candidate before the
        # decision, whether or not the policy reads the answer: so must the replay (the
        # forecast stage and its slots; the decisions are the policy's as before).
        policy.needs_forecast = True
    result = replay(one, policy, model,
                    budget=Budget(**budget), seed=int(cfg["seed"]), driver="puct",
                    search=SearchConfig(**cfg["search"]), engine="des")
    (r,) = result.searches
    used = [live[k] for k in range(n_steps)]
    resumed = sum(bool(x.get("resumed")) for x in used)
    live_wall = sum(x.get("wall_s", 0.0) for x in used)
    live_busy = sum(x.get("gpu_busy_s", 0.0) for x in used)
    sim_busy = sum(r.stages[k].seconds for k in _GPU_STAGES)
    row = {
        "search_id": sid, "task_id": r.task_id, "steps": n_steps, "resumed_steps": resumed,
        "gpu_evals": r.gpu_evals, "live_wall_s": live_wall, "replay_wall_s": r.wall_s,
        "wall_error": r.wall_s / live_wall - 1.0 if live_wall > 0 else math.nan,
        "live_gpu_busy_s": live_busy, "replay_gpu_busy_s": sim_busy,
        "gpu_busy_error": sim_busy / live_busy - 1.0 if live_busy > 0 else math.nan,
        "replay_best_speedup": r.best_speedup, "fallback_draws": r.extra["draws"]["fallback"],
    }
    notes = []
    if resumed:
        notes.append(f"{sid}: {resumed} step(s) finished by a resumed session; their live "
                     "wall-clock and GPU time cover only what that session did")
    if row["fallback_draws"]:
        notes.append(f"{sid}: the replay drew {row['fallback_draws']} children from the "
                     "fallback pool: it left the logged search")
    return row, notes
