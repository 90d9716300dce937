"""Measurers: where an evaluation comes from. ``LogMeasurer`` looks it up in a replay log;
``TritonMeasurer`` compiles, checks and times a real Triton candidate in an isolated worker.

Isolation of untrusted code (DESIGN.md "Live mode"): a separate worker process in its own
process group, an allow-listed environment (no API keys), a private working directory, no
network where ``unshare`` can make a network namespace, an RSS watchdog that kills the process
group past a memory limit (not RLIMIT_AS, which breaks CUDA), wall-clock limits per stage, and
a fresh worker after a crash, a limit or a sticky CUDA error. The reference implementation runs
only here in the parent: the worker blocks its entry points while a candidate runs, and the
parent checks the candidate's outputs against its own reference on its own inputs, again on
fresh inputs after timing. What a candidate with full Python access can still do is forge the
worker's answers about *time*; the parent checks them against its own wall clock and (on a GPU)
NVML energy, which bounds but does not prevent that.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gfsim.core.errors import GfsimError

__all__ = ["Measurer", "LogMeasurer", "TritonMeasurer", "MeasurerConfig", "ENV_ALLOWLIST",
           "CORRECT_UNTIMED"]

CORRECT_UNTIMED = "correct_untimed"

ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                 "CUDA_HOME", "TRITON_INTERPRET", "NCCL_NVLS_ENABLE",
                 "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


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
            raise GfsimError(f"{self.log.path}: no evaluation of candidate {cid!r} (a replay "
                             "measures only what was measured)")
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
    # A separate window of back-to-back calls this long gives joules per call from NVML's
    # energy counter, which is coarse over shorter windows; 0 turns it off.
    energy_window_s: float = 1.0
    isolate_network: bool = True
    seed: int = 0
    # Without a GPU (TRITON_INTERPRET=1): time candidates by wall clock on the CPU (protocol
    # "cpu-wallclock", on ``cpu_shapes`` or the task's first two check shapes) instead of
    # stopping at "correct_untimed". Interpreter times, not GPU times: logs say so.
    cpu_timing: bool = False
    cpu_shapes: tuple = ()
    interpret: bool = False  # run the worker with TRITON_INTERPRET=1 (kernels on the CPU)
    # The baseline's timing is cached per (task, shape) and re-timed after this many timed
    # candidates (clocks and thermals drift over a long run); 0 never re-times.
    ref_retime_every: int = 50


class WorkerFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" | "crash" | "memory"


class _Worker:
    """One worker process and its pipes, watched for memory."""

    def __init__(self, task: str, config: MeasurerConfig, root: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="gfsim-worker-", dir=root))
        env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
        env.update(HOME=str(self.dir), TMPDIR=str(self.dir), PYTHONNOUSERSITE="1",
                   TRITON_CACHE_DIR=str(root / "triton-cache"), PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=_package_root())
        if config.interpret:
            env["TRITON_INTERPRET"] = "1"
        cmd = [sys.executable, "-m", "gfsim.live.worker", task]
        self.network_isolated = False
        if config.isolate_network and _can_unshare_net():
            cmd = ["unshare", "--map-root-user", "--net", *cmd]
            self.network_isolated = True
        self.stderr = open(self.dir / "stderr.log", "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, cwd=self.dir, env=env,
                                     start_new_session=True)
        self.limit_kb = config.memory_limit_mb * 1024
        self.killed_for_memory = False
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_memory, daemon=True)
        self._watch.start()
        self._buffer = b""
        ready = self.call(None, timeout=300.0)
        self.device = ready.get("device")

    def _watch_memory(self) -> None:
        while not self._stop.wait(0.05):
            if _group_rss_kb(self.proc.pid) > self.limit_kb:
                self.killed_for_memory = True
                self.kill()
                return

    def call(self, req: dict | None, timeout: float) -> dict:
        """Send one request (None: read the ready line) and wait for its answer."""
        if req is not None:
            try:
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._failure() from None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise WorkerFailure("timeout", f"no answer within {timeout:.0f} s")
                if not sel.select(timeout=min(left, 0.5)):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise self._failure()
                self._buffer += chunk
        finally:
            sel.close()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _failure(self) -> WorkerFailure:
        self.proc.wait(timeout=10)
        if self.killed_for_memory:
            return WorkerFailure("memory", "worker exceeded the memory limit and was killed")
        tail = (self.dir / "stderr.log").read_bytes()[-600:].decode(errors="replace")
        return WorkerFailure("crash", f"worker died (exit {self.proc.returncode}): {tail}")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self.kill()
        self.proc.wait()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _package_root() -> str:
    import gfsim

    return str(Path(gfsim.__file__).resolve().parent.parent)


_UNSHARE: bool | None = None


def _can_unshare_net() -> bool:
    global _UNSHARE
    if _UNSHARE is None:
        try:
            _UNSHARE = subprocess.run(["unshare", "--map-root-user", "--net", "true"],
                                      capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _UNSHARE = False
    return _UNSHARE


def _group_rss_kb(pgid: int) -> float:
    """Resident memory of every process in a process group (Linux /proc)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != pgid:  # field 5 of stat: process group
                continue
            for line in Path(entry.path, "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += float(line.split()[1])
                    break
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass
class _Reference:
    mean_ms: list[float] = field(default_factory=list)


class TritonMeasurer(Measurer):
    """Compile, check and time Triton candidates of one task, one candidate at a time.

    Stages, each timed: compile (load the code, first call on a benchmark shape: Triton's JIT),
    check (outputs on every check shape against the parent's reference), timing (every
    benchmark shape under the configured protocol), then a re-check on fresh inputs. The
    reference is timed in this process with the same protocol and cached per shape.
    """

    def __init__(self, task, config: MeasurerConfig = MeasurerConfig(), workdir=None):
        self.task_name = task if isinstance(task, str) else task.name
        self.config = config
        self.workdir = workdir
        self._task = None
        self._worker: _Worker | None = None
        self._ref_worker: _Worker | None = None  # times the baseline; never runs candidates
        self._root: Path | None = None
        self._ref_cache: dict = {}
        self.restarts = 0
        self._nvml = None
        self._timed_since_ref = 0
        self.reference_log: list[dict] = []  # every (re-)timing of the baseline, in order

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def task(self):
        if self._task is None:
            from gfsim.live.tasks import get_task

            self._task = get_task(self.task_name)
        return self._task

    def _running(self, worker: _Worker | None) -> _Worker:
        """``worker`` if its process still runs, else a fresh one (the dead one closed)."""
        if worker is not None and worker.proc.poll() is None:
            return worker
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="gfsim-measure-", dir=self.workdir))
        if worker is not None:
            worker.close()
        return _Worker(self.task_name, self.config, self._root)

    def _ensure_worker(self) -> _Worker:
        worker = self._running(self._worker)
        if self._worker is not None and worker is not self._worker:
            self.restarts += 1
        self._worker = worker
        return worker

    def _replace_worker(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
            self.restarts += 1

    def close(self) -> None:
        for name in ("_worker", "_ref_worker"):
            worker = getattr(self, name)
            if worker is not None:
                worker.close()
                setattr(self, name, None)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reference ----------------------------------------------------------------------------
    def _device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() and not self.config.interpret else "cpu"

    def _reference_output(self, dims: dict, seed: int) -> list:
        """The reference's outputs (one or a tuple) as float32 NumPy arrays, in order."""
        from gfsim.live.tasks.base import output_arrays

        inputs = self.task.make_inputs(dims, seed, self._device())
        return output_arrays(self.task.reference(*inputs), "reference()")

    def reference_times(self, dims: dict) -> dict:
        """The baseline's timing on a benchmark shape (cached per shape and protocol): the
        task's PyTorch operator in the candidates' own dtype (``Task.baseline``), which is
        what a speedup is against; the upcast ``Task.reference`` only checks correctness."""
        key = (json.dumps(dims, sort_keys=True), self.config.protocol)
        if key not in self._ref_cache:
            # Timed in a worker process of its own that never loads candidate code (so no
            # candidate can patch the baseline), single-threaded like the candidates' worker.
            # Timed here in the parent, every other thread of this process that wants the GIL
            # (a worker's memory watchdog, a live run's other batches) stalls the launches
            # between the CUDA events: on the H200 a busy thread turned fp8_quant's 0.58 ms
            # baseline into several ms (experiments/ref_drift.py).
            t0 = time.perf_counter()
            ans = self._baseline_worker().call(
                {"op": "time_baseline", "dims": dims, "seed": self.config.seed,
                 "options": self._timing_options()}, self.config.timing_timeout_s)
            if not ans["ok"]:
                raise GfsimError(f"task {self.task_name}: timing the baseline failed: "
                                 f"{ans.get('error')}")
            self._ref_cache[key] = {k: v for k, v in ans.items() if k != "ok"}
            self.reference_log.append({"dims": dims, "value_ms": self._ref_cache[key]["value_ms"],
                                       "seconds": time.perf_counter() - t0})
        return self._ref_cache[key]

    def _baseline_worker(self) -> _Worker:
        self._ref_worker = self._running(self._ref_worker)
        return self._ref_worker

    def timing_shapes(self, device: str) -> list[dict]:
        """The shapes a candidate is timed on: the task's benchmark shapes on a GPU; on the CPU
        (interpreter) ``cpu_shapes`` or the first two check shapes, which it can afford."""
        if device == "cuda":
            return list(self.task.bench_shapes)
        return [dict(d) for d in self.config.cpu_shapes] or list(self.task.check_shapes[:2])

    def _timing_options(self) -> dict:
        c = self.config
        return {"protocol": c.protocol, "rse_target": c.rse_target, "min_reps": c.min_reps,
                "max_reps": c.max_reps, "max_kernel_s": c.max_kernel_s,
                "max_wall_s": c.max_wall_s}

    # -- the stages -----------------------------------------------------------------------------
    def _check(self, worker: _Worker, dims: dict, seed: int) -> str | None:
        """None if the candidate's outputs match the reference's (``Task.compare``), else why
        not. The worker saves output k at ``output_path(out.npy, k)``."""
        import numpy as np

        from gfsim.live.worker import output_path

        path = worker.dir / "out.npy"
        for stale in worker.dir.glob("out*.npy"):
            stale.unlink(missing_ok=True)
        ans = worker.call({"op": "output", "dims": dims, "seed": seed, "path": str(path)},
                          self.config.check_timeout_s)
        if not ans["ok"]:
            raise _StageError(ans)
        ref = self._reference_output(dims, seed)
        n = ans.get("n_outputs", 1)
        if type(n) is not int or n != len(ref):  # the worker's word: checked before use
            return f"{n} outputs where the reference has {len(ref)}"
        try:
            got = [np.load(output_path(path, k), allow_pickle=False) for k in range(n)]
        except (OSError, ValueError) as exc:
            return f"output unreadable ({type(exc).__name__}: {str(exc)[:200]})"
        return self.task.compare(got, ref)

    def measure(self, candidate) -> dict:
        """One evaluation. Never raises for a candidate's own failure: that is an outcome.

        The stage seconds partition ``wall_s``: ``compile_s`` runs from the start (a worker
        started for this candidate included) to the first call's end, ``check_s`` covers the
        checks, ``timing_s`` everything after (the timing, a re-timing of the baseline when it
        is due, the energy window and the re-check on fresh inputs). A replay that books these
        stages therefore holds the GPU exactly as long as the live run did."""
        c = self.config
        task = self.task
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

        try:
            worker = self._ensure_worker()
            rec["network_isolated"] = worker.network_isolated
            shapes = self.timing_shapes(worker.device)
            for req in ({"op": "load", "code": candidate.code},
                        {"op": "compile", "dims": shapes[0], "seed": c.seed}):
                ans = worker.call(req, c.compile_timeout_s)
                if not ans["ok"]:
                    raise _StageError(ans)
            close_stage("check")
            for k, dims in enumerate(task.check_shapes):
                why = self._check(worker, dims, c.seed + 1 + k)
                if why:
                    close_stage(None)
                    return self._finish(rec, "incorrect", t_start, reason=why)
            close_stage("timing")
            if worker.device != "cuda" and not c.cpu_timing:
                # No GPU (TRITON_INTERPRET=1 on CPU): correctness only, no timing. Not a log
                # outcome: such a result is never written as an evaluation.
                return self._finish(rec, CORRECT_UNTIMED, t_start)
            if worker.device != "cuda":
                rec["timing_protocol"] = "cpu-wallclock"
            rec.update(self._time(worker, candidate, shapes))
            rec["timing_s"] = 0.0  # _time's own figure is replaced by the stage's whole span
            why = self._check(worker, task.check_shapes[0], c.seed + 10_000)  # fresh inputs
            close_stage(None)
            if why:
                return self._finish(rec, "incorrect", t_start, reason=f"after timing: {why}")
            return self._finish(rec, "success", t_start)
        except _StageError as exc:
            close_stage(None)
            kind = exc.answer.get("kind")
            if kind == "cuda":
                self._replace_worker()  # a sticky CUDA error poisons the process
            outcome = "compile_failed" if stage == "compile" and kind == "compile" else \
                "runtime_error"
            return self._finish(rec, outcome, t_start, reason=exc.answer.get("error"),
                                failed_stage=stage)
        except WorkerFailure as exc:
            self._replace_worker()
            close_stage(None)
            outcome = "timeout" if exc.kind == "timeout" else "runtime_error"
            return self._finish(rec, outcome, t_start, reason=f"{stage}: {exc}",
                                failed_stage=stage)

    def _time(self, worker: _Worker, candidate, shapes: list[dict]) -> dict:
        c = self.config
        t0 = time.perf_counter()
        retimed = False
        if c.ref_retime_every and self._timed_since_ref >= c.ref_retime_every:
            self._ref_cache.clear()  # due: the baseline is timed again below
            self._timed_since_ref = 0
        if not self._ref_cache:
            retimed = True
        self._timed_since_ref += 1
        e0 = self._energy_mj()
        cand, ref = [], []
        for dims in shapes:
            w0 = time.perf_counter()
            ans = worker.call({"op": "time", "dims": dims, "seed": c.seed,
                               "options": self._timing_options()}, c.timing_timeout_s)
            if not ans["ok"]:
                raise _StageError(ans)
            wall = time.perf_counter() - w0
            if ans["kernel_s"] > wall * 1.05 or ans["value_ms"] <= 0:
                raise _StageError({"kind": "runtime", "error": "timing answer inconsistent "
                                   f"with the parent's clock ({ans['kernel_s']:.3f} s of "
                                   f"kernel time in {wall:.3f} s)"})
            cand.append(ans)
            ref.append(self.reference_times(dims))
        e1 = self._energy_mj()
        timing_s = time.perf_counter() - t0
        out = {"timing_s": timing_s,
               "runtime_ns": _geomean([a["value_ms"] for a in cand]) * 1e6,
               "ref_runtime_ns": _geomean([r["value_ms"] for r in ref]) * 1e6,
               "timing_statistic": cand[0]["statistic"],
               "timing_reps": [a["reps"] for a in cand],
               "timing_rse": [a["rse"] for a in cand]}
        out["speedup"] = out["ref_runtime_ns"] / out["runtime_ns"]
        if retimed:
            out["ref_retimed"] = True
        if e0 is not None and e1 is not None:
            out["energy_j"] = (e1 - e0) / 1e3  # the timing stage (may be under a second)
            out["energy_window_s"] = timing_s
            if c.energy_window_s > 0:
                out.update(self._joules_per_call(worker))
        return out

    def _joules_per_call(self, worker: _Worker) -> dict:
        """NVML energy over a window of at least ``energy_window_s`` of back-to-back calls."""
        c = self.config
        e0 = self._energy_mj()
        ans = worker.call({"op": "loop", "dims": self.task.bench_shapes[0], "seed": c.seed,
                           "seconds": c.energy_window_s}, c.timing_timeout_s)
        e1 = self._energy_mj()
        if not ans["ok"] or e0 is None or e1 is None or not ans["calls"]:
            return {}
        joules = (e1 - e0) / 1e3
        return {"joules_per_call": joules / ans["calls"], "energy_loop_s": ans["seconds"],
                "energy_loop_w": joules / ans["seconds"]}

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
            rec["reason"] = str(reason)[:500]
        if failed_stage:
            rec["failed_stage"] = failed_stage
        return rec


class _StageError(Exception):
    def __init__(self, answer: dict):
        super().__init__(answer.get("error"))
        self.answer = answer


def _geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def config_dict(config: MeasurerConfig) -> dict:
    return asdict(config)
