"""The ``puct`` driver: the reference search (docs/concepts/paper.md) re-run in the simulator.

Each step selects parents from the archive (``simulator.closed.puct``), draws spp x F children per
parent from a ``ChildSource``, runs each parent's batch through the same pipeline as the trace
driver (generate, forecast if the policy reads forecasts, decide, compile, check, time; the
per-parent barrier of the filtered search), measures at most k per parent, waits for the whole
step (the standard search's barrier), and updates the archive with what was measured. Children
are named by their place in the tree (``parent/expansion.slot``), so two policies with the same
seed meet the same children wherever their searches agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.policies.base import Policy, SearchState
from gfsim.simulator.budget import Budget
from gfsim.simulator.children import DRAW_SOURCES, INVENTED, Child, ChildSource
from gfsim.simulator.trace.engine import SearchSimulation
from gfsim.simulator.noise import MeasureNoise
from gfsim.simulator.pipeline import DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.progress import tick
from gfsim.simulator.closed.evolution import make_archive
from gfsim.simulator.closed.puct import ArchiveNode, ChildResult
from gfsim.simulator.results import SearchResult

__all__ = ["SearchConfig", "SEARCH_PRESETS", "PuctSimulation", "EXTRAPOLATED_SHARE",
           "cap_per_parent", "best_lineage", "puct_extra"]

EXTRAPOLATED_SHARE = 0.25  # a replay with more fallback draws than this is labelled extrapolated
_EVAL = ("cold_start", "compilation", "check", "timing")


@dataclass(frozen=True)
class SearchConfig:
    """A PUCT search's shape. Children per parent = samples_per_parent x overgen; at most
    k_per_parent of them are measured and admitted."""

    steps: int = 40
    parents_per_step: int = 2
    samples_per_parent: int = 4
    overgen: int = 1
    k_per_parent: int = 4
    capacity: int = 1000
    c_puct: float = 1.0

    def __post_init__(self):
        for name in ("steps", "parents_per_step", "samples_per_parent", "overgen",
                     "k_per_parent", "capacity"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GfsimError(f"search: {name} must be a whole number >= 1, got {v!r}")

    @property
    def children_per_parent(self) -> int:
        return self.samples_per_parent * self.overgen

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("steps", "parents_per_step", "samples_per_parent",
                                              "overgen", "k_per_parent", "capacity", "c_puct")}


SEARCH_PRESETS = {
    # 40 steps x 2 parents x 4 mutations, all measured: <= 316 GPU evaluations.
    "paper-standard": SearchConfig(samples_per_parent=4, overgen=1, k_per_parent=4),
    # 4x the mutations, each forecast, the top 4 per parent measured: the same <= 316.
    "paper-filtered": SearchConfig(samples_per_parent=4, overgen=4, k_per_parent=4),
}


_MEASURE_STAGES = ("cold_start", "compilation", "check", "timing")


def best_lineage(best_id: str | None, candidate_ids, draw_source, parent_node) -> dict:
    """What a closed-loop search's best rests on: the draw source of the best child (``seed``
    when nothing beat the seed kernel), the number of drawn nodes from the seed down to it
    (``length``) and how many of them were invented (``INVENTED``: children the log never
    held). A best with none invented is a kernel the log measured, reached through kernels it
    measured."""
    if best_id is None:
        return {"source": "seed", "length": 0, "invented": 0}
    where = {cid: i for i, cid in enumerate(candidate_ids)}
    length = invented = 0
    node = best_id
    while node in where:  # up to the root, which is no drawn child
        i = where[node]
        length += 1
        invented += draw_source[i] in INVENTED
        node = parent_node[i]
    return {"source": draw_source[where[best_id]], "length": length, "invented": invented}


def puct_extra(config: SearchConfig, best_id, candidate_ids, draw_source, parent_node,
               archive_size: int, selection=None) -> dict:
    """``SearchResult.extra`` of a closed-loop search (both engines): its shape, where its
    children came from, and what its best rests on; ``driver`` is ``evolution`` (with its
    ``selection`` settings) where an evolutionary archive chose the parents."""
    draws = {s: 0 for s in DRAW_SOURCES}
    for source in draw_source:
        draws[source] += 1
    n = max(len(draw_source), 1)
    invented = sum(draws[s] for s in INVENTED) / n
    chosen = {} if selection is None else {"selection": selection.as_dict()}
    return {"driver": "puct" if selection is None else "evolution", **chosen,
            "search": config.as_dict(), "draws": draws,
            "fallback_share": draws["fallback"] / n, "invented_share": invented,
            "extrapolated": invented > EXTRAPOLATED_SHARE, "archive_size": archive_size,
            "best_lineage": best_lineage(best_id, candidate_ids, draw_source, parent_node)}


def cap_per_parent(batch, measure, k: int) -> np.ndarray:
    """At most k of one parent's batch: the policy's choices by expected bin index (the
    reference's ranking), unforecast ones last, ties by request order."""
    measure = np.asarray(measure, dtype=bool)
    if np.count_nonzero(measure) <= k:
        return measure
    rank = np.where(batch.usable, batch.probs @ np.arange(1, 9), -np.inf)
    order = np.argsort(-rank, kind="stable")
    capped = np.zeros(len(measure), bool)
    capped[order[measure[order]][:k]] = True
    return capped


class _GrowingTrace:
    """The per-candidate columns the engine reads, growing as children are drawn."""

    def __init__(self, search_id, task_id, seed_speedup, forecast_frame, bin_edges):
        self.search_id, self.task_id, self.seed_speedup = search_id, task_id, seed_speedup
        self.forecast_frame, self.bin_edges = forecast_frame, bin_edges
        self.children: list[Child] = []
        self.parent_node: list[str] = []
        self.parent_reward: list[float] = []
        for name in ("candidate_ids", "step", "parent", "gen_s", "gen_in", "gen_out",
                     "gen_imputed", "gen_failed", "fc_s", "fc_in", "fc_out", "fc_imputed",
                     "outcome", "speedup"):
            setattr(self, name, [])
        self.stage_s = {k: [] for k in _EVAL}
        self.stage_imputed = {k: [] for k in _EVAL}
        self.price: dict[str, tuple[list, list, list]] = {}
        self._probs = np.zeros((64, 8))
        self._flags = np.zeros((64, 2), bool)  # has_forecast, parse_failed

    def __len__(self) -> int:
        return len(self.candidate_ids)

    @property
    def probs(self) -> np.ndarray:
        return self._probs[: len(self)]

    @property
    def has_forecast(self) -> np.ndarray:
        return self._flags[: len(self), 0]

    @property
    def parse_failed(self) -> np.ndarray:
        return self._flags[: len(self), 1]

    def append(self, child: Child, step: int, parent: ArchiveNode) -> int:
        i = len(self)
        if i == len(self._probs):
            self._probs = np.vstack([self._probs, np.zeros_like(self._probs)])
            self._flags = np.vstack([self._flags, np.zeros_like(self._flags)])
        self._probs[i] = child.probs
        self._flags[i] = (child.has_forecast, child.parse_failed)
        self.children.append(child)
        self.parent_node.append(parent.node_id)
        self.parent_reward.append(parent.reward)
        self.candidate_ids.append(child.candidate_id)
        self.step.append(step)
        self.parent.append(-1)  # parents are archive nodes: measured by construction
        for name in ("gen_s", "gen_in", "gen_out", "gen_imputed", "gen_failed", "fc_s", "fc_in",
                     "fc_out", "fc_imputed", "outcome", "speedup"):
            getattr(self, name).append(getattr(child, name))
        for k in _EVAL:
            self.stage_s[k].append(child.stage_s[k])
            self.stage_imputed[k].append(False)
        for k, (usd, joules, imp) in child.price.items():
            cols = self.price.setdefault(k, ([0.0] * i, [0.0] * i, [0.0] * i))
            for col, v in zip(cols, (usd, joules, imp)):
                col.append(v)
        return i


class PuctSimulation(SearchSimulation):
    """One closed-loop search. Construct, then ``run()`` once."""

    def __init__(self, source: ChildSource, config: SearchConfig, policy: Policy,
                 model: PresetCostModel, capacities: Capacities, budget: Budget, seed: int, *,
                 search_id: str, task_id: str, forecast_frame: str = "reference",
                 bin_edges: tuple = (), pipeline: Pipeline = DEFAULT_PIPELINE,
                 noise: MeasureNoise | None = None, selection=None):
        root_id, seed_speedup = source.root()
        trace = _GrowingTrace(search_id, task_id, seed_speedup, forecast_frame, bin_edges)
        super().__init__(trace, policy, model, capacities, budget, seed, False, pipeline, noise)
        self.source = source
        self.config = config
        # PUCT's archive, or an evolutionary one (``selection``: simulator.closed.evolution)
        self.selection = selection
        self.archive = make_archive(ArchiveNode(root_id, seed_speedup, (), is_seed=True),
                                    config, selection, seed, search_id)
        self._expanded: dict[str, int] = {}
        self._musd_seen, self._musd_values = 0, []
        # Archive rewards are what the search measured (noisy); children are drawn around a
        # node's noise-free speedup, so noise changes decisions, never the world.
        self._true_speedup: dict[str, float] = {root_id: seed_speedup}

    def _parent_speedup(self, i: int) -> float:
        return self.trace.parent_reward[i]  # parents are archive nodes: always measured

    def _measure_usd(self) -> float:
        """The mean USD of measuring one drawn child so far: ``mean_measure_usd`` of the growing
        trace, bit for bit (the same per-candidate sums, the same ``np.mean``), with each
        candidate's sum computed once instead of rebuilding every column every step."""
        t = self.trace
        while self._musd_seen < len(t):
            i = self._musd_seen
            if t.outcome[i] is not None:
                total = 0.0
                for k in _MEASURE_STAGES:
                    if k in t.price:
                        total = total + t.price[k][0][i]
                self._musd_values.append(total)
            self._musd_seen += 1
        return float(np.mean(self._musd_values)) if self._musd_values else math.nan

    def _cap(self, batch, decisions) -> np.ndarray:
        return cap_per_parent(batch, decisions.measure, self.config.k_per_parent)

    def _driver(self):
        env, cfg, t = self.env, self.config, self.trace
        for step in range(cfg.steps):
            if step >= self.budget.steps and self._stopped_by is None:
                self._stopped_by = "steps"
            if self._exhausted():
                break
            parents = self.archive.select_parents(cfg.parents_per_step)
            self._step_state = SearchState(
                search_id=t.search_id, task_id=t.task_id, step=step, best_speedup=self._best,
                gpu_evals=self._evals, seed=self.seed, budget_left=self._budget_left(),
                measure_usd=self._measure_usd())
            batches = []
            for p in parents:
                e = self._expanded.get(p.node_id, 0)
                self._expanded[p.node_id] = e + 1
                kids = self.source.draw(p.node_id, self._true_speedup[p.node_id], e,
                                        cfg.children_per_parent, self.seed)
                batches.append([t.append(kid, step, p) for kid in kids])
            self._extend(len(t))
            if self._cannot_afford([i for b in batches for i in b]):
                break  # drawn, but not affordable: they stay budget_stopped
            yield env.all_of([env.process(self._parent_batch(step, b)) for b in batches])
            results = []
            for b in batches:
                for i in b:
                    if self._state[i] != "measured":
                        continue
                    ok = t.outcome[i] == "success"
                    if ok:
                        self._true_speedup[t.candidate_ids[i]] = t.speedup[i]
                    else:  # a failed parent (evolution) draws around its parent's speedup
                        self._true_speedup[t.candidate_ids[i]] = self._true_speedup[
                            t.parent_node[i]]
                    results.append(ChildResult(t.parent_node[i], t.candidate_ids[i],
                                               self._measured_speedup[i] if ok else None,
                                               t.children[i].code))
            self.archive.complete_step(parents, results)
            self.source.observe_step(results)
            self._steps_done += 1
            tick()

    def run(self) -> SearchResult:
        result = super().run()
        t = self.trace
        result.table["draw_source"] = [c.draw_source for c in t.children]
        result.table["template"] = [c.template for c in t.children]
        result.table["parent_node"] = list(t.parent_node)
        result.extra = puct_extra(self.config, result.best_candidate_id, t.candidate_ids,
                                  result.table["draw_source"], t.parent_node,
                                  len(self.archive.nodes), self.selection)
        return result


def replace_config(config: SearchConfig, **changes) -> SearchConfig:
    """A config with some fields changed (None values ignored)."""
    return replace(config, **{k: v for k, v in changes.items() if v is not None})
