"""Speedup bins: the two conventions of the paper and its reference code (docs/concepts/paper.md).

Speedup S = reference runtime / candidate runtime. Bins are numbered 1..8 in the logs and
0..7 in arrays here.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = [
    "N_BINS",
    "PAPER_EDGES",
    "REFERENCE_CODE_EDGES",
    "CONVENTIONS",
    "REPRESENTATIVE_SPEEDUP",
    "edges_for",
    "speedup_to_bin",
    "bin_cdf_above",
    "expected_log2_gain",
    "gaussian_bins",
]

N_BINS = 8
# Prompt convention: bin 1 is S <= 0.25, bin 8 is S > 4; intervals closed on the right.
PAPER_EDGES = (0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0)
# Reference-code convention: bin = clamp(floor(2*log2 S) + 4, 1, 8); closed on the left.
REFERENCE_CODE_EDGES = tuple(float(2.0 ** (k / 2)) for k in range(-2, 5))
CONVENTIONS = ("paper", "reference-code")

# Geometric centres of the paper's bins 2..7; the open bins 1 and 8 use the stated fallbacks.
REPRESENTATIVE_SPEEDUP = np.array(
    [0.125, 2**-1.5, 2**-0.75, 2**-0.25, 2**0.25, 2**0.75, 2**1.5, 4 * 2**0.5]
)


def edges_for(convention: str) -> tuple[float, ...]:
    if convention == "paper":
        return PAPER_EDGES
    if convention == "reference-code":
        return REFERENCE_CODE_EDGES
    raise ValueError(f"unknown bin convention {convention!r}; valid: {', '.join(CONVENTIONS)}")


def speedup_to_bin(speedup, convention: str = "reference-code") -> np.ndarray:
    """Bin numbers 1..8 for speedups under a convention. S <= 0 is an error."""
    s = np.asarray(speedup, dtype=float)
    if np.any(~(s > 0)):
        raise ValueError("speedup must be > 0 to have a bin")
    if convention == "reference-code":
        # Exact integer arithmetic on log2 avoids 0.7071 rounding at the edges.
        bins = np.floor(2.0 * np.log2(s)) + 4
        return np.clip(bins, 1, 8).astype(int)
    if convention == "paper":
        # Closed on the right: S == edge belongs to the lower bin.
        return np.searchsorted(np.asarray(PAPER_EDGES), s, side="left").astype(int) + 1
    raise ValueError(f"unknown bin convention {convention!r}; valid: {', '.join(CONVENTIONS)}")


def bin_cdf_above(
    probs: np.ndarray,
    edges,
    threshold: np.ndarray,
    bottom_span: float = 4.0,
    top_span: float = 4.0,
) -> np.ndarray:
    """P(S > threshold) for forecasts ``probs`` (n, 8) over bins with ``edges`` (7 values).

    Mass is spread log-uniformly inside each bin. The open bins need a stated prior: bin 1 is
    taken as log-uniform on [edges[0] / bottom_span, edges[0]] and bin 8 on
    [edges[-1], edges[-1] * top_span] (defaults: a factor of 4, i.e. two octaves, on each side).
    ``threshold`` is one speedup per row, in the same frame as the bins.
    """
    p, lo, hi, t = _in_log2(probs, edges, threshold, bottom_span, top_span)
    # Fraction of each bin's interval lying above t, clipped to [0, 1].
    frac_above = (hi - t) / (hi - lo)
    np.clip(frac_above, 0.0, 1.0, out=frac_above)
    return np.clip(np.einsum("ij,ij->i", p, frac_above), 0.0, 1.0)


def _in_log2(probs, edges, threshold, bottom_span, top_span):
    """Forecasts as (n, 8), the bins' log2 bounds, and thresholds as a log2 column."""
    p = np.atleast_2d(np.asarray(probs, dtype=float))
    lo, hi = _log_bounds(tuple(edges), float(bottom_span), float(top_span))
    t = np.log2(np.maximum(np.asarray(threshold, dtype=float), 1e-300)).reshape(-1, 1)
    return p, lo, hi, t


@functools.lru_cache(maxsize=16)
def _log_bounds(edges: tuple, bottom_span: float, top_span: float):
    """log2 lower and upper bounds of the 8 bins, the open ones closed by the stated prior."""
    e = np.log2(np.asarray(edges, dtype=float))
    lo = np.concatenate([[e[0] - np.log2(bottom_span)], e])
    hi = np.concatenate([e, [e[-1] + np.log2(top_span)]])
    return lo, hi


def expected_log2_gain(
    probs: np.ndarray,
    edges,
    threshold: np.ndarray,
    bottom_span: float = 4.0,
    top_span: float = 4.0,
) -> np.ndarray:
    """E[max(0, log2 S - log2 threshold)] under forecasts ``probs`` (n, 8): the expected gain in
    log2 speedup over ``threshold`` (one per row), with the same log-uniform-within-bin model
    and open-bin priors as ``bin_cdf_above``."""
    p, lo, hi, t = _in_log2(probs, edges, threshold, bottom_span, top_span)
    width = hi - lo
    # Per bin: X uniform on [lo, hi]; E[max(0, X - t)] is the mean gap when t is below the bin,
    # a triangle when t is inside it, and nothing above it.
    below = (lo + hi) / 2 - t
    inside = np.clip(hi - t, 0.0, None) ** 2 / (2 * width)
    gain = np.where(t <= lo, below, np.where(t >= hi, 0.0, inside))
    return np.einsum("ij,ij->i", p, gain)


def gaussian_bins(centre, width: float, edges=PAPER_EDGES) -> np.ndarray:
    """(n, 8) mass of Gaussians in log2 speedup (``centre``, one ``width``) in each of the bins
    between ``edges``."""
    from scipy.special import ndtr

    centre = np.asarray(centre, dtype=float)
    log_edges = np.log2(np.asarray(edges, dtype=float))
    cdf = ndtr((log_edges[None, :] - centre[:, None]) / width)
    cdf = np.hstack([np.zeros((len(centre), 1)), cdf, np.ones((len(centre), 1))])
    return np.clip(np.diff(cdf, axis=1), 0.0, None)
