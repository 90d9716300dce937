"""Logarithms and exponentials that give the same floats on every x86-64 CPU.

numpy's ``log2``, ``log``, ``exp`` and friends dispatch by the CPU: where it has AVX-512, numpy
runs SIMD versions whose results differ from the others' in the last bit for some inputs. A
replay indexes its draws by such values (a world model's features and steps, the nearest
forecast templates), so one bit moved another child into a search, and the same replay gave
other numbers on another machine. These run the C library's functions (Python's ``math``),
one element at a time: meant for arrays of a log's size worked out once, not for hot loops.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["log2", "log2_one", "log", "exp"]


def log2_one(x: float) -> float:
    """``np.log2`` of one float, by the C library: -inf at 0, NaN below 0 and at NaN."""
    if x > 0:
        return math.log2(x)
    return -math.inf if x == 0 else math.nan


def log2(x) -> np.ndarray:
    """``np.log2`` of an array (any shape), element by element through ``log2_one``."""
    return _each(log2_one, x)


def _log_one(x: float) -> float:
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def _exp_one(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _each(fn, x) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    return np.array([fn(v) for v in a.ravel().tolist()], dtype=float).reshape(a.shape)


def log(x) -> np.ndarray:
    """``np.log`` of an array, element by element by the C library (-inf at 0, NaN below)."""
    return _each(_log_one, x)


def exp(x) -> np.ndarray:
    """``np.exp`` of an array, element by element by the C library (inf past its range)."""
    return _each(_exp_one, x)
