"""What a new search finds when its past run found almost nothing: the law ``gfsim plan`` adds
to the best speedup's interval for a log with few improving children (issue 55).

    python experiments/fit_improvement_law.py --fit            # dev split (about 70 s)
    python experiments/fit_improvement_law.py --split heldout  # check on the held-out seeds
    python experiments/fit_improvement_law.py --rows experiments/data/improvement_dev.json.gz --fit

Per world of the counterfactual family, world seed and length (2 to 24 steps): the measure-all
log of one search of one task (the world seed picks which, as ``plan_coverage.py --one-task``),
its measured and improving children (``gfsim.tuning.plan.improving_children``), and four sister
runs on the same world (fresh draws), each with its best over its seed (log2) and its
evaluations. It prints, for logs by their improving children, the share of sisters that
improved beside what ``gfsim.tuning.plan.p_improve`` predicted from the log, and the quantiles
of what the improving sisters found; ``--fit`` prints ``IMPROVEMENT_LAW``'s table (the dev
split's sisters of logs with ``FEW_IMPROVING`` or fewer improving children). The rows of both
splits are kept in ``experiments/data/improvement_*.json.gz``. Everything but the Kernel Tuner
worlds' runtimes is SYNTHETIC.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

STEPS = (2, 3, 4, 6, 8, 12, 16, 24)
SISTERS = 4


def gather(split: str, seeds: int, steps: tuple[int, ...]) -> list[dict]:
    from plan_coverage import _OneTask

    from gfsim.cost_models import load_cost_model
    from gfsim.simulator import build_traces
    from gfsim.tuning.plan import improving_children
    from gfsim.worlds.benchmark import _log_of, _search_config
    from gfsim.worlds.family import world_names, world_seeds
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import run_on_world_many

    model = load_cost_model("serverless-a100")
    rows = []
    for name in world_names():
        _, factory, _ = resolve_world(name)
        for ws in world_seeds(split, seeds):
            for n in steps:
                world = _OneTask(factory(ws), ws)
                evidence = improving_children(build_traces(_log_of(world, ws, n, name), model))
                task = world.tasks[0].task_id
                sisters = []
                for r in range(1, SISTERS + 1):
                    got = run_on_world_many(world, [(task, _search_config(n, 1), "all")], seed=r,
                                            capacities=model.capacities, replicate=r,
                                            keep_records=False)[0]
                    sisters.append((math.log2(got.best_speedup / got.seed_speedup),
                                    got.gpu_evals))
                rows.append({"world": name, "world_seed": ws, "steps": n,
                             "measured": evidence["measured_children"],
                             "improving": evidence["improving_children"], "sisters": sisters})
        print(f"{name}: {len(rows)} logs", file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict]) -> None:
    from gfsim.tuning.plan import IMPROVED_LOG2, p_improve

    print("| improving children in the log | logs | sisters improved | predicted (p_improve) "
          "| found, log2: 5% / 50% / 95% |")
    print("|---|---|---|---|---|")
    for lo, hi in ((0, 0), (1, 2), (3, 5), (6, None)):
        sel = [r for r in rows if r["improving"] >= lo and (hi is None or r["improving"] <= hi)]
        if not sel:
            continue
        seen = [g > IMPROVED_LOG2 for r in sel for g, _ in r["sisters"]]
        said = [p_improve(r["measured"], r["improving"], n) for r in sel for _, n in r["sisters"]]
        found = [g for r in sel for g, _ in r["sisters"] if g > IMPROVED_LOG2]
        q = np.quantile(found, (0.05, 0.5, 0.95)) if found else (math.nan,) * 3
        span = f"{lo}" if lo == hi else f"{lo}+" if hi is None else f"{lo}-{hi}"
        print(f"| {span} | {len(sel)} | {np.mean(seen):.0%} | {np.mean(said):.0%} | "
              f"{q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} |")


def fitted_law(rows: list[dict]) -> tuple[float, ...]:
    """What improving sisters of logs with few improving children found (log2 over their
    seed): its quantiles at 0, 0.05, ..., 1."""
    from gfsim.tuning.plan import FEW_IMPROVING, IMPROVED_LOG2

    found = [g for r in rows if r["improving"] <= FEW_IMPROVING for g, _ in r["sisters"]
             if g > IMPROVED_LOG2]
    return tuple(round(float(x), 3) for x in np.quantile(found, np.linspace(0, 1, 21)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="dev")
    ap.add_argument("--seeds", type=int, default=12, help="world seeds per world")
    ap.add_argument("--steps", default=",".join(map(str, STEPS)))
    ap.add_argument("--rows", default=None, help="read the rows from this file instead")
    ap.add_argument("--save", default=None, help="write the rows (gzipped JSON) here")
    ap.add_argument("--fit", action="store_true", help="print IMPROVEMENT_LAW's table")
    args = ap.parse_args(argv)
    if args.rows:
        with gzip.open(args.rows, "rt") as f:
            rows = json.load(f)
    else:
        rows = gather(args.split, args.seeds, tuple(int(s) for s in args.steps.split(",")))
    if args.save:
        with gzip.open(args.save, "wt") as f:
            json.dump(rows, f)
    print(f"{args.split} split, {len(rows)} logs of one search, {SISTERS} sister runs each "
          "(SYNTHETIC worlds but for the Kernel Tuner runtimes)")
    report(rows)
    if args.fit:
        law = fitted_law(rows)
        print(f"IMPROVEMENT_LAW = {law}  # from {len(rows)} logs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
