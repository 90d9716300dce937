"""Compare a policy with a baseline on a log: what ``gfsim replay`` runs and prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gfsim.cost_models import PresetCostModel
    from gfsim.policies import Policy
    from gfsim.replay_logs import ReplayLog

__all__ = ["compare", "Comparison"]


@dataclass
class Comparison:
    """A policy replayed beside its baseline on one log, as ``gfsim replay`` reports it.

    ``data`` is what ``gfsim replay --json`` prints (the policy's figures at the top level,
    the baseline's under ``baseline``, differences as ``*_delta``, intervals over seeds under
    ``intervals``, a new search's prediction under ``new_search``, where each figure came
    from under ``best_evidence`` and ``notes``). ``result`` and ``baseline_result`` are the
    first seed's replays (``ReplayResult``: per-candidate tables, anytime curves); ``pairs``
    holds (policy, baseline) replays for every seed."""

    data: dict
    result: Any
    baseline_result: Any
    pairs: list = field(repr=False)
    log: Any = field(repr=False)

    @property
    def best_speedup(self) -> float:
        """The policy's best speedup (geometric mean over the log's searches): measured, or
        simulated in a closed loop; ``data["best_evidence"]`` says which."""
        return self.data["best_speedup"]

    @property
    def usd(self) -> float:
        """The policy's dollars (summed over searches)."""
        return self.data["usd"]

    @property
    def usd_delta(self) -> float:
        """Policy minus baseline, in dollars: negative means the policy spent less."""
        return self.data["usd_delta"]

    @property
    def gpu_evals(self) -> int:
        return self.data["gpu_evals"]

    @property
    def wall_s(self) -> float:
        return self.data["wall_s"]

    def to_dict(self) -> dict:
        """What ``gfsim replay --json`` prints."""
        return self.data

    def candidates(self):
        """The policy's per-candidate table (a pandas DataFrame): each candidate's decision,
        stage seconds, dollars and outcome."""
        return self.result.candidate_table()

    def plot(self, path) -> Path:
        """Anytime curves of the policy and its baseline (bands over seeds) as a PNG."""
        from gfsim.analysis.plots import plot_anytime

        d = self.data
        series = {f"policy {d['policy']}": [p[0] for p in self.pairs],
                  f"baseline {d['baseline']['policy']}": [p[1] for p in self.pairs]}
        return plot_anytime(series, path, title=("SYNTHETIC log (nothing measured): "
                                                 if self.log.is_synthetic else "")
                            + f"gfsim replay: log {d['log']}, cost {d['cost_model']}, "
                              f"driver {d['driver']}")

    def __repr__(self) -> str:
        d = self.data
        return (f"Comparison(log={d['log']!r}, policy={d['policy']!r}, "
                f"baseline={d['baseline']['policy']!r}, best_speedup={d['best_speedup']:.3f}, "
                f"usd={d['usd']:.2f}, usd_delta={d['usd_delta']:+.2f}, "
                f"gpu_evals={d['gpu_evals']})")


