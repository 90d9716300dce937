"""Tuning a policy's parameters (and the search's overgeneration) with Optuna.

A *trial* is one point of the search space: a policy spec plus, under the puct driver, the
search's shape (``overgen``, ``samples_per_parent``, ``k_per_parent``, ``parents_per_step``,
``steps``). It is scored by replaying the log for the same seeds every time (common random
numbers: every trial sees the same keyed worlds), aggregating per seed over tasks (geometric
mean of speedups; costs per search) and then over seeds (the mean).

Objectives (``NAME[:max|min]``, several for a multi-objective study):
- ``best_speedup`` (max): the best measured speedup.
- ``score`` (max): the standardised score, after the auto-tuning comparison methodology: per
  search, 0 is the expected best of measuring the same number of the log's candidates of that
  task in random order (closed form, sampling without replacement), 1 is the best kernel in the
  log; the denominator is clipped at 1% of the log's best (``clipped`` says how often), and a
  closed-loop search that finds kernels beyond the log can score above 1.
- ``cost_to_target`` (min): USD to first reach ``target`` x the task's seed speedup, censored at
  what the search spent (a search that never reaches it counts its whole spend).
- ``usd``, ``wall_s``, ``joules``, ``gpu_evals`` (min): per search.

Constraints (``usd<=40``) are kept as a trial attribute and given to the samplers (TPE,
NSGA-II, GP) through ``Trial.set_constraint`` on Optuna 5, or the samplers' ``constraints_func``
on Optuna 4 (both in the pinned range).
"""

from __future__ import annotations

from gfsim.core.drivers import is_closed_loop

import math
from dataclasses import dataclass, field, replace

import numpy as np

from gfsim.core import libm
from gfsim.core.errors import SpecError
from gfsim.simulator.budget import Budget
from gfsim.simulator.results import first_reaching
from gfsim.simulator.settings import ReplaySettings

__all__ = ["TunedParam", "parse_param", "parse_objectives", "parse_constraint", "TrialSetup",
           "evaluate", "SeedPool", "expected_random_best", "seed_dependence_of_space",
           "OBJECTIVES", "SEARCH_PARAMS"]

# Search-shape parameters a trial may set (puct driver only).
SEARCH_PARAMS = ("overgen", "samples_per_parent", "k_per_parent", "parents_per_step", "steps")
OBJECTIVES = {"best_speedup": "maximize", "score": "maximize", "cost_to_target": "minimize",
              "usd": "minimize", "wall_s": "minimize", "joules": "minimize",
              "gpu_evals": "minimize"}
_CLIP = 0.01  # score denominators below 1% of the log's best are clipped to it


@dataclass(frozen=True)
class TunedParam:
    """One dimension of the search space."""

    name: str
    kind: str  # "float" | "int" | "categorical"
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()
    target: str = "policy"  # "policy" or "search"

    def suggest(self, trial):
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)

    def spec(self) -> str:
        if self.kind == "categorical":
            return f"{self.name}={'|'.join(map(str, self.choices))}"
        return f"{self.name}={self.low:g}:{self.high:g}" + (":int" if self.kind == "int" else "") \
            + (":log" if self.log else "")


