"""Many searches' archives as arrays: ``PuctArchive``'s rules, one row per search.

Searches run in lockstep (``simulator.closed.fast.run_lockstep``: every seed of a replay, every
search of a log) select their parents at the same moment, so the selection of all of them is
one set of array operations over a (searches x nodes) table instead of a few dozen small
numpy calls per search: the PUCT score of every node of every search, the greedy choice with
its ties, and the blocking of a chosen node's lineage. The update after a step gathers every
search's visits, best-child rewards and admissions into a handful of indexed writes.

The rules are ``simulator.closed.puct``'s, to the bit (same float operations in the same order);
``tests/test_puct_bank.py`` drives a bank and one ``PuctArchive`` per search with the same
random steps and compares every selection and every column. Rows keep ``PuctArchive``'s
column layout: rewards, visits, best child rewards, whether a node is a seed, and each node's
lineage as the serial number of its ancestor at every depth (its own at its depth), so that a
node's descendants are the columns holding its serial at its depth and its ancestors the
columns whose serial sits in its lineage.
"""

from __future__ import annotations

import math

import numpy as np

from gfsim.simulator.closed.puct import ArchiveNode, ChildResult

__all__ = ["ArchiveBank"]


class ArchiveBank:
    """The archives of ``len(roots)`` searches; search k starts from ``roots[k]`` with its
    own ``k_per_parent``, ``capacity`` and ``c_puct`` (``configs[k]``, a ``SearchConfig``)."""

    def __init__(self, roots: list[ArchiveNode], configs):
        n = len(roots)
        self.k_per_parent = [c.k_per_parent for c in configs]
        self.capacity = [c.capacity for c in configs]
        self.c_puct = np.array([float(c.c_puct) for c in configs])
        width = max((1 + c.steps * c.parents_per_step * c.k_per_parent for c in configs),
                    default=1)
        width = min(width, max((c.capacity for c in configs), default=1) + 1)
        self._cols = max(8, min(width, 64))
        depth = max((c.steps for c in configs), default=1) + 2
        self.nodes: list[list[ArchiveNode]] = [[r] for r in roots]
        self._pos: list[dict[str, int]] = [{r.node_id: 0} for r in roots]
        self._serial: list[dict[str, int]] = [{r.node_id: 0} for r in roots]
        self._codes: list[set] = [set() if r.code is None else {r.code} for r in roots]
        self.expansions = np.zeros(n, dtype=np.int64)  # T
        self.count = np.ones(n, dtype=np.int64)
        cols = self._cols
        self._r = np.full((n, cols), -math.inf)
        self._v = np.zeros((n, cols))
        self._b = np.full((n, cols), math.nan)
        self._seed = np.zeros((n, cols), bool)
        self._ser = np.zeros((n, cols), dtype=np.int64)
        self._dep = np.zeros((n, cols), dtype=np.int64)
        self._anc = np.full((n, cols, depth), -1, dtype=np.int64)
        # Per search: the lowest and highest finite reward of non-seed nodes, then of all.
        self._range = [[math.inf, -math.inf, math.inf, -math.inf] for _ in roots]
        for k, r in enumerate(roots):
            self._r[k, 0] = r.reward
            self._seed[k, 0] = r.is_seed
            self._anc[k, 0, 0] = 0
            self._track(k, r)

    # -- bookkeeping --------------------------------------------------------------------------
    def size(self, k: int) -> int:
        return len(self.nodes[k])

    def _track(self, k: int, m: ArchiveNode) -> None:
        r = m.reward
        if math.isfinite(r):
            span = self._range[k]
            if r < span[2]:
                span[2] = r
            if r > span[3]:
                span[3] = r
            if not m.is_seed:
                if r < span[0]:
                    span[0] = r
                if r > span[1]:
                    span[1] = r

    def _scale(self, k: int) -> float:
        lo, hi, lo_all, hi_all = self._range[k]
        if lo > hi:  # no non-seed node with a finite reward
            lo, hi = lo_all, hi_all
        if lo > hi:
            return 1.0
        return max(1e-6, hi - lo)

    def _grow(self, need: int) -> None:
        """Room for ``need`` columns (the table doubles; padding as in ``__init__``)."""
        cols = self._cols
        while cols < need:
            cols *= 2
        extra = cols - self._cols
        n = len(self.nodes)
        self._r = np.hstack([self._r, np.full((n, extra), -math.inf)])
        self._v = np.hstack([self._v, np.zeros((n, extra))])
        self._b = np.hstack([self._b, np.full((n, extra), math.nan)])
        self._seed = np.hstack([self._seed, np.zeros((n, extra), bool)])
        self._ser = np.hstack([self._ser, np.zeros((n, extra), dtype=np.int64)])
        self._dep = np.hstack([self._dep, np.zeros((n, extra), dtype=np.int64)])
        self._anc = np.concatenate([self._anc, np.full((n, extra, self._anc.shape[2]), -1,
                                                       dtype=np.int64)], axis=1)
        self._cols = cols

    # -- selection ------------------------------------------------------------------------------
    def select(self, rows: list[int], parents_per_step: list[int]) -> list[list[ArchiveNode]]:
        """The parents of one step of searches ``rows`` (``PuctArchive.select_parents``)."""
        if not rows:
            return []
        ks = np.asarray(rows, dtype=np.int64)
        n = self.count[ks]
        m = int(n.max())
        reward = self._r[ks, :m]
        visits, best = self._v[ks, :m], self._b[ks, :m]
        rank = np.empty((len(ks), m), dtype=np.int64)
        np.put_along_axis(rank, np.argsort(-reward, axis=1, kind="stable"),
                          np.broadcast_to(np.arange(m), (len(ks), m)), axis=1)
        weight = n[:, None] - rank
        prior = weight / (n * (n + 1) // 2)[:, None]
        bonus = np.array([self.c_puct[k] * self._scale(k) * math.sqrt(1.0 + self.expansions[k])
                          for k in rows])
        q = np.where((visits > 0) & ~np.isnan(best), best, reward)
        score = q + bonus[:, None] * prior / (1.0 + visits)
        free = np.arange(m)[None, :] < n[:, None]
        wanted = np.asarray(parents_per_step, dtype=np.int64)
        chosen: list[list[ArchiveNode]] = [[] for _ in rows]
        at = np.arange(len(ks))
        for j in range(int(wanted.max())):
            live = (wanted > j) & free.any(axis=1)
            if not live.any():
                break
            s = np.where(free, score, -math.inf)
            top = free & (s == s.max(axis=1)[:, None])
            r = np.where(top, reward, -math.inf)
            top &= reward == r.max(axis=1)[:, None]
            pick = top.argmax(axis=1)
            for a in np.flatnonzero(live).tolist():
                chosen[a].append(self.nodes[rows[a]][int(pick[a])])
            block = live & (wanted > j + 1)
            if block.any():
                b = at[block]
                kb, ib = ks[b], pick[b]
                d = self._dep[kb, ib]
                below = self._anc[kb[:, None], np.arange(m)[None, :], d[:, None]] \
                    == self._ser[kb, ib][:, None]
                above = np.take_along_axis(self._anc[kb, ib, :], self._dep[kb, :m], axis=1) \
                    == self._ser[kb, :m]
                free[b] &= ~(below | above)
        return chosen

    # -- after a step -----------------------------------------------------------------------------
    def complete(self, steps: list[tuple[int, list[ArchiveNode], list[ChildResult]]]) -> None:
        """Each (search, its step's parents, what the step measured), as
        ``PuctArchive.complete_step``."""
        lineage_k, lineage_col = [], []
        add = []  # (search, column, parent column, serial, depth, reward)
        for k, parents, children in steps:
            pos = self._pos[k]
            by_parent: dict[str, list[ChildResult]] = {p.node_id: [] for p in parents}
            for c in children:
                by_parent.setdefault(c.parent_id, []).append(c)
            for p in parents:
                col = pos[p.node_id]
                valid = [c.reward for c in by_parent[p.node_id] if c.reward is not None]
                if valid:
                    best = max(valid)
                    old = self._b[k, col]
                    self._b[k, col] = best if old != old else max(float(old), best)
                lineage_k.append(k)
                lineage_col.append(col)
            self.expansions[k] += len(parents)
            codes, nodes = self._codes[k], self.nodes[k]
            serial = self._serial[k]
            for p in parents:
                ranked = sorted(by_parent[p.node_id], reverse=True,
                                key=lambda c: -math.inf if c.reward is None else c.reward)
                lineage = None
                for c in ranked[: self.k_per_parent[k]]:
                    if c.reward is None or (c.code is not None and c.code in codes):
                        continue
                    if lineage is None:
                        lineage = (p.node_id, *p.ancestors)
                    node = ArchiveNode(c.node_id, c.reward, lineage, c.code)
                    col = len(nodes)
                    pos[node.node_id] = col
                    nodes.append(node)
                    if c.code is not None:
                        codes.add(c.code)
                    self._track(k, node)
                    add.append((k, col, pos[p.node_id],
                                serial.setdefault(node.node_id, len(serial)),
                                len(lineage), node.reward))
        self._visit(lineage_k, lineage_col)
        if add:
            self._admit(add)
        for k, _, _ in steps:
            if len(self.nodes[k]) > self.capacity[k]:
                self._truncate(k)

    def _visit(self, ks: list[int], cols: list[int]) -> None:
        """Every parent and its ancestors still in the archive gain a visit."""
        if not ks:
            return
        ks_, cols_ = np.asarray(ks), np.asarray(cols)
        m = int(self.count[ks_].max())
        mask = np.take_along_axis(self._anc[ks_, cols_, :], self._dep[ks_, :m], axis=1) \
            == self._ser[ks_, :m]
        mask &= np.arange(m)[None, :] < self.count[ks_][:, None]
        row, col = np.nonzero(mask)
        gain = np.bincount(ks_[row] * m + col, minlength=len(self.nodes) * m)
        self._v[:, :m] += gain.reshape(len(self.nodes), m)

    def _admit(self, add: list[tuple]) -> None:
        k, col, parent, serial, depth, reward = (np.asarray(x) for x in zip(*add))
        top = int(col.max()) + 1
        if top > self._cols:
            self._grow(top)
        self._anc[k, col, :] = self._anc[k, parent, :]
        self._anc[k, col, depth] = serial
        self._r[k, col] = reward
        self._v[k, col] = 0.0
        self._b[k, col] = math.nan
        self._seed[k, col] = False
        self._ser[k, col] = serial
        self._dep[k, col] = depth
        for kk in set(k.tolist()):
            self.count[kk] = len(self.nodes[kk])

    def _truncate(self, k: int) -> None:
        """Past capacity the lowest rewards leave (seeds stay); the rest keep their order."""
        nodes = self.nodes[k]
        order = sorted(range(len(nodes)), key=lambda i: nodes[i].reward, reverse=True)
        keep = {i for i, m in enumerate(nodes) if m.is_seed}
        for i in order:
            if len(keep) >= self.capacity[k]:
                break
            keep.add(i)
        idx = np.array(sorted(keep), dtype=np.int64)
        n = len(idx)
        for name in ("_r", "_v", "_b", "_seed", "_ser", "_dep", "_anc"):
            table = getattr(self, name)
            kept = table[k, idx].copy()
            table[k, :n] = kept
            if name == "_r":
                table[k, n:] = -math.inf
            elif name == "_b":
                table[k, n:] = math.nan
            elif name == "_anc":
                table[k, n:] = -1
            else:
                table[k, n:] = 0
        self.nodes[k] = [nodes[i] for i in idx.tolist()]
        self._pos[k] = {m.node_id: i for i, m in enumerate(self.nodes[k])}
        self._codes[k] = {m.code for m in self.nodes[k] if m.code is not None}
        self._range[k] = [math.inf, -math.inf, math.inf, -math.inf]
        for m in self.nodes[k]:
            self._track(k, m)
        self.count[k] = n
