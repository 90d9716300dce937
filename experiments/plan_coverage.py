"""How often ``gfsim plan``'s intervals hold a new search, on the counterfactual benchmark's
worlds (issue 55).

    python experiments/plan_coverage.py                    # dev split, 6 world seeds
    python experiments/plan_coverage.py --split heldout    # its held-out seeds
    python experiments/plan_coverage.py --worlds h200:softmax,h200:layernorm --steps 10
    python experiments/plan_coverage.py --steps 4 --one-task --seeds 12   # a short run

Per world and world seed: the measure-all log of that world seed (the benchmark's, one search
per task, paper-standard), and a plan from it (``gfsim.tuning.plan.plan``, config ``log`` and
``threshold:0.7@2``) under the benchmark's budget (the log's own spend); the truth is a new
search on the same world (each direct run a fresh replicate of its draws: the sister run), run
under the same budget. A figure's interval covers a direct run when the run lands in it; the
coverage is over world seeds x direct runs, per world, at 50/80/90/95% (the plan's 90% interval
rescaled by its own quantile law to the other levels). Everything but the Kernel Tuner and H200
worlds' runtimes is SYNTHETIC.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

LEVELS = (0.5, 0.8, 0.9, 0.95)
FIGURES = ("usd", "gpu_hours", "wall_s", "best_speedup")
CONFIGS = ("log", "threshold:0.7@2")


def _half_scale(level: float, name: str, m: int) -> float:
    """The plan's half-width per unit sd at ``level`` (its own quantile laws)."""
    from gfsim.simulator.predictive import ERROR_DF, ERROR_SCALE, _t
    from gfsim.tuning.plan import BEST_SCALE, COST_SCALE

    if name == "best_speedup":
        return BEST_SCALE * ERROR_SCALE * _t(0.5 + level / 2, ERROR_DF)
    return COST_SCALE.get(name, 1.0) * _t(0.5 + level / 2, m - 1)


class _OneTask:
    """A world restricted to one of its tasks (``--one-task``): a past run of one search, as
    most real runs are, rather than a log of one search per task pooled by the world model."""

    def __init__(self, world, index: int):
        self._world = world
        self.tasks = [world.tasks[index % len(world.tasks)]]

    def __getattr__(self, name):
        return getattr(self._world, name)


def one_world_seed(world_spec: str, world_seed: int, steps: int, direct: int,
                   new_searches: int, one_task: bool = False) -> list[dict]:
    """Per configuration and figure: the plan's centre and sd, and the direct runs' values."""
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy
    from gfsim.simulator import Budget, build_traces
    from gfsim.simulator.replay import replay_many
    from gfsim.simulator.shape import OwnShape
    from gfsim.tuning.plan import PlanBudget, improving_children, plan, search_figures
    from gfsim.tuning.recommend import parse_config
    from gfsim.worlds.benchmark import _log_of, _search_config
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import run_on_world_many

    name, factory, _ = resolve_world(world_spec)
    world = factory(world_seed)
    if one_task:
        world = _OneTask(world, world_seed)
    log = _log_of(world, world_seed, steps, name)
    model = load_cost_model("serverless-a100")
    std = replay_many(log, [make_policy("all")], model, [0], driver="puct",
                      search=_search_config(steps, 1))[0]
    usd = float(np.mean([s.total.usd for s in std.searches]))
    budget = Budget(usd=usd)
    configs = [parse_config(c, "closed", OwnShape()) for c in CONFIGS]
    got = plan([log], configs, model, PlanBudget(budget, None, f"usd={usd}"),
               fresh_seeds=range(8, 8 + new_searches))
    tasks = [t.task_id for t in world.tasks]
    # the log's evidence: its measured successes per search, its improving children in all
    traces = build_traces(log, model)
    successes = float(np.mean([sum(o == "success" for o in t.outcome) for t in traces]))
    improving = improving_children(traces)["improving_children"]
    out = []
    for text, config, row in zip(CONFIGS, configs, got["configs"]):
        spec, at, f = ("all@1" if text == "log" else text).partition("@")
        shape = _search_config(steps, int(f))
        truth = {k: [] for k in FIGURES}
        for r in range(1, direct + 1):
            runs = run_on_world_many(world, [(t, shape, spec) for t in tasks], seed=r,
                                     budget=budget, capacities=model.capacities, replicate=r,
                                     keep_records=False)
            figs = [search_figures(x, model) for x in runs]
            for k in FIGURES:
                key = "log2_best" if k == "best_speedup" else k
                truth[k].append(float(np.mean([g[key] for g in figs])))
        for k in FIGURES:
            f = row[k]
            centre = f["centre_log2"] if k == "best_speedup" else f["mean"]
            sd = f["sd_log2"] if k == "best_speedup" else f["sd"]
            out.append({"world": name, "world_seed": world_seed, "config": text, "figure": k,
                        "centre": centre, "sd": sd, "truth": truth[k],
                        "m": new_searches, "successes": successes,
                        "improving": improving, "improvement": f.get("improvement")})
    return out


