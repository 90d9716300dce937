"""Tune a policy (and the PUCT search's overgeneration) with Optuna over replayed searches:
what ``gfsim tune`` runs and prints."""

from __future__ import annotations

from gfsim.core.drivers import is_closed_loop

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from gfsim.replay_logs import ReplayLog

__all__ = ["tune", "Tuning"]


@dataclass
class Tuning:
    """A tuning study's outcome, as ``gfsim tune`` reports it.

    ``data`` is what ``gfsim tune --json`` prints: the best trial (``best``) or the Pareto
    front (``pareto_front``), the top trials (``top``), their re-scoring on fresh seeds
    (``out_of_sample``), leave-one-task-out choices, the recommendation against the incumbent
    (``recommendation``) and where every figure came from (``notes``). ``study`` is the
    Optuna study itself (its trials, its user attributes)."""

    data: dict
    study: Any = field(repr=False)
    log: Any = field(repr=False)

    @property
    def best(self) -> dict | None:
        """The best trial (one objective): its ``spec``, ``params`` and ``metrics``."""
        return self.data["best"]

    @property
    def recommendation(self) -> dict | None:
        return self.data["recommendation"]

    def to_dict(self) -> dict:
        """What ``gfsim tune --json`` prints."""
        return self.data

    def plot(self, folder) -> list[str]:
        """Each objective's history and, with two objectives, the Pareto front, as PNGs in
        ``folder``; the title names the study and the log (SYNTHETIC where it is)."""
        d = self.data
        title = ("SYNTHETIC log (nothing measured): " if self.log.is_synthetic else "") + \
            (f"gfsim tune: study {d['study']}, log {d['log']}, policy {d['policy']}, cost "
             f"{d['cost_model']}")
        return _plots(self.study, [tuple(o) for o in d["objectives"]], Path(folder), title)

    def __repr__(self) -> str:
        d = self.data
        lead = d["best"] or (d["pareto_front"] or [{}])[0]
        return (f"Tuning(study={d['study']!r}, log={d['log']!r}, trials={d['trials']}, "
                f"best={lead.get('spec')!r})")


