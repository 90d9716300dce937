"""The measurement worker: the request loop that runs candidate code (inside the sandbox, one
process per candidate: ``gfsim.live.measure.sandbox``) or times the task's baseline (a process
of its own that never loads candidate code).

It reads one JSON request per line and answers one JSON line; the candidate's own prints go to
stderr. Outputs are written as .npy files into the private folder for the measurer to check
against the reference, which never runs here: while a candidate runs, the task's reference
entry points (``Task.blocked``) raise instead. Nothing a worker says is believed: the measurer
checks outputs itself and times the timing requests with its own clock.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
import traceback

__all__ = ["guard", "serve", "output_path", "rep_seed", "check_rows", "resolve"]


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


def rep_seed(seed: int, rep: int) -> int:
    """The input seed of timed repetition ``rep`` of a batch whose base seed is ``seed``."""
    return (int(seed) * 1_000_003 + 7_919 * int(rep) + 1) % (1 << 62)


def check_rows(n_rows: int, seed: int, k: int) -> list[int]:
    """The rows of an output that repetition ``seed`` keeps for the measurer's check (drawn
    with replacement: O(k), and a repeated row is simply checked twice)."""
    import numpy as np

    if n_rows <= k:
        return list(range(n_rows))
    return sorted(np.random.default_rng(seed).integers(0, n_rows, size=k).tolist())


def _error_kind(exc: BaseException) -> str:
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if "CompilationError" in name or "CompileError" in name or isinstance(exc, SyntaxError):
        return "compile"
    if "CUDA error" in text or "illegal memory access" in text or "AcceleratorError" in name:
        return "cuda"  # sticky: the parent replaces this worker
    return "runtime"


class Worker:
    def __init__(self, task_name: str, sock=None):
        from gfsim.live.measure import timing
        from gfsim.live.tasks import get_task

        import torch

        # Under TRITON_INTERPRET=1 kernels run on the CPU, and so does everything else here.
        interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        t0 = time.perf_counter()
        gpu = torch.cuda.is_available() and not interpreted
        if gpu:
            torch.empty(1, device="cuda")  # the context now, so that init_s says what it costs
            timing.bind()
        self.init_s = time.perf_counter() - t0
        self.timing = timing
        self.torch = torch
        self.task = get_task(task_name)
        self.device = "cuda" if gpu else "cpu"
        self.run = None
        self.kept: dict = {}
        self.ready: dict = {}  # op_time_null's outputs, by shape
        self.sock = sock  # the answer socket: descriptors arrive on it (op_attach)
        self.shared = None  # the measurer's region, once attached (gfsim.live.measure.gpushare)

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
        _refuse_aliases(out, inputs)
        arrays = output_arrays(out)
        for k, arr in enumerate(arrays):
            np.save(output_path(req["path"], k), arr, allow_pickle=False)
        return {"seconds": seconds, "shape": list(arrays[0].shape), "n_outputs": len(arrays)}

    def op_warmup(self, req):
        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        if req.get("baseline"):
            self._trusted_only()
        fn = self.task.baseline if req.get("baseline") else self.run
        t0 = time.perf_counter()
        with guard(() if req.get("baseline") else self.task.blocked):
            calls = self.timing.warm_up(fn, inputs, device=self.device,
                                        protocol=req.get("protocol", "gfsim"))
            # ...and one short batch of the timing loop itself, discarded: its first pass
            # allocates (the flush buffer, the kept rows) and would weigh on the first batch.
            self._batch(fn, {**req, "reps": 2, "seed": req["seed"] + 991})
        return {"calls": calls, "seconds": time.perf_counter() - t0}

    def op_time(self, req):
        """A batch of ``reps`` timed calls of the candidate (see ``_batch``)."""
        with guard(self.task.blocked):
            return self._batch(self.run, req)

    def op_time_baseline(self, req):
        """The task's own baseline (what a speedup is against), timed like a candidate. The
        measurer sends this only to a worker that never loaded candidate code."""
        self._trusted_only()
        return self._batch(self.task.baseline, req)

    def op_time_null(self, req):
        """The batch with a call that does nothing (returns a ready output): what the loop
        itself costs (fresh inputs, flush, events, synchronisation, the rows kept, the answer),
        so that the measurer can take it off its own clock. Trusted workers only; the ready
        output is made by the first request for a shape (``prepare``), outside any clock."""
        self._trusted_only()
        key = json.dumps(req["dims"], sort_keys=True)
        if req.get("prepare") or key not in self.ready:
            self.ready[key] = self.task.baseline(*self.task.make_inputs(
                req["dims"], req["seed"], self.device))
            self._sync()
        ready = self.ready[key]
        # Under the reference protocol a call's events hold the clones of its inputs: the
        # null leaves them out, so that they stay in the difference the measurer judges.
        return self._batch(lambda *_: ready, req, clone=False)

    def op_prime(self, req):
        """Compile and run the task's own hand-written kernels once (trusted code, never a
        candidate's), so that this process's Triton cache holds the C modules Triton builds
        for any kernel (its driver utilities, launchers), which the measurer then copies into
        every candidate's empty cache. Trusted workers only; ``self.run`` stays unset."""
        import importlib.util

        self._trusted_only()
        dims = self.task.check_shapes[0]
        t0, ran, errors = time.perf_counter(), 0, []
        for n, cand in enumerate(self.task.candidates()):
            path = os.path.join(os.getcwd(), f"prime_{n}.py")
            with open(path, "w") as fh:
                fh.write(cand.code)
            try:
                spec = importlib.util.spec_from_file_location(f"prime_{n}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                module.run(*self.task.make_inputs(dims, int(req.get("seed", 0)), self.device))
                self._sync()
                ran += 1
            except Exception as exc:  # noqa: BLE001 - a priming miss only costs time later
                errors.append(f"{cand.variant}: {type(exc).__name__}: {str(exc)[:200]}")
        return {"ran": ran, "errors": errors, "seconds": time.perf_counter() - t0}

    def _trusted_only(self):
        if self.run is not None:
            raise RuntimeError("this worker has run candidate code: it does not time the "
                               "baseline")

    def _batch(self, fn, req, clone: bool = True):
        """``reps`` calls, each on fresh inputs (``rep_seed``). After every call the same rows of
        every output are gathered and kept (on the device, asynchronously), so no call looks
        different from another; the measurer asks for one repetition's rows (``op_rows``) only
        after the batch."""
        import torch

        dims, seed, k = req["dims"], req["seed"], req.get("rows", 16)
        reps = int(req["reps"])
        self.kept = kept = {}
        index: dict = {}

        def inputs_for(r):
            return self.task.make_inputs(dims, rep_seed(seed, r), self.device)

        def on_output(r, out):
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            rows = []
            for j, o in enumerate(outs):
                if o.dim() == 0:
                    rows.append(o.reshape(1).clone())
                    continue
                if j not in index:  # every repetition's rows of output j, copied once
                    rows_j = torch.as_tensor([check_rows(o.shape[0], rep_seed(seed, q), k)
                                              for q in range(reps)]).reshape(reps, -1)
                    if o.is_cuda:  # pinned, so that the copy does not wait for the device
                        rows_j = rows_j.pin_memory()
                    index[j] = rows_j.to(o.device, non_blocking=True)
                rows.append(o.index_select(0, index[j][r]))
            kept[r] = rows

        result = self.timing.time_reps(fn, inputs_for, reps, device=self.device,
                                       protocol=req.get("protocol", "gfsim"),
                                       on_output=on_output,
                                       pad_cycles=int(req.get("pad_cycles", 0)), clone=clone)
        return dict(result)

    def op_rows(self, req):
        """Save the kept rows of repetition ``rep`` of the last batch as
        ``{path}.{rep}.{k}.npy``."""
        import numpy as np

        rep = int(req["rep"])
        rows = self.kept.get(rep, ())
        for k, t in enumerate(rows):
            np.save(f"{req['path']}.{rep}.{k}.npy", t.detach().float().cpu().numpy(),
                    allow_pickle=False)
        return {"outputs": len(rows)}

    # -- the measurer's GPU clock (gfsim.live.measure.gpushare) ----------------------------
    def op_attach(self, req):
        """Map the measurer's shared region (its descriptor arrives on the answer socket just
        before this request) and make the pool every later queued call allocates from."""
        import ctypes
        import socket

        from gfsim.live.measure import gpushare

        torch = self.torch
        _msg, fds, _flags, _addr = socket.recv_fds(self.sock, 64, 1)
        if len(fds) != 1:
            raise RuntimeError("op_attach: no descriptor on the answer socket")
        region = gpushare.Region.attach(fds[0], int(req["size"]))
        pool_ptr, pool_size = region.ptr + int(req["pool_at"]), int(req["pool_size"])
        lib = ctypes.CDLL(req["allocator"])
        lib.gfsim_arena_set(ctypes.c_void_p(pool_ptr), ctypes.c_size_t(pool_size))
        alloc = torch.cuda.memory.CUDAPluggableAllocator(req["allocator"], "gfsim_arena_alloc",
                                                         "gfsim_arena_free")
        self.shared = {"region": region, "pool_ptr": pool_ptr, "lib": lib, "alloc": alloc,
                       "pool": torch.cuda.MemPool(alloc.allocator()),
                       "layouts": req["layouts"], "stream": torch.cuda.Stream(), "ready": {}}
        return {"pool_ptr": pool_ptr}

    def op_enqueue(self, req):
        """Queue ``reps`` calls on the shared inputs, each behind the measurer's GO signal and
        followed by this process's DONE (``gfsim.live.measure.gpushare``); answer where each call's
        outputs lie in the pool. ``call`` is ``candidate``, or (trusted workers only)
        ``baseline`` or ``null`` (a ready output: what the protocol itself costs). With
        ``warm`` the request makes one call only, unqueued and synchronised, which the measurer
        sends first, so that CUDA's lazy module loading never happens while the stream waits
        (a load waits for the context to go idle); the queued request then only launches, and
        the measurer gives it a short deadline. A call that synchronises the device while
        queued raises (torch's sync debug mode) or waits for ever (that deadline ends it): the
        trusted clock cannot time it."""
        from gfsim.live.measure import gpushare

        torch = self.torch
        sh = self.shared
        if sh is None:
            raise RuntimeError("op_enqueue before op_attach")
        kind = req.get("call", "candidate")
        if kind != "candidate":
            self._trusted_only()
        key = json.dumps(req["dims"], sort_keys=True)
        inputs = [sh["region"].view(s) for s in sh["layouts"][key]]
        fn = self.run if kind == "candidate" else self.task.baseline
        stream, sig = sh["stream"], sh["region"].ptr
        k0, reps = int(req["k0"]), int(req["reps"])
        specs = []
        with torch.cuda.stream(stream), torch.cuda.use_mem_pool(sh["pool"]), \
                guard(self.task.blocked if kind == "candidate" else ()):
            if req.get("warm"):
                if kind == "null":
                    if key not in sh["ready"]:
                        # A ready output, and one element a kernel writes in each
                        # repetition: stream memory operations alone do not need this
                        # context to run on the GPU, and any real call does (a context
                        # switch each way, the bulk of the protocol's cost).
                        sh["ready"][key] = (fn(*inputs), torch.zeros(1, device="cuda"))
                    sh["ready"][key][1].add_(1)
                else:
                    out = fn(*inputs)
                    del out
                stream.synchronize()
                return {"outputs": [], "pool_used": int(sh["lib"].gfsim_arena_used())}
            if kind == "null":
                if key not in sh["ready"]:
                    raise RuntimeError("a queued null before its warm call")
                ready, tick = sh["ready"][key]
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                for r in range(reps):
                    gpushare.wait_geq(stream, sig, gpushare.GO, k0 + r)
                    if kind == "null":
                        tick.add_(1)
                        out = ready
                    else:
                        out = fn(*inputs)
                    specs.append(gpushare.output_specs(out, sh["pool_ptr"]))
                    gpushare.write(stream, sig, gpushare.DONE, k0 + r)
                    del out
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        return {"outputs": specs, "pool_used": int(sh["lib"].gfsim_arena_used())}

    def op_loop(self, req):
        """Call the candidate until ``seconds`` have passed (an energy window)."""
        inputs = self.task.make_inputs(req["dims"], req["seed"], self.device)
        clock = self.timing.perf  # bound before the candidate loaded (it may patch time)
        calls, t0 = 0, clock()
        with guard(self.task.blocked):
            while clock() - t0 < req["seconds"]:
                self.run(*inputs)
                calls += 1
                if calls % 16 == 0:
                    self._sync()
            self._sync()
        return {"calls": calls, "seconds": clock() - t0}

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


def _refuse_aliases(out, inputs) -> None:
    """An output that shares memory with an input is refused (the check would compare the
    caller's own buffer, which the candidate may keep writing to)."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    seen = {}
    for j, x in enumerate(inputs):
        if hasattr(x, "untyped_storage"):
            seen[x.untyped_storage().data_ptr()] = j
    for k, o in enumerate(outs):
        if hasattr(o, "untyped_storage") and o.untyped_storage().data_ptr() in seen:
            raise RuntimeError(f"output {k} aliases input {seen[o.untyped_storage().data_ptr()]}"
                               " (a kernel must write its own output)")


def serve(task_name: str, requests, send, ready: dict | None = None, sock=None) -> None:
    """Answer requests from ``requests`` (lines of JSON) with ``send(bytes)``, one message per
    answer, until ``exit`` or end of input. ``sock`` is the answer socket, on which the
    measurer sends descriptors (``op_attach``)."""
    worker = Worker(task_name, sock)
    send(json.dumps({"ok": True, "ready": True, "pid": os.getpid(), "device": worker.device,
                     "init_s": worker.init_s, **(ready or {})}).encode())
    for line in requests:
        req = json.loads(line)
        if req.get("op") == "exit":
            break
        send(json.dumps(worker.handle(req)).encode())
