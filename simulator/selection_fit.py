"""How hard a logged evolutionary search pressed on its best programs, read from its own choices.

The evolutionary driver (``simulator.closed.evolution``) draws parents as the run's tool does,
with the settings the run recorded or the tool's defaults. Whether those settings describe the
run is checked against the parents the log shows it chose: the log's history is walked step by step
through an ``EvolutionArchive`` that admits exactly the logged children, and at each step the
probability the archive gives the logged parent is read (``parent_distribution``). The
strategy's pressure parameter is then estimated by maximum likelihood on a grid:

- OpenEvolve: ``exploitation_ratio``, the share of parents drawn from the elite archive (the
  exploration share held at its setting; the rest fitness-weighted);
- ShinkaEvolve ``power_law``: ``exploitation_alpha``; ``weighted``: ``parent_selection_lambda``;
  beam search and hill climbing have none (their likelihood alone is reported).

Its 90% interval is the grid's values within 2.706 / 2 log-likelihood units of the best (the
likelihood-ratio test with one degree of freedom), the grid refined five times around it. Beside it:
how many logged parents the archive could not have drawn (``outside_model``: programs its rules had
dropped, e.g. by OpenEvolve's MAP-Elites cells, which it does not model) and how many PUCT would
have chosen.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from gfsim.core.rng import stream
from gfsim.simulator.closed.evolution import EvolutionArchive, EvolutionConfig
from gfsim.simulator.closed.puct import ArchiveNode, ChildResult, PuctArchive

__all__ = ["PRESSURE", "fit_selection", "logged_steps", "describe_fit"]

PRESSURE = {"openevolve": ("exploitation_ratio", None),
            "power_law": ("exploitation_alpha", tuple(np.round(np.arange(0, 4.01, 0.25), 2))),
            "weighted": ("parent_selection_lambda",
                         (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0))}
_ROOT = "__seed__"
_CHI2_90 = 2.706  # the 90% quantile of chi-square with one degree of freedom


def logged_steps(trace) -> list[tuple[list[str], list[ChildResult]]]:
    """The log's steps in order: (the parents it expanded, in order of their first child;
    the children it measured, each with its speedup or None when it failed or was never
    evaluated)."""
    by_step: dict[int, list[int]] = {}
    for i, s in enumerate(trace.step):
        by_step.setdefault(int(s), []).append(i)
    ids = trace.candidate_ids
    out = []
    for step in sorted(by_step):
        parents: list[str] = []
        children = []
        for i in by_step[step]:
            p = trace.parent[i]
            pid = _ROOT if p < 0 else ids[p]
            if pid not in parents:
                parents.append(pid)
            ok = trace.outcome[i] == "success" and trace.speedup[i] == trace.speedup[i]
            children.append(ChildResult(pid, ids[i], float(trace.speedup[i]) if ok else None))
        out.append((parents, children))
    return out


def _walk(steps, root: ArchiveNode, config: EvolutionConfig) -> tuple[float, int, int]:
    """(log-likelihood of the logged parents, choices, outside the model) under ``config``."""
    archive = EvolutionArchive(root, config, stream(0, "selection-fit"))
    ll, n, outside = 0.0, 0, 0
    for parents, children in steps:
        archive._slot_island = {}
        chosen = []
        for slot, pid in enumerate(parents):
            island = archive.next_island()
            archive._slot_island[slot] = island
            ids, p = archive.parent_distribution(island)
            prob = float(sum(q for i, q in zip(ids, p) if i == pid))
            n += 1
            if prob > 0:
                ll += math.log(prob)
            else:
                outside += 1
            node = archive._by_id.get(pid)
            chosen.append(node if node is not None else ArchiveNode(pid, 0.0, ()))
        archive.complete_step(chosen, children)
    return ll, n, outside


def _puct_agrees(steps, root: ArchiveNode) -> int:
    """How many logged parents PUCT's archive, fed the same history, would have chosen."""
    archive = PuctArchive(root, k_per_parent=10 ** 6, capacity=10 ** 6)
    agree = 0
    for parents, children in steps:
        picked = {m.node_id for m in archive.select_parents(len(parents))}
        agree += sum(pid in picked for pid in parents)
        known = [archive.get(p) for p in parents if p in archive._by_id]
        archive.complete_step(known, [c for c in children
                                      if c.parent_id in {k.node_id for k in known}])
    return agree


