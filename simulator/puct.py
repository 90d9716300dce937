"""The reference search's archive and parent selection (REFERENCE.md section 4), as pure state.

Score of an archive node s: Q(s) + c * scale * P(s) * sqrt(1 + T) / (1 + n(s)), where
- Q(s) is the best reward among s's children once s has been visited, else s's own reward;
- P(s) is a rank prior: weight N - rank (rank 0 = best reward), normalised over the archive;
- scale is max - min reward over non-seed nodes (all nodes if none; 1.0 if no reward at all),
  at least 1e-6;
- T counts expansions and n(s) visits.
Parents are chosen greedily by (score, reward), each choice blocking its ancestors and
descendants for the rest of the step. After a step: the best child reward of each parent is
recorded; every parent and all its ancestors gain a visit and T grows by one per parent (a
parent with no valid child too, so a node that keeps failing loses its bonus); then each
parent's top-k children by reward enter the archive, failed ones never, exact duplicate code
never, and past ``capacity`` the lowest rewards leave (seeds stay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ArchiveNode", "PuctArchive", "ChildResult"]


@dataclass
class ArchiveNode:
    node_id: str
    reward: float  # measured speedup; the seed kernel's for the root
    ancestors: tuple[str, ...]  # parent first, root last
    code: str | None = None
    is_seed: bool = False


@dataclass(frozen=True)
class ChildResult:
    """A measured child of a step's parent: its reward is None when it failed."""

    parent_id: str
    node_id: str
    reward: float | None
    code: str | None = None


@dataclass
class PuctArchive:
    root: ArchiveNode
    k_per_parent: int = 4
    capacity: int = 1000
    c_puct: float = 1.0
    nodes: list[ArchiveNode] = field(default_factory=list)
    visits: dict[str, int] = field(default_factory=dict)
    best_child: dict[str, float] = field(default_factory=dict)
    expansions: int = 0  # T

    def __post_init__(self):
        self.nodes = [self.root]
        self._reindex()

    def _reindex(self) -> None:
        """The per-node columns selection reads, aligned with ``nodes`` (rebuilt only when
        nodes leave; appended to as they come)."""
        self._by_id = {n.node_id: n for n in self.nodes}
        self._pos = {n.node_id: i for i, n in enumerate(self.nodes)}
        self._reward = [n.reward for n in self.nodes]
        self._seed = [n.is_seed for n in self.nodes]
        self._visits = [self.visits.get(n.node_id, 0) for n in self.nodes]
        self._best = [self.best_child.get(n.node_id, math.nan) for n in self.nodes]
        self._codes = {n.code for n in self.nodes if n.code is not None}

    def get(self, node_id: str) -> ArchiveNode:
        return self._by_id[node_id]

    # -- selection ------------------------------------------------------------------------------
    def _scale(self, rewards: np.ndarray) -> float:
        finite = np.isfinite(rewards)
        pick = finite & ~np.asarray(self._seed, dtype=bool)
        if not pick.any():
            pick = finite
        if not pick.any():
            return 1.0
        r = rewards[pick]
        return max(1e-6, float(r.max()) - float(r.min()))

    def _ranked(self) -> tuple[np.ndarray, np.ndarray]:
        """(score of every node, node positions best first: ties by higher reward, then archive
        order)."""
        rewards = np.array(self._reward, dtype=float)
        n = len(rewards)
        rank = np.empty(n, dtype=int)
        rank[np.argsort(-rewards, kind="stable")] = np.arange(n)
        prior = (n - rank) / (n - rank).sum()
        bonus_scale = self.c_puct * self._scale(rewards) * math.sqrt(1.0 + self.expansions)
        visits = np.array(self._visits, dtype=float)
        best = np.array(self._best, dtype=float)
        q = np.where((visits > 0) & ~np.isnan(best), best, rewards)
        score = q + bonus_scale * prior / (1.0 + visits)
        return score, np.lexsort((np.arange(n), -rewards, -score))

    def scores(self) -> list[tuple[float, float, ArchiveNode]]:
        """(score, reward, node) for every archive node, best first (ties: higher reward,
        then archive order)."""
        score, order = self._ranked()
        return [(float(score[i]), self.nodes[i].reward, self.nodes[i]) for i in order.tolist()]

    def select_parents(self, batch_size: int) -> list[ArchiveNode]:
        """Greedy by score; a chosen node blocks its whole lineage for this step."""
        chosen: list[ArchiveNode] = []
        blocked: set[str] = set()
        for i in self._ranked()[1].tolist():
            node = self.nodes[i]
            if node.node_id in blocked:
                continue
            chosen.append(node)
            if len(chosen) >= batch_size:
                break
            blocked |= self._lineage(node)
        return chosen

    def _lineage(self, node: ArchiveNode) -> set[str]:
        # A descendant's ancestors run from its parent to the root, so ``node`` sits at the
        # same distance from the root end of every descendant's chain.
        out = {node.node_id, *node.ancestors}
        d = len(node.ancestors)
        nid = node.node_id
        for m in self.nodes:
            a = m.ancestors
            if len(a) > d and a[len(a) - 1 - d] == nid:
                out.add(m.node_id)
        return out

    # -- after a step -----------------------------------------------------------------------------
    def complete_step(self, parents: list[ArchiveNode], children: list[ChildResult]) -> None:
        by_parent: dict[str, list[ChildResult]] = {p.node_id: [] for p in parents}
        for c in children:
            by_parent.setdefault(c.parent_id, []).append(c)
        pos = self._pos
        for p in parents:
            valid = [c.reward for c in by_parent[p.node_id] if c.reward is not None]
            if valid:
                best = max(valid)
                best = self.best_child[p.node_id] = max(self.best_child.get(p.node_id, best),
                                                        best)
                if p.node_id in pos:
                    self._best[pos[p.node_id]] = best
            for a in (p.node_id, *p.ancestors):
                v = self.visits[a] = self.visits.get(a, 0) + 1
                if a in pos:
                    self._visits[pos[a]] = v
            self.expansions += 1
        codes = self._codes
        for p in parents:
            ranked = sorted(by_parent[p.node_id], reverse=True,
                            key=lambda c: -math.inf if c.reward is None else c.reward)
            for c in ranked[: self.k_per_parent]:
                if c.reward is None or (c.code is not None and c.code in codes):
                    continue
                node = ArchiveNode(c.node_id, c.reward, (p.node_id, *p.ancestors), c.code)
                pos[node.node_id] = len(self.nodes)
                self.nodes.append(node)
                self._by_id[node.node_id] = node
                self._reward.append(node.reward)
                self._seed.append(False)
                self._visits.append(self.visits.get(node.node_id, 0))
                self._best.append(self.best_child.get(node.node_id, math.nan))
                if c.code is not None:
                    codes.add(c.code)
        if len(self.nodes) > self.capacity:
            self._truncate()

    def _truncate(self) -> None:
        order = sorted(range(len(self.nodes)), key=lambda i: self.nodes[i].reward, reverse=True)
        keep = {i for i, n in enumerate(self.nodes) if n.is_seed}
        for i in order:
            if len(keep) >= self.capacity:
                break
            keep.add(i)
        self.nodes = [self.nodes[i] for i in sorted(keep)]
        self._reindex()
