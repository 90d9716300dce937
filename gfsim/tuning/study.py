"""The Optuna side of ``gfsim tune``: samplers, storage, the objective, out-of-sample checks.

Storage: a JournalStorage file ``NAME.journal`` by default (an SQLite ``NAME.db`` left by an
earlier gfsim resumes), which many processes on one host can append to safely, opened by
``journal.open_journal`` (a file that cannot serve, a full disk, a torn or foreign line: one
line); any Optuna storage URL with ``storage``. ``trials`` is the number of finished trials
the study should hold: running the same command again after an interruption (a killed worker
too) runs only the rest.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from contextlib import contextmanager

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.tuning.trials import OBJECTIVES, SeedPool, aggregate, evaluate

__all__ = ["SAMPLERS", "make_sampler", "make_storage", "storage_url", "open_study",
           "run_study", "out_of_sample", "leave_one_task_out", "trial_rows", "retry_of"]

SAMPLERS = ("tpe", "nsga2", "gp", "random")
WORKER_POLL_S = 0.5  # how often the parent of several workers looks at them and the study


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
            raise GfsimError("`sampler` gp needs torch (pip install 'gfsim[live]' or torch)")
        return optuna.samplers.GPSampler(seed=seed, **kw)
    if name == "random":
        if constrained:
            raise GfsimError("`sampler` random ignores constraints; use tpe, nsga2 or gp")
        return optuna.samplers.RandomSampler(seed=seed)
    raise GfsimError(f"`sampler`: unknown {name!r}; valid: {', '.join(SAMPLERS)}")


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


def make_storage(url: str, heartbeat: int | None = None, retries: int = 1, check: bool = True):
    """An Optuna storage for ``url``: an RDB URL (sqlite, postgresql, mysql) with Optuna's own
    heartbeat and retry of failed trials; a path ending in ``.journal`` as a JournalStorage
    file (its heartbeat is gfsim's, see ``Objective``), checked and guarded by
    ``journal.open_journal`` (``check=False`` leaves out the pass over its lines); anything
    else as Optuna resolves it."""
    import optuna

    if url.endswith(".journal"):
        from gfsim.tuning.claims import stamp_new_trials
        from gfsim.tuning.journal import open_journal

        return stamp_new_trials(open_journal(url, check=check))
    if url.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql"):
        import warnings

        from gfsim.tuning.rdb import check_rdb_url

        check_rdb_url(url, rows=check)  # in-memory; a foreign SQLite file's triggers, rows
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
        for attempt in range(10):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # heartbeat options are experimental
                    made = optuna.storages.RDBStorage(url, **kw)
                break
            except Exception as exc:  # a bad URL, an unreachable server, a missing driver
                # Workers started together on a fresh database race to create Optuna's
                # tables; the loser sees a duplicate type or table (SQLite: "table ...
                # already exists", or the winner's lock), and a second try finds them made.
                racing = type(exc).__name__ in ("IntegrityError", "ProgrammingError") or (
                    type(exc).__name__ == "OperationalError"
                    and ("already exists" in str(exc) or "database is locked" in str(exc)))
                if not racing or attempt == 9:
                    # (SQLAlchemy's own text adds the statement and a link on more lines)
                    cause = getattr(exc, "orig", None) or exc
                    raise GfsimError(f"`storage` {url}: cannot open ({type(exc).__name__}: "
                                     f"{str(cause)[:200]})") from None
                time.sleep(0.2 * (attempt + 1))
        from gfsim.tuning.claims import stamp_new_trials

        return stamp_new_trials(made)
    return url


def native_heartbeat(storage) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return not isinstance(storage, str) and is_heartbeat_enabled(storage)


def open_study(storage, study: str, directions: list[str], sampler):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        try:  # an existing study is loaded, not created again: a journal would append the
            # attempt, and a study refused next (``recorded``, ``identity``) would be changed
            s = optuna.load_study(storage=storage, study_name=study, sampler=sampler)
        except KeyError:
            s = optuna.create_study(storage=storage, study_name=study, sampler=sampler,
                                    directions=directions, load_if_exists=True)
    except GfsimError:  # the storage's own line (a journal file that cannot serve)
        raise
    except Exception as exc:  # bad URL, unreachable database
        raise GfsimError(f"`storage`: cannot open study {study!r}: {exc}") from None
    if [d.name.lower() for d in s.directions] != directions:
        raise GfsimError(f"study {study!r} exists with directions "
                         f"{[d.name.lower() for d in s.directions]}, not {directions}: use "
                         "another `study`")
    return s


class Objective:
    """Picklable: a trial's values -> replays for every seed -> the objective values.

    Before each trial, RUNNING trials that lost their process (a killed worker's on this
    host, or one with no heartbeat for three beats) are failed and, up to ``retries`` times,
    enqueued again with the same parameters (``claims.fail_lost_trials``); a trial that would
    take the study past ``total`` trials (set by ``run_study``) is ended PRUNED and stops
    its process (``claims.beyond_total``). ``heartbeat`` (seconds), for storages without
    Optuna's own (JournalStorage): while a trial runs, a thread stamps it every
    ``heartbeat`` seconds."""

    total: int | None = None  # the study's trials, set by run_study

    def __init__(self, setup, params, objectives, constraint, jobs: int = 1,
                 heartbeat: int | None = None, retries: int = 1):
        self.setup, self.params, self.objectives = setup, params, objectives
        self.constraint, self.jobs = constraint, jobs
        self.heartbeat, self.retries = heartbeat, retries
        self._pool = None

    def __call__(self, trial):
        import optuna

        from gfsim.tuning.claims import beyond_total, fail_lost_trials, record_worker

        record_worker(trial)
        own_beat = bool(self.heartbeat) and not native_heartbeat(trial.storage)
        fail_lost_trials(trial.study, self.retries, 3 * self.heartbeat if own_beat else None,
                         skip=trial.number)
        if self.total is not None and beyond_total(trial, self.total):
            trial.study.stop()
            raise optuna.TrialPruned(f"the study holds its {self.total} trials")
        stop = _beat(trial, self.heartbeat) if own_beat else None
        try:
            return self._evaluate(trial)
        finally:
            if stop is not None:
                stop.set()

    def seed_pool(self):
        """The processes a trial's seeds are replayed in (``SeedPool``; None with one job),
        started on first need and kept, warm, until ``close``: the trials use them, and so
        can what comes after (``out_of_sample``, the recommendation)."""
        if self.jobs > 1 and self._pool is None:
            self._pool = SeedPool(self.setup, self.jobs)
        return self._pool

    def use_pool(self, pool) -> None:
        """Replay what follows the trials in ``pool`` (a ``SeedPool``; a cluster's), closed
        with this objective."""
        self.close()
        self._pool = pool

    def _evaluate(self, trial):
        values = {p.name: p.suggest(trial) for p in self.params}
        spec, search = self.setup.spec(values, self.params)
        ev = evaluate(self.setup, spec, search, pool=self.seed_pool())
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


def retry_of(trial) -> int | None:
    """The number of the failed trial this one retries (gfsim's or Optuna's bookkeeping)."""
    n = trial.user_attrs.get("gfsim_retry_of")
    return n if n is not None else trial.system_attrs.get("failed_trial")


def _counted(study) -> int:
    from gfsim.tuning.claims import counted

    return counted(study)


def _finished(study) -> int:
    import optuna

    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(
        deepcopy=False))


@contextmanager
def _storage_errors(storage):
    """Raise the journal's own line where its append failed: Optuna replaces an error raised
    while it records a trial's end with an ``AssertionError`` of its own bookkeeping."""
    try:
        yield
    except Exception:
        from gfsim.tuning.journal import journal_failure

        failure = journal_failure(storage)
        if failure is None:
            raise
        raise failure from None


def _worker(args, stop=None, parent: tuple | None = None):
    """One worker's share of the trials; it stops after its running trial once ``stop`` (a
    multiprocessing event) is set, its ``parent`` (pid, start) is gone, or the study holds
    its total."""
    url, study_name, sampler_name, seed, constrained, objective, share = args
    import optuna

    from gfsim.core.lifeline import is_alive

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(url, objective.heartbeat, objective.retries, check=False)
    s = optuna.load_study(study_name=study_name, storage=storage,
                          sampler=make_sampler(sampler_name, seed, constrained))

    def check(st, t):
        if ((stop is not None and stop.is_set()) or (parent and not is_alive(*parent))
                or (objective.total is not None and _counted(st) >= objective.total)):
            st.stop()

    stops = [check]
    try:
        with _storage_errors(storage):
            while True:
                try:
                    s.optimize(objective, n_trials=share, callbacks=stops)
                    break
                except ValueError as exc:
                    if not _told_twice(exc):
                        raise
                    # SQLite has no row locks, so two workers can pop the same waiting trial
                    # (a retried one: claims.fail_lost_trials enqueues it) and run it both
                    # (optuna#4621); the other told it first, so this run of it is dropped
                    # and the worker goes on (the study's total still stops it).
    finally:
        objective.close()


def _told_twice(exc: ValueError) -> bool:
    """Whether ``exc`` is Optuna refusing to tell a trial that another worker completed."""
    return str(exc).startswith("Cannot tell a COMPLETE trial")


def _worker_main(args, stop, conn, parent: tuple | None = None) -> None:
    """A worker process: dies with its ``parent`` (pid, start time), runs ``_worker`` and
    sends its outcome to the parent, ``("ok",)`` or ``("error", exception or None where it
    does not pickle, traceback)``."""
    import traceback

    from gfsim.core.lifeline import die_with_parent, is_alive

    die_with_parent()  # the parent (fork) or the fork server, which ends with it
    if parent and not is_alive(*parent):  # it ended before the request took hold
        os._exit(1)
    try:
        _worker(args, stop, parent)
        reply = ("ok",)
    except BaseException as exc:  # KeyboardInterrupt too: the parent says what happened
        reply = ("error", _portable(exc), traceback.format_exc())
    try:
        conn.send(reply)
        conn.close()
    except OSError:  # the parent is gone
        pass


def _portable(exc: BaseException) -> BaseException | None:
    """``exc`` as the parent can unpickle it: a ``GfsimError`` (whose subclasses take other
    arguments) by its line; None for one that does not make the trip."""
    import pickle

    if isinstance(exc, GfsimError):
        return GfsimError(str(exc))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
    return exc


def _outcome(proc, conn):
    """A finished worker's outcome; ``("died", pid, exit code)`` for one that ended without
    sending it (killed); None while it runs."""
    if conn.poll():
        try:
            reply = conn.recv()
        except (EOFError, OSError):  # closed unsent: the process is ending, or has
            reply = None
        if reply is not None:
            proc.join()
            return reply
        proc.join()
    if proc.is_alive():
        return None
    return ("died", proc.pid, proc.exitcode)


def _how(code: int) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without reporting"


def _raise_failure(number: int, total: int, outcome) -> None:
    """Raise what ended worker ``number``: a ``GfsimError`` as it is; a worker killed, in one
    line naming it; any other error with the worker's traceback as its cause."""
    if outcome[0] == "died":
        _, pid, code = outcome
        raise GfsimError(f"tune worker {number} of {total} (pid {pid}) {_how(code)}; the "
                         "other workers stopped after their running trial and every finished "
                         "trial is kept in the study: run the same command again to resume it")
    _, exc, text = outcome
    if isinstance(exc, GfsimError):
        raise exc
    if isinstance(exc, BaseException):
        raise exc from RuntimeError(f"in tune worker {number}:\n{text}")
    raise RuntimeError(f"tune worker {number} failed:\n{text}")


def _run_workers(jobs: list, poll) -> None:
    """Run each of ``jobs`` (``_worker``'s arguments) in a process of its own, calling
    ``poll()`` about every half second. When one fails or dies, the others are asked to stop
    after their running trial (what they finish is kept); then the first failure is raised,
    a worker's death before any error (``_raise_failure``)."""
    import multiprocessing
    from multiprocessing.connection import wait

    from gfsim.core.lifeline import process_start

    ctx = multiprocessing.get_context()
    stop = ctx.Event()
    running = {}
    me = (os.getpid(), process_start(os.getpid()))  # a worker dies with it
    for number, job in enumerate(jobs, 1):
        conn, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker_main, args=(job, stop, send, me),
                           name=f"gfsim-tune-worker-{number}")
        proc.start()
        send.close()  # the child's end: EOF here once it is gone
        running[number] = (proc, conn)
    outcomes = {}
    try:
        while running:
            wait([c for _, c in running.values()] + [p.sentinel for p, _ in running.values()],
                 timeout=WORKER_POLL_S)
            for number, (proc, conn) in list(running.items()):
                outcome = _outcome(proc, conn)
                if outcome is not None:
                    del running[number]
                    outcomes[number] = outcome
                    if outcome[0] != "ok":
                        stop.set()
            poll()
    finally:
        stop.set()
        for proc, _ in running.values():  # left only by an error here (Ctrl-C)
            proc.terminate()
        for proc, _ in running.values():
            proc.join()
    failed = sorted((outcome[0] != "died", number) for number, outcome in outcomes.items()
                    if outcome[0] != "ok")
    if failed:
        number = failed[0][1]
        _raise_failure(number, len(jobs), outcomes[number])


def run_study(study, objective, *, trials: int, workers: int = 1, storage=None,
              sampler_name: str = "tpe", seed: int = 0, progress=None,
              keep_pool: bool = False, executor=None) -> int:
    """Run until the study holds ``trials`` finished trials; returns how many ran now.
    ``progress(done, total)`` is called as trials finish. Several ``workers`` are processes
    of their own (``_run_workers``), or the tasks of ``executor`` (a Ray cluster's,
    ``gfsim.core.executor``, whose shared input is the objective's setup; the storage a
    server every host reaches); a storage that fails, or a local worker that dies, ends it
    in one line (``GfsimError``), and the same command resumes the study. ``keep_pool``: the
    objective's seed processes stay up for the caller (who then calls ``objective.close()``)."""
    from gfsim.tuning.claims import fail_lost_trials

    objective.total = trials
    # A killed worker's trials (this host's) are failed and retried now, not a grace later.
    fail_lost_trials(study, objective.retries)
    before = _finished(study)
    todo = max(0, trials - before)
    if progress is not None:
        progress(before, trials)
    if todo == 0:
        return 0
    poll = (lambda: progress(_finished(study), trials)) if progress else None
    if executor is not None:
        _run_workers_on(executor, _worker_args(study, objective, storage, sampler_name, seed,
                                               todo, workers, seed_jobs=1), poll)
        return _finished(study) - before
    if workers <= 1:
        def cb(s, t):
            done = _finished(s)
            if progress is not None:
                progress(done, trials)
            if _counted(s) >= trials:  # other processes share the study: stop at total
                s.stop()

        try:
            with _storage_errors(study._storage):
                study.optimize(objective, n_trials=todo, callbacks=[cb],
                               catch=(ArithmeticError,))
        finally:
            if not keep_pool:
                objective.close()
        return _finished(study) - before
    _run_workers(_worker_args(study, objective, storage, sampler_name, seed, todo, workers),
                 poll or (lambda: None))
    return _finished(study) - before


def _worker_args(study, objective, storage, sampler_name: str, seed: int, todo: int,
                 workers: int, seed_jobs: int | None = None) -> list:
    """``_worker``'s arguments for each of ``workers``: each runs its share of the ``todo``
    trials left (a count, not a race on the total), its sampler seeded apart; ``seed_jobs``:
    the processes each trial's seeds replay in there (None: the objective's own)."""
    if seed_jobs is not None and seed_jobs != objective.jobs:
        objective = copy.copy(objective)
        objective.jobs, objective._pool = seed_jobs, None
    constrained = objective.constraint is not None
    shares = [todo // workers + (w < todo % workers) for w in range(workers)]
    return [(storage, study.study_name, sampler_name, seed + 1000 * w, constrained, objective,
             share) for w, share in enumerate(shares) if share]


def _run_workers_on(executor, jobs: list, poll) -> None:
    """Run each of ``jobs`` (``_worker``'s arguments) as a task of ``executor``, calling
    ``poll()`` about every half second. The objective travels without its trial setup, which
    each task reads from the executor's shared input (the log once per worker, not once per
    task). A worker killed mid-trial costs a rerun of its task (its share goes on; Optuna's
    heartbeat fails the trial it held and retries it); an error in one is raised here once the
    others are cancelled."""
    light = []
    for args in jobs:
        objective = copy.copy(args[5])
        objective.setup = None
        light.append((*args[:5], objective, *args[6:]))
    executor.run(_task_worker, light, poll=poll)


def _task_worker(setup, args) -> None:
    """A tune worker as a cluster's task (``_run_workers_on``): its objective given back the
    trial setup (``setup``, the executor's shared input)."""
    args[5].setup = setup
    _worker(args)


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


def out_of_sample(setup, rows: list[dict], objectives, fresh_seeds, pool=None,
                  replayed: dict | None = None) -> list[dict]:
    """The given trials re-scored on seeds no trial saw, beside their in-sample figures.
    ``replayed``: (spec, search) -> ``metric_rows`` of replays on these seeds already made
    (the recommendation's), which are not made again."""
    from gfsim.simulator.shape import shape_from_dict

    out = []
    for r in rows:
        search = shape_from_dict(r["search"])
        ev = evaluate(setup, r["spec"], search, seeds=fresh_seeds, pool=pool,
                      rows=(replayed or {}).get((r["spec"], search)))
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

