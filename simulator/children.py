"""Where a closed-loop search's children come from.

``LogChildren`` replays a logged search: an expansion of a node draws children *without
replacement*, in this order: the node's own logged children from the same expansion; its other
logged expansions; then a fallback pool of logged (parent, child) pairs of the same task whose
parent is in the node's speedup bin, the child's speedup carried over as the child/parent ratio.
Every draw says which (``draw_source``). ``LandscapeChildren`` asks a synthetic landscape
instead, which is what a replay is checked against.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from gfsim.core.rng import stream
from gfsim.cost_models.presets import PresetCostModel
from gfsim.forecasts.bins import speedup_to_bin
from gfsim.simulator.trace import SearchTrace

__all__ = ["Child", "ChildSource", "LogChildren", "LandscapeChildren", "DRAW_SOURCES"]

DRAW_SOURCES = ("own", "other_expansion", "fallback", "landscape")
_EVAL_STAGES = ("cold_start", "compilation", "check", "timing")


@dataclass
class Child:
    """One drawn candidate, with every field the engine reads (durations in service seconds,
    prices per cost stage as (usd, joules, usd_imputed))."""

    candidate_id: str
    draw_source: str
    template: str | None  # the logged candidate it copies, if any
    code: str | None  # identity for the archive's duplicate check
    gen_s: float
    gen_in: float
    gen_out: float
    gen_imputed: bool
    gen_failed: bool
    has_forecast: bool
    probs: np.ndarray
    parse_failed: bool
    fc_s: float
    fc_in: float
    fc_out: float
    fc_imputed: bool
    outcome: str | None
    speedup: float
    stage_s: dict[str, float]
    price: dict[str, tuple[float, float, float]] = field(default_factory=dict)


class ChildSource(ABC):
    """Draws the children of one expansion of an archive node; keyed, so the same (seed,
    node, expansion) always gives the same children."""

    @abstractmethod
    def root(self) -> tuple[str, float]:
        """The seed kernel's node id and measured speedup."""

    @abstractmethod
    def draw(self, node_id: str, node_speedup: float, expansion: int, n: int,
             seed: int) -> list[Child]:
        """``n`` children for expansion ``expansion`` of ``node_id``."""


class LogChildren(ChildSource):
    """Children of a logged search (one ``SearchTrace``)."""

    def __init__(self, trace: SearchTrace):
        self.t = trace
        self._speedup = np.asarray(trace.speedup, dtype=float)
        # Logged expansions per node: parent index (-1: the seed kernel) -> children by step.
        groups: dict[int, dict[int, list[int]]] = {}
        for i, (p, s) in enumerate(zip(trace.parent, trace.step)):
            groups.setdefault(p, {}).setdefault(s, []).append(i)
        self._expansions = {p: [g[s] for s in sorted(g)] for p, g in groups.items()}
        # Fallback pool: children whose parent (or the seed) has a measured speedup, by bin.
        self._pool: dict[int, list[int]] = {}
        self._pool_parent_speedup: dict[int, float] = {}
        for i, p in enumerate(trace.parent):
            ps = trace.seed_speedup if p < 0 else self._speedup[p]
            if not ps > 0:
                continue
            self._pool_parent_speedup[i] = float(ps)
            self._pool.setdefault(int(speedup_to_bin([ps])[0]), []).append(i)
        self._logged: dict[str, int] = {}  # replay node id -> logged index (exact draws)
        self._used: dict[str, set[int]] = {}

    def root(self) -> tuple[str, float]:
        self._logged["seed"] = -1
        return "seed", self.t.seed_speedup

    def draw(self, node_id, node_speedup, expansion, n, seed):
        used = self._used.setdefault(node_id, set())
        rng = stream(seed, self.t.task_id, node_id, expansion)
        picks: list[tuple[int, str]] = []
        j = self._logged.get(node_id)
        exps = self._expansions.get(j, []) if j is not None else []
        own = exps[expansion] if expansion < len(exps) else []
        other = [c for e, g in enumerate(exps) if e != expansion for c in g]
        for tier, source in ((own, "own"), (other, "other_expansion")):
            free = [c for c in tier if c not in used]
            for c in (free if source == "own" else rng.permutation(free).tolist()):
                if len(picks) < n:
                    picks.append((c, source))
                    used.add(c)
        if len(picks) < n:
            picks += [(c, "fallback") for c in self._fallback(node_speedup, n - len(picks),
                                                              used, rng)]
        out = []
        for slot, (c, source) in enumerate(picks):
            cid = f"{node_id}/{expansion}.{slot}"
            s = self._speedup[c]
            if source == "fallback" and s == s:
                s = node_speedup * s / self._pool_parent_speedup[c]
            else:
                self._logged[cid] = c
            out.append(self._child(c, cid, source, float(s)))
        return out

    def _fallback(self, node_speedup, n, used, rng) -> list[int]:
        """Pool entries of the node's speedup bin (the nearest non-empty bin if it has none);
        without replacement per node while they last."""
        if not self._pool:
            return []
        b = int(speedup_to_bin([node_speedup])[0])
        nearest = min(self._pool, key=lambda k: (abs(k - b), k))
        pool = self._pool.get(b) or self._pool[nearest]
        free = [c for c in pool if c not in used]
        order = rng.permutation(free).tolist()
        while len(order) < n:  # exhausted: draw again, with replacement
            order += rng.permutation(pool).tolist()
        used.update(order[:n])
        return order[:n]

    def _identity(self, c: int) -> str:
        """What the archive's duplicate-code check compares: the code's hash where the log
        records it (two logged candidates with the same code are one kernel, as the live
        search saw them), else the logged candidate."""
        sha = self.t.code_sha256[c] if self.t.code_sha256 else None
        return sha or self.t.candidate_ids[c]

    def _child(self, c: int, cid: str, source: str, speedup: float) -> Child:
        t = self.t
        return Child(
            candidate_id=cid, draw_source=source, template=t.candidate_ids[c],
            code=None if source == "fallback" else self._identity(c),
            gen_s=t.gen_s[c], gen_in=t.gen_in[c], gen_out=t.gen_out[c],
            gen_imputed=t.gen_imputed[c], gen_failed=t.gen_failed[c],
            has_forecast=bool(t.has_forecast[c]), probs=t.probs[c],
            parse_failed=bool(t.parse_failed[c]), fc_s=t.fc_s[c], fc_in=t.fc_in[c],
            fc_out=t.fc_out[c], fc_imputed=t.fc_imputed[c], outcome=t.outcome[c],
            speedup=speedup, stage_s={k: t.stage_s[k][c] for k in _EVAL_STAGES},
            price={k: tuple(float(x[c]) for x in t.price[k]) for k in t.price},
        )


