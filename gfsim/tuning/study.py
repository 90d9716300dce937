"""The Optuna side of ``gfsim tune``: samplers, storage, the objective, out-of-sample checks.

Storage: a JournalStorage file ``NAME.journal`` by default (an SQLite ``NAME.db`` left by an
earlier gfsim resumes), which many processes on one host can append to safely; any Optuna
storage URL with ``storage``. ``trials`` is the number of finished trials the study
should hold: running the same command again after an interruption runs only the rest.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.tuning.trials import OBJECTIVES, SeedPool, aggregate, evaluate

__all__ = ["SAMPLERS", "make_sampler", "make_storage", "storage_url", "open_study",
           "run_study", "out_of_sample", "leave_one_task_out", "trial_rows", "retry_of"]

SAMPLERS = ("tpe", "nsga2", "gp", "random")


def _constraints(trial):
    return trial.user_attrs.get("constraint", [0.0])


def _native_constraints() -> bool:
    """Optuna >= 5 takes constraints from ``Trial.set_constraint`` (and deprecates the
    samplers' ``constraints_func``); 4.x only has ``constraints_func``."""
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def make_sampler(name: str, seed: int, constrained: bool):
    import optuna

    kw = {"constraints_func": _constraints} if constrained and not _native_constraints() else {}
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **kw)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, **kw)
    if name == "gp":
        import importlib.util

        if importlib.util.find_spec("torch") is None:  # GPSampler needs it
            raise GfsimError("--sampler gp needs torch (pip install 'gfsim[live]' or torch)")
        return optuna.samplers.GPSampler(seed=seed, **kw)
    if name == "random":
        if constrained:
            raise GfsimError("--sampler random ignores constraints; use tpe, nsga2 or gp")
        return optuna.samplers.RandomSampler(seed=seed)
    raise GfsimError(f"--sampler: unknown {name!r}; valid: {', '.join(SAMPLERS)}")


def storage_url(storage: str | None, study: str, workers: int) -> str:
    """Where the study lives: ``storage`` if given; else a JournalStorage file named after the
    study (one or many workers on this host: Optuna's RDB storage costs ~50 ms per trial in
    SQLite round trips, a journal file a few), unless an SQLite file of that study from an
    earlier gfsim is there, which then resumes."""
    if storage:
        return storage
    from pathlib import Path

    if Path(f"{study}.db").exists():
        return f"sqlite:///{study}.db"
    return f"{study}.journal"


def make_storage(url: str, heartbeat: int | None = None, retries: int = 1):
    """An Optuna storage for ``url``: an RDB URL (sqlite, postgresql, mysql) with Optuna's own
    heartbeat and retry of failed trials; a path ending in ``.journal`` as a JournalStorage
    file (its heartbeat is gfsim's, see ``Objective``); anything else as Optuna resolves it."""
    import optuna

    if url.endswith(".journal"):
        from optuna.storages.journal import JournalFileBackend

        try:
            return optuna.storages.JournalStorage(JournalFileBackend(url))
        except (OSError, ValueError) as exc:  # unwritable, a folder, not a journal (JSON)
            what = "is not a journal file Optuna can read" if isinstance(exc, ValueError) \
                else "cannot be opened for appending"
            raise GfsimError(f"--storage {url}: {what} ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); the file is left as it is") from None
    if url.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql"):
        import warnings

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        kw = {}
        if heartbeat:
            kw = dict(heartbeat_interval=int(heartbeat), grace_period=3 * int(heartbeat))
            stale = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            if stale is not None:  # Optuna >= 4.9
                kw["heartbeat_stale_trial_callback"] = stale(max_retry=retries)
            else:
                kw["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(
                    max_retry=retries)
        for attempt in range(5):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # heartbeat options are experimental
                    return optuna.storages.RDBStorage(url, **kw)
            except Exception as exc:  # a bad URL, an unreachable server, a missing driver
                # Workers started together on a fresh database race to create Optuna's
                # tables; the loser sees a duplicate type or table, and a second try finds
                # them made.
                racing = type(exc).__name__ in ("IntegrityError", "ProgrammingError")
                if not racing or attempt == 4:
                    raise GfsimError(f"--storage {url}: cannot open ({type(exc).__name__}: "
                                     f"{str(exc)[:200]})") from None
                time.sleep(0.2 * (attempt + 1))
    return url


def native_heartbeat(storage) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return not isinstance(storage, str) and is_heartbeat_enabled(storage)


