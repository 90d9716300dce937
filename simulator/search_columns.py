"""A replay of many searches as one table: every per-search figure a column for the whole log.

The fast path (``simulator.trace.fast``) replays a log's searches together and leaves their
figures here, one array per field, rather than one ``SearchResult`` per search (10^6
one-candidate searches: about 700 B and a dozen objects each). ``SearchList`` shows the
columns as the list of results a replay has always held: indexing or iterating builds a
``SearchResult`` for that search, a view that holds its own copy of the figures (writing to it
does not change the replay). What a replay reports over all of its searches (``ReplayResult``'s
figures, the ``--json`` summaries and anytime rows) reads the columns directly, a chunk of
searches at a time, and gives, to the bit, what the per-search results give.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from gfsim.cost_models.usage import STAGES, Cost
from gfsim.simulator.results import SearchResult

__all__ = ["SearchColumns", "SearchList", "SummaryRows", "AnytimeRows", "StopReasonRows",
           "search_extras", "columns_in", "anytime_points", "CHUNK_SEARCHES"]

CHUNK_SEARCHES = 8192  # searches whose JSON is built at once (a few MB of objects)

_INTS = ("gpu_evals", "candidates", "forecasts", "unmeasurable", "orphans", "reached", "steps")
_FLOATS = ("seed_speedup", "best_speedup", "wall_s", "confirmed_speedup", "true_best_speedup")


class SearchColumns:
    """Every search's figures: ``ints`` and ``floats`` (arrays, one value per search), ``ids``
    (search_id, task_id, best_candidate_id, stopped_by: lists), ``stages`` (stage -> rows seconds,
    usd, joules, usd_imputed, coded where few are distinct), ``anytime`` (one array of every
    search's anytime rows, search i's rows ``anytime[heads[i]:ends[i]]``), ``unforecast``
    (candidates decided with no forecast, per search), and ``tables`` (builds search i's
    per-candidate table on first read). Every search ran on one ``engine``, and none has
    driver-specific figures."""

    def __init__(self, *, ints: dict, floats: dict, ids: dict, stages: dict, anytime: tuple,
                 unforecast: np.ndarray, tables, engine: str = "des", traces=None):
        self.ints, self.floats = ints, floats
        self.ids = _Ids(ids, traces)
        self.unforecast, self.tables = unforecast, tables
        self.anytime, self.anytime_heads, self.anytime_ends = anytime
        self.engine = engine
        self._stop_reasons: np.ndarray | None = None
        total = np.zeros((len(unforecast), 4))
        for s in STAGES:  # Cost() + c1 + c2 ...: left to right from zero, as sum_costs adds
            total = total + stages[s]
        self.total = total
        self.stages = {s: _CodedRows(rows) for s, rows in stages.items()}

    def __len__(self) -> int:
        return len(self.unforecast)

    def result(self, i: int):
        """Search i's ``SearchResult`` (its table built when first read)."""
        stages = {s: Cost(*self.stages[s][i].tolist()) for s in STAGES}
        r = SearchResult(
            search_id=self.ids["search_id"][i], task_id=self.ids["task_id"][i],
            seed_speedup=float(self.floats["seed_speedup"][i]),
            best_speedup=float(self.floats["best_speedup"][i]),
            best_candidate_id=self.ids["best_candidate_id"][i],
            **{k: int(self.ints[k][i]) for k in _INTS},
            wall_s=float(self.floats["wall_s"][i]), stages=stages,
            stopped_by=self.ids["stopped_by"][i],
            anytime=self.anytime[self.anytime_heads[i]:self.anytime_ends[i]], table=None,
            engine=self.engine, confirmed_speedup=float(self.floats["confirmed_speedup"][i]),
            true_best_speedup=float(self.floats["true_best_speedup"][i]))
        d = r.__dict__
        del d["table"]
        d["_table_source"] = (self.tables, i)
        d["_unforecast"] = int(self.unforecast[i])
        d["_total"] = (stages, Cost(*self.total[i].tolist()))
        return r

    # -- over every search ----------------------------------------------------------------------
    def stage_sums(self) -> dict[str, Cost]:
        """Each stage summed over the searches, as ``sum_costs`` adds them (to the bit)."""
        return {s: Cost(*(_fold(self.stages[s].column(j)) for j in range(4))) for s in STAGES}

    def int_sum(self, name: str) -> int:
        return int(sum(self.ints[name].tolist()))

    def float_sum(self, name: str) -> float:
        return sum(self.floats[name].tolist())  # Python's own sum, as over the results

    def stopped_by(self) -> set:
        return set(self.ids["stopped_by"])

    def summaries(self, a: int, b: int, stop_reasons: bool = False) -> list[dict]:
        """``SearchResult.summary()`` of searches a..b-1 (and ``stop_reason`` if asked)."""
        ints = {k: self.ints[k][a:b].tolist() for k in _INTS}
        fl = {k: self.floats[k][a:b].tolist() for k in _FLOATS}
        usd, joules = self.total[a:b, 1].tolist(), self.total[a:b, 2].tolist()
        ids = {k: v[a:b] for k, v in self.ids.items()}
        out = []
        reasons = self.stop_reasons()[a:b].tolist() if stop_reasons else None
        for j in range(b - a):
            row = {"search_id": ids["search_id"][j], "task_id": ids["task_id"][j],
                   "best_speedup": fl["best_speedup"][j],
                   "best_candidate_id": ids["best_candidate_id"][j],
                   "confirmed_speedup": fl["confirmed_speedup"][j],
                   "true_best_speedup": fl["true_best_speedup"][j],
                   "gpu_evals": ints["gpu_evals"][j], "candidates": ints["candidates"][j],
                   "forecasts": ints["forecasts"][j], "unmeasurable": ints["unmeasurable"][j],
                   "orphans": ints["orphans"][j], "steps": ints["steps"][j],
                   "wall_s": fl["wall_s"][j], "usd": usd[j], "joules": joules[j],
                   "stopped_by": ids["stopped_by"][j], "engine": self.engine}
            if reasons is not None:
                row["stop_reason"] = reasons[j]
            out.append(row)
        return out

    def stop_reasons(self) -> np.ndarray:
        """``budget.stop_reason`` of every search, as an array of objects: one dict per
        distinct (stopped_by, steps), shared by the searches that have it (read-only)."""
        if self._stop_reasons is None:
            from gfsim.simulator.budget import stop_reason

            codes: dict = {}
            code = np.fromiter((codes.setdefault(s, len(codes)) for s in self.ids["stopped_by"]),
                               np.int64, len(self))
            steps = self.ints["steps"]
            key = code * (int(steps.max(initial=0)) + 1) + steps
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            by = self.ids["stopped_by"]
            made = np.empty(len(first), dtype=object)
            made[:] = [stop_reason(_Stopped(by[i], int(steps[i]))) for i in first.tolist()]
            self._stop_reasons = made[inverse.reshape(-1)]
        return self._stop_reasons

    def anytime_rows(self, a: int, b: int, points: int | None) -> dict[str, list]:
        """Searches a..b-1's anytime rows as lists (``anytime_points``)."""
        heads, ends = self.anytime_heads[a:b].tolist(), self.anytime_ends[a:b].tolist()
        ids = self.ids["search_id"][a:b]
        if points is None or all(e - h <= points for h, e in zip(heads, ends)):
            rows = self.anytime[heads[0]:ends[-1]].tolist() if b > a else []
            base = heads[0] if b > a else 0
            return {sid: rows[h - base:e - base] for sid, h, e in zip(ids, heads, ends)}
        return {sid: anytime_points(self.anytime[h:e], points).tolist()
                for sid, h, e in zip(ids, heads, ends)}


