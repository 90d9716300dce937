"""Measurement noise (docs/concepts/replay.md): a search keeps the best of noisy measurements.

``--measure-noise cv=0.02`` multiplies every measured runtime by a keyed log-normal factor
exp(sigma z), z ~ N(0, 1), with sigma = sqrt(ln(1 + cv^2)) so that the factor's coefficient of
variation is exactly ``cv`` and its median is 1 (the log's value is the noise-free truth). A
speedup is reference time over candidate time, so the measured speedup is the logged one times
exp(-sigma z). The factor is keyed by (seed, search, candidate, "noise"): two policies that
measure the same candidate see the same measurement (common random numbers).

The search acts on what it measured: its best, its PUCT rewards and the parent speedups of
parent-relative forecasts are all noisy. Because the best is a maximum of noisy values it is
biased upward (the winner's curse), so every result also carries

- ``confirmed_speedup``: the raw best candidate measured once more, with a fresh keyed draw
  (seed, search, candidate, "confirm"); this re-measurement is not charged to any budget;
- ``true_best_speedup``: the log's noise-free speedup of that same candidate.

Without noise all three equal the raw best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gfsim.core.errors import SpecError
from gfsim.core.rng import keyed_uniforms

__all__ = ["MeasureNoise", "parse_noise", "confirm_best"]


@dataclass(frozen=True)
class MeasureNoise:
    """Keyed log-normal noise on measured runtimes with coefficient of variation ``cv``."""

    cv: float

    def __post_init__(self):
        if not (math.isfinite(self.cv) and 0 <= self.cv <= 1):
            raise SpecError(f"`measure_noise`: cv must be in [0, 1], got {self.cv!r}")

    @property
    def sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv**2))

    def factors(self, seed: int, search_id: str, candidate_ids, purpose: str = "noise"
                ) -> np.ndarray:
        """Per candidate: the factor its measured *speedup* is multiplied by."""
        if self.cv == 0 or not len(candidate_ids):
            return np.ones(len(candidate_ids))
        keys = [f"{search_id}\x1f{c}" for c in candidate_ids]
        # Box-Muller on two keyed uniforms: one normal per key, no draw order involved.
        u1 = keyed_uniforms(seed, keys, purpose + ":u1")
        u2 = keyed_uniforms(seed, keys, purpose + ":u2")
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
        return np.exp(-self.sigma * z)

    def as_dict(self) -> dict:
        return {"model": "log-normal on runtime, median 1", "cv": self.cv,
                "sigma_log": self.sigma, "key": "(seed, search, candidate, 'noise')"}


def parse_noise(text: str | None) -> MeasureNoise | None:
    """``cv=0.02`` (or a bare ``0.02``) -> MeasureNoise; None or empty -> no noise."""
    if text is None or not text.strip():
        return None
    from gfsim.core.specs import parse_kv

    items = parse_kv(text, "`measure_noise`")
    if len(items) == 1 and items[0][0] in ("cv", None):
        raw = items[0][1]
    else:
        keys = ", ".join(str(k) for k, _ in items)
        raise SpecError(f"`measure_noise`: expected cv=VALUE, got keys {keys}")
    try:
        cv = float(raw)
    except ValueError:
        raise SpecError(f"`measure_noise`: cv={raw!r} is not a number") from None
    return MeasureNoise(cv)


def confirm_best(result, candidate_ids, true_speedup, noise: MeasureNoise | None,
                 seed: int) -> None:
    """Fill ``result.confirmed_speedup`` and ``result.true_best_speedup`` (see module doc)."""
    best_id = result.best_candidate_id
    if best_id is None:  # nothing beat the seed kernel, which is not re-measured
        result.true_best_speedup = result.confirmed_speedup = result.best_speedup
        return
    i = list(candidate_ids).index(best_id)
    true = float(true_speedup[i])
    result.true_best_speedup = true
    factor = 1.0 if noise is None else float(
        noise.factors(seed, result.search_id, [best_id], purpose="confirm")[0])
    result.confirmed_speedup = true * factor
