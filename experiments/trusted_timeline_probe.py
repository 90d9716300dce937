"""Can a trusted process time a call made by a process in another PID namespace, on the GPU?

A feasibility probe for the measurer (docs/concepts/live-measurement.md, "What is left
open"): today the timing loop
runs in the candidate's process, so the measurer's own clock is a wall clock over a whole batch
and cannot resolve lies of 1.5x on kernels under about 0.25 ms. Here the trusted process owns
the GPU timeline instead:

- it allocates the inputs, the outputs and two 32-bit signal words with CUDA's virtual memory
  API as shareable POSIX file descriptors, and sends the descriptors over a socket to a child
  made with ``unshare --user --map-root-user --pid --net --fork --mount
  --mount-proc`` (legacy CUDA IPC handles do
  not cross PID namespaces; descriptors do);
- per repetition k, its own stream fills the inputs, flushes the L2, records event S_k, writes
  GO = k and waits for DONE >= k (stream memory operations), then records E_k;
- the child's stream waits for GO >= k, runs the call on the shared buffers, and writes DONE =
  k. The child enqueues the whole batch before the parent starts it, so no host round trip is
  inside any S_k..E_k.

It prints, per workload, the call's time as the trusted process measures it in its own process
(no child: the truth), as the child's own events report it, and as the trusted process sees it
across processes, less the same protocol with a child that does nothing (the null). Run on a
GPU machine: ``python experiments/trusted_timeline_probe.py [--reps 100] [--json OUT]``.
Needs ``cuda-python`` (``cuda.bindings``) and the ``unshare`` program. It stands alone (no
gfsim import), as it was run to decide the design; the measurer's own version of these
primitives is ``gfsim.live.measure.gpushare`` and its protocol
``gfsim.live.measure.measurer._GpuClock``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

WORKLOADS = [  # (name, elements or matrix side)
    ("null", 0),
    ("add 1M", 1 << 20),
    ("add 4M", 1 << 22),
    ("add 16M", 1 << 24),
    ("add 64M", 1 << 26),
    ("matmul 1024", 1024),
    ("matmul 2048", 2048),
    ("matmul 4096", 4096),
]
MAX_ELEMS = 1 << 26
SIG_BYTES = 1 << 21  # one granule for the two signal words


def _ok(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def _prop(cu):
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = \
        cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


def _map(cu, handle, size: int) -> int:
    ptr = _ok(cu.cuMemAddressReserve(size, 0, 0, 0))
    _ok(cu.cuMemMap(ptr, size, 0, handle, 0))
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _ok(cu.cuMemSetAccess(ptr, size, [desc], 1))
    return int(ptr)


class _View:
    def __init__(self, ptr: int, shape: tuple, typestr: str):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, False), "version": 3, "strides": None,
                                         "stream": None}


def _buffers(torch, base: int):
    """The shared region as tensors: x and y (MAX_ELEMS floats each, or bf16 matrices)."""
    x = torch.as_tensor(_View(base, (MAX_ELEMS,), "<f4"), device="cuda")
    y = torch.as_tensor(_View(base + MAX_ELEMS * 4, (MAX_ELEMS,), "<f4"), device="cuda")
    return x, y


def _call(torch, x, y, name: str, n: int):
    if name == "null":
        return
    if name.startswith("add"):
        torch.add(x[:n], x[:n], out=y[:n])
    else:
        a = x[: n * n].view(torch.bfloat16)[: n * n].view(n, n)
        b = x[n * n: 2 * n * n].view(torch.bfloat16)[: n * n].view(n, n)
        torch.mm(a, b, out=y[: n * n].view(torch.bfloat16)[: n * n].view(n, n))


def _say(*a):
    print(f"[{os.getpid()}]", *a, file=sys.stderr, flush=True)


def _wait(cu, stream, sig: int, what: str, seconds: float = 20.0) -> None:
    """Synchronise ``stream`` with a deadline; on a hang print the signal words and exit."""
    import time

    end = time.monotonic() + seconds
    while not stream.query():
        if time.monotonic() > end:
            import ctypes

            side = _ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
            host = (ctypes.c_uint32 * 128)()
            _ok(cu.cuMemcpyDtoHAsync(ctypes.addressof(host), cu.CUdeviceptr(sig), 512, side))
            _ok(cu.cuStreamSynchronize(side))
            _say(f"HANG in {what}: GO={host[0]} DONE={host[64]}")
            os._exit(3)
        time.sleep(0.0005)


def _sizes():
    return SIG_BYTES, 2 * MAX_ELEMS * 4


def child(sock_fd: int) -> None:  # pragma: no cover - runs under unshare on a GPU
    import torch
    from cuda.bindings import driver as cu

    sock = socket.socket(fileno=sock_fd)
    torch.empty(1, device="cuda")
    _say("child: CUDA up")
    fds = socket.recv_fds(sock, 16, 2)[1]
    _say("child: descriptors", fds)
    sig_size, data_size = _sizes()
    ht = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    sig = _map(cu, _ok(cu.cuMemImportFromShareableHandle(fds[0], ht)), sig_size)
    data = _map(cu, _ok(cu.cuMemImportFromShareableHandle(fds[1], ht)), data_size)
    x, y = _buffers(torch, data)
    _say("child: mapped")
    stream = torch.cuda.Stream()
    cs = cu.CUstream(stream.cuda_stream)
    go, done = cu.CUdeviceptr(sig), cu.CUdeviceptr(sig + 256)
    geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    f = sock.makefile("rw")
    f.write(json.dumps({"pid": os.getpid()}) + "\n")
    f.flush()
    for line in f:
        req = json.loads(line)
        if req["op"] == "stop":
            break
        name, n, k0, reps = req["name"], req["n"], req["k0"], req["reps"]
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
        # Once outside the protocol first: CUDA loads modules lazily, and a load while this
        # stream waits on the parent's signal would wait for the context to go idle: never.
        with torch.cuda.stream(stream):
            _call(torch, x, y, name, n)
        stream.synchronize()
        with torch.cuda.stream(stream):
            for r in range(reps):
                _ok(cu.cuStreamWaitValue32(cs, go, k0 + r, geq))
                ev[r][0].record(stream)
                _call(torch, x, y, name, n)
                ev[r][1].record(stream)
                _ok(cu.cuStreamWriteValue32(cs, done, k0 + r, 0))
        f.write(json.dumps({"enqueued": True}) + "\n")
        f.flush()
        _wait(cu, stream, sig, f"child batch {name}")
        f.write(json.dumps({"child_ms": [a.elapsed_time(b) for a, b in ev]}) + "\n")
        f.flush()


def main() -> None:  # pragma: no cover - needs a GPU
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    a, b = socket.socketpair()
    proc = subprocess.Popen(["unshare", "--user", "--map-root-user", "--pid", "--net", "--fork",
                             "--mount", "--mount-proc",
                             sys.executable, os.path.abspath(__file__), "--child",
                             str(b.fileno())], pass_fds=[b.fileno()])
    b.close()

    import torch
    from cuda.bindings import driver as cu

    torch.empty(1, device="cuda")
    ht = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    sig_size, data_size = _sizes()
    handles = [_ok(cu.cuMemCreate(s, _prop(cu), 0)) for s in (sig_size, data_size)]
    sig, data = (_map(cu, h, s) for h, s in zip(handles, (sig_size, data_size)))
    fds = [int(_ok(cu.cuMemExportToShareableHandle(h, ht, 0))) for h in handles]
    _say("parent: exported", fds)
    socket.send_fds(a, [b"fds"], fds)
    f = a.makefile("rw")
    print("child:", f.readline().strip(), flush=True)
    x, y = _buffers(torch, data)
    sigt = torch.as_tensor(_View(sig, (128,), "<u4"), device="cuda")
    sigt.zero_()
    torch.cuda.synchronize()
    flush = torch.empty(int(2 * torch.cuda.get_device_properties(0).L2_cache_size),
                        dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    ts = cu.CUstream(stream.cuda_stream)
    go, done = cu.CUdeviceptr(sig), cu.CUdeviceptr(sig + 256)
    geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    k = 1
    results = {"device": torch.cuda.get_device_name(0), "reps": args.reps, "workloads": {}}

    def fill(name, n):
        m = n if name.startswith("add") else n * n  # matmul: 2 n^2 bf16 = n^2 floats
        x[:m].normal_()

    for name, n in WORKLOADS:
        for trial in range(2):  # the first a warm-up
            # the truth: the call in this process, same fill and flush
            own = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(args.reps)]
            with torch.cuda.stream(stream):
                for r in range(args.reps):
                    fill(name, n)
                    flush.zero_()
                    own[r][0].record(stream)
                    _call(torch, x, y, name, n)
                    own[r][1].record(stream)
            stream.synchronize()
            # across processes
            f.write(json.dumps({"op": "batch", "name": name, "n": n, "k0": k,
                                "reps": args.reps}) + "\n")
            f.flush()
            assert json.loads(f.readline())["enqueued"]
            _say("parent: child enqueued", name, trial)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.reps)]
            with torch.cuda.stream(stream):
                for r in range(args.reps):
                    fill(name, n)
                    flush.zero_()
                    ev[r][0].record(stream)
                    _ok(cu.cuStreamWriteValue32(ts, go, k + r, 0))
                    _ok(cu.cuStreamWaitValue32(ts, done, k + r, geq))
                    ev[r][1].record(stream)
            _wait(cu, stream, sig, f"parent batch {name}")
            k += args.reps
            child_ms = json.loads(f.readline())["child_ms"]
        own_ms = [p.elapsed_time(q) for p, q in own]
        cross_ms = [p.elapsed_time(q) for p, q in ev]
        row = {"own_ms": statistics.median(own_ms), "child_ms": statistics.median(child_ms),
               "cross_ms": statistics.median(cross_ms),
               "cross_p10": sorted(cross_ms)[len(cross_ms) // 10],
               "cross_p90": sorted(cross_ms)[len(cross_ms) * 9 // 10],
               "own_all": own_ms, "child_all": child_ms, "cross_all": cross_ms}
        results["workloads"][name] = row
        null = results["workloads"]["null"]["cross_ms"]
        print(f"{name:12s} own {row['own_ms']*1e3:8.1f} us  child {row['child_ms']*1e3:8.1f} us"
              f"  cross {row['cross_ms']*1e3:8.1f} us (p10 {row['cross_p10']*1e3:7.1f}, p90 "
              f"{row['cross_p90']*1e3:7.1f})  cross-null {(row['cross_ms']-null)*1e3:8.1f} us",
              flush=True)
    f.write(json.dumps({"op": "stop"}) + "\n")
    f.flush()
    proc.wait(timeout=30)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        main()
