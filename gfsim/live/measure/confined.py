"""The measurer's side of the sandbox: the zygote it starts once per task (``Zygote``: ``python
-m gfsim.live.measure.sandbox``, torch imported, CUDA never initialised, no candidate code) and
one confined process per candidate, or for the baseline, that it forks and drives
(``Confined``): its folder and limits (a cgroup where the machine delegates one,
``gfsim.live.measure.cgroup``; the fallback's rlimits and seccomp elsewhere), the watchdogs over
its memory, tasks and folder, and the requests and bounded answers that pass between them. What
the confined process runs is ``gfsim.live.measure.worker``; how it is confined,
``gfsim.live.measure.sandbox``; what the answers mean, ``gfsim.live.measure.measurer``.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.core.folders import remove_tree, tree_usage
from gfsim.live.measure.config import MeasurerConfig
from gfsim.live.measure.sandbox import plain_env

__all__ = ["Zygote", "Confined", "WorkerFailure", "Unreadable", "open_regular",
           "seed_triton_cache", "MAX_ANSWER_BYTES", "STDERR_TAIL_BYTES"]

# What this process reads of what a candidate's process answers or leaves in its folder. All of
# it is the candidate's to forge (its code runs in that process), so each read is bounded: a
# forgery costs the candidate its measurement, never this process its memory or its progress.
#
# One answer (one message on the answer socket). The largest honest answers are an enqueue's
# output descriptions (about 100 bytes per output per repetition: 160 KB for 100 repetitions of
# 16 outputs) and a batch's times; 4 MiB is far above them and a trivial buffer here. A longer
# message arrives cut, and is refused.
MAX_ANSWER_BYTES = 4 << 20
# The end of a dead worker's stderr kept for the record's reason: with the words before it, it
# fits the reason's 500 characters (``_finish``), and it holds a traceback's last lines.
STDERR_TAIL_BYTES = 400


class WorkerFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" | "crash" | "memory"


_SO_TIMESTAMPNS = 35  # Linux: the kernel stamps each message with the time it was sent
# Held by a watchdog's scan of /proc and by ``Confined.call`` from reading the clock to writing
# the request, so that a scan (Python holding the GIL) cannot slip in between and lengthen a
# timed batch as this process sees it.
_QUIET = threading.Lock()
# How often a sandbox's folder is measured against its quota (MeasurerConfig.folder_max_*).
FOLDER_CHECK_S = 0.5


class Zygote:
    """The prepared parent (``python -m gfsim.live.measure.sandbox``): torch imported, CUDA not
    initialised, no candidate code ever; it forks every sandboxed process."""

    def __init__(self, task: str, root: Path, interpret: bool):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = plain_env()
        env.update(PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1", HOME=str(root),
                   TRITON_CACHE_DIR=str(root / "triton-zygote"))
        if interpret:  # Triton reads it when it is imported, which the zygote does
            env["TRITON_INTERPRET"] = "1"
        self.stderr = open(root / "zygote.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gfsim.live.measure.sandbox", task, str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self.stderr,
            stderr=self.stderr, cwd=root, env=env, start_new_session=True)
        theirs.close()
        self.sock.settimeout(300.0)
        self.lock = threading.Lock()
        try:
            ready = json.loads(self.sock.recv(1 << 20) or b"null")
        except (OSError, ValueError):
            ready = None
        if not ready:
            self.close()
            tail = _tail(root / "zygote.log", 800)
            raise GfsimError(f"the sandbox's zygote did not start: {tail}")
        from gfsim.live.measure.sandbox import Facilities

        self.facilities = Facilities.from_dict(ready["facilities"])
        self.cuda_initialised = ready.get("cuda_initialised", False)
        self.env = env

    def spawn(self, spec: dict, fds: list[int]) -> int:
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(spec).encode()], fds)
            ans = json.loads(self.sock.recv(1 << 16) or b"null")
        if not ans or "spawned" not in ans:
            raise GfsimError(f"the sandbox's zygote did not fork: {ans}")
        return int(ans["spawned"])

    def sweep(self) -> None:
        """Have the zygote kill what candidates detached from their sandboxes (``setsid``)
        and it adopted as their subreaper (``gfsim.live.measure.orphans``): where no PID namespace
        holds a sandbox, killing its process group does not reach them."""
        with self.lock:
            try:
                self.sock.send(b'{"op": "sweep"}')
                self.sock.recv(1 << 16)
            except OSError:  # (a zygote gone: what it adopted went to init; see close)
                pass

    def close(self) -> None:
        try:
            self.sock.send(b'{"op": "exit"}')  # it kills every process left below it
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        self.stderr.close()


class Confined:
    """One confined process (a candidate's, or the baseline's) and its channels.

    Requests go down a pipe; answers come back on a SOCK_SEQPACKET socket whose messages the
    kernel timestamps when they are sent, so ``call`` knows when an answer was written even if
    this process is slow to read it. A watchdog kills the whole PID namespace past the memory
    or process limit."""

    def __init__(self, zygote: Zygote, task: str, config: MeasurerConfig, root: Path,
                 facilities, seed_cache: Path | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="gfsim-worker-", dir=root))
        if seed_cache is not None:
            seed_triton_cache(seed_cache, self.dir / "triton-cache")
        env = dict(zygote.env)
        env.update(HOME=str(self.dir), TMPDIR=str(self.dir),
                   TRITON_CACHE_DIR=str(self.dir / "triton-cache"))
        if config.interpret:
            env["TRITON_INTERPRET"] = "1"
        req_r, req_w = os.pipe()
        self.ans, ans_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ans.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        st_r, st_w = os.pipe()
        spec = {"dir": str(self.dir), "env": env, "task": task,
                "facilities": facilities.as_dict(), "shm_mb": int(config.memory_limit_mb)}
        spec["file_max_bytes"] = int(config.folder_max_mb * 2**20)  # RLIMIT_FSIZE
        # Where the sandbox has its own mount namespace and this process may read its folder
        # there (root: /proc/<pid>/root), a tmpfs of the quota's bytes and entries over it: the
        # kernel refuses the rest (sandbox.folder_tmpfs). ``view`` is where this process sees
        # the folder as the sandbox does.
        self.tmpfs = facilities.folder_quota.startswith("tmpfs")
        if self.tmpfs:
            spec.update(folder_bytes=int(config.folder_max_mb * 2**20),
                        folder_entries=int(config.folder_max_entries))
        self.view = self.dir
        self.max_tasks = int(config.max_tasks)
        self.zygote = zygote  # (its sweep, in close)
        self.group = _task_group(config, facilities, self.dir.name)
        spec.update(_limits_spec(config, self.group, facilities))
        try:
            zygote.spawn(spec, [req_r, ans_theirs.fileno(), st_w])
        except BaseException:
            self._remove_group()
            raise
        finally:
            os.close(req_r)
            os.close(st_w)
            ans_theirs.close()
        self.req = req_w
        self.status = os.fdopen(st_r, "rb")
        self.network_isolated = facilities.net_ns
        self.limit_kb = config.memory_limit_mb * 1024
        self.killed_for = None
        self.exit_code = None
        self.pid, self.pidfd, self.ns, self.pgid = None, None, None, None
        first = self._status_line(60.0)
        if "pid" not in first:
            self.close()
            raise GfsimError(f"the sandbox did not start: {first.get('error', first)}")
        self.pid = int(first["pid"])
        if self.tmpfs:
            self.view = Path(f"/proc/{self.pid}/root") / str(self.dir).lstrip("/")
        try:
            self.pidfd = os.pidfd_open(self.pid)
            self.pgid = os.getpgid(self.pid)
            if facilities.pid_ns:
                self.ns = os.stat(f"/proc/{self.pid}/ns/pid").st_ino
        except OSError:
            pass
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_memory, daemon=True)
        self._watch.start()
        self.folder_over = None
        threading.Thread(target=self._watch_folder, args=(config,), daemon=True).start()
        ready = self.call(None, timeout=300.0)
        if not ready["ok"]:
            self.close()
            raise WorkerFailure("crash", f"the worker did not start: {ready['error']}")
        self.device = ready["device"]
        self.confined = ready["confined"]
        self.init_s = float(ready["init_s"])  # its torch and CUDA start

    def _status_line(self, timeout: float) -> dict:
        sel = selectors.DefaultSelector()
        sel.register(self.status, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                return {"error": "no word from the sandbox"}
            line = self.status.readline()
        finally:
            sel.close()
        try:
            return json.loads(line) if line else {"error": "the sandbox's parent died"}
        except ValueError:
            return {"error": line[:200].decode(errors="replace")}

    def _watch_memory(self) -> None:
        """Kill the sandbox once its group's limits refused it something (the kernel holds
        them), or once the sum of its resident memory and /dev/shm or its thread count passes
        the limits (where no group holds: what the fallback leaves to watch)."""
        while not self._stop.wait(0.05):
            with _QUIET:
                kb, n = _namespace_usage(self.pid, self.ns, self.view if self.tmpfs else None,
                                         self.dir)
            group = self.group
            over = ("memory" if kb > self.limit_kb or (group and group.oom_kills()) else
                    "processes" if n > self.max_tasks or (group and group.tasks_refused())
                    else None)
            if over:
                self.killed_for = over
                self.kill()
                return

    def _watch_folder(self, config: MeasurerConfig) -> None:
        """Kill the sandbox once its folder passes its quota (``MeasurerConfig.folder_max_*``).
        A check, not the kernel: between two checks a candidate may overshoot by what it
        makes in ``FOLDER_CHECK_S``; ``remove_tree`` removes any overshoot. Files it unlinked
        but holds open count too (``_unlinked_bytes``), where this process may see its
        descriptors. Where the folder is a tmpfs (``self.tmpfs``) the kernel holds its bytes
        (unlinked files' too) and entries, and this check its depth, in ``view``."""
        max_bytes = int(config.folder_max_mb * 2**20)
        dev = os.stat(self.dir).st_dev
        while not self._stop.wait(FOLDER_CHECK_S):
            with _QUIET:
                use = tree_usage(self.view, max_depth=config.folder_max_depth,
                                 max_entries=config.folder_max_entries, max_bytes=max_bytes)
                if use.over is None and not self.tmpfs and \
                        use.bytes + _unlinked_bytes(self.pid, self.ns, self.pgid, dev) > max_bytes:
                    use.over = f"more than {max_bytes >> 20} MiB, with files unlinked but open"
            if use.over and not self._stop.is_set():
                self.folder_over = use.over
                self.killed_for = "folder"
                self.kill()
                return

    def seen(self, path) -> Path:
        """Where this process reads ``path`` (a path in the sandbox's folder, as the sandbox
        names it): in ``view``."""
        return self.view / Path(path).relative_to(self.dir)

    def call(self, req: dict | None, timeout: float, fds: list[int] | None = None) -> dict:
        """Send one request (None: read the ready message) and wait for its answer; the
        answer's ``_sent_s`` is how long after the request it was sent (the kernel's clock).
        ``fds`` go first, on the answer socket, for a request that expects descriptors."""
        payload = (json.dumps(req) + "\n").encode() if req is not None else b""
        written = True
        with _QUIET:  # no watchdog scan between the clock's start and the request's write
            t0 = time.time()
            try:
                if fds:
                    socket.send_fds(self.ans, [b"fd"], fds)
                if payload:
                    os.write(self.req, payload)
            except OSError:
                written = False
        if not written:
            raise self._failure()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"no answer within {timeout:.0f} s")
            self.ans.settimeout(min(left, 0.5))
            try:
                msg, anc, flags, _addr = self.ans.recvmsg(MAX_ANSWER_BYTES, 64)
            except TimeoutError:
                if self.killed_for:
                    raise self._failure() from None
                continue
            except OSError:
                raise self._failure() from None
            if not msg:
                raise self._failure()
            break
        sent = None
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
                sec, ns = struct.unpack("qq", data[:16])
                sent = sec + ns * 1e-9
        ans = _read_answer(msg, bool(flags & socket.MSG_TRUNC),
                           "ready" if req is None else str(req.get("op")))
        ans["_sent_s"] = (sent - t0) if sent is not None else time.time() - t0
        return ans

    def _failure(self) -> WorkerFailure:
        self.kill()
        self._reap()
        if self.killed_for is None and self.group is not None and self.group.oom_kills():
            self.killed_for = "memory"  # the kernel's OOM killer, before the watchdog saw it
        if self.killed_for == "memory":
            return WorkerFailure("memory", "worker exceeded the memory limit and was killed")
        if self.killed_for == "folder":
            return WorkerFailure("crash", f"worker's folder passed its quota "
                                 f"({self.folder_over}) and was killed")
        if self.killed_for == "processes":
            return WorkerFailure("crash", f"worker started more than {self.max_tasks} "
                                 "processes and threads and was killed")
        tail = _tail(self.dir / "stderr.log", STDERR_TAIL_BYTES)
        return WorkerFailure("crash", f"worker died (exit {self.exit_code}): {tail}")

    def _reap(self, timeout: float = 10.0) -> None:
        """Wait for the outer process's word that the namespace is empty (its exit status)."""
        while self.exit_code is None:
            line = self._status_line(timeout)
            if "exit" in line:
                self.exit_code = line["exit"]
            else:
                break

    def kill(self) -> None:
        """SIGKILL the namespace's init: the kernel kills everything else in it."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            elif self.pid is not None:
                os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.ns is None and self.pgid is not None:  # no PID namespace: its process group
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
        if self.pid is not None and self.exit_code is None:
            try:
                os.write(self.req, b'{"op": "exit"}\n')
            except OSError:
                pass
            self._reap(2.0)
            self.kill()
            self._reap()
        if self.ns is None:  # no PID namespace: what left its process group (setsid) too
            self.zygote.sweep()
        self._remove_group()
        for close in (lambda: os.close(self.req), self.ans.close, self.status.close,
                      lambda: self.pidfd is not None and os.close(self.pidfd)):
            try:
                close()
            except OSError:
                pass
        remove_tree(self.dir)  # whatever the candidate made there (gfsim.core.folders)

    def _remove_group(self, wait_s: float = 15.0) -> None:
        """Remove the sandbox's cgroup once its last task (the outer process, which reported
        the namespace's end) has gone: what is still in it is killed, and the group waited for
        (a loaded machine takes a moment to reap); one still busy is left for a later
        measurer's sweep."""
        group = getattr(self, "group", None)
        if group is not None and not group.remove():
            group.kill_all()
            deadline = time.monotonic() + wait_s
            while not group.remove() and time.monotonic() < deadline:
                time.sleep(0.02)
        self.group = None


