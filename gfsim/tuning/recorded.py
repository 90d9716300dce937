"""What ``gfsim tune`` records in a study, checked when a study is opened.

A study is a file anyone can edit, and gfsim reads its own attributes back: the trial's
``spec`` to replay it, ``metrics`` and ``values_*`` to rank and re-score it, ``tasks`` for
leave-one-task-out, the worker, retry and heartbeat marks to fail lost trials, the recorded
configuration and versions to claim the study. A value of another type ended ``gfsim tune``
in a traceback (a ``spec`` that is a list: ``TypeError: unhashable type``), as did a finished
trial without values. ``check_recorded`` names the first such value, by study, trial and
attribute, before any of it is used.
"""

from __future__ import annotations

import functools
from numbers import Real

from gfsim.core.errors import GfsimError

__all__ = ["check_recorded"]


def _number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _numbers(v) -> bool:
    return isinstance(v, list) and all(_number(x) for x in v)


def _matrix(v) -> bool:
    return isinstance(v, list) and all(_numbers(r) for r in v) and len(
        {len(r) for r in v}) <= 1


# Each attribute gfsim writes on a trial: (what it must be, in words; the test).
TRIAL_ATTRS = {
    "spec": ("a policy spec (text)", lambda v: isinstance(v, str)),
    "search": ("a search shape (an object) or null", lambda v: v is None or isinstance(v, dict)),
    "metrics": ("an object of numbers", lambda v: isinstance(v, dict) and all(
        _number(x) or x is None for x in v.values())),
    "tasks": ("a list of task names", lambda v: isinstance(v, list) and all(
        isinstance(x, str) for x in v)),
    "clipped": ("an integer", _integer),
    "constraint": ("a list of numbers", _numbers),
    "gfsim_worker": ("an object (host, pid, start)", lambda v: isinstance(v, dict)),
    "gfsim_retries": ("an integer", _integer),
    "gfsim_retry_of": ("an integer", _integer),
    "gfsim_beyond_trials": ("an integer", _integer),
    "gfsim_heartbeat": ("a time (seconds)", _number),
}
STUDY_ATTRS = {
    "gfsim_configuration": ("an object", lambda v: isinstance(v, dict)),
    "gfsim_version": ("a list of versions", lambda v: isinstance(v, list) and all(
        isinstance(x, str) for x in v)),
    "gfsim_runs": ("a list of runs", lambda v: isinstance(v, list)),
}


def check_recorded(study, url: str, params=()) -> None:
    """Refuse (``GfsimError``, one line) a study whose gfsim attributes are not of the types
    gfsim writes (``STUDY_ATTRS``, ``TRIAL_ATTRS``; ``values_*``: a table of numbers, one
    column per task), one of whose finished trials has no value per direction, or one of whose
    waiting trials would run values outside the tuned ``params`` (``TunedParam``)."""
    import optuna

    from gfsim.tuning.identity import _where

    where = f"study {_show(study.study_name)} in {_where(url)}"
    for key, (what, ok) in STUDY_ATTRS.items():
        if key in study.user_attrs and not ok(study.user_attrs[key]):
            raise _refuse(f"{where}: its attribute {key} is not {what}")
    tasks = None
    for t in study.get_trials(deepcopy=False):
        at = f"{where}, trial {t.number}"
        for key, value in t.user_attrs.items():
            if key in TRIAL_ATTRS and not TRIAL_ATTRS[key][1](value):
                raise _refuse(f"{at}: its attribute {key} is not {TRIAL_ATTRS[key][0]}")
            if key.startswith("values_") and not _matrix(value):
                raise _refuse(f"{at}: its attribute {key} is not a table of numbers")
        wrong = _unusable(t.user_attrs)
        if wrong:
            raise _refuse(f"{at}: {wrong}")
        if "tasks" in t.user_attrs:
            tasks = t.user_attrs["tasks"] if tasks is None else tasks
            if t.user_attrs["tasks"] != tasks:
                raise _refuse(f"{at}: its tasks differ from an earlier trial's")
            for key, value in t.user_attrs.items():
                if key.startswith("values_") and any(len(r) != len(tasks) for r in value):
                    raise _refuse(f"{at}: its attribute {key} has not one column per task")
        if t.state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING) \
                and params:  # (a lost running trial is enqueued again with its values)
            outside = _outside(t.system_attrs.get("fixed_params", {}) if t.state ==
                               optuna.trial.TrialState.WAITING else t.params, params)
            if outside:
                raise _refuse(f"{at}: waits to run {outside}, outside the space tuned")
        if not isinstance(t.system_attrs.get("retry_history", []), list):
            raise _refuse(f"{at}: its retry_history is not a list")
        if t.state == optuna.trial.TrialState.COMPLETE and (
                t.values is None or len(t.values) != len(study.directions)):
            raise _refuse(f"{at}: finished without a value per direction")


def _unusable(attrs: dict) -> str | None:
    """Whether a trial's ``spec`` and ``search``, which gfsim replays again (the top trials'
    re-scoring, the recommendation), make a policy and a search shape; in words if not.
    (Text that is no policy was refused only after the study's new trials had run.)"""
    if isinstance(attrs.get("spec"), str):
        why = _no_policy(attrs["spec"])
        if why:
            return f"its spec {_show(attrs['spec'])} is no policy ({why})"
    if isinstance(attrs.get("search"), dict):
        from gfsim.simulator.shape import shape_from_dict

        try:
            shape_from_dict(attrs["search"])
        except (TypeError, ValueError) as exc:
            return f"its search {_show(attrs['search'])} is no search shape ({exc})"
    return None


@functools.lru_cache(maxsize=256)  # (a study's trials share a few specs' shapes)
def _no_policy(spec: str) -> str | None:
    from gfsim.policies import make_policy

    try:
        make_policy(spec)
    except (GfsimError, ValueError, TypeError) as exc:
        return str(exc)[:120]
    return None


def _outside(fixed, params) -> str | None:
    """The first of an enqueued trial's ``fixed`` values that the tuned ``params`` do not
    hold, in words; None if all are held."""
    if not isinstance(fixed, dict):
        return f"fixed parameters {_show(fixed)}"
    space = {p.name: p for p in params}
    for name, value in fixed.items():
        p = space.get(name)
        if p is None:
            return f"a parameter {_show(name)} not tuned"
        if p.kind == "categorical":
            held = value in p.choices
        else:
            held = _number(value) and p.low <= value <= p.high and (
                p.kind != "int" or float(value).is_integer())
        if not held:
            return f"{name}={value if _number(value) else _show(value)}"
    return None


def _refuse(what: str) -> GfsimError:
    return GfsimError(f"{what}; it is not a study gfsim tune wrote, or was changed since: use "
                      "another `study` or storage")


def _show(name) -> str:
    text = "".join(c if c.isprintable() else "?" for c in str(name))
    return repr(text[:80] + ("..." if len(text) > 80 else ""))
