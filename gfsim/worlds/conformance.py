"""The test every world must pass (``gfsim.worlds.protocol``): keyed determinism, record fields,
units. ``check_world`` returns the problems it found (empty: the world conforms);
``assert_world_conforms`` raises on them, for a user's own test suite.

What it checks, on a small tree (``width`` children of the root, of each of its first children,
``depth`` levels down) of every task:

- tasks: a non-empty sequence, unique ids, ``seed_speedup`` and ``reference_runtime_ns`` finite
  and > 0, ``header_entry()`` carrying them unchanged, ``task(id)`` finding each;
- the root: a success at ``seed_speedup``, no parent;
- keyed determinism: every child asked twice, in another order, and from a second world made
  with the same seed (when a factory is given), is the same node with the same records;
  distinct (parent, index) give distinct node ids;
- records: generation, forecast and evaluation records built into a log pass the log reader's
  validation (field names, types, ranges: ``gfsim validate`` on it), and a success's
  ``runtime_ns`` is the reference runtime over its speedup (units: ns and x, not ms or %);
  stage seconds are finite and >= 0; a generation failure has no forecast or evaluation.
"""

from __future__ import annotations

import math
from pathlib import Path

from gfsim.core.durable import temporary

__all__ = ["assert_world_conforms", "check_world"]

_OUTCOMES_OK = {"success", "compile_failed", "runtime_error", "incorrect", "timeout",
                "infrastructure_failure", "generation_failed"}


def _records(world, node) -> tuple:
    gen = world.generation(node)
    if "failed_reason" in gen:
        return gen, None, None
    return gen, world.forecast(node, "conformance", 0), world.evaluation(node)


def _tree(world, task_id: str, width: int, depth: int, order: int) -> dict:
    """node id -> (node, records) of a small tree, asked for in one of two orders."""
    root = world.root(task_id)
    out = {root.node_id: (root, None)}
    frontier = [root]
    for _ in range(depth):
        nxt = []
        idx = list(range(width)) if order == 0 else list(reversed(range(width)))
        for parent in frontier:
            for i in idx:
                child = world.child(parent, i)
                out[child.node_id] = (child, _records(world, child))
                if child.outcome != "generation_failed":
                    nxt.append(child)
        frontier = sorted(nxt, key=lambda n: n.node_id)[:2]
    return out


def check_world(world, factory=None, *, seed: int = 0, width: int = 4,
                depth: int = 3) -> list[str]:
    """Problems found in ``world`` (see the module docstring); [] if it conforms.
    ``factory`` (seed -> world), if given, is asked for a second world with ``seed``."""
    problems: list[str] = []
    try:
        tasks = list(world.tasks)
    except Exception as exc:  # a user's world: report, never raise
        return [f"tasks: cannot be listed ({type(exc).__name__}: {exc})"]
    if not tasks:
        return ["tasks: empty"]
    ids = [getattr(t, "task_id", None) for t in tasks]
    if len(set(ids)) != len(ids) or not all(isinstance(i, str) and i for i in ids):
        problems.append(f"tasks: task ids must be unique non-empty strings, got {ids!r:.200}")
    for t in tasks:
        tid = getattr(t, "task_id", "?")
        for name in ("seed_speedup", "reference_runtime_ns"):
            v = getattr(t, name, None)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v > 0):
                problems.append(f"task {tid}: {name} must be a finite number > 0, got {v!r}")
        try:
            entry = t.header_entry()
            for name in ("task_id", "seed_speedup", "reference_runtime_ns"):
                if entry.get(name) != getattr(t, name, None):
                    problems.append(f"task {tid}: header_entry()[{name!r}] is "
                                    f"{entry.get(name)!r}, the task says "
                                    f"{getattr(t, name, None)!r}")
        except Exception as exc:
            problems.append(f"task {tid}: header_entry() failed ({type(exc).__name__}: {exc})")
        try:
            if world.task(tid) is not t and world.task(tid).task_id != tid:
                problems.append(f"task {tid}: task(id) returns another task")
        except Exception as exc:
            problems.append(f"task {tid}: task(id) failed ({type(exc).__name__}: {exc})")
    if problems:
        return problems
    other = None
    if factory is not None:
        try:
            other = factory(seed)
        except Exception as exc:
            problems.append(f"factory({seed}) failed ({type(exc).__name__}: {exc})")
    trees = {}
    for t in tasks:
        tid = t.task_id
        try:
            root = world.root(tid)
            if root.outcome != "success" or root.parent_id is not None or not (
                    isinstance(root.speedup, (int, float))
                    and math.isclose(root.speedup, t.seed_speedup, rel_tol=1e-9)):
                problems.append(f"task {tid}: the root must be a success at seed_speedup "
                                f"{t.seed_speedup} with no parent; got outcome "
                                f"{root.outcome!r}, speedup {root.speedup!r}, parent "
                                f"{root.parent_id!r}")
            a = _tree(world, tid, width, depth, 0)
            b = _tree(world, tid, width, depth, 1)
        except Exception as exc:
            problems.append(f"task {tid}: building a tree failed ({type(exc).__name__}: {exc})")
            continue
        for nid, (node, rec) in a.items():
            if nid in b and b[nid][1] != rec:
                problems.append(f"task {tid}: node {nid} differs when asked in another order "
                                "(children must be keyed by (parent, index), not drawn in "
                                "sequence)")
                break
            if node.task_id != tid:
                problems.append(f"node {nid}: task_id {node.task_id!r}, expected {tid!r}")
                break
        again = {}
        for nid, (node, rec) in a.items():
            if rec is None:
                continue
            parent = a.get(node.parent_id, (None,))[0]
            if parent is not None:
                again[nid] = parent
        for nid, parent in list(again.items())[:8]:
            hit = [world.child(parent, i) for i in range(width)]
            if not any(h.node_id == nid for h in hit):
                problems.append(f"task {tid}: asking for {parent.node_id}'s children again did "
                                f"not give {nid} back")
                break
        kids = [world.child(world.root(tid), i) for i in range(width)]
        if len({k.node_id for k in kids}) != len(kids):
            problems.append(f"task {tid}: distinct child indices of one parent share a node id")
        if other is not None:
            try:
                c = _tree(other, tid, width, depth, 0)
                if {k: v[1] for k, v in c.items()} != {k: v[1] for k, v in a.items()}:
                    problems.append(f"task {tid}: a second world made with seed {seed} "
                                    "differs from the first")
            except Exception as exc:
                problems.append(f"task {tid}: the second world failed ({type(exc).__name__}: "
                                f"{exc})")
        for nid, (node, rec) in a.items():
            if node.outcome not in _OUTCOMES_OK:
                problems.append(f"node {nid}: unknown outcome {node.outcome!r}")
                break
            if rec is None:
                continue
            gen, fc, ev = rec
            if node.outcome == "generation_failed":
                if fc is not None or ev is not None or "failed_reason" not in gen:
                    problems.append(f"node {nid}: a generation failure has a failed_reason and "
                                    "no forecast or evaluation")
                continue
            if ev.get("outcome") != node.outcome:
                problems.append(f"node {nid}: evaluation outcome {ev.get('outcome')!r} is not "
                                f"the node's {node.outcome!r}")
            if node.outcome == "success":
                sp, rt = ev.get("speedup"), ev.get("runtime_ns")
                if not (isinstance(sp, (int, float)) and sp > 0 and sp == node.speedup):
                    problems.append(f"node {nid}: a success's evaluation speedup {sp!r} must be "
                                    f"> 0 and the node's ({node.speedup!r})")
                elif not (isinstance(rt, (int, float)) and math.isclose(
                        rt, t.reference_runtime_ns / sp, rel_tol=1e-3)):
                    problems.append(f"node {nid}: runtime_ns {rt!r} is not reference_runtime_ns "
                                    f"/ speedup = {t.reference_runtime_ns / sp:.6g} (units: ns)")
            elif node.speedup is not None:
                problems.append(f"node {nid}: a failure has speedup {node.speedup!r}; None")
            for k in ("cold_start_s", "compile_s", "check_s", "timing_s"):
                v = ev.get(k, 0.0)
                if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v < 86_400):
                    problems.append(f"node {nid}: {k} = {v!r}; seconds, finite, 0..86400")
        trees[tid] = a
    if problems:
        return problems
    problems += _validate_as_log(world, tasks, trees)
    return problems


