"""An evolutionary search's archive and parent selection: islands, an elite archive, migration.

OpenEvolve and ShinkaEvolve do not search as PUCT does. Each keeps a population split into
islands and an elite archive, and draws each iteration's parent at random from them:

- ``openevolve`` (OpenEvolve's program database): the iteration's island comes round robin;
  with probability ``exploration_ratio`` the parent is any member of that island, with
  ``exploitation_ratio`` an elite-archive member of that island (any elite if it holds none),
  otherwise a member of the island drawn in proportion to its fitness (at least 0.001). A
  child joins the island its iteration chose; failed children join too (fitness 0), as
  OpenEvolve keeps them. Every ``migration_interval`` island generations the top
  ``migration_rate`` share of each island (at least one, migrants excepted) is copied to its
  two neighbours on the ring.
- ShinkaEvolve's strategies (the island drawn uniformly; only correct programs are parents):
  ``power_law`` ranks the island's elite-archive members (else its programs) by reward and
  draws rank r with probability proportional to (r + 1) ** -``exploitation_alpha``;
  ``weighted`` draws in proportion to sigmoid(lambda (reward - median) / MAD) / (1 + children);
  ``beam_search`` keeps the best program as the parent for ``num_beams`` children, then takes
  the best again; ``hill_climbing`` always takes the best.

The elite archive keeps the ``archive_size`` best programs (a newcomer replaces the worst when
better); past ``population_size`` the worst programs leave (the best and the newcomer stay).
OpenEvolve's MAP-Elites feature cells (a program displacing a worse one in its cell) and its
novelty checks are not modelled: they need the programs' code features, which drawn children
lack. The same interface as ``simulator.puct.PuctArchive`` (``select_parents``,
``complete_step``, ``nodes``), so both closed-loop engines run it; all randomness comes from one
keyed stream (``gfsim.core.rng.stream(seed, "evolution", search_id)``), so both engines draw
the same parents.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream
from gfsim.simulator.closed.puct import ArchiveNode, ChildResult

__all__ = ["EvolutionConfig", "EvolutionArchive", "STRATEGIES", "TOOL_DEFAULTS",
           "EvolutionBank", "make_archive", "make_bank"]

STRATEGIES = ("openevolve", "power_law", "weighted", "beam_search", "hill_climbing")

# The tools' documented defaults, used where a run's folder records no setting (the output
# says which): OpenEvolve's DatabaseConfig (openevolve/config.py) and ShinkaEvolve's
# DatabaseConfig (shinka/database/dbase.py), as of the versions read (OpenEvolve's main of
# December 2025; ShinkaEvolve 0.0.7, whose defaults its later main keeps).
TOOL_DEFAULTS = {
    "openevolve": {"strategy": "openevolve", "islands": 5, "exploration_ratio": 0.2,
                   "exploitation_ratio": 0.7, "elite_selection_ratio": 0.1,
                   "archive_size": 100, "population_size": 1000, "migration_interval": 50,
                   "migration_rate": 0.1, "admit_failures": True, "island_order": "round_robin"},
    "shinka": {"strategy": "weighted", "islands": 2, "exploitation_ratio": 0.2,
               "exploitation_alpha": 1.0, "parent_selection_lambda": 10.0, "num_beams": 5,
               "archive_size": 40, "population_size": 1_000_000, "migration_interval": 10,
               "migration_rate": 0.0, "admit_failures": False, "island_order": "uniform"},
}


@dataclass(frozen=True)
class EvolutionConfig:
    """An evolutionary search's selection settings (see the module docstring). ``tool`` names
    whose rules and defaults they are; ``from_config`` says which fields the run recorded."""

    tool: str = "openevolve"
    strategy: str = "openevolve"
    islands: int = 5
    exploration_ratio: float = 0.2
    exploitation_ratio: float = 0.7
    elite_selection_ratio: float = 0.1
    exploitation_alpha: float = 1.0
    parent_selection_lambda: float = 10.0
    num_beams: int = 5
    archive_size: int = 100
    population_size: int = 1000
    migration_interval: int = 50
    migration_rate: float = 0.1
    admit_failures: bool = True
    island_order: str = "round_robin"  # or "uniform"
    # The log's first step measures the tool's initial program (the importers log it as the
    # root's one child at step 0): that child then stands for the seed in the population.
    seed_step: bool = True
    from_config: tuple[str, ...] = ()

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise GfsimError(f"evolution: unknown parent-selection strategy "
                             f"{self.strategy!r}; valid: {', '.join(STRATEGIES)}")
        for name in ("islands", "archive_size", "population_size", "migration_interval",
                     "num_beams"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GfsimError(f"evolution: {name} must be a whole number >= 1, got {v!r}")
        for name in ("exploration_ratio", "exploitation_ratio", "migration_rate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise GfsimError(f"evolution: {name} must be within [0, 1], got {v!r}")

    @classmethod
    def for_tool(cls, tool: str, recorded: dict | None = None) -> "EvolutionConfig":
        """The settings of a run of ``tool``: what it recorded (``recorded``: field -> value;
        unknown keys ignored), the tool's documented defaults for the rest."""
        if tool not in TOOL_DEFAULTS:
            raise GfsimError(f"evolution: no defaults for tool {tool!r}; valid: "
                             f"{', '.join(TOOL_DEFAULTS)}")
        names = set(cls.__dataclass_fields__) - {"tool", "from_config", "seed_step"}
        given = {k: v for k, v in (recorded or {}).items() if k in names and v is not None}
        return cls(tool=tool, **{**TOOL_DEFAULTS[tool], **given},
                   from_config=tuple(sorted(given)))

    def as_dict(self) -> dict:
        out = asdict(self)
        out["from_config"] = list(self.from_config)
        rules = {"admit_failures", "island_order"} | (
            {"strategy"} if self.tool == "openevolve" else set())  # the tool's, not settings
        out["defaults"] = sorted(set(TOOL_DEFAULTS[self.tool]) - set(self.from_config) - rules)
        return out