def _task_group(config: MeasurerConfig, facilities, name: str):
    """The cgroup that limits a new sandbox (``gfsim.live.measure.cgroup.TaskGroup``), or None where
    none is made: ``config.cgroups`` off, the machine allows none (``facilities.cgroup``), or
    this one could not be made. Without one the fallback's limits hold, and the record's
    ``sandbox`` word says so ("rlimits")."""
    if not (config.cgroups and facilities.cgroup):
        return None
    from gfsim.live.measure.cgroup import TaskGroup

    try:
        return TaskGroup.create(f"{os.getpid()}-{name}", int(config.memory_limit_mb * 2**20),
                                config.max_tasks, tuple(config.cgroup_controllers))
    except OSError:
        return None


def _limits_spec(config: MeasurerConfig, group, facilities=None) -> dict:
    """What the sandbox's processes apply of the limits: the group they join and the
    controllers it holds, and the fallback's for what it does not
    (``sandbox._fallback_rlimits``): a task count (``tasks_by``: RLIMIT_NPROC binds in the user
    namespace unless the measurer is root, whose uid the kernel exempts; then only the
    watchdog's count of threads), and on the CPU (the interpreter, or a machine without a GPU)
    a data limit; not beside a GPU, where the CUDA driver's private mappings would count
    against it and this was never tried there."""
    user_ns = facilities is None or facilities.user_ns
    out = {"max_tasks": int(config.max_tasks), "cgroup": group.version if group else 0,
           "cgroup_procs": group.procs if group else [],
           "cgroup_controllers": list(group.controllers) if group else [],
           "tasks_by": "nproc" if os.geteuid() != 0 and user_ns else "watchdog"}
    if (group is None or "memory" not in group.controllers) and \
            (config.interpret or not _gpu_nodes()):
        out["rlimit_data_bytes"] = int(config.memory_limit_mb * 2**20)
    return out


