"""What a candidate detaches from its sandbox, found and killed.

Where a PID namespace holds a sandbox, the kernel kills everything in it with its PID 1. Where
there is none (``--trust-candidates`` on a machine without one), the measurer kills the
sandbox's process group, and a process that called ``setsid()`` has left it: it would outlive
``close()`` holding what it holds. The zygote, which forks every sandbox, is therefore the
*child subreaper* of its descendants (``PR_SET_CHILD_SUBREAPER``): an orphan of a sandbox is
re-parented to it rather than to init, and it kills what it adopted when asked (``kill_adopted``)
and everything below it when it exits (``kill_all``).
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["PR_SET_CHILD_SUBREAPER", "children", "kill_adopted", "kill_all"]

PR_SET_CHILD_SUBREAPER = 36


def children(parent: int) -> set[int]:
    """The live (not zombie) processes whose parent is ``parent``, from ``/proc``."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 1 and fields[0] != b"Z" and int(fields[1]) == parent:
            found.add(int(name))
    return found


def _kill(pids) -> int:
    n = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except OSError:
            pass
    return n


def kill_adopted(parent: int, own: set[int]) -> int:
    """SIGKILL ``parent``'s children other than ``own`` (the processes it forked itself; those
    no longer alive are dropped from it): what it adopted as subreaper. How many."""
    kids = children(parent)
    own.intersection_update(kids)
    return _kill(kids - own)


def kill_all(parent: int, wait_s: float = 3.0) -> int:
    """SIGKILL ``parent``'s children until none is left (each one's own children, orphaned,
    come to ``parent`` as subreaper and are killed in turn), for at most ``wait_s``. How many
    were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        kids = children(parent)
        if not kids:
            break
        _kill(kids)
        killed |= kids
        time.sleep(0.01)
    return len(killed)