def parse_param(text: str, policy: str, driver: str) -> TunedParam:
    """``tau=0.3:0.99``, ``overgen=1:8:int``, ``usd_per_log2_speedup=0.1:100:log``,
    ``score=maxprob|margin``; the name must be a parameter of ``policy`` or, under the puct
    driver, of the search."""
    from gfsim.policies.registry import POLICIES

    name, sep, rng = (text or "").partition("=")
    name, rng = name.strip(), rng.strip()
    if not sep or not name or not rng:
        raise SpecError(f"`param` {text!r}: expected NAME=LOW:HIGH[:int][:log] or NAME=A|B|C")
    if policy not in POLICIES:
        raise SpecError(f"`policy`: unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    known = {p.name: p for p in POLICIES[policy].params}
    if name in SEARCH_PARAMS:
        if not is_closed_loop(driver):
            raise SpecError(f"`param` {name}: a search parameter, only with `driver` puct")
        target = "search"
    elif name in known:
        target = "policy"
    elif not known:
        raise SpecError(f"`param` {name}: policy {policy!r} has no tunable parameters"
                        + (f"; the puct search's: {', '.join(SEARCH_PARAMS)}"
                           if is_closed_loop(driver) else
                           " (tune another policy, or a search parameter with `driver` puct)"))
    else:
        valid = list(known) + (list(SEARCH_PARAMS) if is_closed_loop(driver) else [])
        raise SpecError(f"`param` {name}: not a parameter of {policy!r}"
                        + (" or of the puct search" if is_closed_loop(driver) else "")
                        + f"; valid: {', '.join(valid)}")
    if "|" in rng:
        choices = tuple(c.strip() for c in rng.split("|"))
        if target == "search" or (known[name].kind in (int, float)):
            kind = int if target == "search" else known[name].kind
            try:
                choices = tuple(kind(c) for c in choices)
            except ValueError:
                raise SpecError(f"`param` {text!r}: choices must be {kind.__name__}s") from None
        elif isinstance(known[name].kind, tuple):
            bad = [c for c in choices if c not in known[name].kind]
            if bad:
                raise SpecError(f"`param` {name}: {bad[0]!r} is not one of "
                                f"{', '.join(known[name].kind)}")
        return TunedParam(name, "categorical", choices=choices, target=target)
    parts = [p.strip() for p in rng.split(":")]
    flags = set(parts[2:])
    if len(parts) < 2 or not flags <= {"int", "log"}:
        raise SpecError(f"`param` {text!r}: expected NAME=LOW:HIGH[:int][:log]")
    try:
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise SpecError(f"`param` {text!r}: LOW and HIGH must be numbers") from None
    if not low < high:
        raise SpecError(f"`param` {text!r}: LOW must be below HIGH")
    is_int = "int" in flags or target == "search" or (target == "policy"
                                                     and known[name].kind is int)
    if is_int and (low != int(low) or high != int(high)):
        raise SpecError(f"`param` {text!r}: {name} takes whole numbers")
    if "log" in flags and low <= 0:
        raise SpecError(f"`param` {text!r}: a log scale needs LOW > 0")
    if target == "policy" and known[name].kind not in (int, float):
        raise SpecError(f"`param` {name}: not numeric; give choices A|B|C")
    if target == "policy":
        for v in (low, high):
            known[name].convert(v, policy)  # range checks: e.g. rho in [0, 1]
    elif low < 1:
        raise SpecError(f"`param` {name}: must be >= 1")
    return TunedParam(name, "int" if is_int else "float", low, high, "log" in flags,
                      target=target)


def parse_objectives(text: str) -> list[tuple[str, str]]:
    """``best_speedup`` or ``best_speedup:max,usd:min`` -> [(name, direction), ...]."""
    out = []
    for item in (text or "").split(","):
        name, _, d = item.strip().partition(":")
        if name not in OBJECTIVES:
            raise SpecError(f"`objective`: unknown {name!r}; valid: {', '.join(OBJECTIVES)}")
        direction = {"": OBJECTIVES[name], "max": "maximize", "min": "minimize",
                     "maximize": "maximize", "minimize": "minimize"}.get(d)
        if direction is None:
            raise SpecError(f"`objective` {item!r}: direction must be max or min")
        out.append((name, direction))
    if len({n for n, _ in out}) != len(out):
        raise SpecError("`objective`: an objective is named twice")
    return out


def parse_constraint(text: str | None) -> tuple[str, float] | None:
    """``usd<=40`` -> ("usd", 40.0): the mean per search must stay at or below the limit."""
    if not text:
        return None
    name, sep, raw = text.partition("<=")
    name = name.strip()
    if not sep or name not in ("usd", "wall_s", "joules", "gpu_evals"):
        raise SpecError(f"`constraint` {text!r}: expected usd|wall_s|joules|gpu_evals<=LIMIT")
    try:
        return name, float(raw)
    except ValueError:
        raise SpecError(f"`constraint` {text!r}: the limit is not a number") from None


def expected_random_best(values: np.ndarray, k: int, floor: float) -> float:
    """E[max(floor, max of k values drawn without replacement from ``values``)], closed form:
    with w sorted ascending, the i-th smallest (1-based) is the maximum of the draw with
    probability C(i-1, k-1) / C(N, k)."""
    w = np.sort(np.maximum(np.asarray(values, dtype=float), floor))
    n = len(w)
    if k <= 0 or n == 0:
        return float(floor)
    k = min(k, n)
    i = np.arange(k, n + 1)
    lg = math.lgamma
    log_total = lg(n + 1) - lg(k + 1) - lg(n - k + 1)
    logp = np.array([lg(j) - lg(k) - lg(j - k + 1) for j in i]) - log_total
    return float(np.sum(w[k - 1:] * np.exp(logp)))


@dataclass
class TrialSetup:
    """Everything a trial's replays share: log, cost model, base policy, the seeds (the same
    for every trial) and the replay's settings (driver, budget, base search, forecaster,
    children, learning), which ``settings`` holds as one ``ReplaySettings``."""

    log: object
    model: object
    policy: str
    driver: str = "trace"
    budget: object = None
    seeds: list[int] = field(default_factory=lambda: [0])
    search: object | None = None
    target: float = 1.5
    forecaster: str | None = None  # the logged forecaster policies read (None: the first)
    pools: dict | None = None  # task -> (logged speedups, seed speedup), for the score
    children: str = "fallback"  # puct: where unlogged children come from (--children)
    simulate: bool = False  # puct: simulate a log PUCT does not reproduce on thin evidence
    learning: object | None = None  # a learned forecaster: learns from what each replay measured
    # The replay settings the fields above leave out (capacities, pipeline, engine, noise), as
    # the front door built them; None: the defaults.
    rest: ReplaySettings | None = None
    # Every setting the trials' replays read, made from the fields above (``of`` makes a setup
    # from one); ``dataclasses.replace`` of a field makes it again.
    settings: ReplaySettings = field(init=False)

    @classmethod
    def of(cls, log, model, policy: str, seeds, settings: ReplaySettings,
           **fields) -> TrialSetup:
        """A setup whose replays read ``settings`` (the front door's, built once)."""
        return cls(log, model, policy, settings.driver, settings.budget, list(seeds),
                   settings.search, forecaster=settings.forecaster,
                   children=settings.children, simulate=settings.simulate,
                   learning=settings.learning, rest=settings, **fields)

    def __post_init__(self):
        self.settings = (self.rest or ReplaySettings()).replace(
            budget=self.budget if self.budget is not None else Budget(), driver=self.driver,
            search=self.search, forecaster=self.forecaster, children=self.children,
            simulate=self.simulate, learning=self.learning, orphans_dropped=False)
        if self.pools is None:
            self.pools = _pools(self.log)

    def replay(self, spec: str, search, seeds, *, children: str | None = None, model=None,
               learning=True) -> list:
        """``replay_many`` of policy ``spec`` in ``search`` on ``seeds`` under this setup (its
        log, budget, driver, forecaster, children and learning); ``children``, ``model`` and
        ``learning`` (False: none) in place of the setup's where given."""
        from gfsim.policies import make_policy
        from gfsim.simulator.replay import replay_many

        seeds = list(seeds)
        settings = self.settings.replace(search=search,
                                         learning=self.learning if learning is True else None)
        if children and is_closed_loop(self.driver):
            settings = settings.replace(children=children)
        return replay_many(self.log, [make_policy(spec) for _ in seeds], model or self.model,
                           seeds, settings)

    def spec(self, values: dict, params: list[TunedParam]) -> tuple[str, object]:
        """(policy spec, search config) for a trial's values."""
        pol = {p.name: values[p.name] for p in params if p.target == "policy"}
        search = {p.name: values[p.name] for p in params if p.target == "search"}
        spec = self.policy + (":" + ",".join(f"{k}={_fmt(v)}" for k, v in pol.items()) if pol
                              else "")
        config = replace(self.search, **search) if self.search is not None and search else \
            self.search
        return spec, config


def _extremes(p: TunedParam) -> list:
    """The values of ``p`` a policy's seed use could turn on: its choices, or both ends of
    its range (a policy reads the seed by a parameter being set, or crossing a bound such as
    threshold's cal_frac < 1)."""
    if p.kind == "categorical":
        return list(p.choices)
    if p.kind == "int":
        return [int(p.low), int(p.high)]
    return [float(p.low), float(p.high)]


def seed_dependence_of_space(setup: TrialSetup, params: list[TunedParam]) -> str | None:
    """Why a trial's replays can differ between seeds, or None when no trial's can: the trace
    driver, a policy that reads no seed at any corner of the tuned ranges, no measurement
    noise (tune has none). Then every seed replays the same trial, and one replay is it."""
    import itertools

    from gfsim.policies import make_policy
    from gfsim.simulator.replay import seed_dependence

    tuned = [p for p in params if p.target == "policy"]
    corners = itertools.product(*(_extremes(p) for p in tuned))
    policies = [make_policy(setup.spec(dict(zip([p.name for p in tuned], values)), tuned)[0])
                for values in corners]
    # No replay results: under puct, only a replay's draws could show its seeds did not
    # matter, and trials draw differently from one another.
    return seed_dependence(policies, driver=setup.driver, noise=None)


def _pools(log) -> dict:
    ev = log.evaluations
    cands = log.candidates
    out = {}
    if not len(ev):
        return out
    speed = dict(zip(ev["candidate_id"], ev["speedup"]))
    for task, rows in cands.groupby("task_id"):
        seed = float(log.tasks[task].get("seed_speedup") or 1.0)
        vals = [speed[c] if c in speed and speed[c] == speed[c] else seed
                for c in rows["candidate_id"] if c in speed]
        out[task] = (np.asarray(vals, dtype=float), seed)
    return out


def _search_metrics(s, setup: TrialSetup, clipped: list) -> dict:
    tot = s.total
    values, seed = setup.pools.get(s.task_id, (np.array([]), s.seed_speedup))
    e_rand = expected_random_best(values, s.gpu_evals, seed)
    top = max(float(values.max()) if len(values) else seed, seed)
    denom = top - e_rand
    if denom < _CLIP * top:
        clipped.append(1)
        denom = _CLIP * top
    # USD to first reach the target, censored at what the search spent in all (a reserved
    # GPU's idle after the last measurement included).
    reach_usd, _ = first_reaching(s.anytime, 1, setup.target * s.seed_speedup)
    return {"best_speedup": s.best_speedup, "usd": tot.usd, "wall_s": s.wall_s,
            "joules": tot.joules, "gpu_evals": s.gpu_evals,
            "score": (s.best_speedup - e_rand) / denom,
            "cost_to_target": min(reach_usd, tot.usd)}


def evaluate(setup: TrialSetup, spec: str, search, seeds=None, pool=None,
             rows: list | None = None) -> dict:
    """Replay ``spec`` for every seed; returns per-metric (n_seeds, n_tasks) arrays under
    ``values``, the task ids, and how many score denominators were clipped. ``pool``: a
    ``SeedPool`` holding ``setup`` in its processes (the seeds are split among them).
    ``rows``: these seeds' ``metric_rows``, from replays already made (none is made)."""
    seeds = list(setup.seeds if seeds is None else seeds)
    if rows is None:
        rows = pool.run(spec, search, seeds) if pool is not None else \
            _seed_rows(setup, spec, search, seeds)
    tasks = rows[0][0]
    metrics = list(OBJECTIVES)
    values = {m: np.array([[r[m] for r in row[1]] for row in rows]) for m in metrics}
    return {"tasks": tasks, "seeds": seeds, "values": values,
            "clipped": int(sum(row[2] for row in rows))}


def _seed_rows(setup: TrialSetup, spec: str, search, seeds: list[int]) -> list:
    """Per seed: the task ids, each search's metrics, how many scores were clipped. The seeds
    are replayed together (``replay_many``: one policy call per step for all of them), with
    cyclic GC off until the replays are freed (by reference counting, as the rows return:
    the collection that re-enabling starts would walk every search's children first)."""
    from gfsim.core.memory import no_cyclic_gc

    with no_cyclic_gc():
        return _metric_rows(setup, spec, search, seeds)


def _metric_rows(setup: TrialSetup, spec: str, search, seeds: list[int]) -> list:
    return metric_rows(setup, setup.replay(spec, search, seeds))


def metric_rows(setup: TrialSetup, results) -> list:
    """Per seed's replay (``replay_many``'s results): the task ids, each search's metrics,
    how many scores were clipped (what ``evaluate`` reads)."""
    rows = []
    for res in results:
        clipped: list = []
        per = [_search_metrics(s, setup, clipped) for s in res.searches]
        rows.append(([s.task_id for s in res.searches], per, len(clipped)))
    return rows


def trial_draws(setup: TrialSetup, spec: str, search) -> dict:
    """Where one trial's children came from (``draw_shares``) and what its best rests on
    (``best_evidence`` over every seed's searches: measured, invented or simulated), replayed
    on the setup's seeds; empty under the trace driver, which draws none."""
    if not is_closed_loop(setup.driver):
        return {}
    from gfsim.simulator.replay import best_evidence, draw_shares

    # (without the setup's learning, as before: a known gap, not yet mended)
    results = setup.replay(spec, search, setup.seeds, learning=False)
    every = replace(results[0], searches=[s for r in results for s in r.searches])
    return {**draw_shares(results), "best_evidence": best_evidence(every)}


def _seed_chunk(setup: TrialSetup, job):
    spec, search, seeds = job
    return _seed_rows(setup, spec, search, seeds)


class SeedPool:
    """Workers that each receive the trial setup (the log, the cost model) once, when they
    start, and then only (spec, search, seeds) per trial: a trial's seeds are split into one
    contiguous chunk per worker, and the rows come back in seed order. Each worker keeps its
    traces (``cached_traces``) and per-candidate plans across trials. The workers are ``jobs``
    local processes, or ``executor``'s (a ``gfsim.core.executor.Executor`` whose shared input
    is ``setup``: a Ray cluster's); ``executor`` also runs a recommendation's configurations,
    one a task."""

    def __init__(self, setup: TrialSetup, jobs: int, executor=None):
        from gfsim.core.executor import LocalProcesses

        self.executor = executor if executor is not None else LocalProcesses(jobs, setup)
        self.jobs = jobs

    def run(self, spec: str, search, seeds: list[int]) -> list:
        n = len(seeds)
        bounds = [n * k // self.jobs for k in range(self.jobs + 1)]
        chunks = [seeds[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        return [row for part in self.executor.map(_seed_chunk, [(spec, search, c)
                                                                for c in chunks])
                for row in part]

    def shutdown(self, cancel: bool = False) -> None:
        """End the workers, after the tasks given (``cancel``: after the running ones)."""
        self.executor.close(cancel=cancel)


def aggregate(metric: str, block: np.ndarray) -> float:
    """Over tasks (columns: the geometric mean of speedups, the mean of scores and costs per
    search), then the mean over seeds (rows)."""
    if metric == "best_speedup":  # logarithms by the C library: the same on every CPU
        return float(libm.exp(libm.log(block).mean(axis=1)).mean())
    return float(block.mean())


def _fmt(v) -> str:
    """A suggested value in a policy spec: floats to 6 significant digits."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)
