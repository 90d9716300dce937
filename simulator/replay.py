"""Replay a log under a policy and a cost model, beside the measure-everything baseline."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import numpy as np
from gfsim.cost_models.presets import Capacities, PresetCostModel
from gfsim.cost_models.usage import Cost
from gfsim.policies.base import Batch, Policy
from gfsim.policies.registry import make_policy
from gfsim.replay_logs.log import ReplayLog
from gfsim.simulator.budget import Budget
from gfsim.simulator.seconds_report import seconds_note
from gfsim.simulator.children import INVENTED, INVENTED_HEADROOM
from gfsim.simulator.drivers import evolution_note, is_closed_loop, selection_for
from gfsim.simulator.trace.engine import SearchSimulation
from gfsim.simulator.trace.fast import (FastPathUnsafe, LogTraces, fast_path_blockers, log_span,
                                      run_fast_many)
from gfsim.simulator.noise import MeasureNoise
from gfsim.simulator.pipeline import DEFAULT_PIPELINE, Pipeline
from gfsim.simulator.closed.engine import (
    EXTRAPOLATED_SHARE,
    PuctSimulation,
    SearchConfig,
)
from gfsim.simulator.closed.fast import fast_search, run_lockstep, run_puct_fast
from gfsim.simulator.results import ReplayResult, SearchResult, no_cyclic_gc
from gfsim.simulator.search_columns import (AnytimeRows, SummaryRows, anytime_points,
                                            columns_in, search_extras)
from gfsim.simulator.traces import SearchTrace, build_traces
from gfsim.simulator.settings import DRIVERS, ENGINES, ReplaySettings
from gfsim.simulator.world_model import child_sources

from gfsim.core.caches import enabled, keep, kept, set_enabled
from gfsim.core.errors import GfsimError

__all__ = ["ENGINES", "DRIVERS", "ReplaySettings", "cached_traces", "calibration_batch",
           "replay", "replay_many", "replay_with_baseline",
           "replay_seeds", "comparison_json", "simulate_search", "simulate_puct",
           "seed_dependence", "seed_free_reason", "SEED_FREE_DRAWS", "best_evidence"]


def _check_shape(log: ReplayLog, policy: Policy, traces: list[SearchTrace]) -> None:
    if policy.needs_forecast:
        if log.shape == "config_space":
            raise GfsimError(f"{log.display_name}: a config_space log allows only policies that "
                             f"need no forecast (all, random, oracle); got {policy.name!r}")
        span = log_span(traces)
        if not (span[0].arrays["has_forecast"][span[1]:span[2]].any() if span else
                any(t.has_forecast.any() for t in traces)):
            raise GfsimError(f"{log.display_name}: policy {policy.name!r} reads forecasts and "
                             "the log has none")


def calibration_batch(traces: list[SearchTrace]) -> Batch:
    """Every forecast of the log, the data a policy's ``fit`` calibrates on (e.g. coverage)."""
    span = log_span(traces)
    if span is not None:  # the log's columns, not each search's fields
        cols, a, b = span
        return Batch(candidate_ids=tuple(cols.lists["candidate_ids"][a:b]),
                     **{k: cols.arrays[k][a:b].copy() for k in ("probs", "has_forecast",
                                                                "parse_failed")},
                     base_speedup=np.ones(b - a), bin_edges=traces[0].bin_edges)
    return Batch(
        candidate_ids=tuple(itertools.chain.from_iterable(t.candidate_ids for t in traces)),
        probs=np.concatenate([t.probs for t in traces]),
        has_forecast=np.concatenate([t.has_forecast for t in traces]),
        parse_failed=np.concatenate([t.parse_failed for t in traces]),
        base_speedup=np.ones(sum(len(t) for t in traces)),
        bin_edges=traces[0].bin_edges if traces else (),
    )


_RESULT_CLASSES = (SearchResult, Cost)
_TRACES: dict = {}  # content key -> traces; a few entries per process
_TRACES_MAX = 8


def trace_cache(on: bool) -> None:
    """Turn every cache on or off in this process (a benchmark's baseline), the trace table
    emptied (``gfsim.core.caches``; ``caches_off`` for a block)."""
    set_enabled(on)
    _TRACES.clear()


