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

import io
import json
import math
import os
import shutil
import statistics
import time
from abc import ABC, abstractmethod
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.core.folders import remove_tree
from gfsim.live.measure.config import MeasurerConfig
from gfsim.live.measure.confined import (
    Confined,
    Unreadable,
    WorkerFailure,
    Zygote,
    open_regular,
)
from gfsim.live.measure.sandbox import ENV_ALLOWLIST

__all__ = ["Measurer", "LogMeasurer", "TritonMeasurer", "MeasurerConfig", "ENV_ALLOWLIST",
           "CORRECT_UNTIMED", "UntrustedRefused", "judge_timing",
           "harvest_triton_cache"]

CORRECT_UNTIMED = "correct_untimed"
# What this process reads of a candidate's outputs is bounded, as every read of what its
# process answers (gfsim.live.measure.confined): a forgery costs the candidate its measurement,
# never this process its memory. An output's .npy header: NumPy's own limit for a header read
# without trust (np.save writes 128 bytes for any array here). Its data must then be exactly
# what an array of the reference's shape and dtype takes, so nothing larger is ever read.
MAX_NPY_HEADER_BYTES = 10_000
_REASON_CHARS = 500  # a record's reason, at most


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


class UntrustedRefused(GfsimError):
    """This machine cannot confine candidate code, and --trust-candidates was not given."""


def _load_output(path, ref):
    """The array a worker saved at ``path``, read only if it is what an output compared with
    ``ref`` can be: a regular file whose .npy header (at most ``MAX_NPY_HEADER_BYTES``) gives
    the reference's dtype and shape, followed by exactly that array's bytes. Else
    ``Unreadable``; a file is never read further than such an array."""
    import numpy as np
    from numpy.lib import format as npy

    with open_regular(path) as fh:
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
            raise Unreadable(f"has no .npy header of at most {MAX_NPY_HEADER_BYTES} bytes "
                              f"({str(exc)[:150]})") from None
        if dtype != ref.dtype or tuple(shape) != ref.shape:
            raise Unreadable(f"is refused unread: its header says {dtype} of shape "
                              f"{tuple(shape)}, the reference's is {ref.dtype} of shape "
                              f"{ref.shape}")
        start = head.tell()
        if size != start + ref.nbytes:
            raise Unreadable(f"is {size} bytes, where its header and its array take "
                              f"{start + ref.nbytes} bytes")
        fh.seek(start)
        data = bytearray(ref.nbytes)  # (writable, and read into in place)
        if fh.readinto(data) != ref.nbytes:
            raise Unreadable("was cut while it was read")
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
        self._zygote: Zygote | None = None
        self._cgroup_held = False  # cgroup.hold() called; release() at close
        self._ref_worker: Confined | None = None  # times the baseline; never runs candidates
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

    def _start_zygote(self) -> Zygote:
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
            self._zygote = Zygote(self.task_name, self._root, self.config.interpret)
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

    def _spawn(self, trusted: bool = False) -> Confined:
        zygote = self._start_zygote()
        seed = self._root / "triton-trusted"
        t0 = time.perf_counter()
        box = Confined(zygote, self.task_name, self.config, self._root, zygote.facilities,
                       seed_cache=seed if seed.is_dir() else None)
        self.spawn_s.append(time.perf_counter() - t0)
        if trusted and self.config.prime_cache and box.device == "cuda" and not seed.is_dir():
            self._prime(box, seed)
        return box

    def _prime(self, box: Confined, seed: Path) -> None:
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

    def _baseline_worker(self) -> Confined:
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
    def _check(self, worker: Confined, dims: dict, seed: int) -> str | None:
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
            except Unreadable as exc:
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

    def _time(self, worker: Confined, shapes: list[dict]) -> dict:
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

    def _time_shape(self, worker: Confined, dims: dict, op: str) -> dict:
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

    def _time_shape_gpu(self, box: Confined, dims: dict, call: str) -> dict:
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

    def _check_rep(self, worker: Confined, path: Path, dims: dict, seed: int, rep: int):
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

    def _joules_per_call(self, worker: Confined, value_ms: float) -> dict:
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

    def attach(self, box: Confined, lane: str, timeout: float) -> None:
        ln = self.lanes[lane]
        ans = box.call({"op": "attach", "size": ln.region.size, "pool_at": ln.pool_at,
                        "pool_size": ln.pool_size, "allocator": self.allocator,
                        "layouts": self.layouts}, timeout, fds=[ln.region.fd])
        if not ans["ok"]:
            raise _StageError(ans)

    def batch(self, box: Confined, lane: str, dims: dict, seed: int, reps: int, call: str,
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