def open_study(storage, study: str, directions: list[str], sampler):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        s = optuna.create_study(storage=storage, study_name=study, sampler=sampler,
                                directions=directions, load_if_exists=True)
    except Exception as exc:  # bad URL, unreachable database
        raise GfsimError(f"--storage: cannot open study {study!r}: {exc}") from None
    if [d.name.lower() for d in s.directions] != directions:
        raise GfsimError(f"study {study!r} exists with directions "
                         f"{[d.name.lower() for d in s.directions]}, not {directions}: use "
                         "another --study")
    return s


class Objective:
    """Picklable: a trial's values -> replays for every seed -> the objective values.

    ``heartbeat`` (seconds), for storages without Optuna's own (JournalStorage): while a trial
    runs, a thread stamps it every ``heartbeat`` seconds; before each trial, RUNNING trials
    whose last stamp is older than three beats (a killed worker's) are failed and, up to
    ``retries`` times, enqueued again with the same parameters."""

    def __init__(self, setup, params, objectives, constraint, jobs: int = 1,
                 heartbeat: int | None = None, retries: int = 1):
        self.setup, self.params, self.objectives = setup, params, objectives
        self.constraint, self.jobs = constraint, jobs
        self.heartbeat, self.retries = heartbeat, retries
        self._pool = None

    def __call__(self, trial):
        if self.heartbeat and not native_heartbeat(trial.storage):
            _fail_stale(trial, 3 * self.heartbeat, self.retries)
            stop = _beat(trial, self.heartbeat)
        else:
            stop = None
        try:
            return self._evaluate(trial)
        finally:
            if stop is not None:
                stop.set()

    def _evaluate(self, trial):
        values = {p.name: p.suggest(trial) for p in self.params}
        spec, search = self.setup.spec(values, self.params)
        if self.jobs > 1 and self._pool is None:
            self._pool = SeedPool(self.setup, self.jobs)
        ev = evaluate(self.setup, spec, search, pool=self._pool)
        agg = {m: aggregate(m, ev["values"][m]) for m in OBJECTIVES}
        trial.set_user_attr("spec", spec)
        trial.set_user_attr("search", search.as_dict() if search is not None else None)
        trial.set_user_attr("metrics", agg)
        trial.set_user_attr("tasks", ev["tasks"])
        trial.set_user_attr("clipped", ev["clipped"])
        for name, _ in self.objectives:  # per (seed, task), for leave-one-task-out
            trial.set_user_attr(f"values_{name}", ev["values"][name].tolist())
        if self.constraint is not None:
            metric, limit = self.constraint
            trial.set_user_attr("constraint", [agg[metric] - limit])
            if _native_constraints():
                trial.set_constraint(metric, agg[metric] - limit)
        out = [agg[name] for name, _ in self.objectives]
        return out[0] if len(out) == 1 else out

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _beat(trial, every: float):
    """Stamp ``trial`` every ``every`` seconds until the returned event is set."""
    import threading

    stop = threading.Event()

    def run():
        while True:
            try:
                trial.storage.set_trial_user_attr(trial._trial_id, "gfsim_heartbeat", time.time())
            except Exception:  # the trial finished meanwhile
                return
            if stop.wait(every):
                return

    threading.Thread(target=run, daemon=True).start()
    return stop


def _fail_stale(trial, grace: float, retries: int) -> None:
    """Fail RUNNING trials of ``trial``'s study with no stamp for ``grace`` seconds; enqueue
    each again (same parameters) while it has retries left."""
    import optuna

    study, now = trial.study, time.time()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.number == trial.number:
            continue
        last = t.user_attrs.get("gfsim_heartbeat") or (
            t.datetime_start.timestamp() if t.datetime_start else now)
        if now - last <= grace:
            continue
        try:
            if not trial.storage.set_trial_state_values(t._trial_id,
                                                        optuna.trial.TrialState.FAIL):
                continue
        except Exception:  # another worker failed it first
            continue
        done = int(t.user_attrs.get("gfsim_retries", 0))
        if done < retries and t.params:
            study.enqueue_trial(t.params, user_attrs={"gfsim_retry_of": t.number,
                                                      "gfsim_retries": done + 1})


def retry_of(trial) -> int | None:
    """The number of the failed trial this one retries (gfsim's or Optuna's bookkeeping)."""
    n = trial.user_attrs.get("gfsim_retry_of")
    return n if n is not None else trial.system_attrs.get("failed_trial")


def _finished(study) -> int:
    import optuna

    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(
        deepcopy=False))


