"""How honest is a closed-loop replay? Check it against the landscape the log came from.

For each landscape seed: log the standard search (every child measured) on a synthetic
landscape; then, for a policy and an overgeneration factor F, compare (a) the puct driver
replaying that log with (b) the same policy and F run directly on the landscape. A replay can
only reuse what the log holds, so as F grows it falls back on children borrowed from other
parents in the same speedup bin; the bias of (a) against (b) is reported beside that fallback
share. Everything here is SYNTHETIC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gfsim.core.durable import temporary
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import LogWriter, load_log
from gfsim.simulator.closed.engine import SEARCH_PRESETS
from gfsim.simulator.replay import replay
from gfsim.worlds.landscape import Landscape, LandscapeParams
from gfsim.worlds.synth import build_records
from gfsim.worlds.synth_puct import run_on_landscape

__all__ = ["Comparison", "compare", "summarize"]


@dataclass(frozen=True)
class Comparison:
    """One (seed, task, policy, F): replayed and direct best speedup and GPU evaluations."""

    seed: int
    task_id: str
    policy: str
    overgen: int
    replay_best: float
    direct_best: float
    replay_evals: int
    direct_evals: int
    fallback_share: float

    @property
    def log2_bias(self) -> float:
        return math.log2(self.replay_best) - math.log2(self.direct_best)


def compare(seeds, policies, overgens, *, tasks: int = 2, steps: int = 40,
            cost: str = "serverless-a100") -> list[Comparison]:
    model = load_cost_model(cost)
    rows: list[Comparison] = []
    with temporary("gfsim-compare-") as tmp:
        for seed in seeds:
            records = build_records(seed=seed, candidates=None, tasks=tasks, driver="puct",
                                    steps=steps)
            path = Path(tmp) / f"puct-{seed}.jsonl"
            with LogWriter(path) as w:
                w.append_many(records)
            log = load_log(path)
            land = Landscape(LandscapeParams(), seed, tasks)
            for spec in policies:
                for f in overgens:
                    config = replace(SEARCH_PRESETS["paper-standard"], steps=steps, overgen=f)
                    replayed = replay(log, make_policy(spec), model, seed=seed, driver="puct",
                                      search=config)
                    for r in replayed.searches:
                        direct, _ = run_on_landscape(land, r.task_id, config, spec, seed=seed,
                                                     cost=cost)
                        rows.append(Comparison(
                            seed, r.task_id, spec, f, r.best_speedup, direct.best_speedup,
                            r.gpu_evals, direct.gpu_evals, r.extra["fallback_share"]))
    return rows


def summarize(rows: list[Comparison]) -> list[dict]:
    """Per (policy, F): mean fallback share, mean and spread of the log2 bias (replay minus
    direct), and the mean GPU evaluations of each."""
    out = []
    keys = dict.fromkeys((r.policy, r.overgen) for r in rows)
    for policy, f in keys:
        sel = [r for r in rows if r.policy == policy and r.overgen == f]
        bias = np.array([r.log2_bias for r in sel])
        out.append({
            "policy": policy, "overgen": f, "n": len(sel),
            "fallback_share": float(np.mean([r.fallback_share for r in sel])),
            "log2_bias_mean": float(bias.mean()),
            "log2_bias_se": float(bias.std(ddof=1) / math.sqrt(len(bias))) if len(bias) > 1
            else math.nan,
            "replay_best_geomean": float(2 ** np.mean([math.log2(r.replay_best) for r in sel])),
            "direct_best_geomean": float(2 ** np.mean([math.log2(r.direct_best) for r in sel])),
            "replay_evals": float(np.mean([r.replay_evals for r in sel])),
            "direct_evals": float(np.mean([r.direct_evals for r in sel])),
        })
    return out