class _CodedRows:
    """Rows of a few floats, one per search, held as their distinct rows and a code per search
    where few are distinct (searches priced alike: 10^6 one-candidate searches have a few
    dozen distinct stage costs); bits kept as they are (-0.0, NaN)."""

    def __init__(self, rows: np.ndarray):
        rows = np.ascontiguousarray(rows, dtype=float)
        self.rows, self.code = rows, None
        if len(rows) < 64:
            return
        bits = rows.view(np.uint64)
        if (bits == bits[0]).all():  # one row for all (a stage no search ran: zeros)
            self.rows, self.code = rows[:1].copy(), np.zeros(len(rows), np.int32)
            return
        mixed = np.zeros(len(rows), np.uint64)
        for j in range(bits.shape[1]):  # a hash of each row's bits, checked below
            mixed ^= bits[:, j] * np.uint64(_ODD[j % len(_ODD)])
        _, first, key = np.unique(mixed, return_index=True, return_inverse=True)
        key = key.reshape(-1)
        if len(first) <= len(rows) // 4 and (bits[first[key]] == bits).all():
            self.rows, self.code = rows[first], key.astype(np.int32)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.rows[i if self.code is None else self.code[i]]

    def column(self, j: int) -> np.ndarray:
        col = self.rows[:, j]
        return col if self.code is None else col[self.code]


