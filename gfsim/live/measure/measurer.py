"""Measurers: where an evaluation comes from. ``LogMeasurer`` looks it up in a replay log;
``TritonMeasurer`` compiles, checks and times a real Triton candidate in a sandbox.

Isolation (``gfsim.live.measure.sandbox``, threat model in docs/concepts/live-measurement.md): every
candidate runs in a fresh process forked from a prepared zygote and never reused, in its own
user, PID, network and mount namespaces, with writes confined by Landlock to its own folder, no
sockets (seccomp), an allow-listed environment, memory and task limits the kernel holds (a
cgroup per candidate: ``gfsim.live.measure.cgroup``; where none may be made, seccomp refuses
memory no process maps and rlimits apply), a memory watchdog over its whole namespace and wall-clock
limits per stage. The reference implementation runs only in this process, and the
baseline only in a process of its own that never loads candidate code.

Nothing the candidate's process says is believed. Its outputs are checked here against the
reference on the check shapes, on a shape it was never told about, on rows of randomly chosen
timed repetitions (every repetition has fresh inputs; which ones are checked is decided after
the batch) and again on fresh inputs after timing. Its timings are batches whose size this
process chooses and times with its own clock (the kernel's timestamp of the answer, so a busy
thread here cannot inflate it); the loop's own cost, measured in the baseline's process just
before and just after each batch, comes off that clock. ``judge_timing`` turns the claim and
that clock into what is recorded: capped, refused as forged, or as claimed.

Only the GPU clock (``_GpuClock``: this process times every call itself) is trusted. On the CPU
clock (``clock_mode()`` "wall": the interpreter, ``clock="wall"``, the reference protocol, or a
GPU where the GPU clock cannot run) the times are the candidate's process's own, and this
process's wall clock cannot bound a call faster than the loop's noise: every timing there is
recorded with ``timing_trusted`` false, and ``gfsim live`` records such successes only when
asked to (``LiveOptions.trust_cpu_clock``).
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
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.core.folders import remove_tree, tree_usage
from gfsim.live.measure.sandbox import ENV_ALLOWLIST, plain_env

__all__ = ["Measurer", "LogMeasurer", "TritonMeasurer", "MeasurerConfig", "ENV_ALLOWLIST",
           "CORRECT_UNTIMED", "UntrustedRefused", "judge_timing",
           "harvest_triton_cache"]

CORRECT_UNTIMED = "correct_untimed"

# What this process reads of what a candidate's process answers or leaves in its folder. All of
# it is the candidate's to forge (its code runs in that process), so each read is bounded: a
# forgery costs the candidate its measurement, never this process its memory or its progress.
#
# One answer (one message on the answer socket). The largest honest answers are an enqueue's
# output descriptions (about 100 bytes per output per repetition: 160 KB for 100 repetitions of
# 16 outputs) and a batch's times; 4 MiB is far above them and a trivial buffer here. A longer
# message arrives cut, and is refused.
MAX_ANSWER_BYTES = 4 << 20
# An output's .npy header (NumPy's own limit for a header read without trust; np.save writes
# 128 bytes for any array here). Its data must then be exactly what an array of the
# reference's shape and dtype takes, so nothing larger is ever read.
MAX_NPY_HEADER_BYTES = 10_000
# The end of a dead worker's stderr kept for the record's reason: with the words before it, it
# fits the reason's 500 characters (``_finish``), and it holds a traceback's last lines.
STDERR_TAIL_BYTES = 400
_REASON_CHARS = 500


class Measurer(ABC):
    """Turns a candidate into the fields of an ``evaluation`` record.

    Contract: ``measure`` returns a dict with ``outcome`` (schema outcomes), ``speedup`` (success
    only), stage seconds (``compile_s``, ``check_s``, ``timing_s``, ``wall_s``) and, where
    known, ``runtime_ns``, ``ref_runtime_ns``, ``energy_j``. A replay measurer that has no
    evaluation for a candidate raises; it never guesses.
    """

    @abstractmethod
    def measure(self, candidate) -> dict: ...

    def close(self) -> None:  # noqa: B027 - optional
        pass


class LogMeasurer(Measurer):
    """Evaluations as a replay log recorded them."""

    def __init__(self, log):
        self.log = log

    def measure(self, candidate) -> dict:
        cid = getattr(candidate, "candidate_id", candidate)
        ev = self.log.evaluations
        rows = ev[ev["candidate_id"] == cid]
        if not len(rows):
            raise GfsimError(f"{self.log.display_name}: no evaluation of candidate {cid!r} (a "
                             "replay measures only what was measured)")
        rec = rows.iloc[0].to_dict()
        return {k: v for k, v in rec.items() if k not in ("line", "extra") and v == v}


@dataclass(frozen=True)
class MeasurerConfig:
    protocol: str = "gfsim"  # or "reference" (the paper's: no L2 flush, clone timed)
    rse_target: float = 0.001
    min_reps: int = 3
    max_reps: int = 100
    max_kernel_s: float = 10.0
    max_wall_s: float = 120.0
    compile_timeout_s: float = 300.0
    check_timeout_s: float = 120.0
    timing_timeout_s: float = 300.0
    memory_limit_mb: float = 16_000.0
    # Tasks (processes and threads) a sandbox may hold at once.
    max_tasks: int = 512
    # Limit each sandbox's memory and tasks with a cgroup where this machine allows one
    # (gfsim.live.measure.cgroup); False: the fallback's limits (sandbox._fallback_rlimits, seccomp
    # refusing memfd and SysV shm, the watchdog), as on a machine without cgroups.
    cgroups: bool = True
    # The controllers of those groups (a diagnostic: ("memory",) behaves as a machine that
    # delegates the memory controller alone, as the lent GPU machines do).
    cgroup_controllers: tuple = ("memory", "pids")
    # A separate window of back-to-back calls this long gives joules per call from NVML's
    # energy counter, which is coarse over shorter windows; 0 turns it off.
    energy_window_s: float = 1.0
    seed: int = 0
    # Run candidates even where the kernel lacks part of the sandbox (gfsim.live.measure.sandbox
    # .Facilities.missing): with what there is. Off, such a machine refuses untrusted code.
    trust_candidates: bool = False
    # The measurer's own clock of a call, less its noise and ``timing_slack_ms``, is a floor
    # the true time is above: a reported time below (1 - timing_tolerance) x that floor is
    # capped at it, one below forged_below x it refused as forged (``judge_timing``). The
    # defaults flagged none of 117 honest measurements of the task suite on the H200
    # (docs/concepts/live-measurement.md), at the price of resolving forgeries only for kernels
    # above about 0.25 ms there. On the CPU a claim is capped, never refused (judge_timing).
    timing_tolerance: float = 0.30
    timing_slack_ms: float = 0.20
    forged_below: float = 0.5
    # A GPU spin of this many cycles before each timed repetition (0: none). A diagnostic: a
    # candidate that rewrites the loop in its process can skip it and so hide its length.
    pad_cycles: int = 0
    # Copy the C modules Triton built for the task's own kernels (driver utilities,
    # launchers; built once in the baseline's trusted process) into every candidate's empty
    # Triton cache, so that no candidate pays for building them again.
    prime_cache: bool = True
    # Whose clock a GPU timing is: "gpu" (this process times every repetition on the GPU
    # itself, over memory it shares with the timed process: gfsim.live.measure.gpushare),
    # "wall" (the candidate's process times its loop and this one judges the claim by its wall
    # clock, judge_timing), or "auto" (gpu where it can run, with the gfsim protocol; else wall).
    # Only the GPU clock is trusted: every evaluation says which (timing_clock) and whether
    # (timing_trusted).
    clock: str = "auto"
    # Device memory of each of the GPU clock's two pools (the baseline's process, and the
    # candidate's), from which the timed calls allocate; at least 8x the largest inputs.
    gpu_pool_mb: int = 2048
    # On the GPU clock a shape's batches stop once their windows sum to this many seconds
    # (and at least 20 repetitions ran): a window also holds the fresh inputs' generation,
    # which for large inputs (cross_entropy's logits) costs milliseconds.
    gpu_clock_shape_s: float = 0.2
    # On the GPU clock each batch first makes one unqueued call (``timing_timeout_s``); the
    # queued calls after it only launch, and must be queued within this many seconds (a call
    # that waits for the device while queued waits for ever).
    gpu_queue_timeout_s: float = 30.0
    check_rows: int = 16  # rows of each output kept per timed repetition
    checked_reps: int = 3  # timed repetitions per batch whose rows are checked
    hidden_shapes: int = 1  # extra check shapes drawn at random per candidate
    # Without a GPU (TRITON_INTERPRET=1): time candidates by wall clock on the CPU (protocol
    # "cpu-wallclock", on ``cpu_shapes`` or the task's first two check shapes) instead of
    # stopping at "correct_untimed". Interpreter times, not GPU times: logs say so.
    cpu_timing: bool = False
    cpu_shapes: tuple = ()
    interpret: bool = False  # run the worker with TRITON_INTERPRET=1 (kernels on the CPU)
    # The baseline's timing is cached per (task, shape) and re-timed after this many timed
    # candidates (clocks and thermals drift over a long run); 0 never re-times.
    ref_retime_every: int = 50
    # A candidate's folder (its HOME, TMPDIR and Triton cache, the only place it may write):
    # the sandbox is killed once the folder holds folders nested deeper, more entries or more
    # bytes on disk than these (``_Sandbox._watch_folder``, every ``FOLDER_CHECK_S``), and the
    # kernel refuses any one file past ``folder_max_mb`` (RLIMIT_FSIZE). An honest candidate's
    # holds a Triton cache of some hundred files two folders deep and its outputs.
    folder_max_depth: int = 32
    folder_max_entries: int = 20_000
    folder_max_mb: float = 4096.0


class WorkerFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" | "crash" | "memory"


class UntrustedRefused(GfsimError):
    """This machine cannot confine candidate code, and --trust-candidates was not given."""


_SO_TIMESTAMPNS = 35  # Linux: the kernel stamps each message with the time it was sent
# Held by a watchdog's scan of /proc and by ``_Sandbox.call`` from reading the clock to writing
# the request, so that a scan (Python holding the GIL) cannot slip in between and lengthen a
# timed batch as this process sees it.
_QUIET = threading.Lock()
# How often a sandbox's folder is measured against its quota (MeasurerConfig.folder_max_*).
FOLDER_CHECK_S = 0.5


class _Zygote:
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


class _Sandbox:
    """One confined process (a candidate's, or the baseline's) and its channels.

    Requests go down a pipe; answers come back on a SOCK_SEQPACKET socket whose messages the
    kernel timestamps when they are sent, so ``call`` knows when an answer was written even if
    this process is slow to read it. A watchdog kills the whole PID namespace past the memory
    or process limit."""

    def __init__(self, zygote: _Zygote, task: str, config: MeasurerConfig, root: Path,
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


class _Unreadable(Exception):
    """A file a worker left that this process refuses to read (the message says why)."""


def _open_regular(path) -> io.BufferedReader:
    """``path`` opened for reading if it is a regular file, never following a symbolic link
    and never waiting on a FIFO (opened non-blocking, then checked); else ``_Unreadable``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _Unreadable("is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Unreadable("is a symbolic link, not a file") from None
        raise _Unreadable(f"cannot be opened ({exc.strerror})") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise _Unreadable("is not a regular file (a FIFO, socket, device or folder)")
    return fh


def _tail(path, n: int) -> str:
    """The last ``n`` bytes of the file at ``path`` as text (only those are read), or a word
    on why it was not read."""
    try:
        with _open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            data = os.pread(fh.fileno(), n, max(0, size - n))
    except _Unreadable as exc:
        return "" if str(exc) == "is missing" else f"(its log {exc})"
    except OSError as exc:
        return f"(its log cannot be read: {exc.strerror})"
    return data.decode(errors="replace")


def _load_output(path, ref):
    """The array a worker saved at ``path``, read only if it is what an output compared with
    ``ref`` can be: a regular file whose .npy header (at most ``MAX_NPY_HEADER_BYTES``) gives
    the reference's dtype and shape, followed by exactly that array's bytes. Else
    ``_Unreadable``; a file is never read further than such an array."""
    import numpy as np
    from numpy.lib import format as npy

    with _open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = io.BytesIO(fh.read(16 + MAX_NPY_HEADER_BYTES))
        try:
            version = npy.read_magic(head)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"version {version} (np.save writes 1.0)")
            read = npy.read_array_header_1_0 if version == (1, 0) else \
                npy.read_array_header_2_0
            shape, fortran, dtype = read(head, max_header_size=MAX_NPY_HEADER_BYTES)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
            raise _Unreadable(f"has no .npy header of at most {MAX_NPY_HEADER_BYTES} bytes "
                              f"({str(exc)[:150]})") from None
        if dtype != ref.dtype or tuple(shape) != ref.shape:
            raise _Unreadable(f"is refused unread: its header says {dtype} of shape "
                              f"{tuple(shape)}, the reference's is {ref.dtype} of shape "
                              f"{ref.shape}")
        start = head.tell()
        if size != start + ref.nbytes:
            raise _Unreadable(f"is {size} bytes, where its header and its array take "
                              f"{start + ref.nbytes} bytes")
        fh.seek(start)
        data = bytearray(ref.nbytes)  # (writable, and read into in place)
        if fh.readinto(data) != ref.nbytes:
            raise _Unreadable("was cut while it was read")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _loggable_text(text: str) -> str:
    """``text`` with every lone surrogate (which no UTF-8 log can hold; JSON's ``\\ud800``
    escape yields one) written out as its escape, ``\\ud800``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class TritonMeasurer(Measurer):
    """Compile, check and time Triton candidates of one task, one candidate at a time, each in
    a fresh sandboxed process (module docstring).

    Stages, each timed: compile (start the candidate's process, load the code, first call on a
    benchmark shape: Triton's JIT), check (outputs on every check shape and on hidden ones
    against this process's reference), timing (every benchmark shape, in batches this process
    times and checks), then a re-check on fresh inputs. The baseline is timed with the same
    protocol in a sandboxed process that never loads candidate code, and cached per shape.
    """

    def __init__(self, task, config: MeasurerConfig = MeasurerConfig(), workdir=None):
        self.task_name = task if isinstance(task, str) else task.name
        self.config = config
        self.workdir = workdir
        self._task = None
        self._zygote: _Zygote | None = None
        self._cgroup_held = False  # cgroup.hold() called; release() at close
        self._ref_worker: _Sandbox | None = None  # times the baseline; never runs candidates
        self._root: Path | None = None
        self._ref_cache: dict = {}
        self._gpu_clock: _GpuClock | None = None
        self._clock_mode: str | None = None
        self.clock_note: str | None = None  # why the GPU clock is not used, where it is not
        self._null_ready: set = set()  # shapes the baseline's process has a null output for
        self._nvml = None
        self._timed_since_ref = 0
        import numpy as np

        # Hidden shapes and checked repetitions: chosen here, never known to a candidate.
        self._rng = np.random.default_rng([config.seed, 0x5A4D])
        self.sandboxes = 0  # candidate processes started
        # Seconds from asking for a candidate's process to its ready answer, its CUDA context
        # included (the sandbox's whole cost per candidate, over a reused worker).
        self.spawn_s: list[float] = []
        self.reference_log: list[dict] = []  # every (re-)timing of the baseline, in order
        self.prime_log: dict = {}  # what priming the Triton cache did (_prime)

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def task(self):
        if self._task is None:
            from gfsim.live.tasks import get_task

            self._task = get_task(self.task_name)
        return self._task

    @property
    def facilities(self):
        """What this machine's kernel allows the sandbox (``sandbox.Facilities``)."""
        return self._start_zygote().facilities

    def _start_zygote(self) -> _Zygote:
        if self._zygote is None or self._zygote.proc.poll() is not None:
            from gfsim.live.measure.sandbox import MISSING_HELP, PR_SET_DUMPABLE, prctl

            if self._root is None:
                from gfsim.core.durable import owned_tempdir

                # (named after this process: a run that was killed leaves its folder, with
                # every candidate's Triton cache, and the next measurer removes it)
                self._root = owned_tempdir("gfsim-measure-", dir=self.workdir)
            if self.config.cgroups and not self._cgroup_held:
                from gfsim.live.measure import cgroup

                cgroup.hold()  # a v2 group that holds processes: they move into a leaf
                self._cgroup_held = True
            self._zygote = _Zygote(self.task_name, self._root, self.config.interpret)
            fac = self._zygote.facilities
            missing = fac.missing()
            if self._zygote.cuda_initialised:
                raise GfsimError("the sandbox's zygote initialised CUDA before forking; "
                                 "candidates could not use the GPU")
            if missing and not self.config.trust_candidates:
                self.close()
                raise UntrustedRefused(f"this machine cannot confine candidate code: no "
                                       f"{', '.join(missing)}; {MISSING_HELP}")
            if not (fac.pid_ns and fac.mount_ns):
                # A candidate could see this process in /proc: its memory and environment
                # stay unreadable only if it is not dumpable.
                prctl(PR_SET_DUMPABLE, 0)
        return self._zygote

    def _spawn(self, trusted: bool = False) -> _Sandbox:
        zygote = self._start_zygote()
        seed = self._root / "triton-trusted"
        t0 = time.perf_counter()
        box = _Sandbox(zygote, self.task_name, self.config, self._root, zygote.facilities,
                       seed_cache=seed if seed.is_dir() else None)
        self.spawn_s.append(time.perf_counter() - t0)
        if trusted and self.config.prime_cache and box.device == "cuda" and not seed.is_dir():
            self._prime(box, seed)
        return box

    def _prime(self, box: _Sandbox, seed: Path) -> None:
        """Run the task's own kernels in the trusted ``box`` and keep the C modules its Triton
        cache then holds (``harvest_triton_cache``) for every later candidate's cache."""
        ans = box.call({"op": "prime", "seed": self.config.seed}, self.config.compile_timeout_s)
        self.prime_log = {k: ans.get(k) for k in ("ok", "ran", "errors", "seconds", "error")}
        if ans.get("ok"):
            self.prime_log["modules"] = harvest_triton_cache(
                box.seen(box.dir / "triton-cache"), seed)

    def close(self) -> None:
        if self._ref_worker is not None:
            self._ref_worker.close()
            self._ref_worker = None
        if self._gpu_clock is not None:
            self._gpu_clock.close()
            self._gpu_clock = None
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self._cgroup_held:
            from gfsim.live.measure import cgroup

            cgroup.release()
            self._cgroup_held = False
        if self._root is not None:
            remove_tree(self._root)
            self._root = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reference ----------------------------------------------------------------------------
    def _device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() and not self.config.interpret else "cpu"

    def _reference_output(self, dims: dict, seed: int, rows: int | None = None) -> list:
        """The reference's outputs (one or a tuple) as float32 NumPy arrays, in order; with
        ``rows``, only the rows ``worker.check_rows`` picks for that seed."""
        from gfsim.live.tasks.base import output_arrays
        from gfsim.live.measure.worker import check_rows

        inputs = self.task.make_inputs(dims, seed, self._device())
        out = self.task.reference(*inputs)
        if rows is not None:
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            out = tuple(o.reshape(1) if o.dim() == 0 else
                        o[check_rows(o.shape[0], seed, rows)] for o in outs)
        return output_arrays(out, "reference()")

    def reference_times(self, dims: dict) -> dict:
        """The baseline's timing on a benchmark shape (cached per shape and protocol): the
        task's PyTorch operator in the candidates' own dtype (``Task.baseline``), which is
        what a speedup is against; the upcast ``Task.reference`` only checks correctness."""
        key = (json.dumps(dims, sort_keys=True), self.config.protocol)
        if key not in self._ref_cache:
            # Timed in a process of its own that never loads candidate code (so no candidate
            # can patch the baseline), with the candidates' protocol.
            t0 = time.perf_counter()
            worker = self._baseline_worker()
            ans = worker.call({"op": "warmup", "dims": dims, "seed": self.config.seed,
                               "protocol": self.config.protocol, "baseline": True},
                              self.config.timing_timeout_s)
            if not ans["ok"]:
                raise GfsimError(f"task {self.task_name}: timing the baseline failed: "
                                 f"{ans.get('error')}")
            if self.clock_mode() == "gpu":
                timed = self._time_shape_gpu(worker, dims, "baseline")
            else:
                timed = self._time_shape(worker, dims, "time_baseline")
            self._ref_cache[key] = timed
            self.reference_log.append({"dims": dims, "value_ms": timed["value_ms"],
                                       "seconds": time.perf_counter() - t0})
        return self._ref_cache[key]

    def _baseline_worker(self) -> _Sandbox:
        if self._ref_worker is None or self._ref_worker.exit_code is not None:
            if self._ref_worker is not None:
                self._ref_worker.close()
            self._ref_worker = self._spawn(trusted=True)
            if self._clock_mode == "gpu":
                self._attach_partner()
        return self._ref_worker

    def _attach_partner(self) -> None:
        self._clock().lanes["partner"].reset()
        self._clock().attach(self._ref_worker, "partner", self.config.timing_timeout_s)

    def clock_mode(self) -> str:
        """"gpu" or "wall" (``MeasurerConfig.clock``); why not "gpu" is in ``clock_note``."""
        if self._clock_mode is None:
            from gfsim.live.measure import gpushare

            c = self.config
            why = None
            if self._device() != "cuda":
                why = "no GPU"
            elif c.protocol != "gfsim":
                why = f"the {c.protocol!r} protocol times clones inside the call"
            elif c.clock != "wall":
                why = gpushare.unavailable()
            if not why and c.clock != "wall":
                # The whole protocol once (the region, the baseline's process attached, a
                # null batch): the driver or torch may still lack a part of it.
                try:
                    self._clock_mode = "gpu"
                    self._clock()
                    if self._ref_worker is not None and self._ref_worker.exit_code is None:
                        self._attach_partner()
                    self._null_gpu(self.timing_shapes("cuda")[0], 3, c.seed)
                except Exception as exc:  # noqa: BLE001 - said in clock_note, or raised
                    if self._gpu_clock is not None:
                        self._gpu_clock.close()
                    self._clock_mode, self._gpu_clock = None, None
                    if self._ref_worker is not None:
                        self._ref_worker.close()
                        self._ref_worker = None
                    why = f"the GPU clock did not start: {type(exc).__name__}: {exc}"[:400]
            if c.clock == "gpu" and why:
                raise GfsimError(f"clock 'gpu' cannot run here: {why}")
            self._clock_mode = "wall" if (why or c.clock == "wall") else "gpu"
            self.clock_note = why if c.clock != "wall" else "clock 'wall' asked for"
        return self._clock_mode

    def _clock(self) -> _GpuClock:
        if self._gpu_clock is None:
            self._start_zygote()
            self._gpu_clock = _GpuClock(self.task, self.timing_shapes("cuda"), self._root,
                                        pool_min=int(self.config.gpu_pool_mb) << 20)
        return self._gpu_clock

    def _null_gpu(self, dims: dict, reps: int, seed: int) -> float:
        """The GPU clock's median window (ms) of a repetition whose call does nothing, in the
        baseline's process: what the protocol itself costs."""
        c = self.config
        times = self._clock().batch(self._baseline_worker(), "partner", dims, seed, reps,
                                    "null", c.check_rows, c.timing_timeout_s,
                                    c.gpu_queue_timeout_s)
        return statistics.median(times)

    def _prepare_gpu_clock(self) -> bool:
        """Before a candidate's process exists: the null of every benchmark shape, and the
        baseline's timing where it is due, so that no candidate can run work on the GPU while
        the clock measures either (the null it could inflate is taken as the least seen).
        Returns whether the baseline was (re-)timed."""
        c = self.config
        retimed = self._reference_due()
        for dims in self.timing_shapes("cuda"):
            self._clock().null_calib[_key(dims)] = self._null_gpu(dims, 10, c.seed + 5)
            if retimed:
                self.reference_times(dims)
        return retimed

    def _reference_due(self) -> bool:
        """Whether the baseline is timed (again) for the next candidate, and so counted."""
        c = self.config
        if c.ref_retime_every and self._timed_since_ref >= c.ref_retime_every:
            self._ref_cache.clear()
            self._timed_since_ref = 0
        self._timed_since_ref += 1
        return not self._ref_cache

    def _null_batch(self, dims: dict, reps: int, seed: int) -> float:
        """Seconds one batch of the timing loop takes with a call that does nothing (fresh
        inputs, flush, events, synchronisation, the rows kept, the answer), in the baseline's
        trusted process. The measurer asks for one just before and one just after every timed
        batch, so that the loop's cost comes off that batch under the same clocks and heat; the
        first for a shape is a discarded warm-up (allocations, first-call costs)."""
        key = json.dumps(dims, sort_keys=True)
        first = key not in self._null_ready
        for prepare in ((True, False) if first else (False,)):
            ans = self._baseline_worker().call(
                {"op": "time_null", "dims": dims, "seed": seed, "reps": reps,
                 "protocol": self.config.protocol, "prepare": prepare,
                 "rows": self.config.check_rows, "pad_cycles": self.config.pad_cycles},
                self.config.timing_timeout_s)
            if not ans["ok"]:
                raise GfsimError(f"task {self.task_name}: timing the loop failed: "
                                 f"{ans.get('error')}")
        self._null_ready.add(key)
        return ans["_sent_s"]

    def timing_shapes(self, device: str) -> list[dict]:
        """The shapes a candidate is timed on: the task's benchmark shapes on a GPU; on the CPU
        (interpreter) ``cpu_shapes`` or the first two check shapes, which it can afford."""
        if device == "cuda":
            return list(self.task.bench_shapes)
        return [dict(d) for d in self.config.cpu_shapes] or list(self.task.check_shapes[:2])

    # -- the stages -----------------------------------------------------------------------------
    def _check(self, worker: _Sandbox, dims: dict, seed: int) -> str | None:
        """None if the candidate's outputs match the reference's (``Task.compare``), else why
        not. The worker saves output k at ``output_path(out.npy, k)``."""
        from gfsim.live.measure.worker import output_path

        path = worker.dir / "out.npy"
        for stale in worker.view.glob("out*.npy"):
            try:
                stale.unlink(missing_ok=True)
            except OSError as exc:  # a folder, say: the candidate's, where outputs go
                return f"{stale.name} cannot be removed ({exc.strerror}): not an output file"
        ans = worker.call({"op": "output", "dims": dims, "seed": seed, "path": str(path)},
                          self.config.check_timeout_s)
        if not ans["ok"]:
            raise _StageError(ans)
        ref = self._reference_output(dims, seed)
        n = ans.get("n_outputs", 1)
        if type(n) is not int or n != len(ref):  # the worker's word, used only to refuse
            return f"{n} outputs where the reference has {len(ref)}"
        return self._compare_files(path, lambda k: worker.seen(output_path(path, k)), ref)

    def _compare_files(self, path: Path, name_of, ref: list) -> str | None:
        """None if the worker's files ``name_of(k)`` hold the outputs ``ref`` (one per
        output; ``Task.compare``), else why not. Each is read only as far as an array of its
        reference's dtype and shape (``_load_output``)."""
        got = []
        for k, r in enumerate(ref):
            try:
                got.append(_load_output(name_of(k), r))
            except _Unreadable as exc:
                return f"output {k} {exc}"
            except OSError as exc:
                return f"output {k} unreadable ({type(exc).__name__}: {str(exc)[:200]})"
        if os.path.lexists(name_of(len(ref))):
            return f"more outputs than the reference's {len(ref)}"
        return self.task.compare(got, ref)

    def check_shapes(self) -> list[dict]:
        """The task's check shapes and ``hidden_shapes`` more, drawn for this candidate."""
        extra = [self.task.hidden_shape(self._rng) for _ in range(self.config.hidden_shapes)]
        return list(self.task.check_shapes) + extra

    def measure(self, candidate) -> dict:
        """One evaluation. Never raises for a candidate's own failure: that is an outcome.

        The stage seconds partition ``wall_s``: ``compile_s`` runs from the start (the
        candidate's fresh process included) to the first call's end, ``check_s`` covers the
        checks, ``timing_s`` everything after (the timing, a re-timing of the baseline when it
        is due, the energy window and the re-check on fresh inputs). A replay that books these
        stages therefore holds the GPU exactly as long as the live run did."""
        c = self.config
        rec: dict = {"candidate_id": candidate.candidate_id, "compile_s": 0.0, "check_s": 0.0,
                     "timing_s": 0.0, "timing_protocol": c.protocol}
        t_start = mark = time.perf_counter()
        stage = "compile"
        stage_key = {"compile": "compile_s", "check": "check_s", "timing": "timing_s"}

        def close_stage(next_stage: str | None) -> None:
            nonlocal mark, stage
            now = time.perf_counter()
            rec[stage_key[stage]] += now - mark
            mark = now
            stage = next_stage or stage

        worker = None
        try:
            self._start_zygote()
            gpu_clock = self.clock_mode() == "gpu"
            if self._device() == "cuda" or c.cpu_timing:
                # The baseline's process first, so its start is not booked to this candidate.
                self._baseline_worker()
            if gpu_clock:
                t0 = time.perf_counter()
                self._retimed = self._prepare_gpu_clock()
                rec["clock_prep_s"] = time.perf_counter() - t0  # the measurer's, not a stage
            mark = t_start = time.perf_counter()
            worker = self._spawn()
            self.sandboxes += 1
            rec["network_isolated"] = worker.network_isolated
            rec["sandbox"] = _sandbox_summary(worker.confined)
            shapes = self.timing_shapes(worker.device)
            for req in ({"op": "load", "code": candidate.code},
                        {"op": "compile", "dims": shapes[0], "seed": c.seed}):
                ans = worker.call(req, c.compile_timeout_s)
                if not ans["ok"]:
                    raise _StageError(ans)
            close_stage("check")
            for k, dims in enumerate(self.check_shapes()):
                why = self._check(worker, dims, c.seed + 1 + k)
                if why:
                    close_stage(None)
                    return self._finish(rec, "incorrect", t_start, reason=f"shape {dims}: {why}")
            close_stage("timing")
            if worker.device != "cuda" and not c.cpu_timing:
                # No GPU (TRITON_INTERPRET=1 on CPU): correctness only, no timing. Not a log
                # outcome: such a result is never written as an evaluation.
                return self._finish(rec, CORRECT_UNTIMED, t_start)
            if worker.device != "cuda":
                rec["timing_protocol"] = "cpu-wallclock"
            if gpu_clock:
                self._clock().lanes["candidate"].reset()
                self._clock().attach(worker, "candidate", c.timing_timeout_s)
            rec.update(self._time(worker, shapes))
            rec["timing_s"] = 0.0  # _time's own figure is replaced by the stage's whole span
            why = self._check(worker, self.task.check_shapes[0], c.seed + 10_000)  # fresh
            close_stage(None)
            if why:
                return self._finish(rec, "incorrect", t_start, reason=f"after timing: {why}")
            return self._finish(rec, "success", t_start)
        except _Incorrect as exc:
            close_stage(None)
            return self._finish(rec, "incorrect", t_start, reason=str(exc))
        except _StageError as exc:
            close_stage(None)
            kind = exc.answer.get("kind")
            outcome = "compile_failed" if stage == "compile" and kind == "compile" else \
                "runtime_error"
            if kind == "forged":
                rec["timing_forged"] = True
            return self._finish(rec, outcome, t_start, reason=exc.answer.get("error"),
                                failed_stage=stage)
        except WorkerFailure as exc:
            close_stage(None)
            outcome = "timeout" if exc.kind == "timeout" else "runtime_error"
            return self._finish(rec, outcome, t_start, reason=f"{stage}: {exc}",
                                failed_stage=stage)
        finally:
            if worker is not None:
                worker.close()  # never reused: the next candidate gets a fresh process

    def _time(self, worker: _Sandbox, shapes: list[dict]) -> dict:
        c = self.config
        t0 = time.perf_counter()
        gpu_clock = self.clock_mode() == "gpu"
        retimed = self._retimed if gpu_clock else self._reference_due()
        e0 = self._energy_mj()
        cand, ref = [], []
        for dims in shapes:
            # (On the GPU clock the queued batch's own first, unqueued call warms up.)
            ans = {"ok": True} if gpu_clock else worker.call(
                {"op": "warmup", "dims": dims, "seed": c.seed, "protocol": c.protocol},
                c.timing_timeout_s)
            if not ans["ok"]:
                raise _StageError(ans)
            cand.append(self._time_shape_gpu(worker, dims, "candidate") if gpu_clock else
                        self._time_shape(worker, dims, "time"))
            ref.append(self.reference_times(dims))
        e1 = self._energy_mj()
        timing_s = time.perf_counter() - t0
        if any(a["capped"] for a in cand):
            # Caught misreporting on one shape, the candidate's claims are believed on none:
            # every shape is recorded at no less than this process's clock of it.
            for a in cand:
                a["value_ms"] = max(a["value_ms"], a["trusted_ms"])
        out = {"timing_s": timing_s, **self._clock_marks(),
               "runtime_ns": _geomean([a["value_ms"] for a in cand]) * 1e6,
               "ref_runtime_ns": _geomean([r["value_ms"] for r in ref]) * 1e6,
               "trusted_runtime_ns": _geomean([max(a["trusted_ms"], 1e-9) for a in cand]) * 1e6,
               "timing_statistic": cand[0]["statistic"],
               "timing_reps": [a["reps"] for a in cand],
               "timing_rse": [a["rse"] for a in cand],
               # per shape: what the candidate's process claimed and what this one saw
               "timing_claimed_ms": [a["claimed_ms"] for a in cand],
               "timing_trusted_ms": [a["trusted_ms"] for a in cand],
               "timing_noise_ms": [a["noise_ms"] for a in cand],
               **({"timing_null_ms": [a["null_ms"] for a in cand]} if gpu_clock else {}),
               "timing_floor_ms": [a["floor_ms"] for a in cand],
               "timing_value_ms": [a["value_ms"] for a in cand]}
        if any(a["capped"] for a in cand):
            out["timing_capped"] = [bool(a["capped"]) for a in cand]
        if any(a.get("suspect") for a in cand):
            out["timing_suspect"] = [a.get("suspect") for a in cand]
        out["speedup"] = out["ref_runtime_ns"] / out["runtime_ns"]
        if retimed:
            out["ref_retimed"] = True
        if e0 is not None and e1 is not None:
            out["energy_j"] = (e1 - e0) / 1e3  # the timing stage (may be under a second)
            out["energy_window_s"] = timing_s
            if c.energy_window_s > 0:
                out.update(self._joules_per_call(worker, cand[0]["value_ms"]))
        return out

    def _clock_marks(self) -> dict:
        """Whose clock this candidate's timing is (``timing_clock``: "gpu" or "wall") and
        whether it can be believed (``timing_trusted``): only the GPU clock, on which this
        process times every call itself, is trusted; on the wall (CPU) clock the times are the
        candidate's process's own, which it can forge."""
        mode = self.clock_mode()
        marks = {"timing_clock": mode, "timing_trusted": mode == "gpu"}
        if mode != "gpu" and self.clock_note:
            marks["timing_clock_note"] = self.clock_note  # why not the GPU clock
        return marks

    def _batches(self):
        """Batch sizes: min_reps (at least 5), then doubling, up to max_reps in all."""
        c = self.config
        n, total = max(c.min_reps, 5), 0
        while total < c.max_reps:
            n = min(n, c.max_reps - total)
            yield n
            total += n
            n *= 2

    def _time_shape(self, worker: _Sandbox, dims: dict, op: str) -> dict:
        """Time one shape in batches and judge the claim against this process's clock.

        ``trusted_ms`` is this process's view of one call: the batches' wall time (request
        sent to answer sent, by the kernel's clock) less the loop's own cost (``_null_batch``,
        the mean of the null batches just before and just after each), per repetition;
        ``noise_ms`` is twice the summed difference between those two null batches, per
        repetition (only trusted processes' batches: a candidate cannot widen it). For a
        candidate, ``checked_reps`` repetitions per batch, chosen after the batch, have their
        rows checked against the reference."""
        from gfsim.live.measure import timing
        from gfsim.live.measure.worker import rep_seed

        c = self.config
        candidate = op == "time"
        times: list[float] = []
        wall = null = spread = 0.0
        started = time.perf_counter()
        for b, n in enumerate(self._batches()):
            seed = c.seed * 7_777 + 1_000 * (b + 1) + (17 if candidate else 0)
            path = worker.dir / f"rows-{b}"
            before = self._null_batch(dims, n, seed + 1)
            ans = worker.call({"op": op, "dims": dims, "seed": seed, "reps": n,
                               "protocol": c.protocol, "rows": c.check_rows, "path": str(path),
                               "pad_cycles": c.pad_cycles}, c.timing_timeout_s)
            if not ans["ok"]:
                raise _StageError(ans)
            batch_wall = ans["_sent_s"]
            after = self._null_batch(dims, n, seed + 2)  # before the checks: adjacent in time
            got = ans.get("times_ms")
            if not isinstance(got, list) or len(got) != n or not all(
                    isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in got):
                raise _StageError({"kind": "forged", "error": f"timing answer for {n} "
                                   "repetitions is not n positive times"})
            if candidate:
                for r in sorted(self._rng.choice(n, size=min(n, c.checked_reps),
                                                 replace=False).tolist()):
                    self._check_rep(worker, path, dims, rep_seed(seed, r), r)
            times += [float(t) for t in got]
            wall += batch_wall
            null += (before + after) / 2.0
            spread += abs(after - before)
            reps = len(times)
            if reps >= c.min_reps and timing.rse(times) < c.rse_target:
                break
            if sum(times) / 1e3 >= c.max_kernel_s or time.perf_counter() - started >= \
                    c.max_wall_s:
                break
        reps = len(times)
        statistic = "mean" if c.protocol == "reference" else "median"
        value = statistics.fmean(times) if statistic == "mean" else statistics.median(times)
        verdict = judge_timing(
            claimed_ms=statistics.fmean(times), value_ms=value,
            trusted_ms=(wall - null) / reps * 1e3,
            noise_ms=2.0 * spread / reps * 1e3,  # what the loop's own cost may be off by
            config=c, gpu=self._device() == "cuda")
        if candidate and verdict["forged"]:
            raise _StageError({"kind": "forged", "error": (
                f"timing forged: shape {dims}: {verdict['forged']}")})
        if not candidate:
            verdict.update(value_ms=value, capped=False, suspect=None)
        del verdict["forged"]
        return {**verdict, "reps": reps, "rse": timing.rse(times), "statistic": statistic,
                "wall_s": wall}

    def _time_shape_gpu(self, box: _Sandbox, dims: dict, call: str) -> dict:
        """Time one shape on the GPU clock (``_GpuClock``), in the batches ``_batches`` gives.

        The recorded value is the median window less the null, and the null is the least of
        those measured for this shape: before any candidate's process existed
        (``_prepare_gpu_clock``), and just before and just after each batch. A process that
        ran work on the GPU during a null could only make it longer, so it cannot lower its
        own value that way; ``noise_ms`` is the largest difference between the nulls. For a
        candidate, ``checked_reps`` repetitions per batch, chosen after the batch, have the
        rows this process gathered on the GPU checked against the reference."""
        from gfsim.live.measure import timing
        from gfsim.live.measure.worker import rep_seed

        c = self.config
        clock = self._clock()
        candidate = call == "candidate"
        lane = "candidate" if candidate else "partner"
        timeout = c.timing_timeout_s
        times: list[float] = []
        nulls = [clock.null_calib[_key(dims)]] if _key(dims) in clock.null_calib else []
        started = time.perf_counter()
        for b, n in enumerate(self._batches()):
            seed = c.seed * 7_777 + 1_000 * (b + 1) + (17 if candidate else 0)
            if b == 0:  # the null's windows vary by microseconds: ten repetitions suffice
                nulls.append(self._null_gpu(dims, 10, seed + 1))
            got = clock.batch(box, lane, dims, seed, n, call, c.check_rows, timeout,
                              c.gpu_queue_timeout_s)  # rows gathered in every window
            kept = clock.kept
            if candidate:
                for r in sorted(self._rng.choice(n, size=min(n, c.checked_reps),
                                                 replace=False).tolist()):
                    self._check_kept(kept[r], dims, rep_seed(seed, r), r)
            times += got
            null = min(nulls)
            if len(times) >= c.min_reps and \
                    timing.rse([max(t - null, 1e-6) for t in times]) < c.rse_target:
                break
            spent = sum(times) / 1e3
            if spent >= c.max_kernel_s or time.perf_counter() - started >= c.max_wall_s or (
                    len(times) >= 20 and spent >= c.gpu_clock_shape_s):
                break
        nulls.append(self._null_gpu(dims, 10, seed + 2))
        null = min(nulls)
        value = max(statistics.median(times) - null, 1e-6)
        net = [t - null for t in times]
        return {"value_ms": value, "trusted_ms": value, "claimed_ms": None,
                "noise_ms": max(nulls) - null, "floor_ms": None, "capped": False,
                "null_ms": null, "reps": len(times), "rse": timing.rse([max(t, 1e-6)
                                                                        for t in net]),
                "statistic": "median", "wall_s": time.perf_counter() - started}

    def _check_kept(self, kept: list, dims: dict, seed: int, rep: int) -> None:
        """The rows the GPU clock gathered from repetition ``rep``'s outputs, against the
        reference on the same inputs."""
        ref = self._reference_output(dims, seed, rows=self.config.check_rows)
        got = [t.detach().float().cpu().numpy() for t in kept]
        why = f"{len(got)} outputs where the reference has {len(ref)}" \
            if len(got) != len(ref) else self.task.compare(got, ref)
        if why:
            raise _Incorrect(f"during timing (shape {dims}, repetition {rep}): {why}")

    def _check_rep(self, worker: _Sandbox, path: Path, dims: dict, seed: int, rep: int):
        """Rows of timed repetition ``rep``'s outputs, fetched after its batch, against the
        reference on the same inputs."""
        ans = worker.call({"op": "rows", "path": str(path), "rep": rep},
                          self.config.check_timeout_s)
        if not ans["ok"]:
            raise _StageError(ans)
        ref = self._reference_output(dims, seed, rows=self.config.check_rows)
        why = self._compare_files(path, lambda k: worker.seen(f"{path}.{rep}.{k}.npy"), ref)
        if why:
            raise _Incorrect(f"during timing (shape {dims}, repetition {rep}): {why}")

    def _joules_per_call(self, worker: _Sandbox, value_ms: float) -> dict:
        """NVML energy over a window of at least ``energy_window_s`` of back-to-back calls;
        the call count is capped at what this process's clock allows at the timed speed."""
        c = self.config
        e0 = self._energy_mj()
        ans = worker.call({"op": "loop", "dims": self.task.bench_shapes[0], "seed": c.seed,
                           "seconds": c.energy_window_s}, c.timing_timeout_s)
        e1 = self._energy_mj()
        if not ans["ok"] or e0 is None or e1 is None or not ans.get("calls"):
            return {}
        seconds = ans["_sent_s"]
        calls = min(int(ans["calls"]), max(1, int(seconds / (value_ms / 1e3) * 1.5)))
        joules = (e1 - e0) / 1e3
        return {"joules_per_call": joules / calls, "energy_loop_s": seconds,
                "energy_loop_w": joules / seconds}

    def _energy_mj(self) -> float | None:
        if self._nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
                self._pynvml = pynvml
            except Exception:  # noqa: BLE001 - no NVML here: energy is simply unknown
                self._nvml = False
        if not self._nvml:
            return None
        try:
            return float(self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._nvml))
        except Exception:  # noqa: BLE001
            return None

    def idle_power_w(self, seconds: float = 1.0) -> float | None:
        """Board power with nothing of ours running, over ``seconds`` (reported apart)."""
        e0 = self._energy_mj()
        time.sleep(seconds)
        e1 = self._energy_mj()
        return None if e0 is None or e1 is None else (e1 - e0) / 1e3 / seconds

    def _finish(self, rec: dict, outcome: str, t_start: float, reason: str | None = None,
                failed_stage: str | None = None):
        rec["outcome"] = outcome
        # The stages partition the call (see measure), so their sum is its wall time up to
        # the microseconds between the last stage's end and this line.
        staged = rec["compile_s"] + rec["check_s"] + rec["timing_s"]
        rec["wall_s"] = staged if staged > 0 else time.perf_counter() - t_start
        rec["service_s"] = rec["wall_s"]
        if reason:
            rec["reason"] = _loggable_text(str(reason))[:_REASON_CHARS]
        if failed_stage:
            rec["failed_stage"] = failed_stage
        return rec


