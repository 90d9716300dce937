"""One control group per sandbox: the kernel limits its memory and its tasks.

A watchdog that sums a namespace's resident memory cannot see memory no process maps (a
``memfd`` written through its descriptor, a detached SysV segment), and a count of processes
misses their threads. A cgroup's memory controller charges every page its tasks bring in,
those included, and its pids controller counts every task, threads included; past the limit
the kernel refuses the page (its OOM killer then kills in the group) or the ``clone``.

``support()`` says whether this process may make such groups here, and ``controllers()`` which
of the two they hold: cgroup v2 with the memory controller, the pids controller or both, else
the v1 hierarchies of either (as root, beneath this process's own group). A group holds what
the machine delegates; the fallback (``gfsim.live.measure.sandbox``) covers the rest, and the
sandbox's word says which held. ``TaskGroup.create`` makes one for a sandbox; the sandbox's
outer process writes its pid into ``procs`` before it enters its namespaces, so everything it
starts is inside.

cgroup v2 lets a non-root group hand a domain controller (memory) to its children only while it
holds no process itself ("no internal processes"): the kernel refuses ``+memory`` in
``cgroup.subtree_control`` with EBUSY while any task is in the group, whoever started it, and
refuses to move a task into it once the controller is on. So where this process's own group
holds processes, ``hold()`` moves every process of that group (not only this process's: the
kernel counts them all) into a leaf child, ``gfsim-measurer-<pid>``, which has no limit of its
own (the group's own limits still bind it: they are hierarchical), enables the controllers, and
``release()`` undoes it: the controllers it enabled off, the processes moved back, the leaf
removed, once no other group is left beneath. Nothing outside the own group is touched.
"""

from __future__ import annotations

import atexit
import errno
import os
from dataclasses import dataclass

__all__ = ["support", "controllers", "join", "hold", "release", "delegate", "undelegate",
           "TaskGroup", "Delegation", "CONTROLLERS", "LEAF_PREFIX"]

CONTROLLERS = ("memory", "pids")
_PREFIX = "gfsim-sandbox-"
LEAF_PREFIX = "gfsim-measurer-"
# How many passes a move of a group's processes makes (a process may fork while it runs).
_MOVE_PASSES = 50


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


def _words(folder: str, name: str) -> list[str]:
    try:
        return _read(os.path.join(folder, name)).split()
    except OSError:
        return []


def _v2_base() -> str | None:
    """The v2 group new groups go beneath: this process's own, or, where this process is in
    a measurer's leaf (``hold``), the group the leaf was made in."""
    v2, _v1 = _mounts()
    own = _own_groups()
    if v2 is None or "" not in own:
        return None
    base = _join(v2, "/", own[""])
    if os.path.basename(base.rstrip("/")).startswith(LEAF_PREFIX):
        base = os.path.dirname(base.rstrip("/"))
    return base


def _v2_parents(base: str) -> tuple[dict[str, str], str]:
    """({controller: base} for what ``base`` hands its children, why the rest is missing)."""
    have = [c for c in CONTROLLERS if c in _words(base, "cgroup.controllers")]
    if not have:
        return {}, "the own cgroup v2 group has neither the memory nor the pids controller"
    enabled = _words(base, "cgroup.subtree_control")
    why = ""
    for c in have:
        if c not in enabled:  # refused (EBUSY) for memory while the group holds processes
            try:
                _write(os.path.join(base, "cgroup.subtree_control"), "+" + c)
                enabled.append(c)
            except OSError as exc:
                why = f"+{c} refused in the own group's subtree_control (" + (
                    "EBUSY: it holds processes, until a measurer moves them into a leaf)"
                    if exc.errno == errno.EBUSY else f"{exc.strerror})")
    out = {c: base for c in have if c in enabled}
    return out, why or "the own cgroup v2 group enables no controller for its children"


def _parents() -> tuple[int, dict[str, str]] | str:
    """(version, {controller: folder new groups go beneath}), or why there is none. Of v2 and
    v1, the one whose groups hold more of ``CONTROLLERS`` (memory first; v2 on a tie)."""
    v2, v1 = _mounts()
    own = _own_groups()
    found, why2 = {}, "no cgroup v2"
    base = _v2_base()
    if base is not None:
        found, why2 = _v2_parents(base)
    old = {c: _join(*v1[c], own[c]) for c in CONTROLLERS if c in v1 and c in own}
    if not found and not old:
        return (f"no cgroup v2 group with the memory or pids controller ({why2}), nor a v1 "
                "hierarchy of either, that this process may make groups in")
    if (("memory" in old, len(old)) > ("memory" in found, len(found))):
        return 1, old
    return 2, found