def _inside(r: dict, t: float, level: float) -> bool:
    """Whether ``t`` lies in row ``r``'s plan interval at ``level``."""
    if r["figure"] == "best_speedup" and r.get("improvement") is not None:
        from gfsim.tuning.plan import best_interval

        imp = r["improvement"]
        lo, hi = best_interval(r["centre"], r["sd"] ** 2, level, imp["prior_weight"],
                               imp["seed_log2"], imp["no_gain"])
        return lo <= t <= hi
    z = abs(t - r["centre"]) / r["sd"] if r["sd"] > 0 else (0.0 if t == r["centre"]
                                                            else math.inf)
    return z <= _half_scale(level, r["figure"], r["m"])


def coverage(rows: list[dict]) -> dict:
    """Per world, configuration and figure: the share of direct runs inside the interval at
    each level, and the z-scores' spread (|truth - centre| / sd)."""
    table: dict = {}
    for r in rows:
        key = (r["world"], r["config"], r["figure"])
        for t in r["truth"]:
            table.setdefault(key, []).append([_inside(r, t, lv) for lv in LEVELS])
    out = {}
    for key, hits in table.items():
        out[key] = {lv: float(np.mean([h[i] for h in hits])) for i, lv in enumerate(LEVELS)}
        out[key]["n"] = len(hits)
    return out


def main(argv=None) -> int:
    from gfsim.worlds.family import world_names, world_seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="dev")
    ap.add_argument("--seeds", type=int, default=6, help="world seeds per world")
    ap.add_argument("--worlds", default=None, help="comma-separated (default: the family)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--direct", type=int, default=2, help="direct runs per world seed")
    ap.add_argument("--new-searches", type=int, default=32)
    ap.add_argument("--save", default=None, help="write the rows (gzipped JSON) here")
    ap.add_argument("--one-task", action="store_true",
                    help="each log one search of one task (the world seed picks which), as a "
                         "real run is: no other tasks' searches to pool")
    args = ap.parse_args(argv)
    worlds = args.worlds.split(",") if args.worlds else world_names()
    seeds = world_seeds(args.split, args.seeds) if not args.worlds or \
        all(w in world_names() for w in worlds) else list(range(args.seeds))
    rows = []
    for w in worlds:
        for s in seeds:
            rows += one_world_seed(w, s, args.steps, args.direct, args.new_searches,
                                   args.one_task)
        print(f"{w}: done", file=sys.stderr)
    cov = coverage(rows)
    print(f"{'world':<28}{'config':<18}{'figure':<14}" + "".join(f"{lv:>6.0%}" for lv in LEVELS)
          + "     n")
    for (w, c, f), v in sorted(cov.items()):
        print(f"{w:<28}{c:<18}{f:<14}" + "".join(f"{v[lv]:>6.0%}" for lv in LEVELS)
              + f"{v['n']:>6}")
    for f in FIGURES:
        per_world = [v for (w, c, ff), v in cov.items() if ff == f]
        print(f"all worlds, {f}: " + ", ".join(f"{lv:.0%} {np.mean([v[lv] for v in per_world]):.0%}"
                                               for lv in LEVELS)
              + f"; the 90% interval's width times {needed_scale(rows, f):.2f} would cover 90%")
    from gfsim.tuning.plan import FEW_IMPROVING

    for few in (True, False):  # the best speedup by what the logs showed of improvement
        hits = [[_inside(r, t, lv) for lv in LEVELS] for r in rows
                if r["figure"] == "best_speedup" and (r["improving"] <= FEW_IMPROVING) == few
                for t in r["truth"]]
        if hits:
            shown = ", ".join(f"{lv:.0%} {np.mean([h[i] for h in hits]):.0%}"
                              for i, lv in enumerate(LEVELS))
            print(f"best_speedup, logs with {'<=' if few else '>'} {FEW_IMPROVING} improving "
                  f"children ({len(hits)} runs): {shown}")
    if args.save:
        import gzip
        import json

        with gzip.open(args.save, "wt") as fh:
            json.dump(rows, fh)
    return 0


def needed_scale(rows: list[dict], figure: str, level: float = 0.9) -> float:
    """The factor on the plan's ``level`` half-width at which its intervals would cover the
    direct runs at ``level`` (worlds x configurations weighted by their runs)."""
    ratios = [abs(t - r["centre"]) / (r["sd"] * _half_scale(level, figure, r["m"]))
              for r in rows if r["figure"] == figure and r["sd"] > 0 for t in r["truth"]]
    return float(np.quantile(ratios, level)) if ratios else math.nan


if __name__ == "__main__":
    raise SystemExit(main())
