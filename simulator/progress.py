"""Progress of long replays, for a front end that shows it.

The engines tick once per search step they finish (``tick``); nothing listens unless a front
end asks, for the length of one call (``listening``), so a tick without a listener costs one
lookup. A listener only counts: it never changes what a replay does. Ticks in worker processes
(``--jobs``) are not seen by the parent's listener.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

__all__ = ["tick", "listening"]

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
