"""The reference search's archive and parent selection (docs/concepts/paper.md), as pure state.

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
    """The archive. ``nodes``, ``visits`` and ``best_child`` are the state; columns kept
    alongside (numpy, one row per node) make a step's selection a few array operations:
    rewards, visits, best child rewards, and each node's lineage as the serial number of its
    ancestor at every depth (its own at its depth), so that a node's descendants are the rows
    holding its serial at its depth and its ancestors the rows whose serial sits in its row."""

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
        self._serial: dict[str, int] = {self.root.node_id: 0}  # every node ever admitted
        self._reindex()

    def _reindex(self) -> None:
        """Rebuild the columns from ``nodes`` (at the start, and when nodes leave)."""
        n = len(self.nodes)
        cap = max(64, 2 * n)
        depth = max((len(m.ancestors) for m in self.nodes), default=0)
        self._by_id = {m.node_id: m for m in self.nodes}
        self._pos = {m.node_id: i for i, m in enumerate(self.nodes)}
        self._r = np.zeros(cap)
        self._v = np.zeros(cap)
        self._b = np.full(cap, math.nan)
        self._is_seed = np.zeros(cap, bool)
        self._ser = np.zeros(cap, dtype=np.int64)
        self._dep = np.zeros(cap, dtype=np.int64)
        self._anc = np.full((cap, depth + 2), -1, dtype=np.int64)
        self._n = 0
        self._codes = set()
        self._lo = self._hi = None  # non-seed finite rewards' range
        self._lo_all = self._hi_all = None
        for m in self.nodes:
            self._append(m)

    def _append(self, m: ArchiveNode, parent: int | None = None) -> None:
        """Add ``m``'s row; ``parent``: its parent's row, whose lineage it extends."""
        i = self._n
        if i == len(self._r):
            grow = len(self._r)
            self._r = np.r_[self._r, np.zeros(grow)]
            self._v = np.r_[self._v, np.zeros(grow)]
            self._b = np.r_[self._b, np.full(grow, math.nan)]
            self._is_seed = np.r_[self._is_seed, np.zeros(grow, bool)]
            self._ser = np.r_[self._ser, np.zeros(grow, dtype=np.int64)]
            self._dep = np.r_[self._dep, np.zeros(grow, dtype=np.int64)]
            self._anc = np.vstack([self._anc, np.full_like(self._anc, -1)])
        d = len(m.ancestors)
        if d + 1 >= self._anc.shape[1]:
            self._anc = np.hstack([self._anc, np.full((len(self._anc), self._anc.shape[1]),
                                                      -1, dtype=np.int64)])
        serial = self._serial.setdefault(m.node_id, len(self._serial))
        row = self._anc[i]
        if parent is not None:
            row[:] = self._anc[parent]
        else:
            row[:] = -1
            for k, a in enumerate(m.ancestors):  # parent first, root last
                row[d - 1 - k] = self._serial[a]
        row[d] = serial
        self._r[i] = m.reward
        self._v[i] = self.visits.get(m.node_id, 0)
        self._b[i] = self.best_child.get(m.node_id, math.nan)
        self._is_seed[i] = m.is_seed
        self._ser[i] = serial
        self._dep[i] = d
        self._n = i + 1
        if m.code is not None:
            self._codes.add(m.code)
        r = m.reward
        if math.isfinite(r):
            self._lo_all = r if self._lo_all is None else min(self._lo_all, r)
            self._hi_all = r if self._hi_all is None else max(self._hi_all, r)
            if not m.is_seed:
                self._lo = r if self._lo is None else min(self._lo, r)
                self._hi = r if self._hi is None else max(self._hi, r)

    def get(self, node_id: str) -> ArchiveNode:
        return self._by_id[node_id]

    # -- selection ------------------------------------------------------------------------------
    def _scale(self) -> float:
        """max - min reward over non-seed nodes (all nodes if none; 1.0 if no reward)."""
        lo, hi = (self._lo, self._hi) if self._lo is not None else (self._lo_all, self._hi_all)
        if lo is None:
            return 1.0
        return max(1e-6, hi - lo)

    def _score(self) -> np.ndarray:
        n = self._n
        rewards = self._r[:n]
        rank = np.empty(n, dtype=int)
        rank[np.argsort(-rewards, kind="stable")] = np.arange(n)
        prior = (n - rank) / (n - rank).sum()
        bonus_scale = self.c_puct * self._scale() * math.sqrt(1.0 + self.expansions)
        visits, best = self._v[:n], self._b[:n]
        q = np.where((visits > 0) & ~np.isnan(best), best, rewards)
        return q + bonus_scale * prior / (1.0 + visits)

    def scores(self) -> list[tuple[float, float, ArchiveNode]]:
        """(score, reward, node) for every archive node, best first (ties: higher reward,
        then archive order)."""
        score = self._score()
        order = np.lexsort((np.arange(self._n), -self._r[:self._n], -score))
        return [(float(score[i]), self.nodes[i].reward, self.nodes[i]) for i in order.tolist()]

    def _lineage_mask(self, i: int) -> np.ndarray:
        """Row i's node, its ancestors and its descendants."""
        n = self._n
        d = self._dep[i]
        below = self._anc[:n, d] == self._ser[i]
        above = self._anc[i][self._dep[:n]] == self._ser[:n]
        return below | above

    def select_parents(self, batch_size: int) -> list[ArchiveNode]:
        """Greedy by score (ties: higher reward, then archive order); a chosen node blocks its
        whole lineage for this step."""
        score = self._score()
        rewards = self._r[:self._n]
        free = np.ones(self._n, bool)
        chosen: list[ArchiveNode] = []
        while len(chosen) < batch_size and free.any():
            s = np.where(free, score, -np.inf)
            top = np.flatnonzero(free & (s == s.max()))
            if len(top) > 1:
                r = rewards[top]
                top = top[r == r.max()]
            i = int(top[0])
            chosen.append(self.nodes[i])
            if len(chosen) < batch_size:
                free &= ~self._lineage_mask(i)
        return chosen

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
                    self._b[pos[p.node_id]] = best
            for a in (p.node_id, *p.ancestors):
                v = self.visits[a] = self.visits.get(a, 0) + 1
                if a in pos:
                    self._v[pos[a]] = v
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
                self._append(node, pos[p.node_id])
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
