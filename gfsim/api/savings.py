"""What a policy saves against a baseline, per search: what ``gfsim savings`` runs and
prints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gfsim.replay_logs import ReplayLog

__all__ = ["savings", "DEFAULT_SEEDS"]

DEFAULT_SEEDS = 32  # paired seeds where a seed can change the replay


def savings(log: ReplayLog | str | Path | None = None, policy: str = "threshold:0.7",
            baseline: str = "all", *, cost: str = "serverless-a100", budget: str | None = None,
            driver: str = "trace", search: str | None = None, overgen: int | None = None,
            forecaster: str | None = None, children: str = "auto", simulate: bool = False,
            seeds: int | None = None, seed: int = 0, jobs: int = 1,
            cluster: str | None = None) -> dict:
    """Dollars, seconds and joules ``policy`` saves per search against ``baseline`` on
    ``log``, with 95% intervals over seeds and tasks; the cost to reach speedup targets; the
    speedup at equal cost; the break-even prices.

    Every keyword is the ``gfsim savings`` option of the same name (``gfsim savings -h``).

    Args:
        log: a ``ReplayLog``, a path, or a shipped log's name; None: the shipped default.
        policy: the policy spec; baseline: what it is compared with (``"all"``).
        seeds: paired seeds (default 32 where a seed can change the replay, else 1).
        jobs: processes the seeds are replayed in; cluster: a Ray cluster instead (``"ray"``,
            the one at ``$RAY_ADDRESS``, or ``"ray://HOST:PORT"``); the same figures.

    Returns:
        What ``gfsim savings --json`` prints: ``usd_saved_per_search``,
        ``seconds_saved_per_search`` and ``joules_saved_per_search`` (baseline minus policy:
        positive is saved, with ``lo``/``hi``), the per-search figures of each side, the cost
        to reach targets, the speedup at equal cost, break-even prices, ``inputs`` (what was
        replayed), ``notes`` (where each figure came from) and ``ran_on`` (where the seeds
        after the first were replayed).

    Examples:
        >>> import gfsim
        >>> s = gfsim.savings("synthetic-mini", "topk:2")
        >>> sorted(s["inputs"])[:3]
        ['baseline', 'budget', 'cost_model']
    """
    from gfsim.analysis.savings import savings as compute
    from gfsim.api.options import add_provenance, replay_inputs
    from gfsim.core.errors import GfsimError
    from gfsim.policies import make_policy
    from gfsim.simulator.replay import (
        draw_shares,
        replay_seeds,
        seed_dependence,
        seed_free_reason,
    )

    if jobs < 1:
        raise GfsimError("`jobs` must be >= 1")
    policies = [make_policy(policy), make_policy(baseline)]

    got = replay_inputs(log, forecaster=forecaster, cost=cost, driver=driver, search=search,
                        children=children, simulate=simulate, budget=budget, overgen=overgen)
    the_log, forecaster, model = got.log, got.forecaster, got.model
    children, puct_only, the_budget = got.children, got.puct_only, got.budget
    kwargs = dict(baseline=baseline, settings=got.settings)
    pairs = replay_seeds(the_log, policy, model, [seed], **kwargs)
    varies = seed_dependence(policies, driver=driver, results=pairs[0])
    wanted = seeds if seeds is not None else DEFAULT_SEEDS if varies else 1
    ran_on = {"executor": "in-process", "workers": 1}
    if varies and wanted > 1:
        pairs += replay_seeds(the_log, policy, model, range(seed + 1, seed + wanted),
                              jobs=jobs, cluster=cluster, ran_on=ran_on, **kwargs)
    out = compute(pairs, seed=seed)
    out["ran_on"] = ran_on
    out["seed_dependence"] = varies
    if varies is None:
        out["seeds_note"] = (
            "replayed once: no seed can change this configuration "
            f"({seed_free_reason(policies, driver)}); intervals are over the log's tasks only"
            + (f" (--seeds {seeds} asked for)" if seeds and seeds > 1 else ""))
    out["inputs"] = {"log": the_log.name, "synthetic_log": the_log.is_synthetic,
                     "policy": pairs[0][0].policy, "baseline": pairs[0][1].policy,
                     "cost_model": cost, "driver": driver, "budget": the_budget.as_dict(),
                     "forecaster": forecaster,
                     "seeds": [p[0].seed for p in pairs],
                     "search": pairs[0][0].searches[0].extra.get("search")}
    # Where the forecasts came from, the log's known caveats, a price for another GPU.
    add_provenance(out, the_log, forecaster, model,
                   read=make_policy(policy).needs_forecast or make_policy(baseline).needs_forecast)
    if puct_only:
        out["inputs"]["children"] = children
        out["inputs"]["policy_draws"] = draw_shares([p for p, _ in pairs])
        out["inputs"]["baseline_draws"] = draw_shares([b for _, b in pairs])
    return out
