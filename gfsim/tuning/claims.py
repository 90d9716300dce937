"""Which trials of a study are alive, and which may still run: the bookkeeping that keeps
several processes (workers, other ``gfsim tune`` commands, other hosts) from losing a trial
to a killed worker or running more trials than asked.

- Each trial records the process running it (``WORKER_ATTR``: host, pid, the pid's start
  time), in the very write that creates it (``stamp_new_trials``). A RUNNING trial whose
  process on this host is gone is failed at the next start or the next trial
  (``fail_lost_trials``), as is one whose heartbeat is older than a grace period (for
  storages without Optuna's own heartbeat), and is enqueued again with the same parameters
  while it has retries left. A trial whose process on this host lives is never failed.
- A trial runs only if the trials numbered before it that are finished, running or waiting
  (``COUNTED``) are fewer than the study's total (``beyond_total``). Trial numbers are handed
  out by the storage in order, so of any two trials the later one sees the earlier: the study
  never finishes more than its total, however many processes share it. A trial past the total
  is ended PRUNED before it draws any parameter, marked ``BEYOND_ATTR``.
"""

from __future__ import annotations

import os
import time

import optuna

from gfsim.core.lifeline import host_id, is_alive, process_start

__all__ = ["WORKER_ATTR", "BEYOND_ATTR", "COUNTED", "stamp_new_trials", "record_worker",
           "fail_lost_trials", "beyond_total", "counted"]

WORKER_ATTR = "gfsim_worker"
BEYOND_ATTR = "gfsim_beyond_trials"
_STATE = optuna.trial.TrialState
COUNTED = (_STATE.COMPLETE, _STATE.RUNNING, _STATE.WAITING)


def _this_process() -> dict:
    pid = os.getpid()
    return {"host": host_id(), "pid": pid, "start": process_start(pid)}


def stamp_new_trials(storage):
    """Have each trial this process creates in ``storage`` carry ``WORKER_ATTR`` from the
    write that creates it (a template, one journal line or one transaction): a process killed
    a moment after, or whose next write fails, leaves no RUNNING trial without an owner.
    Returns ``storage``."""
    from datetime import datetime

    # RDBStorage creates through _create_new_trial (Optuna's cache calls it directly).
    name = "_create_new_trial" if hasattr(storage, "_create_new_trial") else "create_new_trial"
    plain = getattr(storage, name)

    def create(study_id, template_trial=None):
        if template_trial is None:
            template_trial = optuna.trial.FrozenTrial(
                number=-1, state=_STATE.RUNNING, value=None, datetime_start=datetime.now(),
                datetime_complete=None, params={}, distributions={},
                user_attrs={WORKER_ATTR: _this_process()}, system_attrs={},
                intermediate_values={}, trial_id=-1)
        return plain(study_id, template_trial)

    setattr(storage, name, create)
    return storage


def record_worker(trial) -> None:
    """Note on ``trial`` the process that runs it, where its creation did not (a waiting
    trial, enqueued by another, that this process took)."""
    me = _this_process()
    if trial.user_attrs.get(WORKER_ATTR) != me:
        trial.set_user_attr(WORKER_ATTR, me)


def _lost(t, here: str, now: float, grace: float | None) -> bool:
    """Whether RUNNING trial ``t`` has lost its process: one on this host that is gone, or
    (``grace`` given) no heartbeat for ``grace`` seconds."""
    who = t.user_attrs.get(WORKER_ATTR)
    if isinstance(who, dict) and who.get("host") == here and isinstance(who.get("pid"), int):
        return not is_alive(who["pid"], who.get("start"))  # alive here: not lost
    if grace is None:
        return False
    last = t.user_attrs.get("gfsim_heartbeat") or (
        t.datetime_start.timestamp() if t.datetime_start else now)
    return now - last > grace


def fail_lost_trials(study, retries: int, grace: float | None = None,
                     skip: int | None = None) -> int:
    """Fail the RUNNING trials of ``study`` (other than number ``skip``) that lost their
    process (``_lost``), and enqueue each again with its parameters while it has retries left;
    returns how many were failed."""
    storage, here, now, failed = study._storage, host_id(), time.time(), 0
    for t in study.get_trials(deepcopy=False, states=(_STATE.RUNNING,)):
        if t.number == skip or not _lost(t, here, now, grace):
            continue
        try:
            if not storage.set_trial_state_values(t._trial_id, _STATE.FAIL):
                continue
        except Exception:  # another process failed it first
            continue
        failed += 1
        done = max(int(t.user_attrs.get("gfsim_retries", 0)),
                   len(t.system_attrs.get("retry_history", ())))
        if done < retries and t.params:
            study.enqueue_trial(t.params, user_attrs={"gfsim_retry_of": t.number,
                                                      "gfsim_retries": done + 1})
    return failed


def counted(study) -> int:
    """The trials finished or running: a process stops once they reach the study's total.
    (A waiting trial is left out: a process that stops leaves it unrun.)"""
    return len(study.get_trials(deepcopy=False, states=(_STATE.COMPLETE, _STATE.RUNNING)))


def beyond_total(trial, total: int) -> bool:
    """Whether ``trial`` would take its study past ``total``: as many trials numbered before
    it are finished, running or waiting. Marks it so (``BEYOND_ATTR``) when it would."""
    before = sum(t.number < trial.number for t in trial.study.get_trials(
        deepcopy=False, states=COUNTED))
    if before < total:
        return False
    trial.set_user_attr(BEYOND_ATTR, total)
    return True
