"""Progress of long replays, for a front end that shows it.

The engines tick once per search step they finish (``tick``); nothing listens unless a front
end asks, for the length of one call (``listening``), so a tick without a listener costs one
lookup. A listener only counts: it never changes what a replay does. Ticks in other processes
(``--jobs``, a cluster's workers) are not seen by this one's listener; ``ticked_map`` counts
them there and ticks them here as each task comes back.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

__all__ = ["tick", "listening", "ticked_map"]

_LISTENER: ContextVar[Callable[[int], None] | None] = ContextVar("gfsim_progress",
                                                                 default=None)


def tick(steps: int = 1) -> None:
    """``steps`` search steps are done (any search, any engine)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(steps)


@contextmanager
def listening(listener: Callable[[int], None]) -> Iterator[None]:
    """Call ``listener(steps)`` on every ``tick`` inside the ``with`` block."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def ticked_map(executor, fn: Callable, items: list, **kw) -> Iterator:
    """``executor.map(fn, items)`` (``gfsim.core.executor``), the search steps its replays
    tick heard here: in this process as they happen, from other processes as each task
    returns. The tasks are handed out at the call."""
    if executor.kind == "in-process":
        return executor.map(fn, items, **kw)
    return _ticking(executor.map(_counted, [(fn, item) for item in items], **kw))


def _ticking(results: Iterator) -> Iterator:
    for got, steps in results:
        tick(steps)
        yield got


def _counted(shared, job) -> tuple:
    """In a worker: ``fn(shared, item)`` and the search steps it ticked."""
    fn, item = job
    steps = [0]
    with listening(lambda n: steps.__setitem__(0, steps[0] + n)):
        got = fn(shared, item)
    return got, steps[0]
