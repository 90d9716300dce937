"""What the next search will cost and find before it runs: what ``gfsim plan`` runs and
prints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from gfsim.replay_logs import ReplayLog

__all__ = ["plan"]


def plan(logs: ReplayLog | str | Path | Sequence[ReplayLog | str | Path] | None = None,
         budget: str = "usd=40", candidates: str | Sequence[str] | None = None, *,
         cost: str = "serverless-a100", steps: int | None = None,
         forecaster: str | None = None, children: str = "auto", replays: int = 8,
         new_searches: int = 32, seed: int = 0, level: float = 0.9, prices: str = "run",
         simulate: bool = False, jobs: int = 0, cluster: str | None = None) -> dict:
    """One new search like the past runs ``logs``, predicted under ``budget`` for each of
    ``candidates`` (``POLICY[@F]``, or ``log``: the runs as they ran): its dollars (LLM
    tokens, forecasts, evaluations), GPU-hours, wall-clock and best speedup, each with its
    interval and what it rests on, and the chance that the budget stops it before its planned
    steps.

    Every keyword is the ``gfsim plan`` option of the same name.

    Args:
        logs: past runs (``ReplayLog``s, paths or shipped names); None: the shipped default.
        budget: ``usd=N``, ``gpu_hours=H`` or ``candidates=N`` (commas combine them).
        candidates: the configurations to plan; default: the runs as they ran (``log``) and
            what ``gfsim recommend`` recommends on the first log, where that is another.
        steps: each search's planned steps (default: its own, as logged).
        prices: ``run`` (the generator's token prices as each run recorded them, else the
            catalog's for the model it names, else the cost model's) or ``preset`` (the cost
            model's).
        jobs: processes the replays run in (0: one per core; 1: this process).
        cluster: run them on a Ray cluster instead: ``"ray"`` (the one at ``$RAY_ADDRESS``)
            or ``"ray://HOST:PORT"``; the same plan.

    Returns:
        What ``gfsim plan --json`` prints: per configuration ``usd`` (with its ``parts``),
        ``gpu_hours``, ``wall_s`` and ``best_speedup`` as ``{mean, lo, hi}``,
        ``p_budget_exhausted`` and ``rests_on``; the prices' sources; what the intervals are
        over.

    Examples:
        >>> import gfsim
        >>> out = gfsim.plan("synthetic-mini", "usd=5", ["log"], replays=2, new_searches=4)
        >>> row = out["configs"][0]
        >>> row["config"], row["usd"]["hi"] <= 5
        ('all F=own', True)
    """
    from gfsim.api.options import replay_inputs
    from gfsim.core.errors import GfsimError
    from gfsim.core.executor import cores
    from gfsim.tuning.plan import parse_plan_budget
    from gfsim.tuning.plan import plan as run_plan
    from gfsim.tuning.recommend import parse_config

    if prices not in ("run", "preset"):
        raise GfsimError(f"`prices` must be run or preset, got {prices!r}")
    if replays < 1:
        raise GfsimError(f"`replays` must be >= 1, got {replays}")
    if steps is not None and steps < 1:
        raise GfsimError(f"`steps` must be >= 1, got {steps}")
    the_budget = parse_plan_budget(budget)
    given = logs if isinstance(logs, (list, tuple)) else [logs]
    inputs = [replay_inputs(one, forecaster=forecaster, cost=cost, driver="closed",
                            search=None, children=children, simulate=simulate, budget=None)
              for one in given]
    first = inputs[0]
    if isinstance(candidates, str):
        candidates = [candidates]
    notes: list[str] = []
    texts = ["log", *(c for c in (candidates or []) if c.strip() != "log")]
    configs = [parse_config(c, "closed", first.search, what="`candidate`") for c in texts]
    recommended = None
    if candidates is None:
        recommended, note = _recommended(given[0], forecaster, children, the_budget, seed,
                                         level, jobs, cluster, simulate, cost)
        notes.append(note)
        if recommended is not None:
            configs.append(parse_config(recommended, "closed", first.search,
                                        what="`candidate`"))
    out = run_plan([i.log for i in inputs], configs, first.model, the_budget, steps=steps,
                   seeds=range(seed, seed + replays),
                   fresh_seeds=range(seed + replays, seed + replays + new_searches),
                   level=level, children=first.children, prices=prices == "run",
                   forecaster=first.forecaster, simulate=simulate,
                   jobs=jobs or cores(), cluster=cluster)
    out["cost_model"] = cost
    out["synthetic_logs"] = [i.log.name for i in inputs if i.log.is_synthetic]
    out["recommended"] = recommended
    for row in out["configs"]:
        row["recommended"] = recommended is not None and row is out["configs"][-1]
    if notes:
        out["notes"] = notes
    return out


def _recommended(log, forecaster, children: str, budget, seed: int, level: float, jobs: int,
                 cluster: str | None, simulate: bool, cost: str) -> tuple[str | None, str]:
    """What ``gfsim recommend`` adopts on ``log`` against the runs as they ran (``log``),
    under the plan's budget, in ``POLICY@F`` form (None: it keeps them), and a line saying
    so."""
    from gfsim.api.recommend import recommend

    if budget.candidates is not None:
        return None, ("no recommendation is planned: gfsim recommend runs under a usd, "
                      "gpu_hours, gpu_evals or seconds budget, and this one counts candidates")
    out = recommend(log, None, "log", cost=cost, budget=budget.text, driver="closed",
                    forecaster=forecaster, children=children, simulate=simulate, seed=seed,
                    level=level, prices=False, jobs=jobs, cluster=cluster)
    rec = out["recommendation"]
    said = f"gfsim recommend on {out['log']}: {rec['verdict']}"
    if rec["keeps_incumbent"]:
        return None, said
    pick = next(r for r in rec["configs"] if r["recommended"])
    f = pick["search"].get("overgen") if pick["search"] else None
    return f"{pick['policy']}@{f if f is not None else 'own'}", said
