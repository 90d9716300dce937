"""A SYNTHETIC replica of the paper's evaluation set, the population the what-if presets are
fitted to (``experiments/fit_paper_forecasters.py``): 424 correct pairs x 3 repeats, bin-balanced,
log-uniform within a bin, over six tasks."""

from __future__ import annotations

from gfsim.core.rng import keyed_uniforms
from gfsim.forecasts.scoring import forecaster_rows, score_rows
from gfsim.forecasts.whatif import WhatIfForecaster, attach
from gfsim.testing import LogBuilder

__all__ = ["REPLICA_PAIRS", "REPLICA_REPEATS", "REPLICA_TASKS", "replica_log", "replica_scores"]

REPLICA_PAIRS, REPLICA_REPEATS, REPLICA_TASKS = 424, 3, 6
# log2 speedup range of each reference-code bin (the open ones closed at 1/8x and 8x).
_BIN_LOG2 = [(-3.0, -1.5)] + [((b - 4) / 2, (b - 3) / 2) for b in range(2, 8)] + [(2.0, 3.0)]


def replica_log(seed: int = 0):
    """A SYNTHETIC ``pairs`` log shaped like the paper's evaluation set: 424 correct pairs,
    53 per (reference-code) bin, log-uniform within a bin, spread over six tasks."""
    per_bin = REPLICA_PAIRS // 8
    u = keyed_uniforms(seed, [f"pair{i}" for i in range(REPLICA_PAIRS)], "replica")
    tasks = [f"task{t}" for t in range(REPLICA_TASKS)]
    b = LogBuilder({t: 1.0 for t in tasks}, shape="pairs")
    b.header["label_bin_convention"] = "reference-code"
    b.header["log_id"] = f"paper-eval-replica-seed{seed}"
    b.header["provenance"]["note"] = ("SYNTHETIC replica of the paper's evaluation set: 424 "
                                      "correct pairs, 53 per bin, six tasks")
    for i in range(REPLICA_PAIRS):
        lo, hi = _BIN_LOG2[min(i // per_bin, 7)]
        s = 2.0 ** (lo + (hi - lo) * u[i])
        b.candidate(tasks[i % REPLICA_TASKS], 0, speedup=float(s), probs=None)
    return b


def replica_scores(forecaster: WhatIfForecaster, log) -> dict:
    """gfsim's scores of ``forecaster`` on a loaded replica log (all its repeats)."""
    scored = score_rows(forecaster_rows(attach(log, forecaster, REPLICA_REPEATS),
                                        forecaster.name))
    return {"recovered": 100 * scored["recovered_mean"], "ece": scored["ece"],
            "accuracy": scored["accuracy"], "n": scored["n"]}