class EvolutionArchive:
    """The population, islands and elite archive of one evolutionary search. ``nodes``: every
    program in the population, in admission order; ``rng``: its keyed stream."""

    def __init__(self, root: ArchiveNode, config: EvolutionConfig, rng: np.random.Generator):
        self.config, self.rng = config, rng
        self.root = root
        self.nodes: list[ArchiveNode] = [root]
        self.fitness: dict[str, float] = {root.node_id: root.reward}
        self.correct: dict[str, bool] = {root.node_id: True}
        self.children: dict[str, int] = {root.node_id: 0}
        self.migrant: set[str] = set()
        # The seed starts on island 0 (OpenEvolve) or on every island (ShinkaEvolve copies it).
        every = config.tool == "shinka"
        self.island_members: list[list[str]] = [
            [root.node_id] if every or i == 0 else [] for i in range(config.islands)]
        self.elite: list[str] = [root.node_id]
        self.generations = [0] * config.islands
        self.last_migration = 0
        self._turn = 0  # round-robin island counter
        self._slot_island: dict[int, int] = {}  # position in the last selection -> island
        self._beam: str | None = None
        self._by_id = {root.node_id: root}
        self._steps = 0

    # -- selection ------------------------------------------------------------------------------
    def _ranked(self, ids: list[str]) -> list[str]:
        order = {m.node_id: i for i, m in enumerate(self.nodes)}
        return sorted(ids, key=lambda i: (-self.fitness[i], order[i]))

    def parent_distribution(self, island: int) -> tuple[list[str], np.ndarray]:
        """The programs a parent drawn on ``island`` may be, and each one's probability (a
        program listed twice, as an island member and an elite, has both shares)."""
        cfg = self.config
        members = [i for i in self.island_members[island] if i in self._by_id]
        if cfg.tool == "shinka":
            members = [i for i in members if self.correct[i]]
        if not members:  # an empty island draws from the whole population
            members = [m.node_id for m in self.nodes if self.correct[m.node_id]] or [
                self.nodes[0].node_id]
        elite_here = [i for i in self.elite if i in members]
        s = cfg.strategy
        if s == "openevolve":
            elite = elite_here or self.elite
            fit = np.maximum(np.array([self.fitness[i] for i in members]), 0.001)
            rest = 1.0 - cfg.exploration_ratio - cfg.exploitation_ratio
            p = np.concatenate([np.full(len(members), cfg.exploration_ratio / len(members)),
                                np.full(len(elite), cfg.exploitation_ratio / len(elite)),
                                rest * fit / fit.sum()])
            return members + elite + members, p
        if s == "power_law":
            pool = self._ranked(elite_here or members)
            w = np.arange(1, len(pool) + 1, dtype=float) ** -cfg.exploitation_alpha
            return pool, w / w.sum()
        if s == "weighted":
            pool = elite_here or members
            f = np.array([self.fitness[i] for i in pool])
            mid = float(np.median(f))
            scale = max(float(np.median(np.abs(f - mid))), 1e-6)
            z = np.clip(cfg.parent_selection_lambda * (f - mid) / scale, -500, 500)
            w = 1.0 / (1.0 + np.exp(-z)) / (1.0 + np.array([self.children[i] for i in pool]))
            return pool, (w / w.sum() if w.sum() > 0 else np.full(len(pool), 1.0 / len(pool)))
        everyone = [m.node_id for m in self.nodes if self.correct[m.node_id]]
        if s == "beam_search":
            if self._beam is None or self._beam not in self._by_id or (
                    self.children[self._beam] >= cfg.num_beams):
                self._beam = self._ranked(everyone)[0]
            return [self._beam], np.ones(1)
        return self._ranked(everyone)[:1], np.ones(1)  # hill_climbing

    def next_island(self) -> int:
        """The island the next parent is drawn on (round robin, or uniform for ShinkaEvolve);
        ``select_parents`` calls it once per slot."""
        if self.config.island_order == "uniform":
            return int(self.rng.integers(self.config.islands))
        k = self._turn % self.config.islands
        self._turn += 1
        return k

    def select_parents(self, batch_size: int) -> list[ArchiveNode]:
        """One parent per slot, each from the island its slot draws; a parent may be chosen
        twice in a step (two iterations of the tool may pick the same program)."""
        chosen = []
        self._slot_island = {}
        for slot in range(batch_size):
            island = self.next_island()
            self._slot_island[slot] = island
            ids, p = self.parent_distribution(island)
            pick = ids[int(self.rng.choice(len(ids), p=p))] if len(ids) > 1 else ids[0]
            chosen.append(self._by_id[pick])
        return chosen

    # -- after a step -----------------------------------------------------------------------------
    def complete_step(self, parents: list[ArchiveNode], children: list[ChildResult]) -> None:
        """Admit the step's measured children to their slot's island (failures too where the
        tool keeps them), update the elite archive and the population, then migrate if due."""
        slot_of: dict[str, list[int]] = {}
        for slot, p in enumerate(parents):
            slot_of.setdefault(p.node_id, []).append(slot)
        seen: dict[str, int] = {}
        for c in children:
            slots = slot_of.get(c.parent_id, [0])
            k = seen.get(c.parent_id, 0)
            seen[c.parent_id] = k + 1
            island = self._slot_island.get(slots[k % len(slots)], 0)
            self.children[c.parent_id] = self.children.get(c.parent_id, 0) + 1
            self.generations[island] += 1
            if c.reward is None and not self.config.admit_failures:
                continue
            parent = self._by_id.get(c.parent_id)
            ancestors = (c.parent_id, *(parent.ancestors if parent is not None else ()))
            node = ArchiveNode(c.node_id, 0.0 if c.reward is None else c.reward, ancestors,
                               c.code)
            self._admit(node, island, c.reward is not None)
        self._steps += 1
        if self._steps == 1 and self.config.seed_step:
            self._seed_measured(children)
            return
        if max(self.generations) - self.last_migration >= self.config.migration_interval:
            self._migrate()

    def _seed_measured(self, children: list[ChildResult]) -> None:
        """After the first step: its best measured child (the initial program) takes the
        root's place on the root's islands and in the elite; the island generations restart,
        as the tool's count from its first mutation, and so do the islands' turns. Without one,
        the root stays."""
        ok = [c for c in children if c.reward is not None and c.parent_id == self.root.node_id]
        if not ok:
            return
        seed = self._by_id[max(ok, key=lambda c: c.reward).node_id]
        rid, sid = self.root.node_id, seed.node_id
        self.island_members = [[i for i in isl if i != sid] for isl in self.island_members]
        self.island_members = [[sid if i == rid else i for i in isl]
                               for isl in self.island_members]
        self.elite = list(dict.fromkeys(sid if i == rid else i for i in self.elite))
        self.nodes = [m for m in self.nodes if m.node_id != rid]
        del self._by_id[rid]
        self.root = seed
        self.generations = [0] * self.config.islands
        self._turn = 0  # the first mutation goes to island 0, as the tool's first iteration

    def _admit(self, node: ArchiveNode, island: int, correct: bool) -> None:
        nid = node.node_id
        self.nodes.append(node)
        self._by_id[nid] = node
        self.fitness[nid] = node.reward
        self.correct[nid] = correct
        self.children.setdefault(nid, 0)
        self.island_members[island].append(nid)
        if correct or self.config.tool == "openevolve":
            if len(self.elite) < self.config.archive_size:
                self.elite.append(nid)
            else:
                worst = min(self.elite, key=lambda i: self.fitness[i])
                if self.fitness[nid] > self.fitness[worst]:
                    self.elite[self.elite.index(worst)] = nid
        if len(self.nodes) > self.config.population_size:
            self._shrink(keep=nid)

    def _shrink(self, keep: str) -> None:
        """Past ``population_size``: the worst programs leave (the best and the newcomer
        stay, as in OpenEvolve)."""
        order = {m.node_id: i for i, m in enumerate(self.nodes)}
        best = self._ranked([m.node_id for m in self.nodes])[0]
        spare = {best, keep}
        worst = sorted((m.node_id for m in self.nodes if m.node_id not in spare),
                       key=lambda i: (self.fitness[i], order[i]))
        gone = set(worst[: len(self.nodes) - self.config.population_size])
        self.nodes = [m for m in self.nodes if m.node_id not in gone]
        for i in gone:
            del self._by_id[i]
        self.island_members = [[i for i in isl if i not in gone] for isl in self.island_members]
        self.elite = [i for i in self.elite if i not in gone]

    def _migrate(self) -> None:
        cfg, n = self.config, self.config.islands
        self.last_migration = max(self.generations)
        if n < 2 or cfg.migration_rate <= 0.0:
            return
        moves = []
        for k, members in enumerate(self.island_members):
            ranked = [i for i in self._ranked(list(dict.fromkeys(members)))
                      if i not in self.migrant]
            count = max(1, int(len(members) * cfg.migration_rate)) if ranked else 0
            for nid in ranked[:count]:
                for target in dict.fromkeys(((k + 1) % n, (k - 1) % n)):
                    if target != k:
                        moves.append((nid, target))
        for nid, target in moves:
            if nid not in self.island_members[target]:
                self.island_members[target].append(nid)
                self.migrant.add(nid)