class LandscapeChildren(ChildSource):
    """Children straight from a synthetic landscape (the ground truth a replay is checked
    against). Child slot k of expansion e is landscape index e * 1000 + k, so a search that
    draws more children per expansion sees the same first ones."""

    def __init__(self, landscape, task_id: str, model: PresetCostModel,
                 forecaster: str = "synthetic"):
        self.land = landscape
        self.task_id = task_id
        self.model = model
        self.forecaster = forecaster
        self.nodes = {}
        self.records: dict[str, tuple] = {}  # node id -> (generation, forecast, evaluation)

    def root(self) -> tuple[str, float]:
        node = self.land.root(self.task_id)
        self.nodes[node.node_id] = node
        return node.node_id, float(self.land.task(self.task_id).seed_speedup)

    def draw(self, node_id, node_speedup, expansion, n, seed):
        parent = self.nodes[node_id]
        return [self._child(self.land.child(parent, expansion * 1000 + k)) for k in range(n)]

    def _child(self, node) -> Child:
        from gfsim.cost_models.usage import Usage

        m, pri = self.model, self.model.priors
        gen = self.land.generation(node)
        failed = "failed_reason" in gen
        fc = ev = None
        if not failed:
            fc = self.land.forecast(node, self.forecaster, 0)
            ev = self.land.evaluation(node)
        self.nodes[node.node_id] = node
        self.records[node.node_id] = (gen, fc, ev)
        raw = np.asarray(fc["probs"], dtype=float) if fc else np.zeros(8)
        parse_failed = bool(fc and fc["parse_failed"])
        probs = raw / raw.sum() if raw.sum() > 0 else np.zeros(8)
        stage = {"cold_start": ev["cold_start_s"] if ev else 0.0,
                 "compilation": ev["compile_s"] if ev else 0.0,
                 "check": ev["check_s"] if ev else 0.0, "timing": ev["timing_s"] if ev else 0.0}
        if m.billing != "serverless":
            stage["cold_start"] = 0.0
        child = Child(
            candidate_id=node.node_id, draw_source="landscape", template=None,
            code=node.node_id, gen_s=gen["service_s"], gen_in=pri.gen_input_tokens,
            gen_out=pri.gen_output_tokens, gen_imputed=True, gen_failed=failed,
            has_forecast=fc is not None, probs=probs, parse_failed=parse_failed,
            fc_s=fc["latency_s"] if fc else 0.0, fc_in=fc["input_tokens"] if fc else 0.0,
            fc_out=fc["output_tokens"] if fc else 0.0, fc_imputed=False,
            outcome=ev["outcome"] if ev else None,
            speedup=float(ev["speedup"]) if ev and ev["outcome"] == "success" else math.nan,
            stage_s=stage,
        )
        usages = {"generation": Usage("generation", child.gen_s, child.gen_in, child.gen_out,
                                      imputed=True),
                  "forecasting": Usage("forecasting", child.fc_s, child.fc_in, child.fc_out)}
        usages.update({k: Usage(k, v) for k, v in stage.items()})
        for k, u in usages.items():
            c = m.cost(u)
            child.price[k] = (c.usd, c.joules, c.usd_imputed)
        return child