def judge_timing(*, claimed_ms: float, value_ms: float, trusted_ms: float, noise_ms: float,
                 config: MeasurerConfig, gpu: bool) -> dict:
    """What is recorded for one shape, from the candidate's claim and this process's clock.

    ``claimed_ms`` is the mean of the times the candidate's process reported, ``value_ms`` the
    statistic that would be recorded from them, ``trusted_ms`` this process's clock of a call
    (the batches' wall time less the loop's own cost, per repetition; it may come out below
    zero) and ``noise_ms`` what that loop cost may be off by. ``floor = trusted - noise -
    timing_slack_ms`` (the slack on a GPU only) is a time the call cannot have been faster
    than. A claim (its mean, or the statistic recorded) below ``(1 - timing_tolerance)`` x
    floor is capped at the floor.

    On a GPU the claim is refused as forged (``forged`` says why) when it is below
    ``forged_below`` x floor, or when the batches were over ``timing_tolerance`` faster than
    the calls they claim to contain (``trusted + noise < (1 - timing_tolerance) x claim``:
    only a process that skipped the loop's own work can do that). On the CPU nothing is
    refused: there the loop's cost differs between the candidate's process and the null's by
    more than a fast honest call takes (an ``aten._softmax`` was refused so), so a claim below
    ``forged_below`` x floor is only capped and said in ``suspect``; the CPU clock's timings
    are untrusted anyway (``timing_trusted``)."""
    tol = config.timing_tolerance
    slack = config.timing_slack_ms if gpu else 0.0
    floor_ms = trusted_ms - noise_ms - slack
    forged = suspect = None
    if floor_ms > 0 and claimed_ms < config.forged_below * floor_ms:
        why = (f"the candidate's process reports {claimed_ms:.4g} ms a call, this process's "
               f"clock saw {trusted_ms:.4g} ms")
        forged, suspect = (why, None) if gpu else (None, why)
    elif gpu and trusted_ms + noise_ms < (1.0 - tol) * claimed_ms:
        forged = (f"the batches took {max(trusted_ms, 0.0):.4g} ms a call beyond the loop's own "
                  f"work, less than the {claimed_ms:.4g} ms a call the candidate's process "
                  "reports: it skipped part of the loop")
    # The cap judges what would be recorded (the median, under gfsim's protocol) as well as the
    # mean: one huge reported time lifts a mean above the floor while the median stays below.
    capped = floor_ms > 0 and min(claimed_ms, value_ms) < (1.0 - tol) * floor_ms
    return {"value_ms": floor_ms if capped else value_ms, "trusted_ms": trusted_ms,
            "claimed_ms": claimed_ms, "noise_ms": noise_ms, "floor_ms": floor_ms,
            "capped": capped, "forged": forged, "suspect": suspect}


