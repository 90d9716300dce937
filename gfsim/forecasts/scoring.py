"""``gfsim score``: forecast quality of the forecasters in a log, by the metrics of
``gfsim.forecasts.metrics``. Only candidates with a successful evaluation have a true bin.

The true speedup is taken in each forecast's frame (header ``forecast_relative_to``: the
reference, the seed kernel, or the parent, whose own logged speedup must then exist) and binned
with the header's ``label_bin_convention``; the forecast's bin index is compared with it as the
paper's reference code does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.forecasts import metrics as M
from gfsim.forecasts.bins import speedup_to_bin
from gfsim.forecasts.calibration import recalibrate_log
from gfsim.forecasts.confidence import SCORES
from gfsim.replay_logs.log import PROB_COLUMNS, ReplayLog

__all__ = ["true_speedups", "Rows", "forecaster_rows", "score_rows", "score_log"]

RANKING_SCORE = "expected_speedup"


def true_speedups(log: ReplayLog) -> dict[str, float]:
    """candidate_id -> measured speedup in the forecasts' frame, for successful evaluations
    (and, for parent-relative forecasts, only where the parent's speedup was measured)."""
    ev = log.evaluations
    if not len(ev):
        return {}
    ok = ev[ev["outcome"] == "success"]
    s_ref = dict(zip(ok["candidate_id"], ok["speedup"].astype(float)))
    frame = log.header.get("forecast_relative_to") or "reference"
    if frame == "reference":
        return s_ref
    cands = log.candidates.set_index("candidate_id")
    if frame == "seed":
        seeds = {t: float(v.get("seed_speedup") or 1.0) for t, v in log.tasks.items()}
        return {c: s / seeds[cands.at[c, "task_id"]] for c, s in s_ref.items()}
    out = {}
    for c, s in s_ref.items():
        parent = cands.at[c, "parent_id"]
        if parent is None or parent != parent:  # a child of the seed kernel
            seed = float(log.tasks[cands.at[c, "task_id"]].get("seed_speedup") or 1.0)
            out[c] = s / seed
        elif parent in s_ref:
            out[c] = s / s_ref[parent]
    return out


def true_bins(log: ReplayLog) -> dict[str, int]:
    s = true_speedups(log)
    if not s:
        return {}
    bins = speedup_to_bin(list(s.values()), log.header["label_bin_convention"])
    return dict(zip(s.keys(), bins.tolist()))


@dataclass
class Rows:
    """One forecaster's forecast rows; ``has_truth`` marks those with a true bin."""

    forecaster: str
    modes: list[str]
    candidate_id: np.ndarray
    task: np.ndarray
    repeat: np.ndarray
    probs: np.ndarray
    parsed: np.ndarray
    predicted_bin: np.ndarray  # declared, NaN where none
    true_speedup: np.ndarray  # NaN without ground truth
    true_bin: np.ndarray  # 0 without ground truth

    @property
    def has_truth(self) -> np.ndarray:
        return ~np.isnan(self.true_speedup)

    def subset(self, m: np.ndarray) -> "Rows":
        return Rows(self.forecaster, self.modes, self.candidate_id[m], self.task[m],
                    self.repeat[m], self.probs[m], self.parsed[m], self.predicted_bin[m],
                    self.true_speedup[m], self.true_bin[m])


def forecaster_rows(log: ReplayLog, name: str) -> Rows:
    fc = log.forecasts[log.forecasts["forecaster"] == name]
    task_of = dict(zip(log.candidates["candidate_id"], log.candidates["task_id"]))
    truth = true_speedups(log)
    ids = fc["candidate_id"].to_numpy(dtype=object)
    s = np.array([truth.get(c, np.nan) for c in ids], dtype=float)
    tb = np.zeros(len(ids), int)
    have = ~np.isnan(s)
    if have.any():
        tb[have] = speedup_to_bin(s[have], log.header["label_bin_convention"])
    return Rows(
        forecaster=name, modes=sorted(set(fc["mode"])), candidate_id=ids,
        task=np.array([task_of[c] for c in ids], dtype=object),
        repeat=fc["repeat"].to_numpy(dtype=int), probs=fc[PROB_COLUMNS].to_numpy(dtype=float),
        parsed=~fc["parse_failed"].to_numpy(dtype=bool),
        predicted_bin=fc["predicted_bin"].to_numpy(dtype=float), true_speedup=s, true_bin=tb,
    )


def score_rows(rows: Rows, score: str = "maxprob", weights: np.ndarray | None = None) -> dict:
    """Every metric for rows that have ground truth (the caller filters)."""
    n = len(rows.true_bin)
    parsed = rows.parsed
    pred = M.declared_bins(rows.probs, rows.predicted_bin)
    tb = rows.true_bin
    correct = (pred == tb) & parsed
    conf = M.confidence_on_declared(rows.probs, pred)
    rep = M.representative_speedups(rows.true_speedup, tb)
    exp_s = np.where(parsed, M.expected_speedup(rows.probs, rep), np.nan)
    # Recovered: per task and repeat (a repeat is one full pass of a forecaster over the data).
    group = np.array([f"{t}#{r}" for t, r in zip(rows.task, rows.repeat)], dtype=object)
    rec = M.recovered(exp_s, rows.true_speedup, group) if n else {}
    sel = SCORES[score](rows.probs) if n else np.zeros(0)
    _, cov, risk = M.risk_coverage(sel, correct, parsed)
    w_parsed = None if weights is None else weights[parsed]
    return {
        "forecaster": rows.forecaster,
        "modes": rows.modes,
        "n": int(n),
        "n_parsed": int(parsed.sum()),
        "accuracy": M.accuracy(pred, tb, parsed, weights),
        "off_by_one": M.off_by_one(pred, tb, parsed, weights),
        "ece": M.ece(conf[parsed], correct[parsed], weights=w_parsed),
        "brier": M.brier(rows.probs, tb, parsed, weights),
        "crps": M.crps(rows.probs, tb, parsed, weights),
        "nll": M.nll(rows.probs, tb, parsed, weights),
        "entropy": M.mean_entropy(rows.probs, parsed),
        "forecast_error": M.forecast_error(pred, rows.true_speedup, parsed, rep),
        "recovered": {k: v for k, v in rec.items() if k != "mean"},
        "recovered_mean": rec.get("mean", math.nan),
        "ranking_score": RANKING_SCORE,
        "selective_score": score,
        "aurc": M.aurc(cov, risk),
        "selective_risk_at_50": M.selective_risk_at(cov, risk, 0.5),
        "representative_speedups": rep.tolist(),
        "_curves": {"reliability": M.reliability(conf[parsed], correct[parsed]),
                    "coverage": cov.tolist(), "risk": risk.tolist()},
    }


def _propensity_weights(all_rows: Rows) -> tuple[np.ndarray, float]:
    """Inverse propensity of having ground truth, estimated per declared-bin stratum: p =
    share of the stratum's forecast rows that have ground truth. Returns the weights of the rows
    with ground truth and the share of rows in strata where nothing was measured."""
    pred = M.declared_bins(all_rows.probs, all_rows.predicted_bin)
    stratum = np.where(all_rows.parsed, pred, 0)
    have = all_rows.has_truth
    w = np.zeros(len(pred))
    uncovered = 0
    for k in np.unique(stratum):
        m = stratum == k
        p = have[m].mean()
        if p > 0:
            w[m] = 1.0 / p
        else:
            uncovered += int(m.sum())
    return w[have], uncovered / max(len(pred), 1)


def _one(log: ReplayLog, rows: Rows, score: str, by_task: bool) -> dict:
    truth = rows.has_truth
    out = score_rows(rows.subset(truth), score)
    selection = log.header.get("selection")
    if selection:
        weights, uncovered = _propensity_weights(rows)
        ipw = score_rows(rows.subset(truth), score, weights=weights)
        out["selection"] = {
            "rule": selection,
            "coverage": float(truth.mean()) if len(truth) else math.nan,
            "note": "a logged surrogate chose which candidates were measured; plain metrics "
                    "describe the measured ones only",
        }
        out["ipw"] = {k: ipw[k] for k in ("accuracy", "off_by_one", "ece", "brier", "crps",
                                           "nll")}
        out["ipw"]["propensity"] = ("share of forecast rows with ground truth, per declared-bin "
                                    "stratum")
        out["ipw"]["uncovered_share"] = uncovered
    if by_task:
        out["by_task"] = {t: score_rows(rows.subset(truth & (rows.task == t)), score)
                          for t in dict.fromkeys(rows.task[truth].tolist())}
    return out


def score_log(log: ReplayLog, *, forecaster: str | None = None, task: str | None = None,
              by_task: bool = False, score: str = "maxprob", calibrate: str = "none"
              ) -> list[dict]:
    """One metrics object per forecaster (or only ``forecaster``)."""
    names = log.forecasters()
    if not names:
        raise GfsimError(f"{log.display_name}: the log has no forecasts to score")
    if forecaster is not None:
        if forecaster not in names:
            raise GfsimError(f"{log.display_name}: no forecasts by {forecaster!r}; the log has: "
                             f"{', '.join(names)}")
        names = [forecaster]
    if score not in SCORES:
        raise GfsimError(f"unknown score {score!r}; valid: {', '.join(SCORES)}")
    if task is not None and task not in log.tasks:
        raise GfsimError(f"{log.display_name}: no task {task!r}; the log has: "
                         f"{', '.join(log.tasks)}")
    scored = recalibrate_log(log, calibrate, true_bins(log)) if calibrate != "none" else log
    results = []
    for name in names:
        rows = forecaster_rows(scored, name)
        if task is not None:
            rows = rows.subset(rows.task == task)
        if not rows.has_truth.any():
            raise GfsimError(f"{log.display_name}: forecaster {name!r} has no forecast of a "
                             "candidate with a successful evaluation, so nothing has a true bin")
        out = _one(scored, rows, score, by_task)
        out["label_bin_convention"] = log.header["label_bin_convention"]
        out["forecast_relative_to"] = log.header.get("forecast_relative_to")
        if calibrate != "none":
            before = forecaster_rows(log, name)
            if task is not None:
                before = before.subset(before.task == task)
            b = score_rows(before.subset(before.has_truth), score)
            out["calibration"] = {"method": calibrate, "fold_by": "task (search if one task)",
                                  **{f"{k}_before": b[k] for k in ("ece", "brier", "nll",
                                                                   "accuracy")},
                                  **{f"{k}_after": out[k] for k in ("ece", "brier", "nll",
                                                                    "accuracy")}}
        results.append(out)
    return results
