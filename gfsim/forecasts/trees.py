"""The learned forecaster's boosting loop, compiled: scikit-learn's histogram GBM for its
settings, every tree of a fit in one Numba call.

``learned._Boosted`` fits scikit-learn's ``HistGradientBoostingRegressor`` (squared error, no
early stopping, at most 4 levels) by driving scikit-learn's own histogram builder and splitter
from Python. A search refits at every step, and of a fit's ~18 ms nearly all went to the ~700
Python-level calls into those two classes (a tree's histograms and splits, 100 trees). Here the
same loop runs compiled: the same float32 gradients, the same float64 sums in the same order,
the same split gains (``splitting.pyx``: ``_find_best_bin_to_split_left_to_right``, then
``..._right_to_left`` where a feature has missing values, ties to the lowest bin and feature),
the same stable partition and histogram subtraction, and the root's gradient sum as NumPy's
pairwise sum over feature 0's bins (what ``_Boosted`` took). So the trees are the same, bit
for bit: ``tests/test_learned_batch.py`` fits each way, and scikit-learn's own estimator, and
needs the same trees.

Numba is imported here only, on a first fit; its compiled code is cached on disk.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fit_trees", "available"]

def available() -> bool:
    """Whether the compiled loop can run here (Numba imports)."""
    return _kernel() is not None


def fit_trees(binned: np.ndarray, y: np.ndarray, cuts: list[np.ndarray], has_missing: np.ndarray,
              n_iter: int, depth: int, lr: float, min_leaf: int, base: float):
    """Every tree of one fit as ``_Boosted`` keeps them: (feature, threshold, missing goes
    left) per internal node and value per leaf, each (n_iter, nodes) in heap order."""
    kernel = _kernel()
    nf = binned.shape[1]
    widest = max((len(c) for c in cuts), default=0)
    cut = np.full((nf, max(widest, 1)), np.inf)
    for j, c in enumerate(cuts):
        cut[j, :len(c)] = c
    nbnm = np.array([len(c) + 1 for c in cuts], dtype=np.int64)
    return kernel(np.ascontiguousarray(binned.T), np.ascontiguousarray(y, dtype=np.float64),
                  cut, nbnm, has_missing.astype(np.bool_), int(n_iter), int(depth), float(lr),
                  int(min_leaf), float(base))


_KERNEL: list = []


def _kernel():
    """The compiled fit, or None where Numba is missing (``trees`` is then not imported)."""
    if not _KERNEL:
        try:
            from gfsim.forecasts import _trees_kernel
        except ImportError:
            _KERNEL.append(None)
        else:
            _KERNEL.append(_trees_kernel.fit)
    return _KERNEL[0]
