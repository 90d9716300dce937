"""Recalibrating forecasts out of fold: temperature scaling and isotonic regression.

A calibrator is fitted on the forecasts of *other* folds (tasks, or searches) that have ground
truth and applied to the held-out fold, so no forecast is ever recalibrated with its own
outcome. ``recalibrate_log`` does this for a whole log so that both ``gfsim score`` and every
policy in ``gfsim replay`` can see recalibrated forecasts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import isotonic_regression, minimize_scalar

from gfsim.core.errors import GfsimError
from gfsim.forecasts.metrics import confidence_on_declared, declared_bins

__all__ = ["METHODS", "temperature_scale", "fit_temperature", "fit_isotonic", "apply_isotonic",
           "recalibrate", "recalibrate_log"]

METHODS = ("none", "temperature", "isotonic")


def temperature_scale(probs: np.ndarray, temperature: float) -> np.ndarray:
    """p_b^(1/T), renormalised (softmax of log p / T); zero rows stay zero."""
    p = np.asarray(probs, dtype=float)
    with np.errstate(divide="ignore"):
        logp = np.log(p) / temperature
    logp -= np.max(np.where(np.isfinite(logp), logp, -np.inf), axis=1, keepdims=True)
    q = np.exp(logp)
    q = np.nan_to_num(q)
    s = q.sum(axis=1, keepdims=True)
    return np.divide(q, s, out=np.zeros_like(q), where=s > 0)


def fit_temperature(probs: np.ndarray, true_bin: np.ndarray) -> float:
    """The T in [0.05, 20] that minimises the NLL of the true bins (bounded 1-D search)."""
    rows = np.arange(len(probs))
    tb = np.asarray(true_bin, int) - 1

    def loss(log_t: float) -> float:
        q = temperature_scale(probs, float(np.exp(log_t)))
        return float(-np.log(np.maximum(q[rows, tb], 1e-12)).mean())

    res = minimize_scalar(loss, bounds=(np.log(0.05), np.log(20.0)), method="bounded")
    return float(np.exp(res.x))


def fit_isotonic(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A non-decreasing map from confidence on the declared bin to P(correct), as knots."""
    order = np.argsort(conf, kind="stable")
    x = np.asarray(conf, dtype=float)[order]
    y = isotonic_regression(np.asarray(correct, dtype=float)[order], increasing=True).x
    return x, y


def apply_isotonic(probs: np.ndarray, pred_bin: np.ndarray, knots) -> np.ndarray:
    """Set the declared bin's probability to the isotonic map of its confidence and scale the
    other bins to share the rest in their old proportions (evenly if they had none)."""
    x, y = knots
    p = np.asarray(probs, dtype=float).copy()
    rows = np.arange(len(p))
    cols = np.asarray(pred_bin, int) - 1
    old = p[rows, cols]
    new = np.clip(np.interp(old, x, y), 1e-6, 1 - 1e-6)
    rest_old = 1.0 - old
    scale = np.divide(1.0 - new, rest_old, out=np.zeros_like(new), where=rest_old > 1e-12)
    p *= scale[:, None]
    even = rest_old <= 1e-12
    p[even] = ((1.0 - new[even]) / 7)[:, None]
    p[rows, cols] = new
    return p


def recalibrate(method: str, probs, parsed, predicted_bin, fold, true_bin, has_truth
                ) -> tuple[np.ndarray, dict]:
    """Out-of-fold recalibration of every parsed row; returns new probs and what was fitted.

    ``fold`` labels each row (a task or a search); rows with ``has_truth`` in the other folds
    train the calibrator for a fold. Unparsed rows are left as they are.
    """
    if method not in METHODS:
        raise GfsimError(f"unknown calibration {method!r}; valid: {', '.join(METHODS)}")
    probs = np.asarray(probs, dtype=float)
    out = probs.copy()
    if method == "none":
        return out, {"method": "none"}
    fold = np.asarray(fold, dtype=object)
    parsed = np.asarray(parsed, bool)
    has_truth = np.asarray(has_truth, bool)
    folds = list(dict.fromkeys(fold.tolist()))
    if len(folds) < 2:
        raise GfsimError(f"`calibrate` {method} is fitted out of fold and needs at least two "
                         "tasks or searches; this data has one")
    pred = declared_bins(probs, predicted_bin)
    fitted = {}
    for f in folds:
        train = (fold != f) & parsed & has_truth
        apply = (fold == f) & parsed
        if not train.any() or not apply.any():
            continue
        tb = np.asarray(true_bin)[train].astype(int)
        if method == "temperature":
            t = fit_temperature(probs[train], tb)
            out[apply] = temperature_scale(probs[apply], t)
            fitted[str(f)] = {"temperature": t}
        else:
            correct = pred[train] == tb
            knots = fit_isotonic(confidence_on_declared(probs[train], pred[train]), correct)
            out[apply] = apply_isotonic(probs[apply], pred[apply], knots)
            fitted[str(f)] = {"knots": int(len(knots[0]))}
    return out, {"method": method, "fitted_per_fold": fitted,
                 "note": "fitted on the other folds' forecasts with ground truth, never on the "
                         "rows it is applied to"}


def recalibrate_log(log, method: str, truth):
    """A copy of ``log`` whose forecast probabilities are recalibrated out of fold by task
    (by search when the log has a single task). ``truth`` maps candidate_id -> true bin in each
    forecast's frame (see gfsim.forecasts.scoring.true_bins)."""
    if method not in METHODS:
        raise GfsimError(f"unknown calibration {method!r}; valid: {', '.join(METHODS)}")
    if method == "none":
        return log
    from gfsim.replay_logs.log import PROB_COLUMNS

    fc = log.forecasts
    cands = log.candidates.set_index("candidate_id")
    task = cands["task_id"].reindex(fc["candidate_id"]).to_numpy()
    search = cands["search_id"].reindex(fc["candidate_id"]).to_numpy()
    fold = task if len(set(task.tolist())) > 1 else search
    tb = np.array([truth.get(c, np.nan) for c in fc["candidate_id"]], dtype=float)
    new_probs = np.array(fc[PROB_COLUMNS], dtype=float)  # a copy: it is written below
    for name in dict.fromkeys(fc["forecaster"].tolist()):
        m = (fc["forecaster"] == name).to_numpy()
        probs, _ = recalibrate(method, new_probs[m], ~fc["parse_failed"].to_numpy(bool)[m],
                               fc["predicted_bin"].to_numpy(dtype=float)[m], fold[m],
                               np.nan_to_num(tb[m], nan=1).astype(int), ~np.isnan(tb[m]))
        new_probs[m] = probs
    forecasts = fc.copy()
    forecasts[PROB_COLUMNS] = new_probs
    # The declared bin moves with the distribution only for temperature scaling's argmax, which
    # it preserves; isotonic keeps the declared bin. So predicted_bin stays valid.
    return dataclasses.replace(log, forecasts=forecasts)
