"""Forecast-quality metrics, as the paper's reference code defines them (docs/concepts/paper.md).

Every function takes plain arrays: ``probs`` (n, 8) renormalised forecasts (rows of zeros for
parse failures), ``parsed`` (n,) bool, bins numbered 1..8, speedups > 0. Parse failures are
excluded from accuracy, ECE, entropy and forecast error, and count as the uniform forecast in the
full-set Brier, CRPS and NLL. Each docstring says what a number means.
"""

from __future__ import annotations

import math

import numpy as np

from gfsim.forecasts.bins import REPRESENTATIVE_SPEEDUP

__all__ = [
    "BUDGETS",
    "declared_bins",
    "confidence_on_declared",
    "accuracy",
    "off_by_one",
    "ece",
    "reliability",
    "brier",
    "crps",
    "nll",
    "mean_entropy",
    "representative_speedups",
    "expected_speedup",
    "forecast_error",
    "recovered",
    "risk_coverage",
    "aurc",
    "selective_risk_at",
]

BUDGETS = (1, 5, 10, 25, 50)  # percent of candidates measured, the paper's headline budgets
_UNIFORM = np.full(8, 1 / 8)
_BINS = np.arange(1, 9)


def _full_set(probs: np.ndarray, parsed: np.ndarray) -> np.ndarray:
    """Forecasts with parse failures replaced by the uniform distribution."""
    p = np.asarray(probs, dtype=float).copy()
    p[~np.asarray(parsed, bool)] = _UNIFORM
    return p


def declared_bins(probs: np.ndarray, predicted_bin) -> np.ndarray:
    """The bin a forecaster declared (1..8), falling back to the argmax where it declared none."""
    argmax = np.asarray(probs, dtype=float).argmax(axis=1) + 1
    if predicted_bin is None:
        return argmax
    declared = np.asarray(predicted_bin, dtype=float)
    return np.where(np.isnan(declared), argmax, declared).astype(int)


def confidence_on_declared(probs: np.ndarray, pred_bin: np.ndarray) -> np.ndarray:
    """The probability a forecast puts on its declared bin (ECE's confidence; the paper page)."""
    p = np.asarray(probs, dtype=float)
    return p[np.arange(len(p)), np.asarray(pred_bin, int) - 1] if len(p) else np.zeros(0)


def _mean(x: np.ndarray, w: np.ndarray | None) -> float:
    if not len(x):
        return math.nan
    return float(np.average(x, weights=w)) if w is not None else float(np.mean(x))


def accuracy(pred_bin, true_bin, parsed, weights=None) -> float:
    """Share of parsed rows whose declared bin is the true bin (NaN with no parsed row).
    ``weights`` (e.g. inverse propensities) make it a weighted share."""
    parsed = np.asarray(parsed, bool)
    hit = np.asarray(pred_bin)[parsed] == np.asarray(true_bin)[parsed]
    return _mean(hit, None if weights is None else np.asarray(weights)[parsed])


def off_by_one(pred_bin, true_bin, parsed, weights=None) -> float:
    """Share of parsed rows within one bin of the truth."""
    parsed = np.asarray(parsed, bool)
    gap = np.abs(np.asarray(pred_bin)[parsed] - np.asarray(true_bin)[parsed])
    return _mean(gap <= 1, None if weights is None else np.asarray(weights)[parsed])


def _buckets(conf: np.ndarray, n_buckets: int) -> np.ndarray:
    return np.minimum(np.floor(conf * n_buckets), n_buckets - 1).astype(int)


def ece(conf, correct, n_buckets: int = 10, weights=None) -> float:
    """Expected calibration error over ``n_buckets`` equal-width confidence buckets on [0, 1]:
    sum over non-empty buckets of (n_i / N) |mean confidence_i - accuracy_i|; 0 when N = 0.
    Pass parsed rows only. ``weights`` replace counts by weight sums."""
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=float)
    w = np.ones(len(conf)) if weights is None else np.asarray(weights, dtype=float)
    if len(conf) == 0 or w.sum() == 0:
        return 0.0
    b = _buckets(conf, n_buckets)
    total = 0.0
    for k in np.unique(b):
        m = b == k
        gap = abs(np.average(conf[m], weights=w[m]) - np.average(correct[m], weights=w[m]))
        total += w[m].sum() / w.sum() * gap
    return float(total)