def _content_key(log: ReplayLog) -> tuple:
    """What traces are built from: the log's identity and its forecasts' probabilities (which
    a what-if or recalibrated copy changes). Hashed once per log object and kept on it while
    its tables are the same objects (a copy with other forecasts is another key)."""
    import hashlib

    fc = log.forecasts
    known = kept(log, "_trace_key")
    if known is not None and known[0] is fc and known[1] is log.candidates:
        return known[2]
    from gfsim.replay_logs import derived

    source = derived.source_of(log)
    if source is not None:  # the tables as loaded from these bytes: their digest names them
        key = (str(log.path), log.header.get("log_id"), len(log.candidates), len(fc),
               "sha256:" + source[0])
        keep(log, "_trace_key", (fc, log.candidates, key))
        return key
    digest = hashlib.blake2b(digest_size=16)
    if len(fc):
        from gfsim.replay_logs.log import PROB_COLUMNS

        digest.update(fc[PROB_COLUMNS].to_numpy(dtype=float).tobytes())
        digest.update("\x1f".join(map(str, fc["forecaster"].tolist())).encode())
    key = (str(log.path), log.header.get("log_id"), len(log.candidates), len(fc),
           digest.hexdigest())
    keep(log, "_trace_key", (fc, log.candidates, key))
    return key


def cached_traces(log: ReplayLog, model: PresetCostModel, forecaster: str | None):
    """``build_traces`` once per (log content, cost model, forecaster) in this process: many
    seeds and policies replay the same log (tuning: thousands of replays), and traces depend
    on none of them. The key hashes what traces are built from (``_content_key``), so a
    changed log is never served stale traces. Engines only read traces."""
    key = (*_content_key(log), repr(model), forecaster)
    traces = _TRACES.get(key) if enabled() else None
    if traces is None:
        traces = LogTraces(_stored_traces(log, model, forecaster))
        if enabled():
            if len(_TRACES) >= _TRACES_MAX:
                _TRACES.pop(next(iter(_TRACES)))
            _TRACES[key] = traces
    return traces


def _stored_traces(log: ReplayLog, model: PresetCostModel, forecaster: str | None):
    """``build_traces``, kept beside the log's table cache between processes
    (``replay_logs.derived``: keyed by the log's bytes, the cost model, the forecaster and
    gfsim's code) when the log was loaded through that cache."""
    from gfsim.replay_logs import derived

    key = {"model": repr(model), "forecaster": forecaster}
    store = enabled() and _worth_keeping(log)
    if store:
        traces = derived.load(log, "traces", key, (SearchTrace,))
        if traces is not None:
            return traces
    traces = build_traces(log, model, forecaster)
    if store:
        derived.store(log, "traces", key, traces, (SearchTrace,), lazy={"SearchTrace": _LAZY})
    return traces


# A log of more searches than this, averaging fewer candidates than _KEEP_MIN_MEAN each, keeps
# no derived traces or replays: their encoding costs a few hundred microseconds a search, more
# than building them again (10^5 one-candidate searches: 60 s to store, 8 s to build).
_KEEP_MAX_SEARCHES = 1000
_KEEP_MIN_MEAN = 64


def _worth_keeping(log: ReplayLog) -> bool:
    """Whether traces and replays of ``log`` are kept beside its table cache: not for a log of
    many small searches (the table cache still serves its load)."""
    cands = log.candidates
    known = kept(log, "_keep_derived")
    if known is None or known[0] is not cands:
        searches = int(cands["search_id"].nunique()) if len(cands) else 0
        known = keep(log, "_keep_derived", (cands, searches <= _KEEP_MAX_SEARCHES
                                            or len(cands) >= _KEEP_MIN_MEAN * searches))
    return known[1]


# What a replay whose results are kept does not read of its traces: decoded when read.
_LAZY = ("gen_failed", "gen_s", "gen_in", "gen_out", "gen_imputed", "fc_s", "fc_in", "fc_out",
         "fc_imputed", "outcome", "speedup", "stage_s", "stage_imputed", "energy_j",
         "logged_status", "steps")  # (not price, code_sha256: fields with defaults)


def _shared_lists(traces):
    """The trace lists a search result's table holds as they are (ids, steps, parents), by
    name both ways: a kept replay refers to them instead of holding copies."""
    names = [(i, f) for i in range(len(traces)) for f in ("candidate_ids", "step", "parent")]
    lists = {(i, f): getattr(traces[i], f) for i, f in names}
    return {id(v): k for k, v in lists.items()}, lists


def _replay_key(policy: Policy, model, forecaster, seed, caps, budget, pipeline, engine,
                noise, orphans_dropped) -> dict | None:
    """What a trace-driver replay of one log depends on besides the log, or None when the
    policy is not rebuilt exactly by its spec (a class the registry does not make from it):
    its results are then not kept."""
    try:
        twin = make_policy(policy.spec())
    except Exception:  # noqa: BLE001 - a spec the registry cannot rebuild: no key
        return None
    if type(twin) is not type(policy):
        return None
    return {"policy": policy.spec(),
            "policy_class": f"{type(policy).__module__}.{type(policy).__qualname__}",
            "model": repr(model), "forecaster": forecaster, "seed": repr(seed),
            "capacities": repr(caps), "budget": repr(budget), "pipeline": repr(pipeline),
            "engine": engine, "noise": repr(noise), "orphans_dropped": bool(orphans_dropped)}


