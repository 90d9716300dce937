"""One control group per sandbox: the kernel limits its memory and its tasks.

A watchdog that sums a namespace's resident memory cannot see memory no process maps (a
``memfd`` written through its descriptor, a detached SysV segment), and a count of processes
misses their threads. A cgroup's memory controller charges every page its tasks bring in,
those included, and its pids controller counts every task, threads included; past the limit
the kernel refuses the page (its OOM killer then kills in the group) or the ``clone``.

``support()`` says whether this process may make such groups here: cgroup v2 with the memory
and pids controllers, else the v1 hierarchies of each (as root, beneath this process's own
group). ``TaskGroup.create`` makes one for a sandbox; the sandbox's outer process writes its
pid into ``procs`` before it enters its namespaces, so everything it starts is inside.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["support", "join", "TaskGroup", "CONTROLLERS"]

CONTROLLERS = ("memory", "pids")
_PREFIX = "gfsim-sandbox-"


def _mounts() -> tuple[str | None, dict[str, tuple[str, str]]]:
    """(the cgroup2 mount point, {v1 controller: (mount point, mount root)})."""
    v2, v1 = None, {}
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif rest[0] == "cgroup":
            for opt in rest[2].split(","):
                if opt in CONTROLLERS:
                    v1[opt] = (fields[4], fields[3])
    return v2, v1


def _own_groups() -> dict[str, str]:
    """This process's group per hierarchy: {"": v2 path, "memory": v1 path, ...}."""
    out = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh.read().splitlines():
                _id, names, path = line.split(":", 2)
                for name in (names.split(",") if names else [""]):
                    out[name] = path
    except (OSError, ValueError):
        pass
    return out


def _join(mount: str, root: str, path: str) -> str:
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return os.path.join(mount, rel.lstrip("/"))


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _parents() -> tuple[int, dict[str, str]] | str:
    """(version, {controller: folder new groups go beneath}), or why there is none."""
    v2, v1 = _mounts()
    own = _own_groups()
    if v2 is not None and "" in own:
        base = _join(v2, "/", own[""])
        try:
            have = _read(os.path.join(base, "cgroup.controllers")).split()
            if all(c in have for c in CONTROLLERS):
                enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
                missing = [c for c in CONTROLLERS if c not in enabled]
                if missing:  # fails (EBUSY) in a non-root group that holds processes
                    _write(os.path.join(base, "cgroup.subtree_control"),
                           " ".join("+" + c for c in missing))
                return 2, {c: base for c in CONTROLLERS}
        except OSError:
            pass
    if all(c in v1 and c in own for c in CONTROLLERS):
        return 1, {c: _join(*v1[c], own[c]) for c in CONTROLLERS}
    return ("no cgroup v2 with the memory and pids controllers, nor v1 hierarchies of both, "
            "that this process may make groups in")


@dataclass
class TaskGroup:
    """A sandbox's group: ``folders`` (one per hierarchy), its limits set."""

    version: int
    folders: dict  # {controller: folder}

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_tasks: int) -> TaskGroup:
        """Make ``gfsim-sandbox-<name>`` beneath this process's group in each hierarchy, with
        at most ``memory_bytes`` of memory (no swap) and ``max_tasks`` tasks. Raises OSError
        where the machine allows no such group (``support``)."""
        found = _parents()
        if isinstance(found, str):
            raise OSError(found)
        version, parents = found
        folders: dict = {}
        group = cls(version, folders)
        try:
            for controller, parent in parents.items():
                folder = os.path.join(parent, _PREFIX + name)
                if folder not in folders.values():
                    _sweep(parent)
                    os.mkdir(folder, 0o755)
                folders[controller] = folder
            group._limit(int(memory_bytes), int(max_tasks))
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, memory_bytes: int, max_tasks: int) -> None:
        mem, pids = self.folders["memory"], self.folders["pids"]
        if self.version == 2:
            _write(os.path.join(mem, "memory.max"), str(memory_bytes))
            _optional(os.path.join(mem, "memory.swap.max"), "0")
            _optional(os.path.join(mem, "memory.oom.group"), "1")
        else:
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
            _optional(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        _write(os.path.join(pids, "pids.max"), str(max_tasks))

    @property
    def procs(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid into to join."""
        return sorted({os.path.join(f, "cgroup.procs") for f in self.folders.values()})

    def oom_kills(self) -> int:
        """How many tasks the kernel killed for the memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _counter(os.path.join(self.folders["memory"], name), "oom_kill")

    def tasks_refused(self) -> int:
        """How many forks or threads the task limit refused."""
        return _counter(os.path.join(self.folders["pids"], "pids.events"), "max")

    def kill_all(self) -> None:
        """SIGKILL every task still in the group (the sandbox's own, which outlived its end):
        a group is removed only once empty."""
        import signal

        for folder in sorted(set(self.folders.values())):
            try:
                pids = _read(os.path.join(folder, "cgroup.procs")).split()
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass

    def remove(self) -> bool:
        """Remove the (emptied) group; False where a folder stays (tasks still in it)."""
        ok = True
        for folder in sorted(set(self.folders.values())):
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok


def join(procs: list[str]) -> None:
    """Move this process into the group whose ``cgroup.procs`` files these are."""
    for path in procs:
        _write(path, str(os.getpid()))


def _optional(path: str, text: str) -> None:
    """Write a setting this kernel may lack (swap accounting off, an older kernel)."""
    if os.path.exists(path):
        _write(path, text)


def _counter(path: str, key: str) -> int:
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _sweep(parent: str, min_age_s: float = 60.0) -> None:
    """Remove the empty groups of measurers that are gone (killed before they removed them),
    made over ``min_age_s`` ago (a measurer in another PID namespace looks gone from here: its
    newest group may be empty for a moment before its sandbox joins)."""
    import time

    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("-", 1)[0] if name.startswith(_PREFIX) else ""
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        path = os.path.join(parent, name)
        try:
            if time.time() - os.stat(path).st_mtime > min_age_s:
                os.rmdir(path)
        except OSError:
            pass


def support() -> tuple[int, str | None]:
    """(cgroup version, None) where this process may make a sandbox's group (it makes and
    removes one here); else (0, why not, in a few words)."""
    try:
        group = TaskGroup.create(f"{os.getpid()}-probe", 1 << 30, 64)
    except OSError as exc:
        return 0, exc.strerror or str(exc)
    group.remove()
    return group.version, None