def reliability(conf, correct, n_buckets: int = 10) -> list[dict]:
    """Per non-empty bucket: its range, count, mean confidence and accuracy (for plots)."""
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=float)
    b = _buckets(conf, n_buckets) if len(conf) else np.zeros(0, int)
    return [{"lo": k / n_buckets, "hi": (k + 1) / n_buckets, "n": int((b == k).sum()),
             "confidence": float(conf[b == k].mean()), "accuracy": float(correct[b == k].mean())}
            for k in np.unique(b)]


def brier(probs, true_bin, parsed, weights=None) -> float:
    """Halved multi-class Brier score, mean over all rows: 0.5 * sum_b (p_b - y_b)^2, in [0, 1]."""
    p = _full_set(probs, parsed)
    y = np.eye(8)[np.asarray(true_bin, int) - 1] if len(p) else np.zeros((0, 8))
    return _mean(0.5 * ((p - y) ** 2).sum(axis=1), weights)


def crps(probs, true_bin, parsed, weights=None) -> float:
    """Ordinal ranked probability score, mean over all rows:
    (1/7) sum_{k=1..7} (F_k - 1[k >= true])^2 with F_k the forecast's cumulative probability."""
    p = _full_set(probs, parsed)
    cdf = np.cumsum(p, axis=1)[:, :7]
    step = (_BINS[:7][None, :] >= np.asarray(true_bin, int)[:, None]).astype(float)
    return _mean(((cdf - step) ** 2).sum(axis=1) / 7, weights)


def nll(probs, true_bin, parsed, weights=None) -> float:
    """Mean negative log-likelihood of the true bin, -ln(max(p_true, 1e-12)), in nats."""
    p = _full_set(probs, parsed)
    p_true = p[np.arange(len(p)), np.asarray(true_bin, int) - 1] if len(p) else np.zeros(0)
    return _mean(-np.log(np.maximum(p_true, 1e-12)), weights)


def mean_entropy(probs, parsed) -> float:
    """Mean Shannon entropy of parsed forecasts, in nats (ln 8 = 2.079 for uniform)."""
    p = np.asarray(probs, dtype=float)[np.asarray(parsed, bool)]
    if not len(p):
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return float(h.mean())


def representative_speedups(true_speedup, true_bin) -> np.ndarray:
    """A speedup per bin: the geometric centre for bins 2..7; for the open bins 1 and 8 the mean
    true speedup of the rows whose true bin it is (fallbacks 0.125 and 4*sqrt(2))."""
    rep = REPRESENTATIVE_SPEEDUP.copy()
    s = np.asarray(true_speedup, dtype=float)
    tb = np.asarray(true_bin, int)
    for b in (1, 8):
        if (tb == b).any():
            rep[b - 1] = float(s[tb == b].mean())
    return rep


def expected_speedup(probs, rep) -> np.ndarray:
    """sum_b p_b * rep_b: the ranking score behind "speedup recovered"."""
    return np.asarray(probs, dtype=float) @ np.asarray(rep, dtype=float)


def forecast_error(pred_bin, true_speedup, parsed, rep) -> float:
    """Mean |rep(declared bin) - true S| over parsed rows, in linear speedup units."""
    parsed = np.asarray(parsed, bool)
    if not parsed.any():
        return math.nan
    r = np.asarray(rep)[np.asarray(pred_bin, int)[parsed] - 1]
    return float(np.abs(r - np.asarray(true_speedup, float)[parsed]).mean())