_ODD = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)


class _Ids(dict):
    """The columns of strings; ``search_id`` and ``task_id`` taken from the traces when first
    read (a replay printed as a table never reads them)."""

    def __init__(self, ids: dict, traces):
        super().__init__(ids)
        self.traces = traces

    def __missing__(self, name: str) -> list:
        if name not in ("search_id", "task_id") or self.traces is None:
            raise KeyError(name)
        got = self[name] = [getattr(t, name) for t in self.traces]
        return got

    def items(self):
        for name in ("search_id", "task_id"):
            self[name]  # noqa: B018 - every column, as a dict of them would hold
        return super().items()


def _fold(x: np.ndarray) -> float:
    """0.0 + x[0] + x[1] + ...: left to right (np.cumsum does not sum pairwise)."""
    if len(x) == 0:
        return 0.0
    acc = np.empty(len(x) + 1)
    acc[0] = 0.0
    acc[1:] = x
    return float(np.cumsum(acc)[-1])


class _Stopped:
    """What ``budget.stop_reason`` reads of a trace-driver search."""

    extra: dict = {}

    def __init__(self, stopped_by, steps):
        self.stopped_by, self.steps = stopped_by, steps


class SearchList(Sequence):
    """A replay's searches, held as ``SearchColumns``: ``searches[i]`` is a ``SearchResult``
    built from the columns when read (a new view each time). Pickles as a plain list."""

    def __init__(self, columns: SearchColumns):
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.columns.result(j) for j in range(len(self))[i]]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("search index out of range")
        return self.columns.result(i % n)

    def __iter__(self):
        return map(self.columns.result, range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, SearchList)) and list(self) == list(other)

    __hash__ = None

    def __add__(self, other) -> list:  # as lists add: a list of results
        return list(self) + list(other)

    def __radd__(self, other) -> list:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"SearchList({len(self)} searches held as columns)"

    def __reduce__(self):
        return list, (list(self),)


def columns_in(searches) -> SearchColumns | None:
    """The columns behind a replay's searches, or None for a list of results."""
    return searches.columns if isinstance(searches, SearchList) else None


def search_extras(searches):
    """Each search's driver-specific figures (``SearchResult.extra``); searches held as
    columns have none (the trace driver's), and give none without building a result each."""
    if isinstance(searches, SearchList):
        return ()
    return (s.extra or {} for s in searches)


class _Lazy:
    """Built a chunk of searches at a time for ``print_json`` (``json_chunks``), or whole when
    read as a list or dict; equal to what it stands for. Pickles as the plain value."""

    def _whole(self):
        raise NotImplementedError

    def __eq__(self, other) -> bool:
        return self._whole() == (other._whole() if isinstance(other, _Lazy) else other)

    __hash__ = None

    def __reduce__(self):
        return type(self._whole()), (self._whole(),)