def tune(log: ReplayLog | str | Path | None = None, policy: str | type = "threshold",
         param: str | Sequence[str] = (), *,
         objective: str = "best_speedup", constraint: str | None = None, target: float = 1.5,
         forecaster: str | None = None, cost: str = "serverless-a100",
         budget: str | None = None, driver: str = "trace", search: str | None = None,
         children: str = "auto", simulate: bool = False, seeds: int = 8, seed: int = 0,
         trials: int = 50, sampler: str = "tpe", storage: str | None = None,
         study: str | None = None, workers: int = 1, heartbeat: int = 30, retries: int = 1,
         jobs: int = 1, cluster: str | None = None, top: int = 3, validate_seeds: int | None = None,
         incumbent: str | None = None, recommend: bool = True, plot=None,
         progress: Callable[[int, int], None] | None = None,
         run_record: dict | None = None) -> Tuning:
    """Tune ``policy``'s parameters (and, under ``driver="puct"``, the search's shape) with
    Optuna, each trial replaying ``log`` on the same seeds.

    Every keyword is the ``gfsim tune`` option of the same name (``gfsim tune -h``).

    Args:
        log: a ``ReplayLog``, a path, or a shipped log's name; None: the shipped default.
        policy: the policy's name (``"threshold"``, ``"topk"``, ...), or its class (a
            ``Policy`` subclass, a plug-in's too: tuned by its ``name``).
        param: the search space, one ``NAME=LOW:HIGH[:int][:log]`` or ``NAME=A|B|C`` or a
            list of them (``["tau=0.3:0.95"]``).
        objective: ``best_speedup``, ``score``, ``usd``, ... or ``NAME:max|min,...`` for a
            Pareto front.
        trials: trials to run now (a study opened again adds to its trials).
        storage: an Optuna storage URL (default: a journal file ``STUDY.journal`` in the
            working folder).
        study: the study's name (default: named by a hash of its settings, so the same
            settings resume the same study).
        cluster: run the trial workers as tasks of a Ray cluster (``"ray"``, the one at
            ``$RAY_ADDRESS``, or ``"ray://HOST:PORT"``), ``workers`` of them (1: one per
            cluster CPU), against ``storage``, a PostgreSQL or MySQL server every host reaches;
            the out-of-sample scores and the recommendation run there too.
        progress: called as ``progress(done, total)`` after each trial.
        run_record: what to keep of this run in the study (``gfsim_runs``); the command
            passes its effective settings, a call from Python a record of its arguments.

    Returns:
        A ``Tuning``; ``.to_dict()`` is what ``gfsim tune --json`` prints.

    Examples:
        >>> import gfsim
        >>> t = gfsim.tune("synthetic-mini", "threshold", ["tau=0.3:0.95"], trials=5)
        >>> sorted(t.best["params"])
        ['tau']
    """
    from gfsim.api.options import add_provenance, replay_inputs
    from gfsim.core.docs import docs_url
    from gfsim.core.errors import GfsimError
    from gfsim.tuning.identity import (
        RUNS_ATTR,
        claim_study,
        configuration,
        default_study_name,
    )
    from gfsim.tuning.study import (
        Objective,
        make_sampler,
        make_storage,
        open_study,
        run_study,
        storage_url,
    )
    from gfsim.tuning.trials import (
        TrialSetup,
        parse_constraint,
        parse_objectives,
        parse_param,
        seed_dependence_of_space,
        trial_draws,
    )

    if isinstance(policy, type):  # a Policy subclass: its parameters are tuned by name
        policy = str(getattr(policy, "name", policy))
    if seeds < 1 or trials < 1 or workers < 1 or jobs < 1:
        raise GfsimError("`seeds`, `trials`, `workers` and `jobs` must be >= 1")
    params_given = [param] if isinstance(param, str) else list(param)
    params = [parse_param(p, policy, driver) for p in params_given]
    if len({p.name for p in params}) != len(params):
        raise GfsimError("`param`: a parameter is named twice")
    objectives = parse_objectives(objective)
    limit = parse_constraint(constraint)

    got = replay_inputs(log, forecaster=forecaster, cost=cost, driver=driver, search=search,
                        children=children, simulate=simulate, budget=budget)
    the_log, forecaster, learning, model = got.log, got.forecaster, got.learning, got.model
    config, children, the_budget = got.search, got.children, got.budget
    from gfsim.tuning.recommend import parse_config

    base = parse_config(incumbent or ("all@1" if is_closed_loop(driver) else "all"), driver,
                        config)
    setup = TrialSetup.of(the_log, model, policy, range(seed, seed + seeds), got.settings,
                          target=target)
    seeded = seed_dependence_of_space(setup, params)
    if seeded is None:  # every seed replays the same trial: one replay is all there is
        setup.seeds = setup.seeds[:1]
    settings = configuration(log=the_log, policy=policy, params=params, driver=driver,
                             search=config, children=children, forecaster=forecaster,
                             learning=learning, cost=cost, model=model, budget=the_budget,
                             objectives=objectives, constraint=limit, target=target,
                             seeds=setup.seeds if seeded else None)
    study = study or default_study_name(settings)
    the_sampler = make_sampler(sampler, seed, limit is not None)
    url = storage_url(storage, study, workers)
    if cluster and url.split(":", 1)[0].split("+", 1)[0] not in ("postgresql", "mysql"):
        raise GfsimError(f"`cluster`: the trial workers on a cluster's hosts need a study they "
                         f"all reach, not {url}: give `storage` postgresql+psycopg://USER@HOST/DB "
                         "(or a MySQL URL)")
    from gfsim.tuning.recorded import check_recorded

    the_study = open_study(make_storage(url, heartbeat or None, retries), study,
                           [d for _, d in objectives], the_sampler)
    check_recorded(the_study, url, params)  # gfsim's own records, as gfsim wrote them
    adopted = claim_study(the_study, settings, url)
    # every invocation's effective settings (options, where each came from, gfsim's version,
    # the log's SHA-256), beside the configuration claim_study compares
    runs = the_study.user_attrs.get(RUNS_ATTR) or []
    the_study.set_user_attr(RUNS_ATTR, [*runs, run_record or _call_record(dict(
        log=the_log.name, policy=policy, param=list(params_given), objective=objective,
        constraint=constraint, cost=cost, budget=budget, driver=driver, seeds=seeds, seed=seed,
        trials=trials), log=the_log)][-50:])
    obj = Objective(setup, params, objectives, limit, jobs, heartbeat or None, retries)
    from gfsim.core.executor import make_executor
    from gfsim.tuning.trials import SeedPool

    # On a cluster its tasks run the trial workers, then (the setup in its object store) what
    # follows them: the out-of-sample scores and the recommendation.
    executor = make_executor(cluster=cluster, shared=setup) if cluster else None
    try:  # the trials' seed processes, warm, replay what follows them too
        if executor is not None:
            workers = workers if workers > 1 else executor.workers
        ran = run_study(the_study, obj, trials=trials, workers=workers, storage=url,
                        sampler_name=sampler, seed=seed, progress=progress, keep_pool=True,
                        executor=executor)
        if executor is not None:
            obj.use_pool(SeedPool(setup, executor.workers, executor=executor))
        ran_on = executor.describe() if executor is not None else {
            "executor": "local-processes" if workers > 1 else "in-process", "workers": workers}
        after = _after_trials(the_study, obj, objectives, setup, seeded, seeds, seed,
                              validate_seeds, top, recommend, base)
    finally:
        obj.close()
        if executor is not None:
            executor.close()
    rows, fresh, oos, loto, rec, rec_note = after
    lead = rows[0]
    draws = {}
    if is_closed_loop(driver):
        from gfsim.simulator.shape import shape_from_dict

        draws = trial_draws(setup, lead["spec"], shape_from_dict(lead["search"]))
    out = {
        "study": study, "storage": url,
        "log": the_log.name, "synthetic_log": the_log.is_synthetic, "cost_model": cost,
        "policy": policy, "driver": driver, **({"children": children, "draws_of_first": draws}
                                               if is_closed_loop(driver) else {}),
        "objectives": [list(o) for o in objectives],
        "constraint": constraint, "params": [p.spec() for p in params],
        "seeds": len(setup.seeds), "seeds_requested": seeds,
        "deterministic": None if seeded else (
            "deterministic configuration: each trial replayed once; seeds cannot change it "
            f"({_why_seed_free(driver, policy, params)})"),
        "seed_dependence": seeded, "configuration": settings,
        "trials": len(rows), "ran_now": ran, "ran_on": ran_on,
        "best": rows[0] if len(objectives) == 1 else None,
        "pareto_front": [r for r in rows if r["pareto"]] if len(objectives) > 1 else None,
        "top": rows[:max(top, 5)], "out_of_sample": oos, "fresh_seeds": fresh,
        "leave_one_task_out": loto, "recommendation": rec,
        "notes": ([rec_note] if rec_note else []) + ([adopted] if adopted else []) + ([
            "every trial replays the same seeds (common random numbers); seeds resample one "
            "log, so a tuned value is as good as the log is representative",
            "out_of_sample re-scores the top trials on seeds no trial saw; leave_one_task_out "
            "chooses the best trial on the other tasks and scores it on the held-out one",
        ] if seeded else [
            "a tuned value is as good as the log is representative; leave_one_task_out "
            "chooses the best trial on the other tasks and scores it on the held-out one",
        ]) + ([f"overgen is tuned with --children {children}: most children at F >= 2 were "
              "never logged, and how far such replays are off is measured by gfsim "
              f"counterfactual ({docs_url('experiments/counterfactual-benchmark.md')})"]
             if any(p.name == "overgen" for p in params) else [])
          + (["the log is SYNTHETIC: a tau tuned on it is a demonstration, not a "
              "recommendation"] if the_log.is_synthetic else []),
    }
    from gfsim.policies import POLICIES

    # Where the forecasts the tuned policy reads came from, the log's known caveats, a price
    # for another GPU: a tuned value rests on all three. (The tuned policy is a name; its
    # class says whether it reads forecasts; an unknown one has failed before this.)
    tuned = POLICIES.get(policy.partition(":")[0])
    add_provenance(out, the_log, forecaster, model, read=tuned is None or tuned.needs_forecast)
    tuning = Tuning(out, the_study, the_log)
    if plot is not None:
        out["plots"] = tuning.plot(plot)
    return tuning