def _validate_as_log(world, tasks, trees) -> list[str]:
    """Write the trees as a log and read it back through the validating reader."""
    from gfsim.core.errors import GfsimError
    from gfsim.forecasts.bins import PAPER_EDGES
    from gfsim.replay_logs import SCHEMA_VERSION, LogWriter, load_log

    header = {"kind": "header", "schema_version": SCHEMA_VERSION, "log_id": "conformance",
              "created_at": "2026-01-01T00:00:00Z",
              "provenance": {"kind": "synthetic", "note": "gfsim world conformance check"},
              "log_shape": "trajectory", "label_bin_convention": "reference-code",
              "forecast_bin_edges": list(PAPER_EDGES), "forecast_relative_to": "reference",
              "hardware": {"device_name": "none"},
              "tasks": [t.header_entry() for t in tasks], "duration_basis": "service"}
    records = [header]
    for t in tasks:
        sid = f"{t.task_id}-conformance"
        records.append({"kind": "run", "search_id": sid, "driver": "conformance"})
        root_id = world.root(t.task_id).node_id
        depth_of = {root_id: 0}
        seq: dict[int, int] = {}
        for nid, (node, rec) in trees[t.task_id].items():
            if rec is None:
                continue
            step = depth_of.get(node.parent_id, 0) + 1
            depth_of[nid] = step
            seq[step] = seq.get(step, -1) + 1
            gen, fc, ev = rec
            records.append({"kind": "candidate", "candidate_id": nid, "search_id": sid,
                            "task_id": t.task_id,
                            "parent_id": None if node.parent_id == root_id else node.parent_id,
                            "step": step, "seq": seq[step], "generation": gen})
            records += [r for r in (fc, ev) if r is not None]
    with temporary("gfsim-conformance-") as tmp:
        path = Path(tmp) / "world.jsonl"
        try:
            with LogWriter(path) as w:
                w.append_many(records)
            load_log(path, cache=False)
        except GfsimError as exc:
            return [f"its records do not validate as a log: {str(exc).replace(str(path), 'log')}"]
        except (TypeError, ValueError) as exc:
            return [f"its records cannot be written as a log: {type(exc).__name__}: {exc}"]
    return []


def assert_world_conforms(world_or_factory, *, seed: int = 0) -> None:
    """For a user's own tests: raise AssertionError listing every problem ``check_world``
    finds. Give the factory (seed -> world) to have determinism across instances checked too."""
    if callable(world_or_factory) and not hasattr(world_or_factory, "child"):
        factory = world_or_factory
        world = factory(seed=seed)
        problems = check_world(world, lambda s: factory(seed=s), seed=seed)
    else:
        problems = check_world(world_or_factory, seed=seed)
    if problems:
        raise AssertionError("the world does not conform:\n  " + "\n  ".join(problems))
