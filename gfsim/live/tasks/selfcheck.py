"""Run candidates in this process and compare them with the task's reference.

For development and tests, not for untrusted code (the measurer's worker isolates that). On a
machine without a GPU, run it under ``TRITON_INTERPRET=1`` (set before triton is imported, i.e.
in the environment of a fresh process) with device ``cpu``:

    TRITON_INTERPRET=1 python -m gfsim.live.tasks.selfcheck JOBS.json RESULTS.json

JOBS.json is a list of ``{"task", "variant", "params", "dims", "seed", "dtype"?, "device"?}``;
``dtype`` runs the same kernels on inputs of another dtype (a task instance built with that
dtype supplies inputs, reference and tolerances); ``device`` defaults to ``cpu`` under the
interpreter and ``cuda`` otherwise. RESULTS.json gets ``{"unsupported": null, "results": [...]}``
with one ``{"ok", "error", "excess", "seconds"}`` per job, in order; or, where the interpreter
cannot run a loop with a runtime bound (Triton 3.6's interpreter with NumPy >= 2.4 fails with
"only 0-dimensional arrays can be converted to Python scalars"), ``{"unsupported": WHY,
"results": []}`` without running the jobs.
"""

from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["check", "interpreter_problem", "run_jobs", "main"]


def default_device() -> str:
    return "cpu" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "cuda"


_PROBE = """
import torch
import triton
import triton.language as tl


@triton.jit
def probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + cols, mask=cols < n, other=0.0)
    tl.store(x_ptr + tl.arange(0, BLOCK), acc, mask=tl.arange(0, BLOCK) < n)


def run():
    x = torch.arange(6, dtype=torch.float32)
    probe_kernel[(1,)](x, 6, BLOCK=4)
    return x.tolist()
"""


def interpreter_problem() -> str | None:
    """None if kernels with a runtime loop bound run here (under the interpreter), else why not."""
    import numpy
    import triton

    from gfsim.live.tasks.base import load_code

    try:
        got = load_code(_PROBE, "<interpreter probe>")["run"]()
    except Exception as exc:  # noqa: BLE001
        return (f"the Triton {triton.__version__} interpreter with NumPy {numpy.__version__} "
                f"cannot run a loop with a runtime bound ({type(exc).__name__}: {exc})")
    if got != [4.0, 6.0, 2.0, 3.0, 4.0, 5.0]:
        return f"the interpreter's probe kernel computed {got}"
    return None


def check(task, run, dims: dict, seed: int, device: str) -> dict:
    """Compare ``run(*inputs)`` with ``task.reference`` the way the measurer does: every output
    (one tensor or a tuple) as float32 NumPy, judged by ``task.compare``. ``excess`` is the
    worst ``|got - ref| - atol - rtol |ref|`` over the outputs (diagnostic; None if none
    compares)."""
    from gfsim.live.tasks.base import output_arrays, worst_excess

    t0 = time.perf_counter()
    try:
        inputs = task.make_inputs(dims, seed, device)
        got = output_arrays(run(*inputs))
        ref = output_arrays(task.reference(*inputs), "reference()")
    except Exception as exc:  # noqa: BLE001 - report, do not stop the batch
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1000]}",
                "excess": None, "seconds": time.perf_counter() - t0}
    seconds = time.perf_counter() - t0
    why = task.compare(got, ref)
    return {"ok": why is None, "error": why, "seconds": seconds,
            "excess": worst_excess(got, ref, task.atol, task.rtol)}


def run_jobs(jobs: list[dict]) -> list[dict]:
    from gfsim.live.tasks import get_task
    from gfsim.live.tasks.base import Candidate, load_code

    loaded: dict[str, object] = {}
    results = []
    for job in jobs:
        task = get_task(job["task"])
        if job.get("dtype", task.dtype) != task.dtype:
            task = type(task)(dtype=job["dtype"])
        cand = Candidate(job["task"], job["variant"], job["params"])
        key = cand.candidate_id
        if key not in loaded:
            try:
                loaded[key] = load_code(cand.code, f"<candidate {key}>")["run"]
            except Exception as exc:  # noqa: BLE001
                loaded[key] = f"load: {type(exc).__name__}: {str(exc)[:1000]}"
        if isinstance(loaded[key], str):
            results.append({"ok": False, "error": loaded[key], "excess": None, "seconds": 0.0})
            continue
        results.append(check(task, loaded[key], job["dims"], job.get("seed", 0),
                             job.get("device") or default_device()))
    return results


def main(argv: list[str] | None = None) -> None:
    jobs_path, out_path = (argv if argv is not None else sys.argv[1:])
    with open(jobs_path) as f:
        jobs = json.load(f)
    interpreted = default_device() == "cpu"
    problem = interpreter_problem() if interpreted else None
    results = [] if problem else run_jobs(jobs)
    with open(out_path, "w") as f:
        json.dump({"unsupported": problem, "results": results}, f)


if __name__ == "__main__":
    main()