def _gpu_nodes() -> bool:
    """Whether this machine has a GPU's device nodes (NVIDIA's or AMD's)."""
    import glob

    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def _namespace_usage(pid: int | None, ns: int | None, folder: Path | None = None,
                     host_folder: Path | None = None) -> tuple[float, int]:
    """(resident kB, threads) of a sandbox: every process in its PID namespace, plus what
    its private /dev/shm and its folder's tmpfs (``folder``, as this process sees it) hold;
    without a namespace, the process group of ``pid``.

    Each of the two counts only once it is the sandbox's own filesystem: until the sandbox's
    init has mounted them (it reports its pid first, then mounts), ``/proc/<pid>/root/dev/shm``
    and ``folder`` are the host's ``/dev/shm`` and the disk holding ``host_folder``, whose
    used bytes are not the sandbox's (on a loaded machine the watchdog saw the disk's
    gigabytes there and killed a starting sandbox "for memory")."""
    if pid is None:
        return 0.0, 0
    total, count = 0.0, 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if ns is not None:
                if os.stat(f"{entry.path}/ns/pid").st_ino != ns:
                    continue
            else:
                stat = Path(entry.path, "stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[2]) != pid:
                    continue
            for line in Path(entry.path, "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += float(line.split()[1])
                elif line.startswith("Threads:"):
                    count += int(line.split()[1])
                    break
        except (OSError, ValueError, IndexError):
            continue
    if ns is not None:
        for held, host in ((f"/proc/{pid}/root/dev/shm", "/dev/shm"), (folder, host_folder)):
            if held is not None:
                total += _own_tmpfs_kb(held, host)
    return total, count


def _own_tmpfs_kb(held, host) -> float:
    """The kB used on ``held`` where it is a filesystem of its own, not the one ``host`` (the
    same path as this process sees it) lies on; 0 before the sandbox mounted it, or if gone."""
    try:
        dev = os.stat(held).st_dev
        if host is not None:
            try:
                if os.stat(host).st_dev == dev:
                    return 0.0
            except OSError:
                pass
        st = os.statvfs(held)
        return (st.f_blocks - st.f_bfree) * st.f_frsize / 1024
    except OSError:
        return 0.0


# -- what a worker says and leaves: read without trust ------------------------------------------
# The fields each op's successful answer must have, and of what kind (``_VALUES``); a failure
# answers ``ok`` false, one of ``_FAILURE_KINDS`` and its error text. An answer the measurer
# then uses further (a batch's times, an enqueue's outputs) is checked again where it is used.
_VALUES = {
    "seconds": (lambda v: type(v) in (int, float) and 0 <= v <= 1e9, "a number of seconds"),
    "count": (lambda v: type(v) is int and 0 <= v < 1 << 63, "a count"),
    "list": (lambda v: type(v) is list, "a list"),
    "object": (lambda v: type(v) is dict, "an object"),
    "device": (lambda v: type(v) is str and v in ("cuda", "cpu"), "'cuda' or 'cpu'"),
}
_TIMES = {"times_ms": "list"}
_ANSWER_FIELDS = {
    "ready": {"device": "device", "init_s": "seconds", "confined": "object"},
    "load": {"seconds": "seconds"},
    "compile": {"seconds": "seconds"},
    "output": {"seconds": "seconds", "shape": "list", "n_outputs": "count"},
    "warmup": {"calls": "count", "seconds": "seconds"},
    "time": _TIMES, "time_baseline": _TIMES, "time_null": _TIMES,
    "rows": {"outputs": "count"},
    "prime": {"ran": "count", "errors": "list", "seconds": "seconds"},
    "attach": {"pool_ptr": "count"},
    "enqueue": {"outputs": "list", "pool_used": "count"},
    "loop": {"calls": "count", "seconds": "seconds"},
}
_FAILURE_KINDS = ("compile", "runtime", "cuda", "protocol")


def _unlinked_bytes(pid: int | None, ns: int | None, pgid: int | None, dev: int) -> int:
    """Bytes on the device ``dev`` held by files that a sandbox's processes (its PID namespace
    ``ns``, else its process group) keep open after unlinking them: no walk of its folder sees
    them. A process whose descriptors this one may not list (a measurer not run as root, and
    a non-dumpable candidate) counts nothing."""
    if pid is None:
        return 0
    held: dict = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if (os.stat(f"{entry.path}/ns/pid").st_ino != ns if ns is not None else
                    os.getpgid(int(entry.name)) != pgid):
                continue
            for fd in os.scandir(f"{entry.path}/fd"):
                st = os.stat(fd.path)  # the open file itself, unlinked or not
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 0 and st.st_dev == dev:
                    held[st.st_ino] = st.st_blocks * 512
        except OSError:
            continue
    return sum(held.values())


def _size_text(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / (1 << 10):g} KiB"


def _brief(value) -> str:
    """A value of an answer, short enough for a reason."""
    if value is None:
        return "null or a non-finite number"
    try:
        text = repr(value)
    except RecursionError:  # parsed a few frames up the stack, nested to its limit
        return "a value nested too deep"
    return text if len(text) <= 60 else text[:57] + "..."


def _finite_or_none(text: str) -> float | None:
    """A JSON number as a float; None where it is not finite (1e999 parses as inf)."""
    value = float(text)
    return value if math.isfinite(value) else None


def _answer_problem(ans, op: str) -> str | None:
    """Why ``ans`` (parsed JSON) is not an answer to ``op`` of the shape this process uses, or
    None if it is."""
    if type(ans) is not dict:
        return "is not a JSON object"
    if type(ans.get("ok")) is not bool:
        return "has no true or false 'ok'"
    if not ans["ok"]:
        if type(ans.get("error")) is not str:
            return "is a failure without its error text"
        if ans.get("kind") not in _FAILURE_KINDS:
            return f"is a failure of unknown kind {_brief(ans.get('kind'))}"
        return None
    for field, kind in _ANSWER_FIELDS.get(op, {}).items():
        valid, what = _VALUES[kind]
        if field not in ans:
            return f"has no {field!r}"
        if not valid(ans[field]):
            return f"has {field!r} {_brief(ans[field])}, not {what}"
    return None


def _read_answer(msg: bytes, cut: bool, op: str) -> dict:
    """The worker's answer to ``op`` as this process may use it: the parsed object if it has
    the shape ``_answer_problem`` wants, else a protocol failure saying why not. ``cut``: the
    message was longer than ``MAX_ANSWER_BYTES``; nesting deeper than the parser's recursion is
    refused too. A number that is not finite (NaN, Infinity, 1e999) reads as null: no field
    this process uses takes null, so such a field is refused where it is checked, and an
    unused one (a batch's ``rse`` of a single time is infinite) does no harm."""
    what = f"the worker's answer to {op!r}"
    if cut:
        why = f"is over the {_size_text(MAX_ANSWER_BYTES)} an answer may hold"
    else:
        try:
            ans = json.loads(msg, parse_float=_finite_or_none, parse_constant=lambda _: None)
        except (ValueError, RecursionError) as exc:
            why = f"is not JSON ({type(exc).__name__}: {str(exc)[:120]})"
        else:
            why = _answer_problem(ans, op)
            if why is None:
                return ans
    return {"ok": False, "kind": "protocol", "error": f"{what} {why}"}


class Unreadable(Exception):
    """A file a worker left that this process refuses to read (the message says why)."""


def open_regular(path) -> io.BufferedReader:
    """``path`` opened for reading if it is a regular file, never following a symbolic link
    and never waiting on a FIFO (opened non-blocking, then checked); else ``Unreadable``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Unreadable("is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("is a symbolic link, not a file") from None
        raise Unreadable(f"cannot be opened ({exc.strerror})") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise Unreadable("is not a regular file (a FIFO, socket, device or folder)")
    return fh


def _tail(path, n: int) -> str:
    """The last ``n`` bytes of the file at ``path`` as text (only those are read), or a word
    on why it was not read."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            data = os.pread(fh.fileno(), n, max(0, size - n))
    except Unreadable as exc:
        return "" if str(exc) == "is missing" else f"(its log {exc})"
    except OSError as exc:
        return f"(its log cannot be read: {exc.strerror})"
    return data.decode(errors="replace")


def seed_triton_cache(seed: Path, cache: Path) -> None:
    """Give a new sandbox's Triton cache copies (never links: the sandbox may write its own
    folder) of the trusted modules ``harvest_triton_cache`` kept."""
    shutil.copytree(seed, cache, dirs_exist_ok=True)
