"""A helper process's tie to the process that started it, and whether a process still lives.

``die_with_parent`` asks Linux to kill the calling process when its parent dies
(``PR_SET_PDEATHSIG``): a tune worker must not go on writing a study once the command that
started it has been killed. ``process_start`` and ``is_alive`` name a process by its pid and
start time (ticks since boot), so a pid reused by another process is not taken for it.
"""

from __future__ import annotations

import os
import signal

__all__ = ["die_with_parent", "process_start", "is_alive", "host_id"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (the thread that forked
    it) ends; True where it can (Linux). A parent that ended before this call (``parent_pid``
    no longer this process's parent) ends this process at once."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: the caller's own checks are all there is
        armed = False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # orphaned before the request took hold
    return armed


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, from /proc); None where it does
    not exist or /proc cannot tell."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()
    try:  # field 22 of stat, the 20th after the command's closing parenthesis
        return int(fields[19]) if fields[0] != b"Z" else None
    except (IndexError, ValueError):
        return None


def is_alive(pid: int, start: int | None) -> bool:
    """Whether process ``pid``, started at ``start`` (``process_start``), still runs; True
    where /proc cannot tell."""
    if not os.path.isdir("/proc/self"):
        return True
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def host_id() -> str:
    """This machine as its processes see it: host name, boot and pid namespace, so that a pid
    is compared only with pids of the same boot and namespace."""
    import socket

    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read(64).strip())
    except OSError:
        parts.append("?")
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts.append("?")
    return "/".join(parts)
