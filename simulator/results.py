"""Results of a replay: per search, then aggregated over the searches of a log."""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gfsim.core.memory import no_cyclic_gc
from gfsim.cost_models.usage import STAGES, Cost
from gfsim.replay_logs.derived import Lazy

__all__ = ["SearchResult", "ReplayResult", "geometric_mean", "best_at", "first_reaching",
           "no_cyclic_gc", "sum_costs"]


def _columns(searches):
    """The whole log's columns behind ``searches`` (a ``search_columns.SearchList``), or
    None for a plain list of results."""
    return getattr(searches, "columns", None)


def sum_costs(costs) -> Cost:
    """The costs added left to right, as ``Cost() + c1 + c2 + ...`` adds them (to the bit),
    without a ``Cost`` per partial sum (a log of a million searches: 28 million objects)."""
    costs = costs if isinstance(costs, (list, tuple)) else list(costs)
    if len(costs) <= 16:  # a search's stages: a few additions
        out = Cost()
        for c in costs:
            out = out + c
        return out
    # np.cumsum adds left to right (no pairwise summation): its last value is the fold from 0.0
    return Cost(*(float(np.cumsum(np.fromiter(itertools.chain((0.0,), map(get, costs)),
                                              float, len(costs) + 1))[-1])
                  for get in _COST_FIELDS))


_COST_FIELDS = tuple(operator.attrgetter(f) for f in ("seconds", "usd", "joules",
                                                       "usd_imputed"))


def geometric_mean(values) -> float:
    v = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    return float(np.exp(np.log(v).mean())) if len(v) else math.nan


def best_at(anytime: np.ndarray, col: int, spend):
    """The best speedup a search had found once it had spent ``spend`` (column ``col`` of its
    anytime rows: 0 seconds, 1 USD, 2 joules); a scalar or an array of spends. A search that
    finished before keeps its final best."""
    spent = np.maximum.accumulate(anytime[:, col])
    k = np.maximum(np.searchsorted(spent, spend, "right") - 1, 0)
    return anytime[k, 4]


def first_reaching(anytime: np.ndarray, col: int, target: float) -> tuple[float, bool]:
    """(spend at which the best first reached ``target``, whether it did); the search's final
    spend when it never did (censored there)."""
    hit = np.flatnonzero(anytime[:, 4] >= target)
    return (float(anytime[hit[0], col]), True) if len(hit) else (float(anytime[-1, col]),
                                                                 False)


@dataclass
class SearchResult(Lazy):
    """One replayed search. ``stages`` sum to the totals; ``anytime`` is an array of rows
    (seconds, usd, joules, gpu_evals, best_speedup), one at the start and one after each
    measurement."""

    search_id: str
    task_id: str
    seed_speedup: float
    best_speedup: float
    best_candidate_id: str | None
    gpu_evals: int
    candidates: int
    forecasts: int
    unmeasurable: int
    orphans: int
    reached: int
    steps: int
    wall_s: float
    stages: dict[str, Cost]
    stopped_by: str | None
    anytime: np.ndarray  # shape (k, 5)
    table: dict[str, list]
    engine: str = "des"  # "des" (SimPy events) or "fast" (closed form, no capacity binds)
    extra: dict = field(default_factory=dict)  # driver-specific figures (puct: draw sources)
    # The raw best re-measured, and its noise-free logged speedup (simulator.noise); both
    # equal best_speedup when measurements are noise-free.
    confirmed_speedup: float = math.nan
    true_best_speedup: float = math.nan

    def __getattr__(self, name: str):
        # A fast-path result builds its per-candidate table from the replay's columns when
        # first read (``simulator.trace.fast``): most replays of many searches never read it.
        if name == "table":
            source = self.__dict__.pop("_table_source", None)
            if source is not None:
                table = source[0].table(source[1])
                self.__dict__["table"] = table
                return table
        return super().__getattr__(name)

    def __getstate__(self):
        self.table  # noqa: B018 - a copy or a pickle holds the table itself
        return super().__getstate__()

    @property
    def unforecast(self) -> int:
        """Candidates decided with no forecast at all (reason ``unforecast``)."""
        kept = self.__dict__.get("_unforecast")
        if kept is not None and "table" not in self.__dict__:
            return kept
        return sum(1 for r in self.table.get("reason", ()) if r == "unforecast")

    @property
    def trace_hash(self) -> str:
        """A digest of what happened to every candidate: state, action and end time (to the
        microsecond, so that the two engines' rounding differences do not count)."""
        digest = hashlib.sha256()
        tab = self.table
        for row in zip(tab["candidate_id"], tab["state"], tab["action"], tab["measure_end_s"]):
            end = row[3]
            digest.update(repr((*row[:3], None if end != end else round(end, 6))).encode())
        return digest.hexdigest()

    @property
    def total(self) -> Cost:
        stages = self.stages
        kept = self.__dict__.get("_total")  # (stages, their sum): results priced alike share
        if kept is not None and kept[0] is stages:
            return kept[1]
        return sum_costs(stages.values())

    def summary(self) -> dict:
        tot = self.total
        return {
            "search_id": self.search_id,
            "task_id": self.task_id,
            "best_speedup": self.best_speedup,
            "best_candidate_id": self.best_candidate_id,
            "confirmed_speedup": self.confirmed_speedup,
            "true_best_speedup": self.true_best_speedup,
            "gpu_evals": self.gpu_evals,
            "candidates": self.candidates,
            "forecasts": self.forecasts,
            "unmeasurable": self.unmeasurable,
            "orphans": self.orphans,
            "steps": self.steps,
            "wall_s": self.wall_s,
            "usd": tot.usd,
            "joules": tot.joules,
            "stopped_by": self.stopped_by,
            "engine": self.engine,
            **self.extra,
        }