class SummaryRows(_Lazy, Sequence):
    """``[r.summary() for r in searches]`` (with each ``stop_reason`` once asked), from the
    columns."""

    def __init__(self, columns: SearchColumns):
        self.columns, self.stop_reasons = columns, False

    def __len__(self) -> int:
        return len(self.columns)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        i = range(len(self))[i]
        return self.columns.summaries(i, i + 1, self.stop_reasons)[0]

    def json_chunks(self, size: int = CHUNK_SEARCHES):
        for a in range(0, len(self), size):
            yield self.columns.summaries(a, min(a + size, len(self)), self.stop_reasons)

    def __iter__(self):
        return itertools.chain.from_iterable(self.json_chunks())

    def _whole(self) -> list:
        return list(self)


class AnytimeRows(_Lazy, Mapping):
    """``{search_id: anytime rows}`` of every search (``anytime_points``), from the
    columns. A log whose search ids repeat keeps the last search's rows, as a dict would."""

    def __init__(self, columns: SearchColumns, points: int | None):
        self.columns, self.points = columns, points
        self._index: dict | None = None

    def _where(self) -> dict:
        if self._index is None:
            self._index = {sid: i for i, sid in enumerate(self.columns.ids["search_id"])}
        return self._index

    def __len__(self) -> int:
        return len(self._where())

    def __iter__(self):
        return iter(self._where())

    def __getitem__(self, sid):
        i = self._where()[sid]
        return self.columns.anytime_rows(i, i + 1, self.points)[sid]

    def unique(self) -> bool:
        return len(self._where()) == len(self.columns)

    def json_chunks(self, size: int = CHUNK_SEARCHES):
        if not self.unique():  # a repeated id: the dict's own order and values
            yield self._whole()
            return
        for a in range(0, len(self.columns), size):
            yield self.columns.anytime_rows(a, min(a + size, len(self.columns)), self.points)

    def _whole(self) -> dict:
        out: dict = {}
        for chunk in (self.columns.anytime_rows(a, min(a + CHUNK_SEARCHES, len(self.columns)),
                                                self.points)
                      for a in range(0, len(self.columns), CHUNK_SEARCHES)):
            out.update(chunk)
        return out


class StopReasonRows(_Lazy, Sequence):
    """``[budget.stop_reason(r) for r in searches]`` from the columns (one dict per distinct
    reason, shared)."""

    def __init__(self, columns: SearchColumns):
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.columns.stop_reasons()[i].tolist()
        return self.columns.stop_reasons()[range(len(self))[i]]

    def json_chunks(self, size: int = CHUNK_SEARCHES):
        reasons = self.columns.stop_reasons()
        for a in range(0, len(self), size):
            yield reasons[a:a + size].tolist()

    def __iter__(self):
        return itertools.chain.from_iterable(self.json_chunks())

    def _whole(self) -> list:
        return list(self)


def anytime_points(anytime: np.ndarray, points: int | None) -> np.ndarray:
    """At most ``points`` rows of an anytime array: the first and last, every row where the
    best improves (they define the curve), evenly spaced ones between; evenly spaced among
    those if they alone are more. ``None``: every row."""
    n = len(anytime)
    if points is None or n <= points:
        return anytime
    best = anytime[:, 4]
    keep = np.union1d(np.flatnonzero(np.r_[True, best[1:] > best[:-1]]), [0, n - 1])
    if len(keep) >= points:
        return anytime[keep[np.unique(np.linspace(0, len(keep) - 1, points).round()
                                      .astype(int))]]
    rest = np.setdiff1d(np.arange(n), keep)
    fill = rest[np.unique(np.linspace(0, len(rest) - 1, points - len(keep)).round().astype(int))]
    return anytime[np.union1d(keep, fill)]
