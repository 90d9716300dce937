"""Scores of a forecast distribution over the 8 bins (docs/concepts/paper.md).

All functions take probabilities of shape (n, 8) (rows renormalised) and return shape (n,).
"""

from __future__ import annotations

import numpy as np

__all__ = ["maxprob", "negentropy", "top2_margin", "expected_bin_index", "SCORES"]

_LN8 = float(np.log(8.0))


def maxprob(p: np.ndarray) -> np.ndarray:
    return np.asarray(p, dtype=float).max(axis=1)


def negentropy(p: np.ndarray) -> np.ndarray:
    """1 - H(p)/ln 8: 1 for a one-hot forecast, 0 for the uniform one."""
    p = np.asarray(p, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return 1.0 - h / _LN8


def top2_margin(p: np.ndarray) -> np.ndarray:
    """Largest minus second-largest probability."""
    p = np.asarray(p, dtype=float)
    if p.shape[0] == 0:
        return np.zeros(0)
    top2 = np.partition(p, -2, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


_BIN_NUMBERS = np.arange(1, 9, dtype=float)


def expected_bin_index(p: np.ndarray) -> np.ndarray:
    """sum_b b * p_b with bins numbered 1..8: the reference's top-k ranking score. Summed row by
    row (not a matrix product, whose rounding depends on how many rows it is given), so a
    forecast scores the same whichever batch it is in."""
    return (np.asarray(p, dtype=float) * _BIN_NUMBERS).sum(axis=1)


SCORES = {"maxprob": maxprob, "negentropy": negentropy, "margin": top2_margin}
