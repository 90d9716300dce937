"""Logs of the reference PUCT search run directly on a world.

``gfsim synth --driver puct`` runs the standard search (every child measured) through the
simulator's ``puct`` driver with children drawn from a world (the synthetic landscape by
default, any ``gfsim.worlds.protocol.World`` with ``--world``), and writes what it did as an
ordinary trajectory log: so closed-loop replays have real parent/child structure, and a replay
can be checked against the world it came from.
"""

from __future__ import annotations

import hashlib

from gfsim.cost_models import Capacities, load_cost_model
from gfsim.forecasts.bins import PAPER_EDGES
from gfsim.policies import Policy, make_policy
from gfsim.simulator.budget import Budget
from gfsim.simulator.children import WorldChildren
from gfsim.simulator.closed.engine import SEARCH_PRESETS, SearchConfig
from gfsim.simulator.replay import simulate_puct
from gfsim.worlds.landscape import Landscape

__all__ = ["run_on_world", "run_on_world_many", "run_on_landscape", "puct_search_records",
           "PUCT_RULE"]

PUCT_RULE = ("the reference PUCT search (REFERENCE.md section 4) as gfsim's puct driver runs it: "
             "rank-prior scores, lineage-blocked parents, top-k admission; every child measured")
_WIDE = Capacities(generator=1024, forecaster=1024, compile_workers=1024, gpus=1024)


def run_on_world(world, task_id: str, config: SearchConfig, policy: str | Policy, *, seed: int,
                 cost: str = "serverless-a100", budget: Budget = Budget(),
                 capacities: Capacities = _WIDE, engine: str = "auto", replicate: int = 0,
                 cache: dict | None = None, keep_records: bool = True, learning=None):
    """One search with children from a world; returns (result, its child source).

    A policy given as a spec is made unfitted; one that must be fitted first (e.g.
    ``threshold:coverage=..``) is passed as a Policy already fitted (``Policy.fit``).
    ``capacities`` default to wide (nothing queues); pass the cost model's to compare with a
    replay under reserved billing, where idle GPUs are paid for. ``engine``: the fast path
    (``auto``) or the SimPy engine (``des``), which give the same result. ``replicate`` picks
    a fresh set of the world's draws (0: the draws a logged standard search saw); ``cache``:
    see ``WorldChildren``. ``learning``: a ``LearnedForecaster``: a policy that reads forecasts
    reads the cost model's, learned in this search from what it measured
    (``simulator.learning.LearningChildren``; the world's ``describe`` gives the features),
    instead of the world's what-if forecasts. The source returned is the world's.
    """
    model = load_cost_model(cost)
    source, drawn, policy = _search_parts(world, task_id, policy, model, replicate, cache,
                                          keep_records, learning)
    result = simulate_puct(drawn, config, policy, model, capacities, budget, seed,
                           engine=engine, search_id=f"{task_id}-puct", task_id=task_id,
                           bin_edges=PAPER_EDGES)
    return result, source


def _search_parts(world, task_id, policy, model, replicate, cache, keep_records, learning):
    """(the world's child source, the source the search draws from, the policy) of one
    search on ``world`` (``run_on_world``'s arguments)."""
    source = WorldChildren(world, task_id, model, replicate=replicate, cache=cache,
                           keep_records=keep_records)
    if isinstance(policy, str):
        policy = make_policy(policy)
    drawn = source
    if learning is not None and policy.needs_forecast:
        from gfsim.simulator.learning import LearningChildren, world_meta_of

        drawn = LearningChildren(source, learning, world_meta_of(source), model)
    return source, drawn, policy


def run_on_world_many(world, searches: list[tuple[str, SearchConfig, str | Policy]], *,
                      seed: int, cost: str = "serverless-a100", budget: Budget = Budget(),
                      capacities: Capacities = _WIDE, replicate: int = 0,
                      caches: dict | None = None, keep_records: bool = True,
                      learning=None) -> list:
    """``run_on_world`` for several searches ((task id, config, policy) each) with the same
    seed, replicate and budget, stepped together by the fast path (``run_lockstep``): each
    result is what ``run_on_world`` gives for that search alone, and a step's decisions of
    searches that share a policy take one call. ``caches``: task id -> that task's
    ``WorldChildren`` cache (shared by its searches: a child is keyed by its node id and slot,
    so the order in which searches draw it does not change it). Returns the results."""
    from gfsim.simulator.closed.fast import fast_search, run_lockstep

    model = load_cost_model(cost)
    caches = caches if caches is not None else {}
    runs = []
    for task_id, config, policy in searches:
        _, drawn, policy = _search_parts(world, task_id, policy, model, replicate,
                                         caches.setdefault(task_id, {}), keep_records,
                                         learning)
        runs.append(fast_search(drawn, config, policy, model, capacities, budget, seed,
                                search_id=f"{task_id}-puct", task_id=task_id,
                                bin_edges=PAPER_EDGES))
    return run_lockstep(runs)


