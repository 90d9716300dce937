"""How a Triton measurer measures (``MeasurerConfig``): its timing protocol and stopping rule,
its limits per stage, the sandbox's memory, task and folder limits, and the clock it trusts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MeasurerConfig"]

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
    # bytes on disk than these (``Confined._watch_folder``, every ``FOLDER_CHECK_S``), and the
    # kernel refuses any one file past ``folder_max_mb`` (RLIMIT_FSIZE). An honest candidate's
    # holds a Triton cache of some hundred files two folders deep and its outputs.
    folder_max_depth: int = 32
    folder_max_entries: int = 20_000
    folder_max_mb: float = 4096.0
