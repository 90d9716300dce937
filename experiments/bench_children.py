"""What the child sources cost: closed-loop replays of one log under each ``--children`` (not a
test).

    python experiments/bench_children.py [--world nk-heavy | --log synthetic-puct-v1]
        [--seeds 4] [--overgen 4] [--repeat 3]

Replays, with every child source, either a standard search logged on a built-in world
(``--world``: SYNTHETIC, world seed 0; ``topk:4`` and ``threshold:0.7``, no budget) or a shipped
log (``--log``: ``threshold:0.97`` under a $40 budget, each search in its own shape), at
overgeneration F, ``--seeds`` seeds each, and prints the CPU seconds per replay (best of
``--repeat``; CPU seconds, not wall, so that other work on a shared machine weighs less) and
the ratio to the fallback pool's, measured in the same run, the sources taken in turn within
each repeat. The target (issue 39) is a model-children search at most ``TARGET`` times the
fallback's. The model's fitting (one ensemble member per seed) is timed apart: a tuning run
pays it once per log and seed, not per trial.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.simulator import Budget
from gfsim.simulator.closed.engine import SEARCH_PRESETS
from gfsim.simulator.replay import cached_traces, replay_many
from gfsim.simulator.shape import OwnShape
from gfsim.simulator.world_model import world_model

from gfsim.replay_logs import open_log
from gfsim.worlds.benchmark import _log_of
from gfsim.worlds.protocol import resolve_world

SOURCES = ("fallback", "model:crb", "model:gbm")
TARGET = 1.5  # model children at most 1.5x the fallback pool's cost per search


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="nk-heavy")
    ap.add_argument("--log", default=None, help="a shipped log instead of --world's")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--overgen", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = load_cost_model("serverless-a100")
    seeds = list(range(args.seeds))
    if args.log:
        log = open_log(args.log)
        what = f"log {args.log}, threshold:0.97, $40"
        policies, budget = ("threshold:0.97",), Budget(usd=40)
        config = OwnShape(overgen=args.overgen)
    else:
        name, factory, _ = resolve_world(args.world)
        log = _log_of(factory(0), 0, 40, name)
        what = f"world {name} (SYNTHETIC log, world seed 0), topk:4 and threshold:0.7"
        policies, budget = ("topk:4", "threshold:0.7"), Budget()
        config = replace(SEARCH_PRESETS["paper-standard"], overgen=args.overgen)
    traces = cached_traces(log, model, None)
    fit = {}
    for family in ("crb", "gbm"):
        t0 = time.process_time()
        wm = world_model(traces, family)
        for q in seeds:
            wm.member(q)
        fit[family] = time.process_time() - t0

    def once(src: str) -> float:
        pols = [make_policy(p) for p in policies for _ in seeds]
        t0 = time.process_time()
        replay_many(log, pols, model, seeds * len(policies), budget=budget, driver="puct",
                    search=config, children=src, orphans_dropped=False)
        return (time.process_time() - t0) / len(pols)

    rows = dict.fromkeys(SOURCES, np.inf)
    for _ in range(args.repeat):
        for src in SOURCES:
            rows[src] = min(rows[src], once(src))
    print(f"{what}, F = {args.overgen}, {args.seeds} seeds x {len(policies)} "
          f"{'policy' if len(policies) == 1 else 'policies'}, best of {args.repeat}")
    for src, s in rows.items():
        ratio = s / rows["fallback"]
        verdict = "" if src == "fallback" else \
            f"   {'within' if ratio <= TARGET else 'OVER'} the {TARGET:g}x target"
        print(f"  {src:<10} {s:7.3f} CPU s per replay   x{ratio:.2f} the fallback's{verdict}")
    for family, s in fit.items():
        print(f"  fitting {family}: {s / len(seeds):.2f} CPU s per ensemble member")


if __name__ == "__main__":
    main()