def simulate_search(trace: SearchTrace, policy: Policy, model: PresetCostModel,
                    caps: Capacities, budget: Budget, seed: int, drop_orphans: bool,
                    pipeline: Pipeline = DEFAULT_PIPELINE, engine: str = "auto",
                    noise: MeasureNoise | None = None):
    """One search through the fast path where it applies (``auto``), else the event engine."""
    return simulate_searches([trace], policy, model, caps, budget, seed, drop_orphans,
                             pipeline, engine, noise)[0]


def simulate_searches(traces: list[SearchTrace], policy: Policy, model: PresetCostModel,
                      caps: Capacities, budget: Budget, seed: int, drop_orphans: bool,
                      pipeline: Pipeline = DEFAULT_PIPELINE, engine: str = "auto",
                      noise: MeasureNoise | None = None) -> list:
    """``simulate_search`` for every trace, in order: the searches the fast path covers run
    together in lockstep (a log of many small searches costs about what one search of as
    many candidates does), the others, and any it finds a tie in, on the event engine."""
    if engine not in ENGINES:
        raise GfsimError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    out: list = [None] * len(traces)
    fast = []
    if engine != "des":
        for j, (t, blocker) in enumerate(zip(traces, fast_path_blockers(traces, policy, model,
                                                                        caps, budget))):
            if blocker is None:
                fast.append(j)
            elif engine == "fast":
                raise GfsimError(f"the fast path cannot replay search {t.search_id!r}: "
                                 f"{blocker}")
    if fast:
        got = run_fast_many(traces if len(fast) == len(traces) else [traces[j] for j in fast],
                            policy, model, caps, budget, seed, drop_orphans, pipeline, noise)
        if len(fast) == len(traces) and columns_in(got) is not None:
            columns_in(got).engine = "fast"
            return got  # every search in one table (simulator.search_columns)
        for j, result in zip(fast, got):
            if isinstance(result, FastPathUnsafe):
                if engine == "fast":
                    raise GfsimError(f"the fast path cannot replay search "
                                     f"{traces[j].search_id!r}: {result}")
                continue
            result.engine = "fast"
            out[j] = result
    for j, t in enumerate(traces):
        if out[j] is None:
            out[j] = SearchSimulation(t, policy, model, caps, budget, seed, drop_orphans,
                                      pipeline, noise).run()
    return out


def simulate_puct(source, config: SearchConfig, policy: Policy, model: PresetCostModel,
                  capacities: Capacities, budget: Budget, seed: int, *, engine: str = "auto",
                  **kwargs):
    """One closed-loop search: the fast path (``auto`` or ``fast``; it covers every setting)
    or the SimPy engine (``des``), which it reproduces."""
    if engine not in ENGINES:
        raise GfsimError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    if engine == "des":
        return PuctSimulation(source, config, policy, model, capacities, budget, seed,
                              **kwargs).run()
    return run_puct_fast(source, config, policy, model, capacities, budget, seed, **kwargs)




def replay(log: ReplayLog, policy: Policy, model: PresetCostModel, *, seed: int = 0,
           settings: ReplaySettings | None = None, **changes) -> ReplayResult:
    """Replay every search of ``log``.

    ``driver="trace"`` keeps the logged order (open loop): orphans are kept, and (if asked) the
    run is repeated with orphans dropped so both can be reported; ``engine``: ``auto`` uses the
    closed-form fast path wherever no capacity binds, ``des`` always the SimPy engine, ``fast``
    insists on it. ``driver="puct"`` re-runs the reference search (closed loop) with ``search``
    (default paper-standard), drawing children from the log (``simulator.children``); its
    ``engine`` is the SimPy one (``des``) or the event loop without SimPy that reproduces it
    (``auto`` or ``fast``: ``simulator.closed.fast``, for any capacity or budget).
    ``noise``: keyed log-normal noise on every measurement (``simulator.noise``).
    ``settings``: every other setting (``simulator.settings.ReplaySettings``; None: the
    defaults), with ``changes`` (settings by name) applied to it.
    """
    return replay_many(log, [policy], model, [seed], settings, **changes)[0]