def make_archive(root: ArchiveNode, config, selection: EvolutionConfig | None, seed: int,
                 search_id: str):
    """The archive a closed-loop search selects from: PUCT's (``selection`` None) or an
    evolutionary one, its stream keyed by (seed, search)."""
    if selection is None:
        from gfsim.simulator.closed.puct import PuctArchive

        return PuctArchive(root, k_per_parent=config.k_per_parent, capacity=config.capacity,
                           c_puct=config.c_puct)
    return EvolutionArchive(root, selection, stream(seed, "evolution", str(search_id)))


class EvolutionBank:
    """Archives of searches run in lockstep (``simulator.closed.fast.run_lockstep``): PUCT's
    rows in one ``ArchiveBank``, each evolutionary search in its own ``EvolutionArchive``
    (its selection is a handful of draws a step; nothing to gain from arrays). The same
    ``select``/``complete``/``size`` as ``ArchiveBank``."""

    def __init__(self, runs):
        from gfsim.simulator.closed.bank import ArchiveBank

        self._puct = [k for k, r in enumerate(runs) if r.selection is None]
        self._row = {k: j for j, k in enumerate(self._puct)}
        self._bank = ArchiveBank([runs[k].root for k in self._puct],
                                 [runs[k].config for k in self._puct])
        self._evo = {k: make_archive(r.root, r.config, r.selection, r.seed, r.search_id)
                     for k, r in enumerate(runs) if r.selection is not None}

    def size(self, k: int) -> int:
        return len(self._evo[k].nodes) if k in self._evo else self._bank.size(self._row[k])

    def select(self, rows: list[int], parents_per_step: list[int]) -> list[list[ArchiveNode]]:
        out: dict[int, list[ArchiveNode]] = {}
        puct = [(k, n) for k, n in zip(rows, parents_per_step) if k not in self._evo]
        if puct:
            got = self._bank.select([self._row[k] for k, _ in puct], [n for _, n in puct])
            out.update({k: g for (k, _), g in zip(puct, got)})
        for k, n in zip(rows, parents_per_step):
            if k in self._evo:
                out[k] = self._evo[k].select_parents(n)
        return [out[k] for k in rows]

    def complete(self, steps: list[tuple[int, list[ArchiveNode], list[ChildResult]]]) -> None:
        puct = [(self._row[k], p, c) for k, p, c in steps if k not in self._evo]
        if puct:
            self._bank.complete(puct)
        for k, p, c in steps:
            if k in self._evo:
                self._evo[k].complete_step(p, c)


def make_bank(runs):
    """The bank of ``run_lockstep``: ``ArchiveBank`` when every search is PUCT (as before),
    else an ``EvolutionBank``."""
    if all(getattr(r, "selection", None) is None for r in runs):
        from gfsim.simulator.closed.bank import ArchiveBank

        return ArchiveBank([r.root for r in runs], [r.config for r in runs])
    return EvolutionBank(runs)
