"""What the child sources cost: closed-loop replays of one log under each ``--children`` (not a
test).

    python experiments/bench_children.py [--world nk-heavy] [--seeds 4] [--overgen 4]

Logs a standard search on a built-in world (SYNTHETIC, world seed 0), then replays
``topk:4`` and ``threshold:0.7`` at overgeneration F with every child source, ``--seeds`` seeds
each, and prints the seconds per replay (best of ``--repeat``) and the ratio to the fallback
pool's, measured in the same run. The model's fitting (one ensemble member per seed) is timed
apart: a tuning run pays it once per log and seed, not per trial.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.simulator import Budget
from gfsim.simulator.puct_engine import SEARCH_PRESETS
from gfsim.simulator.replay import cached_traces, replay_many
from gfsim.simulator.world_model import world_model

from gfsim.worlds.benchmark import _log_of
from gfsim.worlds.protocol import resolve_world

SOURCES = ("fallback", "model:crb", "model:gbm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="nk-heavy")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--overgen", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    name, factory, _ = resolve_world(args.world)
    log = _log_of(factory(0), 0, 40, name)
    model = load_cost_model("serverless-a100")
    config = replace(SEARCH_PRESETS["paper-standard"], overgen=args.overgen)
    seeds = list(range(args.seeds))
    traces = cached_traces(log, model, None)
    fit = {}
    for family in ("crb", "gbm"):
        t0 = time.perf_counter()
        wm = world_model(traces, family)
        for q in seeds:
            wm.member(q)
        fit[family] = time.perf_counter() - t0
    rows = {}
    for src in SOURCES:
        best = np.inf
        for _ in range(args.repeat):
            pols = [make_policy(p) for p in ("topk:4", "threshold:0.7") for _ in seeds]
            t0 = time.perf_counter()
            replay_many(log, pols, model, seeds * 2, budget=Budget(), driver="puct",
                        search=config, children=src)
            best = min(best, (time.perf_counter() - t0) / len(pols))
        rows[src] = best
    print(f"world {name} (SYNTHETIC log, world seed 0), F = {args.overgen}, {args.seeds} seeds "
          f"x 2 policies, best of {args.repeat}")
    for src, s in rows.items():
        print(f"  {src:<10} {s:7.3f} s per replay   x{s / rows['fallback']:.1f} the fallback's")
    for family, s in fit.items():
        print(f"  fitting {family}: {s / len(seeds):.2f} s per ensemble member")


if __name__ == "__main__":
    main()
