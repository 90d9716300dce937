"""Forecasts drawn in memory onto a copy of a log (what-if and cost-model forecasters)."""

from __future__ import annotations

import copy

import numpy as np

from gfsim.forecasts.bins import PAPER_EDGES

__all__ = ["attach_records"]


def attach_records(log, recs: list[dict], name: str, mode: str):
    """A copy of ``log`` whose forecasts also hold ``recs`` (forecast records of forecaster
    ``name``, replacing any it had); tokens and latency as the records give them (None: the
    cost model's priors impute them in a replay)."""
    import pandas as pd

    from gfsim.replay_logs.log import PROB_COLUMNS

    rows = pd.DataFrame({
        "candidate_id": [r["candidate_id"] for r in recs], "forecaster": name, "mode": mode,
        "predicted_bin": [r["predicted_bin"] for r in recs],
        "input_tokens": [r.get("input_tokens") for r in recs],
        "output_tokens": [r.get("output_tokens") for r in recs],
        "latency_s": [r.get("latency_s") for r in recs],
        "raw_probability_sum": [r["raw_probability_sum"] for r in recs],
        "parse_failed": [r["parse_failed"] for r in recs],
        "repeat": [r["repeat"] for r in recs], "line": -1})
    probs = np.array([r["probs"] for r in recs], dtype=float).reshape(-1, 8)
    for b, col in enumerate(PROB_COLUMNS):
        rows[col] = probs[:, b]
    out = copy.copy(log)
    base = log.forecasts[log.forecasts["forecaster"] != name]
    out.forecasts = pd.concat([base, rows], ignore_index=True) if len(base) else rows
    out.header = dict(log.header)
    if not len(base):
        out.header.setdefault("forecast_relative_to", "reference")
        out.header.setdefault("forecast_bin_edges", list(PAPER_EDGES))
    return out