def replay_many(log: ReplayLog, policies: list[Policy], model: PresetCostModel, seeds,
                settings: ReplaySettings | None = None, **changes) -> list[ReplayResult]:
    """``replay`` for several seeds, ``policies[k]`` (fitted here) with ``seeds[k]``; each
    result is what ``replay`` gives for that seed alone. The puct fast path runs every search
    of every seed in lockstep, so that a step's decisions take one policy call.

    ``learning``: a ``LearnedForecaster`` whose forecasts the policy reads, learned from what each
    replay measured, not from the whole log (``gfsim.simulator.learning``): by iterating to a
    fixed point under the trace driver, inside the search under the puct driver (the log's
    own prequential forecasts, attached if it lacks them, serve only to fit a policy).

    ``search`` (puct): a ``SearchConfig`` for every search, or each search in its own shape
    (None, or ``simulator.shape.OwnShape`` with fields overridden). A search that PUCT does
    not reproduce is simulated on the log's evidence, and refused (``simulate`` False) where
    that evidence is too thin to invent children from (``simulator.shape``).

    ``settings`` (``simulator.settings.ReplaySettings``; None: the defaults) holds every
    setting named here; ``changes`` (settings by name) are applied to it."""
    settings = ReplaySettings.of(settings, **changes)
    learning, driver, engine = settings.learning, settings.driver, settings.engine
    if learning is not None and driver == "trace" and policies and policies[0].needs_forecast:
        return _replay_learning(log, policies, model, seeds, settings)
    budget, capacities, forecaster = settings.budget, settings.capacities, settings.forecaster
    orphans_dropped, pipeline, search = (settings.orphans_dropped, settings.pipeline,
                                         settings.search)
    noise, children, simulate = settings.noise, settings.children, settings.simulate
    seeds = list(seeds)
    if len(policies) != len(seeds):
        raise GfsimError("replay_many: one policy per seed")
    started = time.perf_counter()
    caps = capacities or model.capacities
    learns = learning is not None and is_closed_loop(driver) and any(p.needs_forecast
                                                                 for p in policies)
    if learns and forecaster != learning.name:
        from gfsim.forecasts.learned import attach_learned

        log, forecaster = attach_learned(log, learning), learning.name
    traces = cached_traces(log, model, forecaster)
    calibration = calibration_batch(traces)
    for policy, seed in zip(policies, seeds):
        _check_shape(log, policy, traces)
        policy.fit(calibration, seed)
    del calibration  # every forecast again (90 MB per million candidates): not kept meanwhile

    if is_closed_loop(driver):
        if log.shape != "trajectory":
            raise GfsimError(f"{log.display_name}: the {driver} driver needs a trajectory log "
                             f"(parents and children); this one is {log.shape!r}")
        selections = [selection_for(log, t.search_id, driver) for t in traces]
        shapes, repro = _closed_loop_shapes(log, traces, search, model, children, simulate,
                                            selections)
        make_source = child_sources(children, traces)
        make_source = _whatif_children(make_source, log, forecaster, policies)
        if learns:
            from gfsim.simulator.learning import LearningChildren, log_meta_of

            meta_of = log_meta_of(log)

        def one(t, config, policy, seed, selection):
            source = make_source(t)
            if learns and policy.needs_forecast:  # one model per search, learning in it
                source = LearningChildren(source, learning, meta_of, model)
            return dict(source=source, config=config, policy=policy, model=model,
                        capacities=caps, budget=budget, seed=seed, search_id=t.search_id,
                        task_id=t.task_id, forecast_frame=t.forecast_frame,
                        bin_edges=t.bin_edges, pipeline=pipeline, noise=noise,
                        selection=selection)

        jobs = [one(t, config, policy, seed, sel) for policy, seed in zip(policies, seeds)
                for t, (config, _), sel in zip(traces, shapes, selections)]
        if engine == "des":
            flat = [simulate_puct(engine="des", **j) for j in jobs]
        else:
            flat = run_lockstep([fast_search(**j) for j in jobs])
        for k, r in enumerate(flat):
            i = k % len(traces)
            r.extra["shape_source"] = shapes[i][1]
            # The evolutionary driver re-runs the log's own algorithm: no PUCT check applies.
            r.extra["reproduces_log"] = repro[i].reproduced if selections[i] is None else None
        per_seed = [(flat[k * len(traces):(k + 1) * len(traces)], None)
                    for k in range(len(seeds))]
    else:
        def run_all(policy, seed, drop: bool):
            return simulate_searches(traces, policy, model, caps, budget, seed, drop, pipeline,
                                     engine, noise)

        from gfsim.replay_logs import derived

        per_seed = []
        for policy, seed in zip(policies, seeds):
            # A repeated replay of a cached log reads what the same code simulated before.
            key = _replay_key(policy, model, forecaster, seed, caps, budget, pipeline,
                              engine, noise, orphans_dropped) \
                if enabled() and _worth_keeping(log) else None
            kept = derived.load(log, "replay", key, _RESULT_CLASSES,
                                lambda: _shared_lists(traces)[1]) if key else None
            if kept is not None:
                searches, dropped = kept["searches"], kept["dropped"]
                if kept["same"]:
                    dropped = searches
                per_seed.append((searches, dropped))
                continue
            searches = run_all(policy, seed, False)
            # With no orphans, dropping them changes nothing: the same results serve both.
            if not orphans_dropped:
                dropped = None
            elif _any_orphans(searches):
                dropped = run_all(policy, seed, True)
            else:
                dropped = searches
            per_seed.append((searches, dropped))
            if key:
                derived.store(log, "replay", key,
                              {"searches": list(searches), "same": dropped is searches,
                               "dropped": None if dropped is None or dropped is searches
                               else list(dropped)},
                              _RESULT_CLASSES, lambda: _shared_lists(traces)[0],
                              {"SearchResult": ("table",)})
    notes = [seconds_note(traces, model)]  # where evaluation seconds and cold starts come from
    prov = log.header["provenance"]
    if prov.get("kind") != "measured":
        notes.append(f"log {log.name!r} is {prov.get('kind', '?')} (header provenance): "
                     f"{prov.get('note') or prov.get('description') or 'see its header'}")
    if learns:
        notes.append(f"forecaster {learning.name} learned inside each search from what that "
                     "search measured in earlier steps (children drawn, so no log order to "
                     "iterate over); a policy's fit reads its forecasts on the whole log")
    if noise is not None:
        notes.append(f"measurement noise (an assumption): keyed log-normal, cv {noise.cv:g} on "
                     "runtimes; best_speedup is the raw best of noisy measurements, "
                     "confirmed_speedup re-measures that candidate once (not charged), "
                     "true_best_speedup is its noise-free logged speedup")
    took = (time.perf_counter() - started) / max(len(seeds), 1)
    return [ReplayResult(policy=policy.spec(), log=log.name, cost_model=model.name, seed=seed,
                         searches=searches, orphans_dropped=dropped, simulation_s=took,
                         notes=list(notes),
                         measure_noise=noise.as_dict() if noise is not None else None)
            for policy, seed, (searches, dropped) in zip(policies, seeds, per_seed)]