def run_on_landscape(land: Landscape, task_id: str, config: SearchConfig, policy: str | Policy,
                     **kwargs):
    """``run_on_world`` on a landscape (the name from before worlds were pluggable)."""
    return run_on_world(land, task_id, config, policy, **kwargs)


def puct_search_records(land, task_id: str, config: SearchConfig, seed: int,
                        tick=None) -> list[dict]:
    """run, step, candidate, forecast and evaluation records of one standard search."""
    result, source = run_on_world(land, task_id, config, "all", seed=seed)
    tab = result.table
    search_id = f"{task_id}-puct"
    root_id = land.root(task_id).node_id
    reward = {root_id: land.task(task_id).seed_speedup}
    reward.update({c: s for c, s in zip(tab["candidate_id"], tab["speedup"]) if s == s})
    body: list[dict] = []
    by_step: dict[int, list[int]] = {}
    for i, s in enumerate(tab["step"]):
        by_step.setdefault(s, []).append(i)
    for step, rows in by_step.items():
        parents = [p for p in dict.fromkeys(tab["parent_node"][i] for i in rows) if p != root_id]
        body.append({"kind": "step", "search_id": search_id, "step": step,
                     "parent_ids": parents, "parent_scores": [reward[p] for p in parents]})
        for seq, i in enumerate(rows):
            cid = tab["candidate_id"][i]
            gen, fc, ev = source.records[cid]
            parent = tab["parent_node"][i]
            cand = {"kind": "candidate", "candidate_id": cid, "search_id": search_id,
                    "task_id": task_id, "parent_id": None if parent == root_id else parent,
                    "step": step, "seq": seq, "generation": gen}
            describe = getattr(land, "describe", None)
            if callable(describe):  # what the kernel is (a variant, parameters, features)
                cand["source_meta"] = describe(source.nodes[cid])
            ident = getattr(source.nodes[cid], "code_id", None)
            if ident is not None:  # the kernel's identity, so that a replay sees duplicates
                cand["code_sha256"] = hashlib.sha256(str(ident).encode()).hexdigest()
            body.append(cand)
            body += [r for r in (fc, ev) if r is not None]
            if tick is not None:
                tick(1)
    run = {"kind": "run", "search_id": search_id, "driver": "puct",
           "configuration": {**config.as_dict(), "measure": "all", "parent_rule": PUCT_RULE}}
    return [run, *body]


def paper_standard(steps: int) -> SearchConfig:
    from dataclasses import replace

    return replace(SEARCH_PRESETS["paper-standard"], steps=steps)


def world_log_records(world, *, seed: int, steps: int, log_id: str, command: str) -> list[dict]:
    """Every record of a standard-search log on any world, header first (the landscape keeps
    its own header, ``gfsim.worlds.synth``)."""
    from gfsim.replay_logs import SCHEMA_VERSION

    config = paper_standard(steps)
    body = []
    for task in world.tasks:
        body += puct_search_records(world, task.task_id, config, seed)
    prov = dict(world.provenance())
    kind = prov.pop("kind", "synthetic")
    device = prov.pop("device_name", None)
    provenance = {"kind": kind, "note": prov.pop("note", ""), "generator": "gfsim synth",
                  "command": command, "seed": seed, "world": prov,
                  "parent_selection": PUCT_RULE, "search": config.as_dict()}
    header = {
        "kind": "header", "schema_version": SCHEMA_VERSION, "log_id": log_id,
        "created_at": "2026-01-01T00:00:00Z", "provenance": provenance,
        "log_shape": "trajectory",
        # How a score bins the measured speedups: the reference code's convention unless the
        # world says otherwise (a measured world scores in the paper's bins, those its
        # forecasts are given in).
        "label_bin_convention": getattr(world, "label_bin_convention", "reference-code"),
        "forecast_bin_edges": list(PAPER_EDGES), "forecast_relative_to": "reference",
        "hardware": {"device_name": device or "none (a world: nothing was run for this log)"},
        "tasks": [t.header_entry() for t in world.tasks],
        "duration_basis": "service",
        "generator": {"model": "none (a world's keyed draws)"},
    }
    return [header, *body]