def _after_trials(study, objective, objectives, setup, seeded, seeds: int, seed: int,
                  validate_seeds: int | None, top: int, recommend: bool, base) -> tuple:
    """The finished trials, best first; the top ones re-scored on fresh seeds; leave one
    task out; the recommendation (or why there is none): in the trials' seed processes."""
    from gfsim.core.errors import GfsimError
    from gfsim.tuning.study import leave_one_task_out, out_of_sample, trial_rows

    rows = trial_rows(study, objectives)
    if not rows:
        raise GfsimError(f"study {study.study_name!r} has no finished trial")
    n_fresh = seeds if validate_seeds is None else validate_seeds
    if seeded is None:  # fresh seeds would replay the same trials again
        n_fresh = 0
    fresh = list(range(seed + seeds, seed + seeds + n_fresh))
    pool = objective.seed_pool()
    rec, rec_note = None, None
    replayed: dict = {}
    if not recommend:
        pass
    elif [n for n, _ in objectives] != ["best_speedup"]:
        rec_note = ("no recommendation: it compares best speedups; tune with --objective "
                    "best_speedup, or run gfsim recommend")
    else:  # (its replays on the fresh seeds are the out-of-sample scores' too)
        rec = _recommendation(setup, rows[:top], base, fresh, seeded is not None, pool,
                              replayed if fresh else None)
    oos = out_of_sample(setup, rows[:top], objectives, fresh, pool=pool,
                        replayed=replayed) if n_fresh else []
    loto = leave_one_task_out(study, objectives)
    return rows, fresh, oos, loto, rec, rec_note