def _whatif_children(make_source, log, forecaster, policies):
    """``make_source``, its invented children forecast by the what-if forecaster the log's
    forecasts were drawn with (``simulator.whatif_children``), where a policy reads them."""
    from gfsim.forecasts.whatif import whatif_model
    from gfsim.simulator.world_model import OwnChildren

    whatif = whatif_model(log, forecaster)
    if whatif is None or make_source is OwnChildren or not any(p.needs_forecast
                                                               for p in policies):
        return make_source  # nothing invented, or no forecast read
    from gfsim.simulator.whatif_children import WhatIfChildren

    return lambda t: WhatIfChildren(make_source(t), whatif, t)


def _any_orphans(searches) -> bool:
    columns = columns_in(searches)
    if columns is not None:
        return bool(columns.ints["orphans"].any())
    return any(r.orphans for r in searches)


def _closed_loop_shapes(log, traces, search, model, children: str, simulate: bool,
                        selections=None):
    """(shape, its source) per trace, and whether PUCT reproduces each logged search; a
    search that it does not reproduce, and whose evidence is too thin to invent children
    from, is refused unless ``simulate`` (or nothing is invented: ``children`` own). A search
    re-run by its own evolutionary algorithm (``selections``) is not refused: it is no PUCT
    simulated on another search's evidence (its invented share is labelled as any)."""
    from gfsim.simulator.shape import MIN_PAIRS, describe, reproductions, shapes_for

    shapes = shapes_for(log, traces, search)
    own = shapes if search is None else shapes_for(log, traces, None)
    repro = reproductions(traces, [s for s, _ in own], model)
    if not simulate and children != "own":
        for r, (shape, _), sel in zip(repro, own, selections or [None] * len(repro)):
            if r.reproduced or r.pairs >= MIN_PAIRS or sel is not None:
                continue
            raise GfsimError(
                f"{log.display_name}: search {r.search_id!r} cannot be replayed closed loop: "
                "PUCT does not reproduce it (replayed under all in its own shape, "
                f"{describe(shape.as_dict())}, it drew {r.own} of its {r.logged} logged "
                f"children as the log did) and it holds {r.pairs} (parent, child) "
                f"pairs with a measured parent, fewer than the {MIN_PAIRS} a simulation "
                "invents children from; replay it open loop (`driver` trace), or pass "
                "`simulate` to simulate PUCT on this evidence anyway")
    return shapes, repro


def _replay_learning(log, policies, model, seeds, settings: ReplaySettings):
    """``replay_many`` under a learning forecaster: one fixed point per seed."""
    from gfsim.simulator.learning import replay_learning

    spec = settings.learning
    each = settings.replace(learning=None, forecaster=spec.name)
    memo: dict = {}
    out = []
    for policy, seed in zip(policies, seeds):
        def once(attached, policy=policy, seed=seed):
            return replay_many(attached, [policy], model, [seed], each)[0]

        result, rounds = replay_learning(log, policy, model, seed, spec, once, memo)
        result.notes.append(
            f"forecaster {spec.name} learned only from what this replay measured ({rounds} "
            "rounds to a fixed point); the orphans-dropped figures read the same forecasts")
        out.append(result)
    return out


