"""Timing a kernel launch with CUDA events: the two protocols a live measurement can use.

- ``gfsim``: the L2 cache is flushed (a large buffer is overwritten) before every repetition;
  only the candidate's call is between the events; the statistic is the median.
- ``reference`` (the paper's): no flush, cloning the inputs is inside the timed region; the
  statistic is the mean.
Both warm up first (at least 3 calls and 0.1 s), then repeat until the relative standard error of the mean is below
``rse_target`` (from the 3rd repetition), or ``max_reps`` repetitions, or ``max_kernel_s`` of
kernel time, or ``max_wall_s`` of wall time. Times are in milliseconds.

The end event is recorded on the current stream right after the call, and the device is
synchronised after it. (DESIGN.md first asked for a device sync *before* the end event, to count
work a candidate puts on other streams; on the H200 that added ~24 us of host round trip to
every repetition and tripled its noise: per-repetition CV 11% against 4%, run-to-run CV of the
mean 1.8% against 0.2%, experiments/timing_diag.py. Work on other streams is therefore not
counted; the parent's wall-clock check bounds how much could hide there.)

This module is imported by the measurer's worker before any candidate code runs; it keeps its
own references to the CUDA entry points it uses, so a candidate that patches them afterwards
does not change what is measured.
"""

from __future__ import annotations

import math
import statistics
import time

__all__ = ["PROTOCOLS", "STATISTIC", "TimingResult", "time_callable", "time_callable_cpu", "bind",
           "CPU_PROTOCOL"]

PROTOCOLS = ("gfsim", "reference")
STATISTIC = {"gfsim": "median", "reference": "mean"}
_FLUSH_BYTES = 256 * 1024 * 1024  # several times the H200's 60 MB L2


class TimingResult(dict):
    """{"times_ms": [...], "mean_ms", "median_ms", "rse", "reps", "warmup", "protocol",
    "kernel_s", "wall_s"} (a dict, so it crosses the worker pipe as JSON)."""


def _bound_cuda():
    import torch

    Event = torch.cuda.Event
    return {
        "Event": Event,
        "record": Event.record,
        "elapsed": Event.elapsed_time,
        "sync": torch.cuda.synchronize,
        "empty": torch.empty,
    }


_CUDA = None


def bind() -> None:
    """Capture the CUDA entry points now (before untrusted code can patch them)."""
    global _CUDA
    _CUDA = _bound_cuda()


def time_callable(fn, inputs, *, protocol: str = "gfsim", warmup: int = 3,
                  warmup_s: float = 0.1,
                  rse_target: float = 0.001, min_reps: int = 3, max_reps: int = 100,
                  max_kernel_s: float = 10.0, max_wall_s: float = 120.0) -> TimingResult:
    """Time ``fn(*inputs)`` on the current CUDA device under a protocol."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown timing protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if _CUDA is None:
        bind()
    c = _CUDA
    flush = c["empty"](_FLUSH_BYTES, dtype=_uint8(), device="cuda") if protocol == "gfsim" \
        else None
    started = time.perf_counter()
    # Warm up for at least ``warmup`` calls and ``warmup_s`` seconds: the GPU's clocks ramp up
    # over tens of milliseconds, and a fixed count of fast calls ends before they do.
    calls = 0
    while calls < warmup or (time.perf_counter() - started < warmup_s and calls < 10_000):
        fn(*_clone(inputs)) if protocol == "reference" else fn(*inputs)
        calls += 1
        if calls % 8 == 0:
            c["sync"]()
    c["sync"]()
    times: list[float] = []
    kernel_ms = 0.0
    while True:
        if flush is not None:
            flush.zero_()
        start, end = c["Event"](enable_timing=True), c["Event"](enable_timing=True)
        c["record"](start)
        if protocol == "reference":
            fn(*_clone(inputs))
        else:
            fn(*inputs)
        c["record"](end)
        c["sync"]()
        ms = float(c["elapsed"](start, end))
        times.append(ms)
        kernel_ms += ms
        n = len(times)
        if n >= min_reps and _rse(times) < rse_target:
            break
        if n >= max_reps or kernel_ms / 1e3 >= max_kernel_s or \
                time.perf_counter() - started >= max_wall_s:
            break
    mean, median = statistics.fmean(times), statistics.median(times)
    return TimingResult(times_ms=times, mean_ms=mean, median_ms=median,
                        value_ms=median if protocol == "gfsim" else mean,
                        statistic=STATISTIC[protocol], rse=_rse(times), reps=len(times),
                        warmup=calls, protocol=protocol, kernel_s=kernel_ms / 1e3,
                        wall_s=time.perf_counter() - started)


CPU_PROTOCOL = "cpu-wallclock"


def time_callable_cpu(fn, inputs, *, rse_target: float = 0.02, min_reps: int = 3,
                      max_reps: int = 20, max_wall_s: float = 30.0, warmup: int = 3,
                      warmup_s: float = 0.05, **_ignored) -> TimingResult:
    """Wall-clock timing on the CPU (``time.perf_counter`` around each call; the median): for
    a live run without a GPU, where Triton kernels run under ``TRITON_INTERPRET=1``. Such times
    say how fast the interpreter is, not how fast a kernel would be on a GPU; a log made with
    them says so in its header (protocol ``cpu-wallclock``). Warm-up: at least ``warmup``
    calls and ``warmup_s`` seconds (a thread pool's first calls are slow)."""
    started = time.perf_counter()
    calls = 0
    while calls < warmup or (time.perf_counter() - started < warmup_s and calls < 1000):
        fn(*inputs)
        calls += 1
    times: list[float] = []
    while True:
        t0 = time.perf_counter()
        fn(*inputs)
        times.append((time.perf_counter() - t0) * 1e3)
        n = len(times)
        if n >= min_reps and _rse(times) < rse_target:
            break
        if n >= max_reps or time.perf_counter() - started >= max_wall_s:
            break
    mean, median = statistics.fmean(times), statistics.median(times)
    return TimingResult(times_ms=times, mean_ms=mean, median_ms=median, value_ms=median,
                        statistic="median", rse=_rse(times), reps=len(times), warmup=calls,
                        protocol=CPU_PROTOCOL, kernel_s=sum(times) / 1e3,
                        wall_s=time.perf_counter() - started)


def _rse(times: list[float]) -> float:
    n = len(times)
    if n < 2:
        return math.inf
    mean = statistics.fmean(times)
    return statistics.stdev(times) / math.sqrt(n) / mean if mean > 0 else math.inf


def _clone(inputs):
    return [x.clone() if hasattr(x, "clone") else x for x in inputs]


def _uint8():
    import torch

    return torch.uint8
