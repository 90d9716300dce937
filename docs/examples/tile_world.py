"""A user's own world, in full: a kernel is (log2 tile size, unroll) and a mutation nudges one.

SYNTHETIC, and small on purpose: it shows what gfsim asks of a world
(``gfsim.worlds.protocol``). Try it:

    gfsim synth --world docs/examples/tile_world.py:make_world --driver puct --steps 10 \
        -o tile.jsonl
    gfsim counterfactual --world docs/examples/tile_world.py:make_world --seeds 3 --steps 10

Every draw is keyed by (seed, parent, index) through ``gfsim.core.rng.stream``, never taken
from a shared generator, so a child is the same whenever and in whatever order it is asked for.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from gfsim.core.rng import stream
from gfsim.worlds.landscape import bin_probabilities


@dataclass(frozen=True)
class Task:
    task_id: str
    seed_speedup: float
    reference_runtime_ns: float
    best_tile: int

    def header_entry(self) -> dict:
        return {"task_id": self.task_id, "seed_speedup": self.seed_speedup,
                "reference_runtime_ns": self.reference_runtime_ns,
                "description": "SYNTHETIC tile-size task (docs/examples/tile_world.py)"}


@dataclass(frozen=True)
class Node:
    node_id: str
    task_id: str
    parent_id: str | None
    outcome: str
    speedup: float | None
    code_id: str  # two nodes with the same (tile, unroll) are the same kernel
    tile: int
    unroll: int
    log2_speedup: float


class TileWorld:
    def __init__(self, seed: int = 0):
        self.seed = seed
        rng = stream(seed, "tile-world")
        self.tasks = [Task(f"tile-{i}", 1.0, 50_000.0, int(rng.integers(4, 9)))
                      for i in range(2)]

    def task(self, task_id):
        return next(t for t in self.tasks if t.task_id == task_id)

    def _log2_speed(self, task, tile, unroll) -> float:
        """log2 speedup over the reference, which is the seed kernel (tile 3, unroll 0)."""
        def quality(t, u):
            return -0.4 * (t - task.best_tile) ** 2 + 0.1 * u
        return quality(tile, unroll) - quality(3, 0)

    def root(self, task_id):
        t = self.task(task_id)
        return Node(f"{task_id}-root", task_id, None, "success", t.seed_speedup, "3/0", 3, 0,
                    0.0)

    def child(self, parent, index):
        rng = stream(self.seed, parent.task_id, parent.node_id, index)
        tile, unroll = parent.tile, parent.unroll
        if rng.random() < 0.5:
            tile = min(max(tile + int(rng.choice([-1, 1])), 1), 12)
        else:
            unroll = min(max(unroll + int(rng.choice([-1, 1])), 0), 4)
        log2_s = self._log2_speed(self.task(parent.task_id), tile, unroll)
        fails = tile > 10 or rng.random() < 0.1  # too big a tile never compiles
        speedup = None if fails else round(2.0 ** log2_s * math.exp(0.02 * rng.normal()), 6)
        digest = hashlib.blake2b(f"{parent.node_id}/{index}".encode(), digest_size=6)
        return Node(f"{parent.task_id}-{digest.hexdigest()}", parent.task_id, parent.node_id,
                    "compile_failed" if fails else "success", speedup, f"{tile}/{unroll}",
                    tile, unroll, log2_s)

    def generation(self, node):
        return {"service_s": 20.0}

    def forecast(self, node, forecaster="synthetic", repeat=0):
        rng = stream(self.seed, node.node_id, forecaster, repeat)
        probs = bin_probabilities(node.log2_speedup + 0.5 * rng.normal(), 0.5)
        return {"kind": "forecast", "candidate_id": node.node_id, "forecaster": forecaster,
                "mode": "synthetic", "probs": probs, "parse_failed": False, "latency_s": 30.0,
                "input_tokens": 3000, "output_tokens": 6000, "repeat": repeat}

    def evaluation(self, node):
        task = self.task(node.task_id)
        rec = {"kind": "evaluation", "candidate_id": node.node_id, "outcome": node.outcome,
               "cold_start_s": 30.0, "compile_s": 10.0, "check_s": 0.0, "timing_s": 0.0}
        if node.outcome == "success":
            rec.update(check_s=20.0, timing_s=60.0, speedup=node.speedup,
                       runtime_ns=task.reference_runtime_ns / node.speedup)
        rec["wall_s"] = rec["cold_start_s"] + rec["compile_s"] + rec["check_s"] + rec["timing_s"]
        return rec

    def provenance(self):
        return {"kind": "synthetic", "note": "SYNTHETIC: docs/examples/tile_world.py",
                "seed": self.seed}


def make_world(seed: int = 0) -> TileWorld:
    """What ``--world docs/examples/tile_world.py:make_world`` calls, once per world seed."""
    return TileWorld(seed)
