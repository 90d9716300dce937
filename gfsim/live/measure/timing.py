"""Timing a kernel with CUDA events: the two protocols a live measurement can use.

- ``gfsim``: the L2 cache is flushed (a large buffer is overwritten) before every repetition;
  only the candidate's call is between the events; the statistic is the median.
- ``reference`` (the paper's): no flush, cloning the inputs is inside the timed region; the
  statistic is the mean.

``warm_up`` calls first (at least 3 calls and 0.1 s); ``time_reps`` then times a number of
repetitions that the *measurer* chooses, batch by batch, until the relative standard error of
the mean is below its target or a repetition, kernel-time or wall-time limit is reached (the
candidate's process never decides how many repetitions it reports). Every repetition gets
fresh inputs. Times are in milliseconds.

The end event is recorded on the current stream right after the call, and the repetitions of a
batch are queued without a synchronisation between them (and, by default, without a GPU spin
between them: whatever the loop does besides the candidate's call is work a candidate that
rewrites the loop in its own process could skip, so the measurer keeps it as small as the
inputs and the L2 flush allow) (the first design asked for a device
sync *before* each end event, to count work a candidate puts on other streams; on the H200 that
added ~24 us of host round trip to every repetition and tripled its noise, experiments/
timing_diag.py). Work on other streams is not between the events, but it is inside the
measurer's own clock of the batch, which ends with a device-wide synchronisation and which the
recorded time never undercuts (``gfsim.live.measure.measurer``).

Where it can, on a GPU, the measurer does not use this loop at all: it times each call on its
own GPU clock (``gfsim.live.measure.gpushare``, ``MeasurerConfig.clock``). This loop serves the CPU,
the paper's ``reference`` protocol, and GPUs where that clock cannot run.

This module is imported by the sandbox's zygote before any candidate code runs and keeps its
own references to the CUDA entry points it uses; a candidate can still patch anything in its
own process, which is why the measurer trusts only its own clock and its own checks.
"""

from __future__ import annotations

import math
import statistics
import time

__all__ = ["PROTOCOLS", "STATISTIC", "TimingResult", "warm_up", "time_reps", "rse", "bind", "perf",
           "CPU_PROTOCOL", "flush_bytes"]

# Bound at import, before any candidate code runs: a candidate that replaces time.perf_counter
# does not change the clock of this module (the measurer believes neither).
perf = _perf = time.perf_counter

PROTOCOLS = ("gfsim", "reference")
STATISTIC = {"gfsim": "median", "reference": "mean"}
# The L2 flush overwrites twice the device's L2 (120 MB on an H200), at least 32 MB: enough to
# evict it, and little for a candidate to gain by skipping it.
_FLUSH_MIN_BYTES = 32 * 1024 * 1024


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
        "sleep": torch.cuda._sleep,
    }


_CUDA = None


def bind() -> None:
    """Capture the CUDA entry points now (before untrusted code can patch them)."""
    global _CUDA
    _CUDA = _bound_cuda()


def warm_up(fn, inputs, *, device: str, protocol: str = "gfsim", warmup: int = 3,
            warmup_s: float = 0.1) -> int:
    """Call ``fn(*inputs)`` at least ``warmup`` times and for ``warmup_s`` seconds (the GPU's
    clocks ramp up over tens of milliseconds; a thread pool's first calls are slow). Returns
    the number of calls."""
    c = _cuda() if device == "cuda" else None
    started = _perf()
    calls = 0
    while calls < warmup or (_perf() - started < warmup_s and calls < 10_000):
        fn(*_clone(inputs)) if protocol == "reference" else fn(*inputs)
        calls += 1
        if c is not None and calls % 8 == 0:
            c["sync"]()
    if c is not None:
        c["sync"]()
    return calls


def time_reps(fn, inputs_for, reps: int, *, device: str, protocol: str = "gfsim",
              on_output=None, pad_cycles: int = 0, clone: bool = True) -> TimingResult:
    """Time exactly ``reps`` calls, each on fresh inputs ``inputs_for(r)`` (drawn on the
    device before the call, so a candidate that caches by input pointer returns stale
    outputs).

    On a GPU each call sits between two CUDA events, after the L2 flush (``gfsim``) or with the
    clone of its inputs inside (``reference``). The repetitions are queued back to back and
    the whole device is synchronised once, after the last (work on other streams included), so
    the batch's wall time is the GPU's work and little else: the measurer's clock of a batch
    is then precise enough to judge the events' claim. On the CPU (the Triton interpreter)
    each call is timed by ``time.perf_counter``: interpreter times, labelled
    ``cpu-wallclock``. After each call and outside its timing, ``on_output(r, out)`` sees what
    it returned (asynchronously: it must not synchronise). ``pad_cycles`` > 0 spins the GPU for
    that many of its cycles before each repetition, outside the events (a diagnostic: the
    spin's length follows the SM clock, and a candidate can skip it). ``clone=False`` leaves
    the ``reference`` protocol's clones out: the measurer's null batch, whose difference from
    a timed batch must hold the clones the candidate's events saw."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown timing protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    gpu = device == "cuda"
    clock = _perf
    started = clock()
    times: list[float] = []
    if gpu:
        c = _cuda()
        flush = _flush_buffer() if protocol == "gfsim" else None
        events = []
        for r in range(reps):
            inputs = inputs_for(r)
            if pad_cycles > 0:
                c["sleep"](int(pad_cycles))
            if flush is not None:
                flush.zero_()
            start, end = c["Event"](enable_timing=True), c["Event"](enable_timing=True)
            c["record"](start)
            out = fn(*_clone(inputs)) if protocol == "reference" and clone else fn(*inputs)
            c["record"](end)
            events.append((start, end))
            if on_output is not None:
                on_output(r, out)
            del out
        c["sync"]()
        times = [float(c["elapsed"](a, b)) for a, b in events]
    else:
        for r in range(reps):
            inputs = inputs_for(r)
            t0 = clock()
            out = fn(*_clone(inputs)) if protocol == "reference" and clone else fn(*inputs)
            times.append((clock() - t0) * 1e3)
            if on_output is not None:
                on_output(r, out)
    mean, median = statistics.fmean(times), statistics.median(times)
    proto = protocol if gpu else CPU_PROTOCOL
    value = median if proto != "reference" else mean
    return TimingResult(times_ms=times, mean_ms=mean, median_ms=median, value_ms=value,
                        statistic="mean" if proto == "reference" else "median",
                        rse=rse(times), reps=len(times), protocol=proto,
                        kernel_s=sum(times) / 1e3, wall_s=clock() - started)


_FLUSH = None


def _flush_buffer():
    """The L2 flush buffer, allocated once per process."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = _cuda()["empty"](flush_bytes(), dtype=_uint8(), device="cuda")
    return _FLUSH


def flush_bytes() -> int:
    """Bytes the ``gfsim`` protocol overwrites before each repetition: twice the L2."""
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                     "L2_cache_size", 0) or 0)
    return max(2 * l2, _FLUSH_MIN_BYTES)


def _cuda():
    if _CUDA is None:
        bind()
    return _CUDA


CPU_PROTOCOL = "cpu-wallclock"


def rse(times: list[float]) -> float:
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
