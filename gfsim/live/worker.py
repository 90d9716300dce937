"""The measurement worker: runs untrusted candidate code in a separate process.

Started by ``TritonMeasurer`` as ``python -m gfsim.live.worker TASK`` with an allow-listed
environment, a private working directory and (where the kernel allows it) no network. It reads
one JSON request per line on stdin and answers one JSON line on the stdout it was given; the
candidate's own prints go to stderr. Outputs are written as .npy files into the private
directory for the parent to check against the reference, which never runs here: while a
candidate runs, the task's reference entry points (``Task.blocked``) raise instead.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import traceback

__all__ = ["guard", "main", "output_path", "resolve"]


class BlockedCall(RuntimeError):
    """A candidate called the reference implementation."""


def resolve(dotted: str):
    """(owner, attribute name) of a dotted name such as ``torch.nn.functional.softmax``."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise ValueError(f"cannot resolve {dotted!r}")


@contextlib.contextmanager
def guard(blocked):
    """Replace the reference's entry points by a function that raises, for the duration."""
    saved = []
    for dotted in blocked:
        try:
            owner, attr = resolve(dotted)
            original = getattr(owner, attr)
        except (AttributeError, ValueError):
            continue

        def refuse(*_a, _name=dotted, **_k):
            raise BlockedCall(f"candidate called the reference entry point {_name}")

        try:
            setattr(owner, attr, refuse)
        except (AttributeError, TypeError):
            continue
        saved.append((owner, attr, original))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def output_path(path: str, k: int) -> str:
    """Where ``op_output`` saves output ``k``: ``path`` itself for the first (so a one-output
    task is as before), ``path`` with ``.k`` before its suffix for the others."""
    if k == 0:
        return str(path)
    root, ext = os.path.splitext(str(path))
    return f"{root}.{k}{ext}"


def _error_kind(exc: BaseException) -> str:
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if "CompilationError" in name or "CompileError" in name or isinstance(exc, SyntaxError):
        return "compile"
    if "CUDA error" in text or "illegal memory access" in text or "AcceleratorError" in name:
        return "cuda"  # sticky: the parent replaces this worker
    return "runtime"


class Worker:
    def __init__(self, task_name: str):
        from gfsim.live import timing
        from gfsim.live.tasks import get_task

        import torch

        # Under TRITON_INTERPRET=1 kernels run on the CPU, and so does everything else here.
        interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        gpu = torch.cuda.is_available() and not interpreted
        timing.bind() if gpu else None
        self.timing = timing
        self.torch = torch
        self.task = get_task(task_name)
        self.device = "cuda" if gpu else "cpu"
        self.run = None

    def _sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def op_load(self, req):
        # Triton reads a @jit function's source from its file, so the code is written to one
        # (in the private directory) and imported as a fresh module.
        import hashlib
        import importlib.util

        name = "candidate_" + hashlib.sha256(req["code"].encode()).hexdigest()[:16]
        path = os.path.join(os.getcwd(), name + ".py")
        with open(path, "w") as fh:
            fh.write(req["code"])
        t0 = time.perf_counter()
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        with guard(self.task.blocked):
            spec.loader.exec_module(module)
        run = getattr(module, "run", None)
        if not callable(run):
            raise SyntaxError("candidate code defines no callable run(*inputs)")
        self.run = run
        return {"seconds": time.perf_counter() - t0}

    def _call(self, inputs):
        with guard(self.task.blocked):
            out = self.run(*inputs)
            self._sync()
        return out

    def op_compile(self, req):
        """The first call on a benchmark shape: Triton compiles its kernels here."""
        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        self._sync()
        t0 = time.perf_counter()
        self._call(inputs)
        return {"seconds": time.perf_counter() - t0}

    def op_output(self, req):
        """Run once and save each output as float32 .npy: the k-th at ``output_path(path, k)``
        (one tensor or a tuple; float8 widened by ``.float()``)."""
        import numpy as np

        from gfsim.live.tasks.base import output_arrays

        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        t0 = time.perf_counter()
        out = self._call(inputs)
        seconds = time.perf_counter() - t0
        arrays = output_arrays(out)
        for k, arr in enumerate(arrays):
            np.save(output_path(req["path"], k), arr, allow_pickle=False)
        return {"seconds": seconds, "shape": list(arrays[0].shape), "n_outputs": len(arrays)}

    def op_time(self, req):
        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        timer = self.timing.time_callable if self.device == "cuda" else \
            self.timing.time_callable_cpu  # interpreter mode: wall-clock, labelled as such
        with guard(self.task.blocked):
            result = timer(self.run, inputs, **req["options"])
        return dict(result)

    def op_time_baseline(self, req):
        """The task's own baseline (what a speedup is against), timed like a candidate. The
        measurer sends this only to a worker that never loaded candidate code."""
        if self.run is not None:
            raise RuntimeError("this worker has run candidate code: it does not time the "
                               "baseline")
        timer = self.timing.time_callable if self.device == "cuda" else \
            self.timing.time_callable_cpu
        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        return dict(timer(self.task.baseline, inputs, **req["options"]))

    def op_loop(self, req):
        """Call the candidate until ``seconds`` have passed (an energy window)."""
        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        calls, t0 = 0, time.perf_counter()
        with guard(self.task.blocked):
            while time.perf_counter() - t0 < req["seconds"]:
                self.run(*inputs)
                calls += 1
                if calls % 16 == 0:
                    self._sync()
            self._sync()
        return {"calls": calls, "seconds": time.perf_counter() - t0}

    def handle(self, req: dict) -> dict:
        op = getattr(self, f"op_{req['op']}", None)
        if op is None:
            return {"ok": False, "kind": "protocol", "error": f"unknown op {req['op']!r}"}
        try:
            return {"ok": True, **op(req)}
        except BaseException as exc:  # noqa: BLE001 - untrusted code may raise anything
            if isinstance(exc, KeyboardInterrupt):
                raise
            return {"ok": False, "kind": _error_kind(exc), "error": f"{type(exc).__name__}: "
                    f"{str(exc)[:2000]}", "trace": traceback.format_exc(limit=4)[-2000:]}


def main() -> None:
    # Answers go to a private copy of stdout; anything the candidate prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker(sys.argv[1])
    answers.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid(),
                              "device": worker.device}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "exit":
            break
        answers.write(json.dumps(worker.handle(req)) + "\n")


if __name__ == "__main__":
    main()
