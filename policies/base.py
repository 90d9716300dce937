"""The policy extension point: which candidates of a parent batch go to the GPU."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from gfsim.core.specs import Param, bind_params, format_spec, parse_spec

__all__ = ["Batch", "SearchState", "Decisions", "Policy", "GroupPolicy", "group_bounds",
           "rank_within_groups"]


@dataclass(frozen=True)
class Batch:
    """The candidates of one parent batch, column by column (row i is one candidate).

    ``probs`` are renormalised forecasts (zeros where there is none); ``base_speedup`` is the
    measured speedup, against the reference, of the kernel each forecast is relative to (1.0
    for reference-relative forecasts), so that ``S_ref = S_forecast * base_speedup``.
    ``true_speedup`` (NaN for failures) is given only to policies with ``needs_truth``.
    """

    candidate_ids: tuple[str, ...] | np.ndarray  # a tuple, or an object array of str
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

    def take(self, rows) -> "Batch":
        """The sub-batch of ``rows`` (a slice or an index array)."""
        truth = None if self.true_speedup is None else self.true_speedup[rows]
        if isinstance(self.candidate_ids, np.ndarray):  # object array: C-speed fancy indexing
            ids = self.candidate_ids[rows]
        elif isinstance(rows, slice):
            ids = self.candidate_ids[rows]
        else:
            ids = tuple(map(self.candidate_ids.__getitem__, np.asarray(rows).tolist()))
        return Batch(ids, self.probs[rows], self.has_forecast[rows],
                     self.parse_failed[rows], self.base_speedup[rows], self.bin_edges, truth)


def group_bounds(group: np.ndarray) -> np.ndarray:
    """Start offsets of the runs of equal values in ``group``, plus its length at the end."""
    group = np.asarray(group)
    if len(group) == 0:
        return np.zeros(1, dtype=int)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    return np.r_[starts, len(group)]


def rank_within_groups(group: np.ndarray, score: np.ndarray) -> np.ndarray:
    """0-based rank of each row inside its group by descending score, ties by row order."""
    n = len(score)
    order = np.lexsort((np.arange(n), -np.asarray(score, dtype=float), group))
    bounds = group_bounds(np.asarray(group)[order])
    first = np.repeat(bounds[:-1], np.diff(bounds))
    rank = np.empty(n, dtype=int)
    rank[order] = np.arange(n) - first
    return rank


@dataclass(frozen=True)
class SearchState:
    """What a policy may know about the search when it decides.

    ``best_speedup`` is live (the best measured when the batch decides); ``gpu_evals`` and
    ``budget_left`` are as of the start of the step, so that batches deciding at the same
    instant see the same state whatever the event order.
    """

    search_id: str
    task_id: str
    step: int
    best_speedup: float  # best measured speedup so far (the seed kernel counts)
    gpu_evals: int
    seed: int
    budget_left: dict[str, float] = field(default_factory=dict)  # inf where unbounded
    measure_usd: float = float("nan")  # the engine's estimate of one measurement's USD


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
    - randomness comes only from ``gfsim.core.rng`` keyed by (state.seed, candidate id, ...);
    - a candidate with no usable forecast is measured unless a parameter says otherwise;
    - learned state (``fit``) ends in ``_``;
    - ``state_fields`` names every ``SearchState`` field other than ``best_speedup`` that
      decisions depend on (None: any of them). Engines then decide the batches of several
      searches in one ``decide_groups`` call when those fields agree.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    needs_forecast: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False
    state_fields: ClassVar[tuple[str, ...] | None] = None

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

    def reads_seed(self) -> bool:
        """Whether the replay seed can change this policy's decisions: a policy whose
        ``state_fields`` name ``seed`` (or leave the fields open) may draw keyed random numbers;
        one that reads no seed decides the same at every seed, so replays that differ only in
        the seed are the same replay (``gfsim.simulator.replay.seed_dependence``)."""
        return self.state_fields is None or "seed" in self.state_fields

    def fit(self, calibration: Batch, seed: int) -> "Policy":
        """Learn from a calibration split of forecasts (no outcomes). Default: nothing to learn."""
        return self

    @abstractmethod
    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        """Decide every row of ``batch``."""

    def decide_groups(self, batch: Batch, group: np.ndarray, best: np.ndarray,
                      state: SearchState) -> Decisions:
        """Decide several parent batches in one call (the fast path's hot loop).

        Rows with equal, contiguous ``group`` values form one parent batch; ``best[r]`` is the
        best measured speedup when row r's batch decides; everything else comes from
        ``state``. The result must equal calling ``decide`` batch by batch, which is what this
        default does; policies override it with a vectorised version (the conformance suite
        checks that both agree).
        """
        bounds = group_bounds(group)
        parts = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            sub_state = replace(state, best_speedup=float(best[a]))
            parts.append(self.decide(batch.take(slice(a, b)), sub_state))
        if not parts:
            return Decisions.build(np.zeros(0, bool), np.zeros(0), ())
        return Decisions.build(np.concatenate([d.measure for d in parts]),
                               np.concatenate([d.score for d in parts]),
                               [r for d in parts for r in d.reason])

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.get_params().items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


class GroupPolicy(Policy):
    """A policy written batch-wise in ``decide_groups``; one batch is one group."""

    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        n = len(batch)
        return self.decide_groups(batch, np.zeros(n, int), np.full(n, state.best_speedup), state)

    @abstractmethod
    def decide_groups(self, batch: Batch, group: np.ndarray, best: np.ndarray,
                      state: SearchState) -> Decisions: ...
