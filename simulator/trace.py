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
from gfsim.replay_logs.log import PROB_COLUMNS, ReplayLog, release_arrow_memory

__all__ = ["SearchTrace", "build_traces", "pick_forecaster", "ancestor_speedup",
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
        return len(self.candidate_ids)

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
            " (or draw them: paper:PRESET, synthetic:k=v,... or costmodel:...)"
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
    search_ids = rows["search_id"].tolist()
    task_ids = rows["task_id"].tolist()
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
    energy_j = [None if (not same_gpu or np.isnan(x)) else float(x) for x in energy]
    status = [texts.setdefault(x, x) for x in rows["status"].tolist()]
    code = [c if isinstance(c, str) else None for c in rows["code_sha256"].tolist()]
    step_no: dict[int, int] = {}
    step_all = [step_no.setdefault(s, s) for s in rows["step"].astype(int).tolist()]
    price = _price_columns(gen_s, gen_in, gen_out, gen_imputed, fc_s, fc_in, fc_out,
                           fc_imputed, stage_s, stage_imp, energy_j, model)
    # One int object per index, shared by parents and batches (28 bytes each otherwise).
    nums = list(range(max((b - a for a, b in zip(starts, ends)), default=0)))

    traces = []
    for a, b in zip(starts, ends):
        search_id, task_id = search_ids[a], task_ids[a]
        ids = all_ids[a:b]
        index = dict(zip(ids, nums))
        parent = [index[p] if isinstance(p, str) else -1 for p in parent_ids[a:b]]
        # A live run measures its seed kernel itself and records it on its run record (merged
        # runs may have measured the same task's seed apart); otherwise the header's.
        seed_speedup = float(run_seed.get(str(search_id)) or tasks[task_id].get("seed_speedup")
                             or 1.0)
        step_col = step_all[a:b]
        steps: list[tuple[int, list[list[int]]]] = []
        for i, s in zip(nums, step_col):
            if not steps or steps[-1][0] != s:
                steps.append((s, []))
            batches = steps[-1][1]
            for batch in batches:
                if parent[batch[0]] == parent[i]:
                    batch.append(i)
                    break
            else:
                batches.append([i])

        traces.append(SearchTrace(
            search_id=str(search_id), task_id=task_id, seed_speedup=seed_speedup,
            forecast_frame=frame, bin_edges=edges, candidate_ids=ids, step=step_col,
            parent=parent, steps=steps, gen_failed=gen_failed[a:b],
            gen_s=gen_s[a:b], gen_in=gen_in[a:b], gen_out=gen_out[a:b],
            gen_imputed=gen_imputed[a:b],
            has_forecast=has_fc[a:b].copy(), probs=probs[a:b].copy(),
            parse_failed=parse_failed[a:b].copy(),
            fc_s=fc_s[a:b], fc_in=fc_in[a:b], fc_out=fc_out[a:b], fc_imputed=fc_imputed[a:b],
            outcome=outcome[a:b], speedup=speedup[a:b],
            stage_s={k: v[a:b] for k, v in stage_s.items()},
            stage_imputed={k: v[a:b] for k, v in stage_imp.items()},
            energy_j=energy_j[a:b], logged_status=status[a:b], code_sha256=code[a:b],
            stage_split=split[a:b], eval_logged_s=logged_s[a:b],
            price={k: tuple(x[a:b].copy() for x in v) for k, v in price.items()},
        ))
    release_arrow_memory()  # the copies of the log's tables made above
    return traces


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