def best_evidence(result: ReplayResult) -> dict:
    """What a replay's headline best speedup rests on. ``basis``: ``measured`` (every
    search's best is a kernel the log measured, reached through kernels it measured, in a
    search the replay reproduces or replays in logged order), ``invented`` (some search's best
    has a child the log never held in its lineage: ``lineage_invented_share`` of the nodes
    from the seeds down to the bests were invented) or ``simulated`` (some search is PUCT run
    on a log whose own search was not PUCT's, ``simulated_searches`` of them); ``label``
    says what the bests' lineage rests on in a few words for a table."""
    searches = result.searches
    extras = list(search_extras(searches))
    lineage = [e["best_lineage"] for e in extras if "best_lineage" in e]
    simulated = sum(1 for e in extras if e.get("reproduces_log") is False)
    length = sum(b["length"] for b in lineage)
    invented = sum(b["invented"] for b in lineage)
    invented_bests = sum(1 for b in lineage if b["invented"])
    share = invented / length if length else 0.0
    label = f"invented {share:.0%}" if invented_bests else "measured"
    if result.measure_noise is not None:
        label += " (with simulated noise)"
    return {"basis": "simulated" if simulated else "invented" if invented_bests
            else "measured", "label": label, "searches": len(searches),
            "simulated_searches": simulated, "invented_bests": invented_bests,
            "lineage_invented_share": share}


def best_basis_words(*results: ReplayResult) -> str:
    """What the bests of these replays rest on, in words for a note: the weakest basis of any
    (``best_evidence``): MEASURED, partly INVENTED, or SIMULATED."""
    bases = {best_evidence(r)["basis"] for r in results}
    if "simulated" in bases:
        return ("SIMULATED (a search run on the log's evidence, not a replay of the logged "
                "search)")
    if "invented" in bases:
        return "found on a lineage partly INVENTED (children the log never held)"
    return "MEASURED"


def draw_shares(results: list[ReplayResult]) -> dict:
    """Where the children of these replays came from: share per draw source, and the share
    the log never held (fallback or model draws), over every search of every result."""
    draws: dict = {}
    for res in results:
        for extra in search_extras(res.searches):
            for k, v in extra.get("draws", {}).items():
                draws[k] = draws.get(k, 0) + v
    total = sum(draws.values())
    if not total:
        return {}
    return {"draws": {k: v / total for k, v in draws.items() if v},
            "invented_share": sum(draws.get(k, 0) for k in INVENTED) / total}


SEED_FREE_DRAWS = ("own",)  # a closed-loop draw that takes no random number: logged order


def seed_dependence(policies, *, driver: str = "trace", noise: MeasureNoise | None = None,
                    results=()) -> str | None:
    """Why replays of one configuration can differ between seeds, or None when they cannot.

    The seed reaches a replay only through a policy that reads it (``Policy.reads_seed``),
    keyed measurement noise, and the puct driver's child draws. A closed-loop draw takes a
    random number only when it leaves a node's own logged expansion (its other expansions,
    fallback and model draws); ``results`` (replays of this configuration at one seed) whose
    searches drew only their own children show that no other seed can draw differently: the
    same decisions meet the same children at every seed."""
    reasons = [f"policy {p.spec()} draws keyed random numbers"
               for p in dict.fromkeys(policies) if p.reads_seed()]
    if noise is not None:
        reasons.append("measurement noise is keyed by the seed")
    if any(e.get("driver") == "evolution" for res in results
           for e in search_extras(res.searches)) or driver == "evolution":
        reasons.append("the evolutionary driver draws its parents by seed")
    if is_closed_loop(driver):
        drawn: dict = {}
        for res in results:
            for extra in search_extras(res.searches):
                for k, v in extra.get("draws", {}).items():
                    drawn[k] = drawn.get(k, 0) + v
        others = sorted(k for k, v in drawn.items() if v and k not in SEED_FREE_DRAWS)
        if not drawn or others:
            reasons.append("the puct driver draws children by seed"
                           + (f" ({', '.join(others)} draws)" if others else ""))
    return "; ".join(reasons) or None


def seed_free_reason(policies, driver: str) -> str:
    """Why ``seed_dependence`` found nothing a seed could change, in words for a note."""
    names = " and ".join(p.spec() for p in dict.fromkeys(policies))
    return (f"policies {names} read no seed, "
            + ("every child drawn from its node's own logged expansion"
               if is_closed_loop(driver)
               else "the logged order"))