@dataclass
class ReplayResult:
    """A policy replayed over every search of a log (searches run one after another, each with
    its own resources and its own budget). Totals add over searches; ``best_speedup`` is the
    geometric mean over searches of each search's best measured speedup."""

    policy: str
    log: str
    cost_model: str
    seed: int
    searches: list[SearchResult] | Sequence[SearchResult]  # a SearchList: the fast path's columns
    orphans_dropped: list[SearchResult] | Sequence[SearchResult] | None = None
    simulation_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    measure_noise: dict | None = None  # MeasureNoise.as_dict() when measurements were noisy

    @property
    def stages(self) -> dict[str, Cost]:
        columns = _columns(self.searches)
        if columns is not None:
            return columns.stage_sums()
        return {s: sum_costs(r.stages[s] for r in self.searches) for s in STAGES}

    @property
    def total(self) -> Cost:
        return sum_costs(self.stages.values())

    @property
    def best_speedup(self) -> float:
        return self._mean("best_speedup")

    def _mean(self, attr: str) -> float:
        """The geometric mean over searches of a per-search speedup."""
        columns = _columns(self.searches)
        if columns is not None:
            return geometric_mean(columns.floats[attr])
        return geometric_mean(getattr(r, attr) for r in self.searches)

    def _sum(self, attr: str) -> float:
        columns = _columns(self.searches)
        if columns is not None:
            return columns.int_sum(attr) if attr in columns.ints else columns.float_sum(attr)
        return sum(getattr(r, attr) for r in self.searches)

    def figures(self) -> dict:
        """The headline figures (also used for the baseline and the deltas)."""
        stages = self.stages
        tot = sum_costs(stages.values())
        reached = self._sum("reached")
        return {
            "best_speedup": self.best_speedup,
            "confirmed_speedup": self._mean("confirmed_speedup"),
            "true_best_speedup": self._mean("true_best_speedup"),
            "gpu_evals": self._sum("gpu_evals"),
            "candidates": self._sum("candidates"),
            "forecasts": self._sum("forecasts"),
            "unmeasurable": self._sum("unmeasurable"),
            "unforecast": self.unforecast,
            "wall_s": self._sum("wall_s"),
            "usd": tot.usd,
            "joules": tot.joules,
            "usd_imputed_share": tot.usd_imputed / tot.usd if tot.usd > 0 else 0.0,
            "orphan_share": self._sum("orphans") / reached if reached else 0.0,
            "stages": {s: c.as_dict() for s, c in stages.items()},
        }

    @property
    def unforecast(self) -> int:
        """Candidates a forecast-reading policy decided with no forecast at all (reason
        ``unforecast``: no forecaster could run on them); 0 for a policy that reads none."""
        # (a lean result keeps no per-candidate table: nothing to count there)
        columns = _columns(self.searches)
        if columns is not None:
            return int(sum(columns.unforecast.tolist()))
        return sum(s.unforecast for s in self.searches)

    def candidate_table(self) -> pd.DataFrame:
        """Every search's per-candidate table, one after another."""
        return pd.concat([pd.DataFrame(r.table) for r in self.searches], ignore_index=True)

    def trace_hash(self) -> str:
        return hashlib.sha256("".join(r.trace_hash for r in self.searches).encode()).hexdigest()