def harvest_triton_cache(cache: Path, into: Path) -> int:
    """Copy the compiled C modules of a trusted process's Triton cache into ``into``: every
    entry (one folder per key) that holds a shared object and no kernel group file. Kernels'
    own binaries are not copied (a candidate's compile stage keeps its true cost). Returns
    how many entries were copied."""
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    n = 0
    if not cache.is_dir():
        return 0
    for entry in sorted(cache.iterdir()):
        if not entry.is_dir() or entry.name.startswith("tmp"):
            continue
        names = [f.name for f in entry.iterdir() if f.is_file()]
        if any(x.startswith("__grp__") for x in names) or not any(
                x.endswith(suffix) for x in names):
            continue
        dest = into / entry.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name.endswith(suffix):
                shutil.copy2(entry / name, dest / name)
        n += 1
    return n


def seed_triton_cache(seed: Path, cache: Path) -> None:
    """Give a new sandbox's Triton cache copies (never links: the sandbox may write its own
    folder) of the trusted modules ``harvest_triton_cache`` kept."""
    shutil.copytree(seed, cache, dirs_exist_ok=True)


class _Incorrect(Exception):
    """A check failed inside a later stage (a timed repetition's rows)."""


def _sandbox_summary(applied: dict) -> str:
    """A short word for the log: which layers confined the candidate."""
    parts = []
    if applied.get("private_proc_shm"):
        parts.append("namespaces")
    if applied.get("landlock_abi"):
        parts.append(f"landlock{applied['landlock_abi']}")
        if applied.get("reads_confined"):
            parts.append("reads")
    if applied.get("seccomp"):
        parts.append("seccomp")
    if applied.get("limits"):  # "cgroup1"/"cgroup2": the kernel's limits; "rlimits": fallback
        parts.append(applied["limits"])  # (sandbox.limits_word: a group of one controller)
    if applied.get("folder_quota"):  # "tmpfs": the kernel holds the folder's bytes, entries
        parts.append(f"folder-{applied['folder_quota']}")
    return "+".join(parts) or "none"