def replay_with_baseline(log: ReplayLog, policy: Policy, model: PresetCostModel, *,
                         baseline: str | Policy = "all", seed: int = 0,
                         settings: ReplaySettings | None = None,
                         **changes) -> tuple[ReplayResult, ReplayResult]:
    """The policy and the baseline replayed with the same seed (common random numbers). Under
    the puct driver the baseline search does not overgenerate (paper-standard beside
    paper-filtered)."""
    settings = ReplaySettings.of(settings, **changes)
    result = replay(log, policy, model, seed=seed, settings=settings)
    if settings.closed_loop and settings.search is not None:
        settings = settings.replace(search=replace(settings.search, overgen=1))
    base = replay(log, make_policy(baseline), model, seed=seed, settings=settings)
    return result, base


ANYTIME_POINTS = 100  # anytime rows per search in ``gfsim replay --json`` unless --detail


def _engines(searches) -> list[str]:
    columns = columns_in(searches)
    return [columns.engine] if columns is not None and len(columns) else \
        sorted({r.engine for r in searches})


def _stopped_by(searches) -> set:
    columns = columns_in(searches)
    return columns.stopped_by() if columns is not None else {r.stopped_by for r in searches}


def _summaries(searches):
    """Each search's ``summary()``: from a replay's columns, built a chunk at a time where
    ``print_json`` writes them (``search_columns.SummaryRows``)."""
    columns = columns_in(searches)
    return SummaryRows(columns) if columns is not None else [r.summary() for r in searches]


def _anytime_rows(searches, points: int | None):
    """Each search's anytime rows as lists (``anytime_points``); searches whose start rows
    are the same bytes share one list (10^5 searches: 20 MB of identical start rows). From a
    replay's columns, built a chunk at a time (``search_columns.AnytimeRows``)."""
    columns = columns_in(searches)
    if columns is not None:
        return AnytimeRows(columns, points)
    starts: dict = {}
    out = {}
    for r in searches:
        pts = anytime_points(r.anytime, points)
        rows = pts.tolist()
        if rows:
            rows[0] = starts.setdefault(pts[0].tobytes(), rows[0])
        out[r.search_id] = rows
    return out


def comparison_json(result: ReplayResult, base: ReplayResult, budget: Budget,
                    anytime: int | None = ANYTIME_POINTS) -> dict:
    """The ``gfsim replay --json`` object: headline figures, baseline, signed deltas.
    ``anytime``: rows per search of the anytime curves (None: all of them)."""
    with no_cyclic_gc():  # a dict per search: no cycles
        return _comparison_json(result, base, budget, anytime)