@dataclass
class TaskGroup:
    """A sandbox's group: ``folders`` (one per hierarchy, by controller), its limits set. It
    holds the controllers it has folders for (``controllers``)."""

    version: int
    folders: dict  # {controller: folder}

    @property
    def controllers(self) -> tuple:
        return tuple(c for c in CONTROLLERS if c in self.folders)

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_tasks: int,
               controllers: tuple = CONTROLLERS) -> TaskGroup:
        """Make ``gfsim-sandbox-<name>`` beneath this process's group in each hierarchy, with
        at most ``memory_bytes`` of memory (no swap) and ``max_tasks`` tasks, where it holds
        those controllers (of ``controllers``). Raises OSError where the machine allows no
        such group (``support``)."""
        found = _parents()
        if isinstance(found, str):
            raise OSError(found)
        version, parents = found
        parents = {c: f for c, f in parents.items() if c in controllers}
        if not parents:
            raise OSError(f"no group of {', '.join(controllers) or 'no controller'} may be "
                          "made here")
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
        mem, pids = self.folders.get("memory"), self.folders.get("pids")
        if mem and self.version == 2:
            _write(os.path.join(mem, "memory.max"), str(memory_bytes))
            _optional(os.path.join(mem, "memory.swap.max"), "0")
            _optional(os.path.join(mem, "memory.oom.group"), "1")
        elif mem:
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
            _optional(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        if pids:
            _write(os.path.join(pids, "pids.max"), str(max_tasks))

    @property
    def procs(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid into to join."""
        return sorted({os.path.join(f, "cgroup.procs") for f in self.folders.values()})

    def oom_kills(self) -> int:
        """How many tasks the kernel killed for the memory limit (0 without one)."""
        if "memory" not in self.folders:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _counter(os.path.join(self.folders["memory"], name), "oom_kill")

    def tasks_refused(self) -> int:
        """How many forks or threads the task limit refused (0 without one)."""
        if "pids" not in self.folders:
            return 0
        return _counter(os.path.join(self.folders["pids"], "pids.events"), "max")

    def kill_all(self) -> None:
        """SIGKILL every task still in the group (the sandbox's own, which outlived its end):
        a group is removed only once empty."""
        import signal

        for folder in sorted(set(self.folders.values())):
            for pid in _words(folder, "cgroup.procs"):
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


# -- the leaf: a v2 group that holds processes hands its controllers down -----------------------
@dataclass(frozen=True)
class Delegation:
    """What ``delegate`` did in ``base``: the ``leaf`` it made and moved the group's processes
    into (None: the group held none), and the controllers it enabled (``enabled``)."""

    base: str
    leaf: str | None = None
    enabled: tuple = ()


def _move_all(src: str, dst: str) -> None:
    """Move every process of group ``src`` into ``dst``; one that exits meanwhile is passed
    over. Raises OSError where a process stays (the kernel refused it)."""
    for _ in range(_MOVE_PASSES):
        pids = _words(src, "cgroup.procs")
        if not pids:
            return
        for pid in pids:
            try:
                _write(os.path.join(dst, "cgroup.procs"), pid)
            except OSError as exc:
                if exc.errno not in (errno.ESRCH, errno.ENOENT):
                    raise
    if _words(src, "cgroup.procs"):
        raise OSError(errno.EBUSY, f"processes keep appearing in {src}")


def delegate(base: str, wanted: tuple = CONTROLLERS, leaf_name: str | None = None) -> Delegation:
    """Have the v2 group ``base`` hand its children what it has of ``wanted``. Each missing
    controller is enabled in its ``cgroup.subtree_control``; where the kernel refuses one
    (EBUSY: ``base`` is not the root and holds processes), every process of ``base`` moves
    into a new leaf ``leaf_name`` and it is enabled again. Raises OSError (having undone what
    it did) where none could be enabled."""
    have = [c for c in wanted if c in _words(base, "cgroup.controllers")]
    missing = [c for c in have if c not in _words(base, "cgroup.subtree_control")]
    if not missing:
        return Delegation(base)
    enabled = _enable(base, missing)
    leaf = None
    refused = [c for c in missing if c not in enabled]
    if refused and _words(base, "cgroup.procs") and \
            os.path.exists(os.path.join(base, "cgroup.type")):  # (the root has none)
        leaf = os.path.join(base, leaf_name or f"{LEAF_PREFIX}{os.getpid()}")
        os.mkdir(leaf, 0o755)
        try:
            _move_all(base, leaf)
        except OSError:
            undelegate(Delegation(base, leaf, tuple(enabled)))
            raise
        enabled += _enable(base, refused)
    done = Delegation(base, leaf, tuple(enabled))
    if not enabled:
        undelegate(done)
        raise OSError(errno.EBUSY, f"no controller of {', '.join(missing)} could be enabled "
                      f"in {base}")
    return done


def _enable(base: str, names: list) -> list:
    """Enable each of ``names`` in ``base``'s subtree_control; returns those that held."""
    out = []
    for c in names:
        try:
            _write(os.path.join(base, "cgroup.subtree_control"), "+" + c)
            out.append(c)
        except OSError:
            pass
    return out


def undelegate(done: Delegation) -> bool:
    """Undo ``delegate``: once no group but its leaf is left beneath ``base``, turn off the
    controllers it enabled, move the leaf's processes back and remove the leaf (made by it,
    and now empty). False where something stays (another measurer's groups live there: their
    limits need the controllers; the leaf is then swept once empty and its maker gone)."""
    if done.leaf is None and not done.enabled:
        return True  # it did nothing
    leaf_name = os.path.basename(done.leaf) if done.leaf else None
    try:
        others = [e.name for e in os.scandir(done.base) if e.is_dir() and e.name != leaf_name]
    except OSError:
        return False
    if others:
        return False
    try:
        for c in done.enabled:
            _write(os.path.join(done.base, "cgroup.subtree_control"), "-" + c)
        if done.leaf is not None:
            _move_all(done.leaf, done.base)
            os.rmdir(done.leaf)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


_held: dict = {"count": 0, "delegation": None, "pid": 0}


def hold(wanted: tuple = CONTROLLERS) -> str | None:
    """Where this process's own v2 group has a controller of ``wanted`` it does not hand
    its children yet, ``delegate`` it (moving the group's processes into a leaf where it holds
    any), until as many ``release`` calls (or this process's exit). Returns why not, or None.
    Call it before starting processes that make or join sandbox groups (the zygote)."""
    if _held["pid"] != os.getpid():  # a forked child holds nothing of its parent's
        _held.update(count=0, delegation=None, pid=os.getpid())
    _held["count"] += 1
    if _held["count"] > 1:
        return None
    base = _v2_base()
    if base is None:
        return "no cgroup v2 group"
    try:
        _held["delegation"] = delegate(base, wanted, f"{LEAF_PREFIX}{os.getpid()}")
    except OSError as exc:
        return exc.strerror or str(exc)
    if _held["delegation"].enabled:
        atexit.register(_release_all)
    return None


def release() -> bool:
    """End one ``hold``; the last undoes its delegation (``undelegate``). False where
    something stayed."""
    if _held["pid"] != os.getpid() or _held["count"] <= 0:
        return True
    _held["count"] -= 1
    if _held["count"] > 0:
        return True
    done, _held["delegation"] = _held["delegation"], None
    if done is not None and done.enabled:  # this process's sandbox groups, emptied, first
        _remove_empty(done.base, f"{_PREFIX}{os.getpid()}-")
    return done is None or undelegate(done)


def _remove_empty(parent: str, prefix: str) -> None:
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            pass


def _release_all() -> None:
    if _held["pid"] == os.getpid() and _held["count"] > 0:
        _held["count"] = 1
        release()


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
    """Remove the empty groups (a sandbox's, a measurer's leaf) of measurers that are gone
    (killed before they removed them), made over ``min_age_s`` ago (a measurer in another PID
    namespace looks gone from here: its newest group may be empty for a moment before its
    sandbox joins)."""
    import time

    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        prefix = next((p for p in (_PREFIX, LEAF_PREFIX) if name.startswith(p)), None)
        pid = name[len(prefix):].split("-", 1)[0] if prefix else ""
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        path = os.path.join(parent, name)
        try:
            if time.time() - os.stat(path).st_mtime > min_age_s:
                os.rmdir(path)
        except OSError:
            pass


def controllers() -> tuple[int, tuple, str | None]:
    """(cgroup version, the controllers a sandbox's group holds, None) where this process may
    make one (it makes and removes one here, within a ``hold``); else (0, (), why not)."""
    why = hold()
    try:
        group = TaskGroup.create(f"{os.getpid()}-probe", 1 << 30, 64)
    except OSError as exc:
        release()
        return 0, (), exc.strerror or str(exc) or why
    group.remove()
    release()
    return group.version, group.controllers, None


def support() -> tuple[int, str | None]:
    """(cgroup version, None) where this process may make a sandbox's group; else (0, why
    not, in a few words). ``controllers`` says which limits such a group holds."""
    version, _held_controllers, why = controllers()
    return version, why
