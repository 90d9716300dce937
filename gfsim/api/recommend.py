"""Which configuration to run next time, against the incumbent: what ``gfsim recommend``
runs and prints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

if TYPE_CHECKING:
    from gfsim.policies import Policy
    from gfsim.replay_logs import ReplayLog

# A configuration: POLICY[@F], a Policy, or a (policy, F) pair.
Config = Union[str, "Policy", tuple[Any, Any]]

__all__ = ["recommend", "default_candidates", "grid_for"]


def recommend(log: ReplayLog | str | Path | None = None,
              candidates: Config | Sequence[Config] | None = None,
              incumbent: Config | None = None, *,
              cost: str = "serverless-a100", budget: str | None = "usd=40",
              driver: str = "closed", search: str | None = None, forecaster: str | None = None,
              children: str = "auto", simulate: bool = False, seeds: int = 8,
              fresh_seeds: int = 8, seed: int = 0, level: float = 0.9,  # fresh: NEW_SEARCHES
              prices: bool = True, jobs: int = 0, cluster: str | None = None) -> dict:
    """Which of ``candidates`` (``POLICY[@F]``) to run next time instead of ``incumbent``:
    each one's expected gain (what adopting it gives, with its interval: the recommendation
    decides on it) and one new search's gain (where a single run lands), the recommendation,
    and the GPU-hour and forecast prices over which it holds; the incumbent, said so, with what
    would settle it, when no expected gain is adoptable (detectable at ``level``, or a large
    gain detectable at ``simulator.predictive.LARGE_LEVEL``).

    Every keyword is the ``gfsim recommend`` option of the same name.

    Args:
        log: a ``ReplayLog``, a path, or a shipped log's name; None: the shipped default.
        candidates: the configurations to weigh (default: the counterfactual benchmark's):
            ``POLICY[@F]`` specs, ``Policy`` objects or ``(policy, F)`` pairs (a plug-in's
            policy too: it is named by its ``spec()``).
        incumbent: what you do now (default ``all@1`` under puct, ``all`` under trace);
            ``log`` for the search as it ran; a spec, a ``Policy`` or a pair as above.
        jobs: processes the configurations are replayed in (0: one per core, at most one per
            configuration; 1: this process); the answer is the same whatever their number.
        cluster: replay them on a Ray cluster instead: ``"ray"`` (the one at
            ``$RAY_ADDRESS``) or ``"ray://HOST:PORT"``; the same answer.

    Returns:
        What ``gfsim recommend --json`` prints: ``recommendation`` (its ``verdict``, the
        chosen configuration, each candidate's predicted gain with its interval, the
        break-even prices) beside the log, cost model, driver and budget; ``ran_on``: where
        the replays ran.

    Examples:
        >>> import gfsim
        >>> out = gfsim.recommend("synthetic-mini", ["topk:2", "threshold:0.7"],
        ...                       driver="trace", prices=False)
        >>> out.get("recommendation").get("verdict").split(":")[0]
        'keep the incumbent (all)'
    """
    from gfsim.api.options import replay_inputs
    from gfsim.core.errors import GfsimError
    from gfsim.simulator.drivers import is_closed_loop
    from gfsim.simulator.replay import seed_dependence
    from gfsim.tuning.recommend import parse_config, recommendation
    from gfsim.tuning.trials import TrialSetup

    got = replay_inputs(log, forecaster=forecaster, cost=cost, driver=driver, search=search,
                        children=children, simulate=simulate, budget=budget)
    the_log, forecaster, learning, model = got.log, got.forecaster, got.learning, got.model
    config, children, the_budget = got.search, got.children, got.budget
    base = parse_config(incumbent or ("all@1" if is_closed_loop(driver) else "all"), driver,
                        config)
    notes: list[str] = []
    given: list = [candidates] if isinstance(candidates, (str, tuple)) or \
        hasattr(candidates, "decide") else list(candidates or [])  # one: a spec, pair, Policy
    if not given:
        given, left_out = grid_for(the_log, driver, forecaster, learning)
        if left_out:
            notes.append(left_out_note(left_out))
    configs = [parse_config(c, driver, config, what="`candidate`") for c in given]
    if not configs:
        raise GfsimError("`candidate`: name at least one configuration")
    setup = TrialSetup.of(the_log, model, base.spec, [seed], got.settings)
    from gfsim.policies import make_policy

    varies = seed_dependence([make_policy(c.spec) for c in [base, *configs]], driver=driver)
    n = seeds if varies else 1
    if jobs < 0:
        raise GfsimError(f"`jobs` must be >= 0, got {jobs}")
    from gfsim.core.executor import cores, make_executor
    from gfsim.tuning.trials import SeedPool

    distinct = {(c.spec, c.search) for c in configs} | {(base.spec, base.search)}
    with make_executor(min(jobs or cores(), len(distinct)), cluster, shared=setup) as ex:
        pool = None if ex.kind == "in-process" else SeedPool(setup, ex.workers, executor=ex)
        rec = recommendation(setup, configs, base, range(seed, seed + n),
                             fresh_seeds=range(seed + n, seed + n + fresh_seeds), level=level,
                             prices=prices, pool=pool)
        ran_on = ex.describe()
    from gfsim.replay_logs.shipped import log_caveats

    out = {"log": the_log.name, "synthetic_log": the_log.is_synthetic,
           "log_caveats": log_caveats(the_log), "cost_model": cost,
           "driver": driver, **_chosen(the_log, driver), "budget": the_budget.as_dict(),
           **({"children": children} if is_closed_loop(driver) else {}),
           "recommendation": rec, "ran_on": ran_on}
    if notes:
        out["notes"] = notes
    if varies is None:
        out["seeds_note"] = "no seed can change these replays: each configuration replayed once"
    return out


def _chosen(log, driver: str) -> dict:
    """``driver_chosen``: what ``--driver closed`` re-runs for the log's searches (PUCT, or the
    evolutionary driver of an OpenEvolve or ShinkaEvolve run), in the words replay prints."""
    if driver != "closed":
        return {}
    from gfsim.simulator.drivers import chosen_driver, selection_for

    searches = list(dict.fromkeys(log.candidates["search_id"].tolist()))
    return {"driver_chosen": chosen_driver([selection_for(log, s, driver) for s in searches])}


def default_candidates(driver: str) -> list[str]:
    """The configurations the counterfactual benchmark judges recommendations on (its
    policies, at each of its overgeneration factors under the puct driver)."""
    from gfsim.simulator.drivers import is_closed_loop  # not at import: gfsim -h stays light
    from gfsim.worlds.benchmark import DEFAULT_OVERGENS, DEFAULT_POLICIES

    if not is_closed_loop(driver):
        return list(DEFAULT_POLICIES)
    return [f"{p}@{f}" for p in DEFAULT_POLICIES for f in DEFAULT_OVERGENS]


def grid_for(log, driver: str, forecaster, learning) -> tuple[list[str], list[str]]:
    """The default grid this log can replay: every configuration of ``default_candidates``,
    less those whose policy reads forecasts where the log has none and no forecaster makes
    them (a what-if or learned ``--forecaster``); returns (kept, left out)."""
    from gfsim.policies import make_policy

    grid = default_candidates(driver)
    if forecaster is not None or learning is not None or not log.forecasts.empty:
        return grid, []
    reads = [c for c in grid if make_policy(c.partition("@")[0]).needs_forecast]
    return [c for c in grid if c not in reads], reads


def left_out_note(left_out: list[str]) -> str:
    """What the default grid left out, and how to put it back."""
    names = list(dict.fromkeys(c.partition("@")[0] for c in left_out))
    return (f"the log has no forecasts: the default grid's policies that read them "
            f"({', '.join(names)}) are left out; --forecaster paper:gemini3-flash adds them "
            "with what-if forecasts (invented by a model from the log's measured speedups)")