class _StageError(Exception):
    def __init__(self, answer: dict):
        super().__init__(answer.get("error"))
        self.answer = answer


def _geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))



def _key(dims: dict) -> str:
    return json.dumps(dims, sort_keys=True)


class _Lane:
    """One shared region of the GPU clock and the counters of its signal words: the baseline's
    process has one, the candidates (one at a time) another."""

    def __init__(self, region, pool_at: int):
        self.region, self.pool_at = region, pool_at
        self.pool_size = region.size - pool_at
        self.k = 1  # the next GO value
        self.hold = 0

    def reset(self) -> None:
        """Zero the signal words (the previous candidate's process is gone): a value it wrote
        cannot release a later candidate's waits."""
        import torch

        from gfsim.live.measure import gpushare

        self.region.bytes(0, gpushare.SIGNAL_BYTES).zero_()
        torch.cuda.synchronize()
        self.k, self.hold = 1, 0


class _GpuClock:
    """The measurer's own clock of a call on the GPU (``gfsim.live.measure.gpushare``).

    This process owns each lane's region, fills the inputs, flushes the L2 and times every
    repetition between its own events: start, fresh inputs, flush, GO, wait for DONE, the check
    rows gathered, end. The process being timed only waits for GO, calls, and signals DONE, so
    it reports nothing that is believed; every repetition's window also holds the protocol's
    own cost, which the null (the baseline's process with a call that does nothing) measures.
    """

    def __init__(self, task, shapes: list[dict], root: Path, pool_min: int = 2 << 30):
        import torch

        from gfsim.live.measure import gpushare, timing

        self.task = task
        sig = gpushare.SIGNAL_BYTES
        self.layouts: dict = {}
        end = sig
        for dims in shapes:
            specs, e = gpushare.tensor_specs(task.make_inputs(dims, 0, "cuda"), start=sig)
            self.layouts[_key(dims)] = specs
            end = max(end, e)
        g = gpushare.Region.granularity()
        pool_at = -(-end // g) * g
        size = pool_at + max(pool_min, 8 * (end - sig))
        self.allocator = str(gpushare.build_allocator(root / "gpushare"))
        self.lanes = {name: _Lane(gpushare.Region.create(size), pool_at)
                      for name in ("partner", "candidate")}
        for lane in self.lanes.values():
            lane.reset()
        self.stream, self.side = torch.cuda.Stream(), torch.cuda.Stream()
        self.flush = torch.empty(timing.flush_bytes(), dtype=torch.uint8, device="cuda")
        self.kept: dict = {}
        self.null_calib: dict = {}  # per shape: the null with no candidate process alive

    def close(self) -> None:
        """Give the lanes' device memory back (the timed processes are gone by now)."""
        import torch

        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - a broken context frees everything at exit anyway
            return
        self.kept = {}
        for lane in self.lanes.values():
            lane.region.close()

    def attach(self, box: _Sandbox, lane: str, timeout: float) -> None:
        ln = self.lanes[lane]
        ans = box.call({"op": "attach", "size": ln.region.size, "pool_at": ln.pool_at,
                        "pool_size": ln.pool_size, "allocator": self.allocator,
                        "layouts": self.layouts}, timeout, fds=[ln.region.fd])
        if not ans["ok"]:
            raise _StageError(ans)

    def batch(self, box: _Sandbox, lane: str, dims: dict, seed: int, reps: int, call: str,
              rows: int, timeout: float, queue_timeout: float = 30.0) -> list[float]:
        """Per-repetition windows (ms) of ``reps`` calls by ``box`` on fresh inputs (seeds
        ``rep_seed(seed, r)``), the check rows of every repetition kept in ``self.kept``.
        ``timeout`` bounds the unqueued first call and the queued calls' run on the GPU,
        ``queue_timeout`` the queueing itself."""
        import torch

        from gfsim.live.measure import gpushare
        from gfsim.live.measure.worker import check_rows, rep_seed

        ln = self.lanes[lane]
        k0 = ln.k
        ln.k += reps
        key = _key(dims)
        slots = [ln.region.view(s) for s in self.layouts[key]]
        # Valid inputs of this shape before the call's unqueued first run reads them (the
        # region's input bytes are shared by every shape's layout), drawn with a seed no
        # repetition uses: a call that ran before its GO computed none of the batch's outputs.
        with torch.cuda.stream(self.stream):
            for slot, x in zip(slots, self.task.make_inputs(dims, rep_seed(seed, reps + 7),
                                                            "cuda")):
                slot.copy_(x)
        self.stream.synchronize()
        req = {"op": "enqueue", "dims": dims, "k0": k0, "reps": reps, "call": call}
        for warm, limit in ((True, timeout), (False, min(timeout, queue_timeout))):
            ans = box.call({**req, "warm": warm}, limit)
            if not ans["ok"]:
                raise _StageError(ans)
        outs = ans.get("outputs")
        try:
            if not isinstance(outs, list) or len(outs) != reps or not all(
                    isinstance(o, list) and 0 < len(o) <= 16 for o in outs):
                raise gpushare.SpecError(f"no outputs for each of the {reps} repetitions")
            views = [[ln.region.view(gpushare.check_output_spec(s, ln.pool_size), ln.pool_at)
                      for s in rep] for rep in outs]
            # One index of check rows per output for the whole batch, so every repetition's
            # outputs must have the first one's shapes (an index beyond a row count would be
            # a device-side fault in this process).
            shapes = [tuple(v.shape) for v in views[0]]
            for r, rep in enumerate(views):
                if [tuple(v.shape) for v in rep] != shapes:
                    raise gpushare.SpecError(f"repetition {r}'s outputs are not shaped as the "
                                             f"first's {shapes}")
        except (gpushare.SpecError, RuntimeError, ValueError, TypeError) as exc:
            raise _StageError({"kind": "runtime", "error": f"timing: {str(exc)[:300]}"}) \
                from None
        sig = ln.region.ptr
        stream = self.stream
        kept: dict = {}
        events = []
        with torch.cuda.stream(stream):
            index = {}  # output j's rows of every repetition, one (reps, k) copy per output
            for j, v in enumerate(views[0]):
                if rows and v.dim():
                    idx = [check_rows(v.shape[0], rep_seed(seed, r), rows) for r in range(reps)]
                    index[j] = torch.as_tensor(idx, dtype=torch.int64).reshape(
                        reps, len(idx[0])).pin_memory().to("cuda", non_blocking=True)
            # Every operation of the loop once, before the stream waits: CUDA loads modules
            # lazily, and a load waits for the context to go idle, which a stream held on a
            # signal never does (the inputs' draw and copy ran in the pre-fill above).
            self.flush.zero_()
            if rows:
                [v.index_select(0, index[j][0]) if v.dim() else v.reshape(1).clone()
                 for j, v in enumerate(views[0])]
            stream.synchronize()
            ln.hold += 1
            gpushare.wait_geq(stream, sig, gpushare.HOLD, ln.hold)  # until all is queued
            for r in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), \
                    torch.cuda.Event(enable_timing=True)
                start.record(stream)
                fresh = self.task.make_inputs(dims, rep_seed(seed, r), "cuda")
                for slot, x in zip(slots, fresh):
                    slot.copy_(x)
                del fresh
                self.flush.zero_()
                gpushare.write(stream, sig, gpushare.GO, k0 + r)
                gpushare.wait_geq(stream, sig, gpushare.DONE, k0 + r)
                if rows:
                    kept[r] = [v.index_select(0, index[j][r]) if v.dim() else
                               v.reshape(1).clone() for j, v in enumerate(views[r])]
                end.record(stream)
                events.append((start, end))
        gpushare.write(self.side, sig, gpushare.HOLD, ln.hold)
        deadline = time.monotonic() + timeout
        while not events[-1][1].query():
            if time.monotonic() > deadline:
                gpushare.write(self.side, sig, gpushare.DONE, k0 + reps - 1)  # let ours finish
                stream.synchronize()
                raise WorkerFailure("timeout", f"the timed process did not finish {reps} "
                                    f"queued calls within {timeout:.0f} s (a call that waits "
                                    "for the device cannot be timed on the GPU clock)")
            time.sleep(0.0002)
        self.kept = kept
        return [float(a.elapsed_time(b)) for a, b in events]
