"""The policy extension point: which candidates of a parent batch go to the GPU."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gfsim.specs import Param, bind_params, format_spec, parse_spec

__all__ = ["Batch", "SearchState", "Decisions", "Policy"]


@dataclass(frozen=True)
class Batch:
    """The candidates of one parent batch, column by column (row i is one candidate).

    ``probs`` are renormalised forecasts (zeros where there is none); ``base_speedup`` is the
    measured speedup, against the reference, of the kernel each forecast is relative to (1.0
    for reference-relative forecasts), so that ``S_ref = S_forecast * base_speedup``.
    ``true_speedup`` (NaN for failures) is given only to policies with ``needs_truth``.
    """

    candidate_ids: tuple[str, ...]
    probs: np.ndarray
    has_forecast: np.ndarray
    parse_failed: np.ndarray
    base_speedup: np.ndarray
    bin_edges: tuple[float, ...]
    true_speedup: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.candidate_ids)

    @property
    def usable(self) -> np.ndarray:
        """Rows with a parsed forecast."""
        return self.has_forecast & ~self.parse_failed


@dataclass(frozen=True)
class SearchState:
    """What a policy may know about the search when it decides."""

    search_id: str
    task_id: str
    step: int
    best_speedup: float  # best measured speedup so far (the seed kernel counts)
    gpu_evals: int
    seed: int
    budget_left: dict[str, float] = field(default_factory=dict)  # inf where unbounded


@dataclass(frozen=True)
class Decisions:
    """One decision per batch row: measure or not, the score it rested on, and why."""

    measure: np.ndarray
    score: np.ndarray
    reason: tuple[str, ...]

    @classmethod
    def build(cls, measure, score, reason) -> "Decisions":
        measure = np.asarray(measure, dtype=bool)
        score = np.asarray(score, dtype=float)
        return cls(measure, score, tuple(reason))


class Policy(ABC):
    """Decides which candidates of a parent batch are measured.

    Contract (tests/test_conformance.py checks it for every registered policy):
    - the constructor stores its parameters unchanged and does no work;
    - ``decide`` is pure: it reads the batch and the state, never mutates them, does no I/O, and
      returns one decision per row; the same inputs give the same decisions;
    - randomness comes only from ``gfsim.rng`` keyed by (state.seed, candidate id, ...);
    - a candidate with no usable forecast is measured unless a parameter says otherwise;
    - learned state (``fit``) ends in ``_``.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    needs_forecast: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    def __init__(self, **values: Any):
        for p in self.params:
            setattr(self, p.name, values.pop(p.name, p.default))
        if values:
            raise TypeError(f"{self.name}: unexpected parameters {sorted(values)}")

    @classmethod
    def from_spec(cls, spec: str) -> "Policy":
        _, pairs = parse_spec(spec)
        return cls(**bind_params(cls.name, cls.params, pairs))

    def get_params(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name) for p in self.params}

    def spec(self) -> str:
        """The canonical spec: the first parameter, then those that differ from their defaults.
        ``make_policy(p.spec())`` rebuilds an equal policy."""
        values = {}
        for i, p in enumerate(self.params):
            v = getattr(self, p.name)
            if v is not None and (i == 0 or v != p.default):
                values[p.name] = v
        return format_spec(self.name, values)

    def fit(self, calibration: Batch, seed: int) -> "Policy":
        """Learn from a calibration split of forecasts (no outcomes). Default: nothing to learn."""
        return self

    @abstractmethod
    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        """Decide every row of ``batch``."""

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.get_params().items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"