def compare(log: ReplayLog | str | Path | None = None,
            policy: str | Policy = "threshold:0.7", baseline: str | Policy = "all", *,
            cost: str | PresetCostModel = "serverless-a100", budget: str | None = None,
            seed: int = 0, seeds: int = 1, jobs: int = 1, capacity: str | None = None,
            gen_tokens: str | None = None, pipeline: str | None = None,
            driver: str = "trace", search: str | None = None, steps: int | None = None,
            parents_per_step: int | None = None, samples_per_parent: int | None = None,
            overgen: int | None = None, k_per_parent: int | None = None,
            engine: str = "auto", children: str = "auto", simulate: bool = False,
            calibrate: str = "none", forecaster: str | None = None,
            measure_noise: str | None = None, predict: int = 0,
            detail: bool = False) -> Comparison:
    """Replay ``log`` under ``policy`` and under ``baseline`` and compare them.

    Every keyword is the ``gfsim replay`` option of the same name (``gfsim replay -h``).

    Args:
        log: a ``ReplayLog``, a path, or a shipped log's name (``gfsim logs``); None: the
            shipped default.
        policy: the policy spec, e.g. ``"threshold:0.7"``, ``"topk:4"`` (``gfsim policies``),
            or a ``Policy`` (a plug-in's: ``docs/how-to/write-a-plugin.md``).
        baseline: what the policy is compared with; ``"all"`` measures every candidate.
        cost: a cost preset (``"serverless-a100"``, ``"reserved-h100:gpus=2"``), a TOML file, a
            plug-in's name, or a cost model.
        budget: per-search limits, e.g. ``"usd=2,steps=10"``.
        seed: the first seed of every keyed random stream.
        seeds: replay seeds ``seed .. seed + seeds - 1`` and add 95% intervals over them
            (``data["intervals"]``), where a seed can change the outcome.
        driver: ``"trace"`` (the logged order, open loop), ``"puct"`` (closed loop, the
            reference search) or ``"closed"`` (closed loop, each search's own algorithm from
            its run record: evolutionary for OpenEvolve and ShinkaEvolve runs, else PUCT).
        predict: with ``driver="puct"``, predict a new search like the logged one from this
            many searches simulated on the world model (``data["new_search"]``).

    Returns:
        A ``Comparison``; ``.to_dict()`` is what ``gfsim replay --json`` prints.

    Raises:
        gfsim.core.errors.GfsimError: bad input, named in one line.

    Examples:
        >>> import gfsim
        >>> c = gfsim.compare("synthetic-mini", "threshold:0.7")
        >>> round(c.best_speedup, 3), c.gpu_evals
        (5.402, 342)
    """
    from gfsim.api.options import (
        add_provenance,
        learning_spec,
        open_log_arg,
        parse_capacity,
        puct_children,
        resolve_children,
        search_config,
    )
    from gfsim.core.errors import GfsimError
    from gfsim.cost_models import load_cost_model, with_gen_tokens
    from gfsim.forecasts.registry import resolve
    from gfsim.policies import make_policy
    from gfsim.simulator import comparison_json, parse_budget, replay_with_baseline
    from gfsim.simulator.settings import ReplaySettings
    from gfsim.simulator.noise import parse_noise
    from gfsim.simulator.pipeline import parse_pipeline
    from gfsim.simulator.drivers import is_closed_loop
    from gfsim.simulator.replay import ANYTIME_POINTS, seed_dependence, seed_free_reason

    if seeds < 1:
        raise GfsimError(f"`seeds` must be >= 1, got {seeds}")
    the_policy = make_policy(policy)
    the_baseline = make_policy(baseline)  # fails on a bad baseline before any work
    the_budget = parse_budget(budget)
    model = load_cost_model(cost)
    if gen_tokens is not None:
        model = with_gen_tokens(model, gen_tokens)
    caps = parse_capacity(capacity, model.capacities)
    the_pipeline = parse_pipeline(pipeline)
    noise = parse_noise(measure_noise)
    children = resolve_children(driver, children)
    puct_only = puct_children(driver, children, simulate)
    if predict and not is_closed_loop(driver):
        raise GfsimError("`predict`: a new search is simulated closed loop on the log's world "
                         "model; it needs `driver` puct (or closed)")
    learning = learning_spec(forecaster)
    the_log, forecaster = resolve(open_log_arg(log), forecaster)
    config = search_config(driver, search, the_log, steps=steps,
                           parents_per_step=parents_per_step,
                           samples_per_parent=samples_per_parent, overgen=overgen,
                           k_per_parent=k_per_parent)
    if calibrate != "none":
        from gfsim.forecasts.calibration import recalibrate_log
        from gfsim.forecasts.scoring import true_bins

        the_log = recalibrate_log(the_log, calibrate, true_bins(the_log))
    settings = ReplaySettings(budget=the_budget, capacities=caps, forecaster=forecaster,
                              pipeline=the_pipeline, engine=engine, driver=driver,
                              search=config, noise=noise, learning=learning, **puct_only)
    result, base = replay_with_baseline(the_log, the_policy, model, baseline=baseline,
                                        seed=seed, settings=settings)
    out = comparison_json(result, base, the_budget,
                          anytime=None if detail else ANYTIME_POINTS)
    _add_stop_reasons(out, result, base)
    if is_closed_loop(driver):
        out["driver_requested"] = driver
        _add_selection_fit(out, result, the_log, model, forecaster)
    pairs = [(result, base)]
    both = [the_policy, the_baseline]
    varies = seed_dependence(both, driver=driver, noise=noise, results=pairs[0])
    if seeds > 1 and varies is None:
        out["seeds_note"] = (f"--seeds {seeds}: replayed once; no seed can change this "
                             f"configuration ({seed_free_reason(both, driver)}, no "
                             "measurement noise), so an interval over seeds would be one "
                             "number repeated")
    elif seeds > 1:
        pairs = _seed_pairs(the_log, policy, baseline, model, seed, seeds, jobs, settings)
        out["intervals"] = _intervals(pairs, seed)
    if predict:
        from gfsim.simulator.predictive import predict_new_search

        out["new_search"] = predict_new_search(
            the_log, policy, baseline, model, pairs, range(seed, seed + predict),
            children=children, settings=settings)
    out["pipeline"] = str(the_pipeline)
    out["calibration"] = calibrate
    out["gen_tokens_prior"] = {"input": model.priors.gen_input_tokens,
                               "output": model.priors.gen_output_tokens}
    add_provenance(out, the_log, forecaster, model,
                    the_policy.needs_forecast or the_baseline.needs_forecast)
    return Comparison(out, result, base, pairs, the_log)