def recovered(score, true_speedup, group, budgets=BUDGETS) -> dict[str, float]:
    """Speedup recovered at each budget b (percent): per group (a task), rank rows by ``score``
    (higher first, ties by row order; NaN scores, i.e. parse failures, last), take the top
    ceil(b/100 * N), and divide the best true speedup among them by the best among all N.
    Returns {"1": ..., "5": ...} averaged over groups, plus "mean" over budgets and groups."""
    score = np.asarray(score, dtype=float)
    s = np.asarray(true_speedup, dtype=float)
    group = np.asarray(group, dtype=object)
    per_budget: dict[str, list[float]] = {str(b): [] for b in budgets}
    for g in dict.fromkeys(group.tolist()):
        m = np.flatnonzero(group == g)
        key = np.where(np.isnan(score[m]), -np.inf, score[m])
        order = m[np.argsort(-key, kind="stable")]
        best = s[m].max()
        for b in budgets:
            k = math.ceil(b / 100 * len(m) - 1e-9)
            per_budget[str(b)].append(float(s[order[:k]].max() / best))
    out = {b: float(np.mean(v)) if v else math.nan for b, v in per_budget.items()}
    values = [x for v in per_budget.values() for x in v]
    out["mean"] = float(np.mean(values)) if values else math.nan
    return out


def risk_coverage(scores, correct, parsed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The selective-prediction curve: for each threshold tau in the sorted unique scores of
    parsed rows plus -inf and +inf, a row is predicted iff parsed and score >= tau (abstain when
    score < tau, always on a parse failure); coverage = predicted / all rows, risk = error rate
    among predicted rows (NaN at coverage 0). Returns (thresholds, coverage, risk)."""
    scores = np.asarray(scores, dtype=float)
    parsed = np.asarray(parsed, bool)
    wrong = ~np.asarray(correct, bool)
    n = len(scores)
    s = scores[parsed]
    thresholds = np.unique(np.concatenate([[-np.inf, np.inf], s]))
    if n == 0:
        return thresholds, np.zeros(len(thresholds)), np.full(len(thresholds), np.nan)
    # Rows predicted at tau: parsed scores >= tau. Count them with a sorted array.
    order = np.sort(s)
    w_sorted = wrong[parsed][np.argsort(s, kind="stable")]
    wrong_above = np.concatenate([np.cumsum(w_sorted[::-1])[::-1], [0]])
    first = np.searchsorted(order, thresholds, side="left")
    predicted = len(s) - first
    errors = wrong_above[first]
    with np.errstate(invalid="ignore", divide="ignore"):
        risk = np.where(predicted > 0, errors / np.maximum(predicted, 1), np.nan)
    return thresholds, predicted / n, risk


def aurc(coverage, risk) -> float:
    """Area under the risk-coverage curve by the trapezoid rule over coverage, dropping NaN
    risks (coverage 0) and repeated coverages (the first kept)."""
    c = np.asarray(coverage, dtype=float)
    r = np.asarray(risk, dtype=float)
    ok = ~np.isnan(r)
    c, r = c[ok], r[ok]
    if len(c) < 2:
        return math.nan
    o = np.argsort(c, kind="stable")
    c, r = c[o], r[o]
    keep = np.concatenate([[True], np.diff(c) > 0])
    c, r = c[keep], r[keep]
    return float(np.sum(0.5 * (r[1:] + r[:-1]) * np.diff(c))) if len(c) > 1 else math.nan


def selective_risk_at(coverage, risk, target: float) -> float:
    """Risk at a target coverage, linearly interpolated on the curve (snapped at its ends)."""
    c = np.asarray(coverage, dtype=float)
    r = np.asarray(risk, dtype=float)
    ok = ~np.isnan(r)
    c, r = c[ok], r[ok]
    if not len(c):
        return math.nan
    o = np.argsort(c, kind="stable")
    c, r = c[o], r[o]
    keep = np.concatenate([[True], np.diff(c) > 0])
    return float(np.interp(target, c[keep], r[keep]))
