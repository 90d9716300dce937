"""Lean stand-ins for ``simpy.Resource`` and ``env.all_of`` on the engine's hot path.

A replay acquires a resource several times per candidate; most acquisitions find a free slot.
``Slots`` grants those without scheduling an event (the process simply goes on), and queues
the rest first come, first served, as ``simpy.Resource`` does. ``Countdown`` is a join on a
known number of processes without a condition event per process.
"""

from __future__ import annotations

from collections import deque

import simpy

__all__ = ["Slots", "Countdown"]


class Slots:
    """``capacity`` identical slots, granted in request order."""

    __slots__ = ("env", "capacity", "in_use", "waiting")

    def __init__(self, env: simpy.Environment, capacity: int):
        self.env = env
        self.capacity = capacity
        self.in_use = 0
        self.waiting: deque[simpy.Event] = deque()

    def acquire(self) -> simpy.Event | None:
        """None if a slot was free (it is now taken); else an event that fires when one is."""
        if self.in_use < self.capacity and not self.waiting:
            self.in_use += 1
            return None
        event = self.env.event()
        self.waiting.append(event)
        return event

    def release(self) -> None:
        if self.waiting:
            self.waiting.popleft().succeed()  # the slot passes straight to the next in line
        else:
            self.in_use -= 1


class Countdown:
    """An event that fires once ``count`` parties have called ``done`` (at once if zero)."""

    __slots__ = ("remaining", "event")

    def __init__(self, env: simpy.Environment, count: int):
        self.remaining = count
        self.event = env.event()
        if count == 0:
            self.event.succeed()

    def done(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.event.succeed()
