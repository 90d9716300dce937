"""What the simulator replays: one search of a log as flat per-candidate arrays.

``build_traces`` turns a validated ``ReplayLog`` into one ``SearchTrace`` per search, filling
every duration and token count the simulator needs. A value the log did not record comes from
the cost model's priors and is flagged as imputed, so results can say how much rests on them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gfsim.core.errors import GfsimError
from gfsim.cost_models.presets import PresetCostModel
from gfsim.replay_logs.derived import Lazy
from gfsim.simulator.log_seconds import place_cold_starts, split_totals
from gfsim.replay_logs.log import PROB_COLUMNS, ReplayLog, release_unused_memory

__all__ = ["SearchTrace", "TraceColumns", "build_traces", "columns_of", "pick_forecaster",
           "ancestor_speedup",
           "mean_measure_usd"]

# Outcomes after which a stage no longer runs.
_STOPS_BEFORE_CHECK = {"compile_failed"}
_STOPS_BEFORE_TIMING = {"compile_failed", "runtime_error", "incorrect"}


@dataclass
class SearchTrace(Lazy):
    """One search, candidates sorted by (step, seq). Index i is the same candidate everywhere.

    Durations are service seconds; ``*_imputed`` flags say which came from priors, and
    ``stage_split`` which were split from the log's whole-evaluation seconds
    (``simulator.log_seconds``).
    ``steps`` lists, per step, its parent batches as lists of candidate indices.
    """

    search_id: str
    task_id: str
    seed_speedup: float
    forecast_frame: str  # reference | seed | parent
    bin_edges: tuple[float, ...]
    candidate_ids: list[str]
    step: list[int]
    parent: list[int]  # index of the parent in this trace, -1 for a child of the seed kernel
    steps: list[tuple[int, list[list[int]]]]
    gen_failed: list[bool]
    gen_s: list[float]
    gen_in: list[float]
    gen_out: list[float]
    gen_imputed: list[bool]
    has_forecast: np.ndarray
    probs: np.ndarray
    parse_failed: np.ndarray
    fc_s: list[float]
    fc_in: list[float]
    fc_out: list[float]
    fc_imputed: list[bool]
    outcome: list[str | None]  # None: no evaluation in the log
    speedup: list[float]  # NaN unless outcome == success
    stage_s: dict[str, list[float]]  # cold_start, compilation, check, timing
    stage_imputed: dict[str, list[bool]]
    energy_j: list[float | None]  # measured energy of the whole evaluation, if usable
    logged_status: list[str]
    # Per cost stage: (usd, joules, usd_imputed) of each candidate *if* that stage runs for it.
    # Pricing is linear and does not depend on the simulation, so it is done once, vectorised.
    price: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    code_sha256: list[str | None] | None = None  # the code's identity, where the log has it
    # Per candidate: whether its stage seconds were split from the log's whole-evaluation
    # seconds (recorded, not imputed), and those seconds (NaN: none recorded).
    stage_split: list[bool] | None = None
    eval_logged_s: list[float] | None = None

    def __len__(self) -> int:
        view = self.__dict__.get("_view")
        return view[2] - view[1] if view is not None else len(self.candidate_ids)

    def __getattr__(self, name: str):
        # A trace of build_traces is a view of the whole log's columns: a field is sliced
        # from them when first read (a log of 10^5 one-candidate searches held 8 KB of lists
        # and arrays a search otherwise, most of which a replay never reads).
        view = self.__dict__.get("_view")
        if view is not None and name in _VIEW_FIELDS:
            value = view[0].field(name, view[1], view[2])
            self.__dict__[name] = value
            return value
        return super().__getattr__(name)

    def __getstate__(self):
        for name in _VIEW_FIELDS:  # a copy or a pickle holds its own fields, not the log's
            getattr(self, name)
        state = super().__getstate__()
        state.pop("_view", None)
        return state

    @functools.cached_property
    def measure_usd(self) -> float:
        """Mean USD of measuring one of this search's logged candidates (its GPU stages, or CPU
        compile): what a value-of-information policy weighs a measurement against."""
        return mean_measure_usd(self.price, self.outcome)

    @functools.cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """The list columns as numpy arrays, converted once per trace (the fast path's input)."""
        outcome = np.array(self.outcome, dtype=object)
        return {
            "outcome": outcome,
            "gen_failed": np.asarray(self.gen_failed, dtype=bool),
            "speedup": np.asarray(self.speedup, dtype=float),
            "parent": np.asarray(self.parent, dtype=int),
            "generation": np.asarray(self.gen_s, dtype=float),
            "forecasting": np.asarray(self.fc_s, dtype=float),
            **{k: np.asarray(v, dtype=float) for k, v in self.stage_s.items()},
        }


_VIEW_FIELDS = frozenset(
    ("candidate_ids", "step", "parent", "steps", "gen_failed", "gen_s", "gen_in", "gen_out",
     "gen_imputed", "has_forecast", "probs", "parse_failed", "fc_s", "fc_in", "fc_out",
     "fc_imputed", "outcome", "speedup", "stage_s", "stage_imputed", "energy_j",
     "logged_status", "price", "code_sha256", "stage_split", "eval_logged_s"))
# Fields with defaults are class attributes, which would answer before __getattr__ does for a
# view; the generated __init__ keeps its own copy of the defaults.
for _name in ("price", "code_sha256", "stage_split", "eval_logged_s"):
    delattr(SearchTrace, _name)


@dataclass
class TraceColumns:
    """Every candidate of a log in trace order (searches in the order they first appear,
    then step, seq, line), one column each; search i is rows ``starts[i]:ends[i]``. The
    searches' ``SearchTrace`` views slice these, and the fast path reads them whole."""

    lists: dict[str, list]  # the per-candidate list fields
    arrays: dict[str, np.ndarray]  # has_forecast, probs, parse_failed
    stage_s: dict[str, list[float]]
    stage_imputed: dict[str, list[bool]]
    price: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    numeric: dict[str, np.ndarray]  # the fast path's inputs, whole (see SearchTrace.arrays)
    parent_row: np.ndarray  # the parent's row in these columns, -1 for the seed kernel's child
    starts: np.ndarray
    ends: np.ndarray

    def whole(self) -> dict[str, np.ndarray]:
        """The fast path's inputs for every row (``SearchTrace.arrays``'s columns, and the
        candidate ids, steps and parents' rows), converted once."""
        if not self.numeric:
            lists = self.lists
            ids = np.empty(len(lists["candidate_ids"]), dtype=object)
            ids[:] = lists["candidate_ids"]
            self.numeric.update(
                candidate_ids=ids, outcome=np.array(lists["outcome"], dtype=object),
                gen_failed=np.asarray(lists["gen_failed"], dtype=bool),
                speedup=np.asarray(lists["speedup"], dtype=float),
                generation=np.asarray(lists["gen_s"], dtype=float),
                forecasting=np.asarray(lists["fc_s"], dtype=float),
                step=np.asarray(lists["step"], dtype=np.int64),
                **{k: np.asarray(v, dtype=float) for k, v in self.stage_s.items()})
        return self.numeric

    def field(self, name: str, a: int, b: int):
        """The field ``name`` of the search of rows ``a:b``, as build_traces gave it."""
        if name in self.lists:
            return self.lists[name][a:b]
        if name in self.arrays:
            return self.arrays[name][a:b].copy()
        if name == "stage_s":
            return {k: v[a:b] for k, v in self.stage_s.items()}
        if name == "stage_imputed":
            return {k: v[a:b] for k, v in self.stage_imputed.items()}
        if name == "price":
            return {k: tuple(x[a:b].copy() for x in v) for k, v in self.price.items()}
        if name == "parent":
            return [p - a if p >= 0 else -1 for p in self.parent_row[a:b].tolist()]
        if name == "steps":
            return _batched_steps(self.lists["step"][a:b], self.field("parent", a, b))
        raise KeyError(name)


def columns_of(traces) -> tuple[TraceColumns, int, int] | None:
    """(columns, first row, end row) where ``traces`` are consecutive views of one log's
    ``TraceColumns`` (build_traces' searches, in order), else None: what reads every search
    then reads the columns once instead of each search's fields."""
    views = [t.__dict__.get("_view") for t in traces]
    cols = views[0][0] if views and views[0] is not None else None
    if cols is None or any(v is None or v[0] is not cols for v in views):
        return None
    if any(v[1] != u[2] for u, v in zip(views, views[1:])):
        return None
    return cols, views[0][1], views[-1][2]


def peek(trace: SearchTrace, name: str):
    """A field of ``trace``, not kept on a view when it was not already (a read made once)."""
    view = trace.__dict__.get("_view")
    if view is not None and name not in trace.__dict__ and name in _VIEW_FIELDS:
        return view[0].field(name, view[1], view[2])
    return getattr(trace, name)


def _batched_steps(step_col: list[int], parent: list[int]) -> list[tuple[int, list[list[int]]]]:
    """Per step, its parent batches as lists of candidate indices (a batch: the candidates of
    one step with one parent, in order of their first appearance)."""
    steps: list[tuple[int, list[list[int]]]] = []
    for i, s in enumerate(step_col):
        if not steps or steps[-1][0] != s:
            steps.append((s, []))
        batches = steps[-1][1]
        for batch in batches:
            if parent[batch[0]] == parent[i]:
                batch.append(i)
                break
        else:
            batches.append([i])
    return steps


def mean_measure_usd(price: dict, outcome) -> float:
    measured = np.array([o is not None for o in outcome], dtype=bool)
    if not measured.any():
        return float("nan")
    total = sum(np.asarray(price[k][0], dtype=float) for k in
                ("cold_start", "compilation", "check", "timing") if k in price)
    return float(np.mean(np.asarray(total)[measured]))


def ancestor_speedup(parent, i: int, measured_speedup, seed_speedup: float) -> float:
    """For a parent-relative forecast of candidate i: its parent's measured speedup, else the
    nearest measured ancestor's, else the seed kernel's (NaN in ``measured_speedup`` = not
    measured successfully)."""
    p = parent[i]
    while p >= 0:
        s = measured_speedup[p]
        if s == s:  # not NaN
            return float(s)
        p = parent[p]
    return seed_speedup


def pick_forecaster(log: ReplayLog, forecaster: str | None) -> str | None:
    names = log.forecasters()
    if forecaster is None:
        return names[0] if names else None
    if forecaster not in names:
        raise GfsimError(
            f"{log.display_name}: no forecasts by {forecaster!r}; the log has: "
            f"{', '.join(names) or 'none'}"
            " (or draw them: paper:PRESET, synthetic:k=v,... or learned:...)"
        )
    return forecaster


def shared_floats(arr: np.ndarray) -> list[float]:
    """``arr.tolist()`` with one float object per distinct value, bit for bit (so -0.0 and
    NaN stay as they are), where values repeat: a list holds a 24-byte object per float, and
    a column filled from one prior, token counts or NaNs for what did not happen repeat
    most of theirs (a million candidates' traces and results: hundreds of MB)."""
    arr = np.ascontiguousarray(arr, dtype=float)
    if len(arr) < 64:
        return arr.tolist()
    uniq, inverse = np.unique(arr.view(np.int64), return_inverse=True)
    if len(uniq) > 3 * len(arr) // 4:  # mostly distinct: little to share
        return arr.tolist()
    objects = np.empty(len(uniq), dtype=object)
    objects[:] = uniq.view(np.float64).tolist()
    return objects[inverse.reshape(-1)].tolist()


def _fill(values, prior: float) -> tuple[list[float], list[bool]]:
    arr = np.array(pd.to_numeric(pd.Series(values), errors="coerce"), dtype=float)
    missing = np.isnan(arr)
    arr[missing] = prior
    return shared_floats(arr), missing.tolist()


def _evaluation_stages(e, outcome, rows, gen_failed, gen_s, bounds, model: PresetCostModel):
    """Stage seconds and imputed flags of every candidate (``simulator.log_seconds``): the
    log's stage seconds; else its whole evaluation's, split; else the priors; cold starts by
    the model's instance policy. Also which were split, and the log's whole seconds."""
    pri = model.priors
    n = len(outcome)

    def col(name):
        return pd.to_numeric(e[name], errors="coerce").to_numpy(float, copy=True) if name in e \
            else np.full(n, np.nan)

    out = np.array(outcome, dtype=object)
    raw = {"compilation": col("compile_s"), "check": col("check_s"), "timing": col("timing_s")}
    cold_logged = col("cold_start_s")
    total = col("service_s")
    total = np.where(np.isnan(total), col("wall_s"), total)
    split = split_totals(out, raw, cold_logged, total, pri)
    comp, comp_imp = _fill(raw["compilation"], pri.compile_s)
    check, check_imp = _fill(raw["check"], pri.check_s)
    timing, timing_imp = _fill(raw["timing"], pri.timing_s)
    for i, o in enumerate(outcome):
        # A stage after the failure did not run, so no imputed time for it; a logged time
        # is kept (a live measurement that failed its re-check after timing did time).
        if o in _STOPS_BEFORE_CHECK and check_imp[i]:
            check[i], check_imp[i] = 0.0, False
        if o in _STOPS_BEFORE_TIMING and timing_imp[i]:
            timing[i], timing_imp[i] = 0.0, False
    if model.billing != "serverless":
        cold = [0.0] * n  # a warm reserved worker starts no container per candidate
        cold_imp = [False] * n
    elif model.keep_warm_s <= 0:  # a fresh container for every evaluation
        cold, cold_imp = _fill(cold_logged, pri.cold_start_s)
    else:
        evaluated = np.not_equal(out, None) & ~np.asarray(gen_failed, bool)
        gpu_s = np.asarray(check) + np.asarray(timing) + (
            np.asarray(comp) if model.compile_on == "gpu_host" else 0.0)
        charged = place_cold_starts(cold_logged, evaluated, rows["step"].tolist(), gen_s,
                                    gpu_s, list(bounds), pri.cold_start_s, model.keep_warm_s,
                                    model.capacities.gpus)
        arr = np.where(np.isnan(cold_logged), np.where(charged, pri.cold_start_s, 0.0),
                       cold_logged)
        cold, cold_imp = shared_floats(arr), (np.isnan(cold_logged) & charged).tolist()
    stage_s = {"cold_start": cold, "compilation": comp, "check": check, "timing": timing}
    stage_imp = {"cold_start": cold_imp, "compilation": comp_imp, "check": check_imp,
                 "timing": timing_imp}
    return stage_s, stage_imp, split.tolist(), shared_floats(total)


def build_traces(
    log: ReplayLog, model: PresetCostModel, forecaster: str | None = None
) -> list[SearchTrace]:
    """Per-search traces for ``log`` priced under ``model`` (its priors fill gaps)."""
    if log.shape == "pairs":
        raise GfsimError(
            f"{log.display_name}: a 'pairs' log has no search order or parents; use it with "
            "`gfsim score`"
        )
    if not len(log.candidates):
        raise GfsimError(f"{log.display_name}: the log holds no candidates: nothing to replay")
    pri = model.priors
    name = pick_forecaster(log, forecaster)
    cands = log.candidates
    fc = log.forecasts
    if name is not None and len(fc):
        fc = fc[fc["forecaster"] == name].sort_values(["repeat", "line"], kind="stable")
        fc = fc.drop_duplicates("candidate_id", keep="first").set_index("candidate_id")
    else:
        fc = fc.iloc[0:0].set_index("candidate_id")
    ev = log.evaluations.set_index("candidate_id") if len(log.evaluations) else None
    same_gpu = log.header["hardware"].get("device_name") == model.gpu.name
    edges = tuple(log.header.get("forecast_bin_edges") or ())
    frame = log.header.get("forecast_relative_to") or "reference"
    tasks = log.tasks
    run_seed = {r["search_id"]: r.get("seed_speedup") for r in log.runs}

    # Every column is computed once over the whole log, candidates in trace order (searches in
    # the order they first appear, then step, seq, line), and each search takes its slice: a
    # log of many small searches costs what one search of as many candidates does (per-search
    # pandas work cost 6 ms a search, 100 minutes for a million one-candidate searches).
    rank = pd.factorize(cands["search_id"], sort=False)[0]
    rows = cands.assign(_search=rank).sort_values(["_search", "step", "seq", "line"],
                                                  kind="stable")
    ranks = rows["_search"].to_numpy()
    cuts = np.flatnonzero(np.diff(ranks)) + 1
    starts = np.concatenate([[0], cuts]).tolist()
    ends = np.concatenate([cuts, [len(rows)]]).tolist()
    mixed = rows.groupby("_search", sort=True)["task_id"].nunique()
    if (mixed > 1).any():
        search_id = rows["search_id"].iloc[starts[int(np.argmax(mixed.to_numpy() > 1))]]
        raise GfsimError(f"{log.display_name}: search {search_id!r} mixes tasks; one task "
                         "per search")
    # (.tolist() first: iterating an Arrow-backed column costs a Python call per value)
    all_ids = rows["candidate_id"].tolist()
    search_ids = rows["search_id"].iloc[starts].tolist()  # (each search's, not each row's)
    task_ids = rows["task_id"].iloc[starts].tolist()
    parent_ids = rows["parent_id"].tolist()

    gen_s = rows["gen_service_s"].astype(float)
    if log.header.get("duration_basis", "service") == "service":
        derived = rows["gen_completed_s"].astype(float) - rows["gen_started_s"].astype(float)
        gen_s = gen_s.fillna(derived)
    gen_s, gen_s_imp = _fill(gen_s, pri.generation_s)
    gen_in, in_imp = _fill(rows["gen_input_tokens"], pri.gen_input_tokens)
    gen_out, out_imp = _fill(rows["gen_output_tokens"], pri.gen_output_tokens)
    gen_imputed = [a or b or c for a, b, c in zip(gen_s_imp, in_imp, out_imp)]
    gen_failed = rows["gen_failed_reason"].notna().tolist()

    f = fc.reindex(all_ids)
    has_fc = f["forecaster"].notna().to_numpy()
    probs = f[PROB_COLUMNS].to_numpy(dtype=float) if len(f) else np.zeros((0, 8))
    probs = np.nan_to_num(probs, nan=0.0)
    parse_failed = f["parse_failed"].eq(True).to_numpy() & has_fc
    fc_s, fc_s_imp = _fill(f["latency_s"], pri.forecast_s)
    fc_in, fci_imp = _fill(f["input_tokens"], pri.forecast_input_tokens)
    fc_out, fco_imp = _fill(f["output_tokens"], pri.forecast_output_tokens)
    fc_imputed = [a or b or c for a, b, c in zip(fc_s_imp, fci_imp, fco_imp)]
    # Each table copy goes once read: the columns built below are the peak of a large log's
    # replay (a million candidates: the forecast and evaluation copies are 350 MB).
    del f, fc

    e = ev.reindex(all_ids) if ev is not None else pd.DataFrame(index=all_ids, columns=[
        "outcome", "speedup", "cold_start_s", "compile_s", "check_s", "timing_s", "wall_s",
        "service_s", "energy_j"])
    # One object per distinct outcome or status: an Arrow column's .tolist() makes one str per
    # row (60 bytes each, 120 MB per million candidates for these two columns).
    texts: dict[str, str] = {}
    outcome = [texts.setdefault(o, o) if isinstance(o, str) else None
               for o in e["outcome"].tolist()]
    speedup = shared_floats(pd.to_numeric(e["speedup"], errors="coerce").to_numpy(float))
    stage_s, stage_imp, split, logged_s = _evaluation_stages(
        e, outcome, rows, gen_failed, gen_s, zip(starts, ends), model)
    energy = pd.to_numeric(e["energy_j"], errors="coerce").to_numpy(float)
    del e, ev
    energy_j = [None if (not same_gpu or np.isnan(x)) else float(x) for x in energy]
    status = [texts.setdefault(x, x) for x in rows["status"].tolist()]
    code = [c if isinstance(c, str) else None for c in rows["code_sha256"].tolist()]
    step_no: dict[int, int] = {}
    step_all = [step_no.setdefault(s, s) for s in rows["step"].astype(int).tolist()]
    del rows
    price = _price_columns(gen_s, gen_in, gen_out, gen_imputed, fc_s, fc_in, fc_out,
                           fc_imputed, stage_s, stage_imp, energy_j, model)
    cols = TraceColumns(
        lists={"candidate_ids": all_ids, "step": step_all, "gen_failed": gen_failed,
               "gen_s": gen_s, "gen_in": gen_in, "gen_out": gen_out,
               "gen_imputed": gen_imputed, "fc_s": fc_s, "fc_in": fc_in, "fc_out": fc_out,
               "fc_imputed": fc_imputed, "outcome": outcome, "speedup": speedup,
               "energy_j": energy_j, "logged_status": status, "code_sha256": code,
               "stage_split": split, "eval_logged_s": logged_s},
        arrays={"has_forecast": has_fc, "probs": probs, "parse_failed": parse_failed},
        stage_s=stage_s, stage_imputed=stage_imp, price=price,
        numeric={}, parent_row=_parent_rows(all_ids, parent_ids, starts, ends),
        starts=np.asarray(starts, np.int64), ends=np.asarray(ends, np.int64))
    del parent_ids  # (read for the parents' rows alone)
    widest = _widest_steps(cols, step_all)
    traces = []
    for i, (a, b) in enumerate(zip(starts, ends)):
        search_id, task_id = search_ids[i], task_ids[i]
        # A live run measures its seed kernel itself and records it on its run record (merged
        # runs may have measured the same task's seed apart); otherwise the header's.
        seed_speedup = float(run_seed.get(str(search_id)) or tasks[task_id].get("seed_speedup")
                             or 1.0)
        t = SearchTrace.__new__(SearchTrace)
        t.__dict__.update(search_id=str(search_id), task_id=task_id, seed_speedup=seed_speedup,
                          forecast_frame=frame, bin_edges=edges, _view=(cols, a, b),
                          _fast_widest=widest[i])
        traces.append(t)
    release_unused_memory()  # the copies of the log's tables made above
    return traces


def _parent_rows(ids: list, parent_ids: list, starts: list, ends: list) -> np.ndarray:
    """Each candidate's parent's row (within its own search, the last candidate of that id
    there), -1 for a child of the seed kernel; a parent its search lacks raises KeyError."""
    where = {c: r for r, c in enumerate(ids)}
    rows = np.full(len(ids), -1, np.int64)
    search = np.repeat(np.arange(len(starts)), np.subtract(ends, starts))
    for r, p in enumerate(parent_ids):
        if isinstance(p, str):
            q = where.get(p, -1)
            i = search[r]
            if not starts[i] <= q < ends[i]:  # a duplicate id elsewhere: look in the search
                local = {c: k for k, c in enumerate(ids[starts[i]:ends[i]])}
                q = starts[i] + local[p]
            rows[r] = q
    return rows


def _widest_steps(cols: TraceColumns, step_all: list) -> list[int]:
    """Per search, the most candidates one of its steps holds (0 for none)."""
    n = len(step_all)
    if not n:
        return [0] * len(cols.starts)
    step = np.asarray(step_all, np.int64)
    new = np.ones(n, bool)
    new[1:] = step[1:] != step[:-1]
    new[cols.starts] = True
    first = np.flatnonzero(new)
    size = np.diff(np.append(first, n))
    search = np.repeat(np.arange(len(cols.starts)), cols.ends - cols.starts)[first]
    widest = np.zeros(len(cols.starts), np.int64)
    np.maximum.at(widest, search, size)
    return widest.tolist()


def _price_columns(gen_s, gen_in, gen_out, gen_imputed, fc_s, fc_in, fc_out, fc_imputed,
                   stage_s, stage_imputed, energy_j, model: PresetCostModel) -> dict:
    """Per cost stage, (usd, joules, usd_imputed) of each candidate if that stage runs for it.
    Pricing is elementwise, so the whole log's columns are priced at once."""
    gpu_stages = ["cold_start", "check", "timing"] + (
        ["compilation"] if model.compile_on == "gpu_host" else [])
    energy = np.array([np.nan if e is None else e for e in energy_j], dtype=float)
    gpu_s = sum(np.asarray(stage_s[k], dtype=float) for k in gpu_stages)
    price = {
        "generation": model.price_many("generation", gen_s, gen_in, gen_out,
                                       imputed=gen_imputed),
        "forecasting": model.price_many("forecasting", fc_s, fc_in, fc_out,
                                        imputed=fc_imputed),
    }
    for stage, secs in stage_s.items():
        secs = np.asarray(secs, dtype=float)
        if stage in gpu_stages:
            # A measured evaluation energy is shared among its GPU stages by their seconds.
            with np.errstate(invalid="ignore", divide="ignore"):
                share = np.where(gpu_s > 0, energy * secs / gpu_s, np.nan)
        else:
            share = None
        price[stage] = model.price_many(stage, secs, energy_j=share,
                                        imputed=stage_imputed[stage])
    return price
