"""The replay drivers' names: which of them re-run the search (closed loop) and which replay the
log's order (``trace``). Here, not in ``gfsim.simulator.drivers``, so that the command line can
check a ``--driver`` without loading the simulator (``gfsim -h`` stays light)."""

from __future__ import annotations

__all__ = ["CLOSED_LOOP", "is_closed_loop"]

CLOSED_LOOP = ("puct", "closed", "evolution")  # drivers that re-run the search


def is_closed_loop(driver: str) -> bool:
    """Whether ``driver`` re-runs the search (draws children) rather than replaying the log's
    order (``trace``)."""
    return driver in CLOSED_LOOP