def _profile(steps, root, config, name: str, grid: np.ndarray):
    """The log-likelihood over ``grid``, then over a grid five times finer between the coarse
    points around the interval (a coarse grid alone puts an interval's ends, and so whether
    it holds a value between two points, off by a whole step)."""
    def ll(v):
        return _walk(steps, root, replace(config, **{name: round(float(v), 6)}))[0]

    lls = np.array([ll(v) for v in grid])
    near = np.flatnonzero(2 * (lls.max() - lls) <= 2 * _CHI2_90)
    lo, hi = grid[max(near.min() - 1, 0)], grid[min(near.max() + 1, len(grid) - 1)]
    fine = np.setdiff1d(np.round(np.linspace(lo, hi, 5 * (min(near.max() + 1, len(grid) - 1)
                                                         - max(near.min() - 1, 0)) + 1), 6),
                        np.round(grid, 6))
    both = np.concatenate([grid, fine])
    all_lls = np.concatenate([lls, [ll(v) for v in fine]])
    order = np.argsort(both, kind="stable")
    return both[order], all_lls[order]


def fit_selection(trace, config: EvolutionConfig) -> dict:
    """The log's parent choices under ``config``'s strategy: the pressure parameter's maximum
    likelihood estimate and 90% interval beside its setting, the log-likelihood of both and of
    uniform choice, and what PUCT would have chosen (see the module docstring)."""
    steps = logged_steps(trace)
    root = ArchiveNode(_ROOT, float(trace.seed_speedup), (), is_seed=True)
    name, grid = PRESSURE.get(config.strategy, (None, None))
    if config.strategy == "openevolve":
        top = 1.0 - config.exploration_ratio
        grid = tuple(np.round(np.linspace(0.0, top, 21), 4))
    ll_cfg, n, outside = _walk(steps, root, config)
    out = {"strategy": config.strategy, "choices": n, "outside_model": outside,
           "loglik_configured": ll_cfg, "puct_agrees": _puct_agrees(steps, root)}
    uniform = replace(config, strategy="openevolve", exploration_ratio=1.0,
                      exploitation_ratio=0.0)
    out["loglik_uniform_on_island"] = _walk(steps, root, uniform)[0]
    if name is None:
        return out
    grid, lls = _profile(steps, root, config, name, np.asarray(grid, dtype=float))
    best = int(np.argmax(lls))
    inside = [float(v) for v, ll in zip(grid, lls) if 2 * (lls[best] - ll) <= _CHI2_90]
    configured = float(getattr(config, name))
    out.update(parameter=name, configured=configured, estimate=float(grid[best]),
               loglik_estimate=float(lls[best]), interval_90=[min(inside), max(inside)],
               configured_consistent=min(inside) <= configured <= max(inside))
    return out


def describe_fit(search_id: str, fit: dict) -> str:
    """One line for a replay's report: the fitted pressure beside its setting."""
    head = (f"selection pressure of search {search_id} ({fit['strategy']}), from the log's "
            f"{fit['choices']} parent choices: ")
    if "parameter" in fit:
        lo, hi = fit["interval_90"]
        head += (f"{fit['parameter']} set {fit['configured']:g}, fitted {fit['estimate']:g} "
                 f"(90% [{lo:g}, {hi:g}]: the setting "
                 + ("fits" if fit["configured_consistent"] else "does NOT fit") + "); ")
    else:
        head += f"log-likelihood {fit['loglik_configured']:.2f}; "
    return (head + f"{fit['outside_model']} outside its rules; PUCT would have chosen "
            f"{fit['puct_agrees']} of them")