def _worker(args):
    url, study_name, sampler_name, seed, constrained, objective, share = args
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.load_study(study_name=study_name,
                          storage=make_storage(url, objective.heartbeat, objective.retries),
                          sampler=make_sampler(sampler_name, seed, constrained))
    try:
        s.optimize(objective, n_trials=share)
    finally:
        objective.close()


def run_study(study, objective, *, trials: int, workers: int = 1, storage=None,
              sampler_name: str = "tpe", seed: int = 0, progress=None) -> int:
    """Run until the study holds ``trials`` finished trials; returns how many ran now.
    ``progress(done, total)`` is called as trials finish."""
    before = _finished(study)
    todo = max(0, trials - before)
    if progress is not None:
        progress(before, trials)
    if todo == 0:
        return 0
    if workers <= 1:
        def cb(s, t):
            done = _finished(s)
            if progress is not None:
                progress(done, trials)
            if done >= trials:  # other processes (other hosts) share the study: stop at total
                s.stop()

        try:
            study.optimize(objective, n_trials=todo, callbacks=[cb],
                           catch=(ArithmeticError,))
        finally:
            objective.close()
        return _finished(study) - before
    constrained = objective.constraint is not None
    # Each worker runs its share of what is left (a count, not a race on the total).
    shares = [todo // workers + (w < todo % workers) for w in range(workers)]
    args = [(storage, study.study_name, sampler_name, seed + 1000 * w, constrained, objective,
             share) for w, share in enumerate(shares) if share]
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(_worker, a) for a in args]
        while not all(f.done() for f in futures):
            time.sleep(0.5)
            if progress is not None:
                progress(_finished(study), trials)
        for f in futures:
            f.result()
    return _finished(study) - before


def trial_rows(study, objectives) -> list[dict]:
    """Finished trials, best first (the Pareto front first for several objectives)."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE]
    feasible = [t for t in done if all(c <= 0 for c in t.user_attrs.get("constraint", [0]))]
    if len(objectives) == 1:
        sign = -1 if objectives[0][1] == "maximize" else 1
        order = sorted(feasible, key=lambda t: sign * t.value) + [
            t for t in done if t not in feasible]
    else:
        front = {t.number for t in study.best_trials}
        order = sorted(done, key=lambda t: (t.number not in front, t not in feasible,
                                            t.number))
    return [{"number": t.number, "params": t.params, "spec": t.user_attrs.get("spec"),
             "search": t.user_attrs.get("search"), "values": t.values,
             "metrics": t.user_attrs.get("metrics"), "feasible": t in feasible,
             "clipped": t.user_attrs.get("clipped"),
             "pareto": len(objectives) > 1 and t.number in {b.number for b in study.best_trials}}
            for t in order]


def out_of_sample(setup, rows: list[dict], objectives, fresh_seeds, pool=None) -> list[dict]:
    """The given trials re-scored on seeds no trial saw, beside their in-sample figures."""
    from gfsim.simulator.shape import shape_from_dict

    out = []
    for r in rows:
        search = shape_from_dict(r["search"])
        ev = evaluate(setup, r["spec"], search, seeds=fresh_seeds, pool=pool)
        fresh = {m: aggregate(m, ev["values"][m]) for m, _ in objectives}
        out.append({"number": r["number"], "spec": r["spec"],
                    "in_sample": {m: r["metrics"][m] for m, _ in objectives},
                    "fresh_seeds": fresh})
    return out


def leave_one_task_out(study, objectives) -> list[dict]:
    """For each task: the best trial chosen on the *other* tasks, scored on this one, beside
    the best trial chosen on all tasks (first objective; feasible trials only)."""
    import optuna

    name, direction = objectives[0]
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE
            and all(c <= 0 for c in t.user_attrs.get("constraint", [0]))
            and f"values_{name}" in t.user_attrs]
    if len(done) < 2:
        return []
    tasks = done[0].user_attrs["tasks"]
    mats = {t.number: np.asarray(t.user_attrs[f"values_{name}"], dtype=float) for t in done}
    sign = 1 if direction == "maximize" else -1

    def score(m, cols):
        return aggregate(name, m[:, cols])

    all_cols = list(range(len(tasks)))
    best_all = max(done, key=lambda t: sign * score(mats[t.number], all_cols))
    rows = []
    for j, task in enumerate(tasks):
        others = [c for c in all_cols if c != j]
        if not others:
            break
        pick = max(done, key=lambda t: sign * score(mats[t.number], others))
        rows.append({"task": task, "chosen_on_others": pick.number,
                     "held_out": score(mats[pick.number], [j]),
                     "chosen_on_all": best_all.number,
                     "in_sample": score(mats[best_all.number], [j])})
    return rows