def _add_selection_fit(out: dict, result, log, model, forecaster) -> None:
    """``selection_fit``: for each search the evolutionary driver re-ran, how its settings'
    selection pressure fits the parents the log chose (``simulator.selection_fit``)."""
    from gfsim.simulator.drivers import selection_for
    from gfsim.simulator.replay import cached_traces
    from gfsim.simulator.selection_fit import fit_selection

    evo = {s.search_id for s in result.searches if s.extra.get("driver") == "evolution"}
    if not evo:
        return
    fits = {}
    for t in cached_traces(log, model, forecaster):
        config = selection_for(log, t.search_id, "closed") if t.search_id in evo else None
        if config is not None:
            fits[t.search_id] = fit_selection(t, config)
    out["selection_fit"] = fits


def _seed_pairs(log, policy, baseline, model, seed, seeds, jobs, settings) -> list:
    from gfsim.core.errors import GfsimError
    from gfsim.simulator.replay import replay_seeds

    if jobs < 1:
        raise GfsimError(f"`jobs` must be >= 1, got {jobs}")
    return replay_seeds(log, policy, model, range(seed, seed + seeds), baseline=baseline,
                        jobs=jobs, settings=settings)


def _add_stop_reasons(out: dict, result, base) -> None:
    """Why each search ended (``searches[].stop_reason``, the baseline's too), and a note where
    any ended early: a budget, or a closed-loop source out of children."""
    from gfsim.simulator.budget import stop_note, stop_reason
    from gfsim.simulator.search_columns import StopReasonRows, SummaryRows, columns_in

    def reasons(searches):  # from a replay's columns, without a result per search
        columns = columns_in(searches)
        return StopReasonRows(columns) if columns is not None else \
            [stop_reason(r) for r in searches]

    summaries = out["searches"]
    if isinstance(summaries, SummaryRows):
        summaries.stop_reasons = True
        mine = reasons(result.searches)
    else:
        mine = [stop_reason(r) for r in result.searches]
        for summary, reason in zip(summaries, mine):
            summary["stop_reason"] = reason
    out["baseline"]["stop_reasons"] = theirs = reasons(base.searches)
    mine, theirs = stop_note(result.searches, mine), stop_note(base.searches, theirs)
    if mine is not None and mine == theirs:
        out["notes"].append(f"{mine}; the baseline's alike")
        return
    for side, note in (("", mine), ("baseline: ", theirs)):
        if note is not None:
            out["notes"].append(side + note)


def _intervals(pairs, seed: int) -> dict:
    from gfsim.analysis.stats import SeedTable, summarize_seeds

    seed_list = [p[0].seed for p in pairs]
    return summarize_seeds(SeedTable.from_results(seed_list, [p[0] for p in pairs]),
                           SeedTable.from_results(seed_list, [p[1] for p in pairs]), seed=seed)