def _comparison_json(result: ReplayResult, base: ReplayResult, budget: Budget,
                     anytime: int | None) -> dict:
    mine, theirs = result.figures(), base.figures()
    out = {
        "policy": result.policy,
        "log": result.log,
        "cost_model": result.cost_model,
        "seed": result.seed,
        "budget": budget.as_dict(),
        "measure_noise": result.measure_noise,
        "driver": _driver_words(result),
        "engines": _engines(result.searches),
        **mine,
        "baseline": {"policy": base.policy, **theirs},
        "usd_delta": mine["usd"] - theirs["usd"],
        "wall_s_delta": mine["wall_s"] - theirs["wall_s"],
        "joules_delta": mine["joules"] - theirs["joules"],
        "speedup_delta": mine["best_speedup"] - theirs["best_speedup"],
        "gpu_evals_delta": mine["gpu_evals"] - theirs["gpu_evals"],
        "stopped_by": sorted(s for s in _stopped_by(result.searches) if s),
        "searches": _summaries(result.searches),
        "anytime": _anytime_rows(result.searches, anytime),
        "anytime_columns": ["seconds", "usd", "joules", "gpu_evals", "best_speedup"],
        "anytime_points": anytime,
        "simulation_s": result.simulation_s + base.simulation_s,
        "notes": result.notes + [
            "best_speedup is the geometric mean over searches of each search's best "
            f"speedup, {best_basis_words(result, base)}; wall_s, usd and joules add over "
            "searches run one after another",
            "deltas are policy minus baseline; negative usd_delta means the policy spent less",
        ],
    }
    out["best_evidence"] = best_evidence(result)
    out["baseline"]["best_evidence"] = best_evidence(base)
    puct = [e for e in search_extras(result.searches) if e.get("driver") in ("puct",
                                                                           "evolution")]
    if puct:
        evo = [r for r in result.searches if r.extra.get("driver") == "evolution"]
        out["drivers"] = {r.search_id: r.extra["driver"] for r in result.searches}
        if evo:
            out["selection"] = evo[0].extra["selection"]
            out["selection_per_search"] = {r.search_id: r.extra["selection"] for r in evo}
            out["notes"].append(evolution_note(evo[0].extra["selection"], len(evo),
                                               len(result.searches)))
        draws = {k: sum(e["draws"][k] for e in puct) for k in puct[0]["draws"]}
        total = max(sum(draws.values()), 1)
        out["search"] = puct[0]["search"]
        out["search_per_search"] = {r.search_id: r.extra["search"] for r in result.searches}
        out["shape_source"] = sorted({e.get("shape_source", "given") for e in puct})
        out["baseline"]["search"] = base.searches[0].extra.get("search") if base.searches else None
        out["draws"] = draws
        out["draw_shares"] = {k: v / total for k, v in draws.items() if v}
        out["fallback_share"] = draws["fallback"] / total
        out["invented_share"] = sum(draws.get(k, 0) for k in INVENTED) / total
        out["extrapolated"] = out["invented_share"] > EXTRAPOLATED_SHARE
        fresh = draws.get("model") and not draws.get("own") and not draws.get(
            "other_expansion")
        driver = "evolution driver" if len(evo) == len(result.searches) else (
            "puct and evolution drivers" if evo else "puct driver")
        out["notes"].append(
            f"{driver} (--children fresh): every child, the logged ones too, is invented by "
            "a world model fitted to the log (outcome, step, sibling repeats and forecasts "
            "learned from the log's pairs; the seed picks a bootstrap member of its ensemble "
            "and the draws), so each seed is a new search like the logged one; an invented "
            f"child is held to at most {INVENTED_HEADROOM:g}x the best speedup its log "
            "measured" if fresh else
            f"{driver}: children are drawn without replacement from the node's own logged "
            "children, then its other logged expansions, then, for children the log never "
            + ("held, a world model fitted to the log (--children model: outcome, step, "
               "sibling repeats and forecasts learned from the log's pairs; the seed picks a "
               "bootstrap member of its ensemble)"
               if draws.get("model") else
               "held, a fallback pool matched on the parent's speedup bin")
            + f"; a replay with more than {EXTRAPOLATED_SHARE:.0%} such invented draws is "
            "labelled extrapolated; an invented child is held to at most "
            f"{INVENTED_HEADROOM:g}x the best speedup its log measured (the log supports no "
            "more)")
        simulated = out["best_evidence"]["simulated_searches"]
        if simulated:
            out["notes"].append(
                f"SIMULATED: PUCT does not reproduce {simulated} of the log's "
                f"{len(result.searches)} searches (replayed under all at F = 1 in their own "
                "shape, they drew other children than the log's), so their figures are PUCT "
                "simulated on the log's evidence, not a replay of the logged search")
    if result.orphans_dropped is not None:
        dropped = ReplayResult(result.policy, result.log, result.cost_model, result.seed,
                               result.orphans_dropped).figures()
        out["orphans_dropped"] = {k: dropped[k] for k in (
            "best_speedup", "gpu_evals", "candidates", "wall_s", "usd", "joules")}
    return out


def _driver_words(result: ReplayResult) -> str:
    """The driver a replay ran: ``trace``, ``puct``, ``evolution (openevolve)``, or each with
    its number of searches where they differ (``simulator.drivers.chosen_driver``)."""
    from gfsim.simulator.drivers import chosen_driver
    from gfsim.simulator.closed.evolution import EvolutionConfig

    extras = list(search_extras(result.searches))
    if not extras or "driver" not in extras[0]:
        return "trace"
    fields = set(EvolutionConfig.__dataclass_fields__)
    return chosen_driver([None if e.get("driver") != "evolution" else EvolutionConfig(
        **{k: (tuple(v) if k == "from_config" else v) for k, v in e["selection"].items()
           if k in fields}) for e in extras])


def _seed_job(shared, seed: int):
    log, policy_spec, baseline, model, kwargs = shared
    result, base = replay_with_baseline(log, make_policy(policy_spec), model, baseline=baseline,
                                        seed=seed, orphans_dropped=False, **kwargs)
    return result, base


def replay_seeds(log: ReplayLog, policy_spec: str | Policy, model: PresetCostModel, seeds, *,
                 baseline: str | Policy = "all", jobs: int = 1, cluster: str | None = None,
                 ran_on: dict | None = None, **kwargs):
    """The policy and its baseline replayed for every seed (``jobs`` processes, or the Ray
    cluster ``cluster`` names: ``gfsim.core.executor``; the log travels once to each); returns
    the per-seed (result, baseline) pairs in seed order. ``ran_on``: filled with where they
    ran."""
    from gfsim.core.executor import make_executor
    from gfsim.simulator.progress import ticked_map

    seeds = list(seeds)
    shared = (log, policy_spec, baseline, model, kwargs)
    with make_executor(min(jobs, len(seeds)), cluster, shared=shared) as executor:
        pairs = list(ticked_map(executor, _seed_job, seeds))
        if ran_on is not None:
            ran_on.update(executor.describe())
    return pairs
