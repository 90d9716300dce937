"""The seconds of a log's evaluations, as a replay charges them.

A log records an evaluation's stage seconds (compile, check, timing, cold start), or only the
whole evaluation's (``service_s``, else ``wall_s``: OpenEvolve, ShinkaEvolve and KernelBench
imports), or nothing. ``split_totals`` shares a whole evaluation's seconds, less any stage it
did record, among the stages that ran for its outcome (a compile failure: compile; a runtime
error or a wrong answer: compile and check; otherwise all three) in the proportions of the cost
model's priors: recorded seconds, split, not imputed. Priors fill only what is left.

Cold starts follow the cost model's instance policy (``PresetCostModel.instance_policy``):
reserved GPUs stay warm; a serverless container stays warm ``keep_warm_s`` after its last
evaluation. ``place_cold_starts`` decides, on the log's own schedule (each step's evaluations
after its longest generation, on at most ``capacities.gpus`` containers), which evaluations
find no warm container. Done once per trace, so the event engine and the fast path charge the
same cold starts; a policy that skips the evaluation that started a container saves that cold
start, and closed-loop children copy their template's (the log's rate of cold starts).
"""

from __future__ import annotations

import numpy as np

__all__ = ["split_totals", "place_cold_starts"]

_SPLIT_STAGES = ("compilation", "check", "timing")


def split_totals(outcome: np.ndarray, stages: dict[str, np.ndarray], cold: np.ndarray,
                 total: np.ndarray, priors) -> np.ndarray:
    """Fill, in place, the NaN stage seconds of ``stages`` (compilation, check, timing) of
    each evaluation whose whole seconds ``total`` the log recorded: what is left of the total
    after the stages it recorded (``cold`` too), shared among the stages that ran and lack a
    value in the priors' proportions. Returns which evaluations were split."""
    evaluated = np.not_equal(outcome, None)
    ran = {"compilation": evaluated,
           "check": evaluated & (outcome != "compile_failed"),
           "timing": evaluated & ~np.isin(outcome, ["compile_failed", "runtime_error",
                                                    "incorrect"])}
    prior = {"compilation": priors.compile_s, "check": priors.check_s,
             "timing": priors.timing_s}
    missing = {k: ran[k] & np.isnan(stages[k]) for k in _SPLIT_STAGES}
    known = np.nan_to_num(cold) + sum(np.nan_to_num(stages[k]) for k in _SPLIT_STAGES)
    weights = {k: np.where(missing[k], prior[k], 0.0) for k in _SPLIT_STAGES}
    wsum = sum(weights.values())
    count = sum(m.astype(float) for m in missing.values())
    split = ~np.isnan(total) & (count > 0)
    left = np.maximum(np.nan_to_num(total) - known, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        for k in _SPLIT_STAGES:
            share = np.where(wsum > 0, weights[k] / wsum, missing[k] / count)
            stages[k][:] = np.where(split & missing[k], left * share, stages[k])
    return split


def place_cold_starts(cold_logged: np.ndarray, evaluated: np.ndarray, step: list[int],
                      gen_s: list[float], gpu_s: np.ndarray, bounds, cold_s: float,
                      keep_warm_s: float, gpus: int) -> np.ndarray:
    """Which evaluations start a container (and pay ``cold_s``) under a keep-warm window:
    per search (``bounds``: (start, end) rows, sorted by step), a step's evaluations start
    after its longest generation, in order on at most ``gpus`` containers; a container used
    within ``keep_warm_s`` is warm, and the first evaluations beyond the warm ones start new
    containers. An evaluation whose cold start the log recorded keeps it (``cold_logged``:
    its seconds, NaN where not recorded) and is never charged another."""
    charged = np.zeros(len(evaluated), bool)
    logged = ~np.isnan(cold_logged)
    for a, b in bounds:
        clock, warm = 0.0, []  # warm: the end times of this search's containers
        i = a
        while i < b:
            j = i
            while j < b and step[j] == step[i]:
                j += 1
            start = clock + max(gen_s[i:j])
            warm = sorted(w for w in warm if start - w <= keep_warm_s)
            jobs = [k for k in range(i, j) if evaluated[k]]
            n = min(len(jobs), gpus)
            new = max(0, n - len(warm))
            loads = [0.0] * max(n, 1)
            for r, k in enumerate(jobs):
                cold = cold_logged[k] if logged[k] else (cold_s if r < new else 0.0)
                charged[k] = r < new and not logged[k]
                loads[r % n] += cold + gpu_s[k]
            clock = start + max(loads)
            if n:  # the warmest containers were reused; the oldest unused stay as they were
                warm = (warm[:max(len(warm) - n, 0)] + [clock] * n)[-gpus:]
            i = j
    return charged
