"""An OpenEvolve evaluator for the task suite's Triton kernels, on gfsim's sandboxed measurer.

``evaluate_kernel(program_path, task)`` compiles, checks and times the program as a candidate
of ``task`` (``gfsim.live.tasks``) with ``TritonMeasurer`` (one measurer per process, kept
between calls: OpenEvolve re-executes an evaluator file for every program, but not the modules
it imports). Without a CUDA GPU it runs under the Triton interpreter with CPU timing, whose
runtimes say nothing about a GPU (the returned ``device`` says which it was).

OpenEvolve evaluates the initial program in its own process and then forks its evaluation
workers; on a GPU that first measurement has started CUDA (the baseline's outputs are computed
in the measurer's process), and CUDA cannot be used again in a forked child. A call from such a
child (``torch.cuda._is_in_bad_fork()``) is therefore measured in a spawned process of its own,
started once per process and task and kept, so that it works whatever start method the caller
used.

Returns OpenEvolve metrics: a success is ``{"combined_score": speedup, "speedup": ...,
"runtime_ns": ..., "device": ...}`` (speedup against the task's PyTorch baseline); a failure is
``{"combined_score": 0.0, "error": REASON, "outcome": OUTCOME}``, ``OUTCOME`` a gfsim outcome
(``compile_failed``, ``runtime_error``, ``incorrect``, ``timeout``), which
``gfsim import openevolve`` keeps.
"""

from __future__ import annotations

import atexit
import os
import tempfile

__all__ = ["evaluate_kernel"]

_MEASURERS: dict = {}  # (pid, task, interpret) -> TritonMeasurer


def _measurer(task: str, interpret: bool):
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer

    key = (os.getpid(), task, interpret)  # a forked worker starts its own
    if key not in _MEASURERS:
        cfg = (MeasurerConfig(interpret=True, cpu_timing=True, rse_target=0.2, max_reps=3)
               if interpret else MeasurerConfig())
        workdir = tempfile.mkdtemp(prefix="gfsim-oe-eval-")
        m = TritonMeasurer(task, cfg, workdir=workdir)
        _MEASURERS[key] = m
        atexit.register(m.close)
    return _MEASURERS[key]


_SPAWNED: dict = {}  # (pid, task, interpret) -> a one-process spawn pool that measures


def _in_bad_fork() -> bool:
    """Whether this process was forked after its parent started CUDA (CUDA is then unusable
    here)."""
    import torch

    return torch.cuda._is_in_bad_fork()


def _measure_code(task: str, interpret: bool, code: str) -> dict:
    """One program's measurement record (in this process's measurer)."""
    from gfsim.live.candidates import CodeCandidate

    return _measurer(task, interpret).measure(CodeCandidate(task, code))


def _measure_spawned(task: str, interpret: bool, code: str) -> dict:
    """``_measure_code`` in a spawned process of this process's own, kept for its next call."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    key = (os.getpid(), task, interpret)
    if key not in _SPAWNED:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        _SPAWNED[key] = pool
        atexit.register(pool.shutdown)
    return _SPAWNED[key].submit(_measure_code, task, interpret, code).result()


def evaluate_kernel(program_path, task: str = "softmax", interpret: bool | None = None) -> dict:
    """OpenEvolve metrics for the program at ``program_path`` as a kernel of ``task``."""
    bad_fork = _in_bad_fork()
    if interpret is None:
        import torch

        # (a bad fork's parent had started CUDA: there is a GPU, and this process may not ask)
        interpret = False if bad_fork else not torch.cuda.is_available()
    with open(program_path, encoding="utf-8") as f:
        code = f.read()
    r = (_measure_spawned if bad_fork else _measure_code)(task, interpret, code)
    device = "cpu (Triton interpreter)" if interpret else "cuda"
    if r.get("outcome") == "success" and r.get("speedup"):
        return {"combined_score": float(r["speedup"]), "speedup": float(r["speedup"]),
                "runtime_ns": float(r["runtime_ns"]), "device": device}
    return {"combined_score": 0.0, "error": str(r.get("reason") or r.get("outcome"))[:4000],
            "outcome": r.get("outcome") or "runtime_error", "device": device}