def _call_record(options: dict, log) -> dict:
    """A call's arguments as a study keeps them (what ``gfsim tune`` keeps is its effective
    settings, gfsim's version and the log's SHA-256)."""
    from gfsim import __version__
    from gfsim.tuning.identity import log_sha256

    return {"command": "gfsim.tune (Python)", "gfsim_version": __version__,
            "options": options, "log_sha256": log_sha256(log)}


def _recommendation(setup, rows: list[dict], base, fresh: list[int], seeded: bool,
                    pool=None, replayed: dict | None = None) -> dict | None:
    """The top trials that meet the constraint against the incumbent, replayed on the
    out-of-sample seeds (the tuning seeds where there are none) and, under a closed-loop
    driver, simulated as as many new searches on seeds after those, at most ``NEW_SEARCHES``
    (what ``gfsim recommend`` simulates by default)."""
    from gfsim.simulator.shape import shape_from_dict
    from gfsim.tuning.recommend import NEW_SEARCHES, Config, config_label, recommendation

    candidates = [Config(r["spec"], s, config_label(r["spec"], s))
                  for r in rows if r["feasible"]
                  for s in [shape_from_dict(r["search"])]]
    if not candidates:
        return None
    seeds = fresh or list(setup.seeds)
    start = max([*seeds, *setup.seeds]) + 1
    n_new = min(len(seeds), NEW_SEARCHES)  # as gfsim recommend simulates by default
    new = range(start, start + n_new) if is_closed_loop(setup.driver) and seeded else ()
    return recommendation(setup, candidates, base, seeds, fresh_seeds=new, pool=pool,
                          replayed=replayed)


def _why_seed_free(driver: str, policy: str, params) -> str:
    tuned = [p.name for p in params if p.target == "policy"]
    return (f"{driver} driver replays the logged order; policy {policy} reads no seed"
            + (f" at any {', '.join(tuned)}" if tuned else "") + "; no measurement noise")


def _plots(study, objectives, folder: Path, title: str) -> list[str]:
    """gfsim's own plots of a study: each objective's history and, with two, the front; the
    title names the study, the log and the cost model, and SYNTHETIC where the log is."""
    from gfsim.analysis.plots import plot_tuning_front, plot_tuning_history

    folder.mkdir(parents=True, exist_ok=True)
    done = [t for t in study.get_trials(deepcopy=False) if t.values is not None
            and t.state.name == "COMPLETE"]
    paths = []
    for i, (name, direction) in enumerate(objectives):
        paths.append(str(plot_tuning_history([(t.number, t.values[i]) for t in done], name,
                                             direction, folder / f"history-{name}.png",
                                             title=title)))
    if len(objectives) == 2:
        front = {t.number for t in study.best_trials}
        paths.append(str(plot_tuning_front([(t.number, t.values[0], t.values[1]) for t in done],
                                           front, (objectives[0][0], objectives[1][0]),
                                           folder / "pareto-front.png", title=title)))
    return paths
