"""The caches gfsim keeps, declared in one place, and one switch that turns them all off.

A replay, its seeds and a tuning run's trials read the same log thousands of times, so what is
worked out from a shared object is kept: on the object itself (a trace keeps its pool of
logged children, a fit its residuals), in a table of this process (traces per log content,
cost model and forecaster), or on disk beside a log's table cache (``replay_logs.derived``).
Each is declared in ``CACHES`` with what it holds. Engines only read what a cache holds, and a
cache is keyed by everything its value is made from, so turning the caches off changes no
answer, only the time (``tests/test_caches.py`` replays with them on and off):

    >>> from gfsim.core.caches import caches_off, enabled
    >>> with caches_off():
    ...     enabled()
    False
    >>> enabled()
    True

A cache kept on an object goes through ``kept`` and ``keep`` (or ``on_object``), which name it
by its declared key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["CACHES", "caches_off", "enabled", "keep", "kept", "on_object", "set_enabled"]

T = TypeVar("T")

# name -> what it holds (and where: ``on <object>`` for an attribute of that object)
CACHES: dict[str, str] = {
    "_log_pool": "on a trace: its logged expansions, fallback pool and each logged candidate's "
                 "fields as a child copies them (simulator.children.pool_of)",
    "_world_models": "on a log's first trace: the world models fitted to its traces, by family "
                     "(simulator.world_model.world_model)",
    "_templates": "on a trace's fitted pairs: the forecast templates an invented child moves "
                  "(simulator.world_model)",
    "_residuals": "on a gradient-boosted fit: its residuals as a list (simulator.world_model)",
    "_residual_array": "on a gradient-boosted fit: its residuals as an array, for the compiled "
                       "draws (simulator.world_model)",
    "_tables": "on a trace's forecast templates: what the compiled draws read of the trace, "
               "as arrays (simulator.world_model)",
    "_kernel_classes": "on a world model's ensemble member: its outcome classes as the "
                       "compiled draws' codes (simulator.world_model)",
    "_reproduction": "on a trace: how far the closed loop reproduces it, by search shape "
                     "(simulator.shape.reproductions)",
    "_fast_widest": "on a trace: its widest step, which decides whether the trace fast path "
                    "can run (simulator.trace.fast; set when traces are built)",
    "_fast_layout_rows": "on a large trace: its steps flattened for the trace fast path "
                         "(simulator.trace.fast)",
    "_trace_key": "on a log: the content key its traces are cached by (simulator.replay)",
    "_keep_derived": "on a log: whether its traces and replays are worth storing on disk "
                     "(simulator.replay)",
    "traces": "in this process: built traces per (log content, cost model, forecaster), the "
              "last 8 (simulator.replay.cached_traces)",
    "derived": "on disk, beside a log's table cache: its traces and replays, keyed by the log's "
               "bytes, the cost model, the forecaster and gfsim's code (replay_logs.derived)",
}

_ON = [True]
_MISSING = object()


def enabled() -> bool:
    """Whether caches are on in this process."""
    return _ON[0]


def set_enabled(on: bool) -> None:
    """Turn every cache on or off in this process (``caches_off`` for a block)."""
    _ON[0] = bool(on)


@contextmanager
def caches_off() -> Iterator[None]:
    """No cache is read or written inside the block; each value is worked out where it is used
    (what was kept before stays, unread, and serves again after the block)."""
    before = _ON[0]
    _ON[0] = False
    try:
        yield
    finally:
        _ON[0] = before


def kept(obj: Any, name: str, default: Any = None) -> Any:
    """What cache ``name`` holds on ``obj`` (``default``: nothing, or caches off)."""
    if not _ON[0]:
        return default
    return obj.__dict__.get(name, default)


def keep(obj: Any, name: str, value: T) -> T:
    """Keep ``value`` in cache ``name`` on ``obj`` (nothing while caches are off); returns it."""
    if _ON[0]:
        obj.__dict__[name] = value
    return value


def on_object(obj: Any, name: str, make: Callable[[], T]) -> T:
    """Cache ``name`` on ``obj``, made by ``make()`` the first time (every time, caches off)."""
    if not _ON[0]:
        return make()
    d = obj.__dict__
    got = d.get(name, _MISSING)
    if got is _MISSING:
        got = d[name] = make()
    return got
