"""GPU memory and signals shared across processes, for the measurer's own GPU clock.

The measurer's clock of a candidate's call runs in a trusted process (the *clock*), not in the
candidate's: the clock owns one region of device memory, made with CUDA's virtual memory API as
a shareable POSIX file descriptor (legacy CUDA IPC handles do not cross PID namespaces; a
descriptor passed over a Unix socket does). The region holds

- a page of 32-bit signal words (``GO``, ``DONE``, ``HOLD``), written and awaited on the GPU
  with stream memory operations (``cuStreamWriteValue32`` / ``cuStreamWaitValue32``);
- the inputs, which only the clock fills;
- a pool from which the candidate's process allocates everything its call allocates (a torch
  ``MemPool`` over a pluggable first-fit allocator, ``_ALLOC_C``, compiled once: torch takes a
  pluggable allocator only as a shared library), so that its outputs lie in memory the clock
  can read without a copy.

Per repetition the clock's stream records a start event, fills the inputs, flushes the L2,
writes ``GO``, waits for ``DONE``, gathers the check rows of the outputs and records an end
event; the candidate's stream waits for ``GO``, calls, and writes ``DONE``. Without MPS the GPU
time-slices between processes' contexts, so whatever the candidate's process runs while the
clock waits lies between the clock's events; the work a repetition's outputs need cannot start
before its inputs exist nor end after its rows are gathered. A trusted *partner* process does
the same with a call that does nothing (the null), which is taken off.

Needs ``cuda-python`` (``cuda.bindings``), a C compiler (Triton needs one too), and a driver
with virtual memory management and stream memory operations. ``unavailable()`` says what is
missing; the measurer then keeps its wall clock (``MeasurerConfig.clock``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["unavailable", "build_allocator", "Region", "SIGNAL_BYTES", "GO", "DONE", "HOLD",
           "tensor_specs", "output_specs", "check_output_spec", "SpecError"]

SIGNAL_BYTES = 2 << 20  # one allocation granule on current GPUs (rounded up to it anyway)
GO, DONE, HOLD = 0, 256, 512  # byte offsets of the signal words (each on its own line)

_ALLOC_C = r"""
#include <stddef.h>
#include <sys/types.h>
/* First fit over one region, with coalescing frees: the pool's segments are few and large
   (torch's caching allocator asks for 2 MiB and up and keeps what it gets). */
#define MAXSEG 8192
static char *base_;
static size_t cap_, used_;
static size_t off_[MAXSEG], len_[MAXSEG];
static int busy_[MAXSEG], n_;
void gfsim_arena_set(void *base, size_t cap) {
    base_ = (char *)base; cap_ = cap; used_ = 0; n_ = 1; off_[0] = 0; len_[0] = cap; busy_[0] = 0;
}
size_t gfsim_arena_used(void) { return used_; }
void *gfsim_arena_alloc(ssize_t size, int device, void *stream) {
    size_t want = ((size_t)(size < 0 ? 0 : size) + 4095) & ~(size_t)4095;
    (void)device; (void)stream;
    if (size < 0) return NULL;
    if (want == 0) want = 4096;
    for (int i = 0; i < n_; i++) {
        if (busy_[i] || len_[i] < want) continue;
        if (len_[i] > want && n_ < MAXSEG) {
            for (int j = n_; j > i + 1; j--) {
                off_[j] = off_[j - 1]; len_[j] = len_[j - 1]; busy_[j] = busy_[j - 1];
            }
            n_++;
            off_[i + 1] = off_[i] + want; len_[i + 1] = len_[i] - want; busy_[i + 1] = 0;
            len_[i] = want;
        }
        busy_[i] = 1;
        used_ += len_[i];
        return base_ + off_[i];
    }
    return NULL;
}
void gfsim_arena_free(void *ptr, ssize_t size, int device, void *stream) {
    size_t off = (size_t)((char *)ptr - base_);
    (void)size; (void)device; (void)stream;
    for (int i = 0; i < n_; i++) {
        if (off_[i] != off || !busy_[i]) continue;
        busy_[i] = 0;
        used_ -= len_[i];
        if (i + 1 < n_ && !busy_[i + 1]) {
            len_[i] += len_[i + 1];
            for (int j = i + 1; j < n_ - 1; j++) {
                off_[j] = off_[j + 1]; len_[j] = len_[j + 1]; busy_[j] = busy_[j + 1];
            }
            n_--;
        }
        if (i > 0 && !busy_[i - 1]) {
            len_[i - 1] += len_[i];
            for (int j = i; j < n_ - 1; j++) {
                off_[j] = off_[j + 1]; len_[j] = len_[j + 1]; busy_[j] = busy_[j + 1];
            }
            n_--;
        }
        return;
    }
}
"""


class SpecError(ValueError):
    """An output the candidate's process described that the clock will not read."""


def unavailable() -> str | None:
    """Why the GPU clock cannot run here (None: it can, as far as can be told without CUDA)."""
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return "cuda-python is not installed (pip install cuda-python)"
    if not _compiler():
        return "no C compiler (cc, gcc or clang) for the allocator of the shared pool"
    return None


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_allocator(folder: Path) -> Path:
    """Compile the pool's bump allocator into ``folder`` (once) and return the library."""
    folder.mkdir(parents=True, exist_ok=True)
    import hashlib

    lib = folder / f"arena_alloc-{hashlib.sha256(_ALLOC_C.encode()).hexdigest()[:12]}.so"
    if lib.exists():
        return lib
    src = folder / "arena_alloc.c"
    src.write_text(_ALLOC_C)
    cc = _compiler()
    if cc is None:
        raise RuntimeError(unavailable() or "no C compiler")
    tmp = folder / f"{lib.stem}.{os.getpid()}.tmp.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src)], check=True,
                   capture_output=True, timeout=120)
    os.replace(tmp, lib)
    return lib


def _ok(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err!r}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _driver():
    from cuda.bindings import driver

    return driver


def _prop(cu, device: int):
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = \
        cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


class Region:
    """One shared region of device memory, mapped in this process."""

    def __init__(self, handle, ptr: int, size: int, fd: int | None):
        self.handle, self.ptr, self.size, self.fd = handle, ptr, size, fd

    @staticmethod
    def granularity(device: int = 0) -> int:
        cu = _driver()
        return int(_ok(cu.cuMemGetAllocationGranularity(
            _prop(cu, device),
            cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))

    @classmethod
    def create(cls, nbytes: int, device: int = 0) -> Region:
        """Allocate ``nbytes`` (rounded up to the granule) and export it as a descriptor."""
        cu = _driver()
        g = cls.granularity(device)
        size = -(-int(nbytes) // g) * g
        handle = _ok(cu.cuMemCreate(size, _prop(cu, device), 0))
        fd = int(_ok(cu.cuMemExportToShareableHandle(
            handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)))
        return cls(handle, _map(cu, handle, size, device), size, fd)

    @classmethod
    def attach(cls, fd: int, size: int, device: int = 0) -> Region:
        """Map a region another process exported (``fd`` received over a Unix socket)."""
        cu = _driver()
        handle = _ok(cu.cuMemImportFromShareableHandle(
            fd, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        os.close(fd)
        return cls(handle, _map(cu, handle, int(size), device), int(size), None)

    def close(self) -> None:
        """Unmap and release this process's hold on the region (its memory is freed once
        every process that mapped it has let go). Never raises: it runs at shutdown."""
        if self.ptr or self.handle is not None:
            try:
                cu = _driver()
                steps = (lambda: cu.cuMemUnmap(self.ptr, self.size) if self.ptr else 0,
                         lambda: cu.cuMemAddressFree(self.ptr, self.size) if self.ptr else 0,
                         lambda: cu.cuMemRelease(self.handle) if self.handle is not None
                         else 0)
            except ImportError:
                steps = ()
            for step in steps:
                try:
                    _ok(step())
                except Exception:  # noqa: BLE001 - best effort at shutdown
                    pass
        self.ptr, self.handle = 0, None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def bytes(self, offset: int = 0, nbytes: int | None = None):
        """A uint8 torch tensor over ``[offset, offset + nbytes)`` of the region."""
        import torch

        n = self.size - offset if nbytes is None else int(nbytes)
        if offset < 0 or n < 0 or offset + n > self.size:
            raise SpecError(f"bytes [{offset}, {offset + n}) outside a region of {self.size}")
        return torch.as_tensor(_CudaArray(self.ptr + offset, n), device="cuda")

    def view(self, spec: dict, offset: int = 0):
        """The tensor ``spec`` describes (``tensor_specs``), at ``offset`` + its own offset."""
        import torch

        dtype = getattr(torch, spec["dtype"])
        item = torch.empty((), dtype=dtype).element_size()
        span = _span(spec["shape"], spec["stride"]) * item
        raw = self.bytes(offset + int(spec["offset"]), span)
        flat = raw.view(dtype)
        return torch.as_strided(flat, spec["shape"], spec["stride"])


def _map(cu, handle, size: int, device: int) -> int:
    ptr = _ok(cu.cuMemAddressReserve(size, 0, 0, 0))
    _ok(cu.cuMemMap(ptr, size, 0, handle, 0))
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _ok(cu.cuMemSetAccess(ptr, size, [desc], 1))
    return int(ptr)


class _CudaArray:
    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (int(nbytes),), "typestr": "|u1",
                                         "data": (int(ptr), False), "version": 3,
                                         "strides": None, "stream": None}


def wait_geq(stream, sig_ptr: int, word: int, value: int) -> None:
    """Make ``stream`` (a torch stream) wait until the signal word is >= ``value``."""
    cu = _driver()
    _ok(cu.cuStreamWaitValue32(cu.CUstream(stream.cuda_stream), cu.CUdeviceptr(sig_ptr + word),
                               int(value) & 0xFFFFFFFF,
                               cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ))


def write(stream, sig_ptr: int, word: int, value: int) -> None:
    """Make ``stream`` write ``value`` to the signal word when it gets there."""
    cu = _driver()
    _ok(cu.cuStreamWriteValue32(cu.CUstream(stream.cuda_stream), cu.CUdeviceptr(sig_ptr + word),
                                int(value) & 0xFFFFFFFF, 0))


def _span(shape, stride) -> int:
    """Elements from a strided tensor's first to one past its last (0 if it is empty)."""
    if any(int(s) == 0 for s in shape):
        return 0
    return 1 + sum((int(n) - 1) * int(s) for n, s in zip(shape, stride))


def tensor_specs(tensors, start: int = 0, align: int = 256) -> tuple[list[dict], int]:
    """Where tensors like ``tensors`` go in a region, packed from ``start``: specs (offset,
    shape, stride, dtype; contiguous) and the end offset."""
    specs, off = [], int(start)
    for t in tensors:
        off = -(-off // align) * align
        shape = [int(n) for n in t.shape]
        stride = [int(s) for s in _contiguous_strides(shape)]
        specs.append({"offset": off, "shape": shape, "stride": stride,
                      "dtype": str(t.dtype).removeprefix("torch.")})
        off += _span(shape, stride) * t.element_size()
    return specs, off


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return list(reversed(strides))


def output_specs(out, pool_ptr: int) -> list[dict]:
    """How the clock finds each of a call's outputs in the pool: offsets from the pool's
    start in this process, shape, stride and dtype (checked by ``check_output_spec``)."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    specs = []
    for o in outs:
        if not hasattr(o, "data_ptr") or not getattr(o, "is_cuda", False):
            raise SpecError("an output that is not a CUDA tensor")
        specs.append({"offset": int(o.data_ptr()) - int(pool_ptr),
                      "shape": [int(n) for n in o.shape], "stride": [int(s) for s in o.stride()],
                      "dtype": str(o.dtype).removeprefix("torch.")})
    return specs


_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
         "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
         "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1}


def check_output_spec(spec, pool_size: int, max_dims: int = 8) -> dict:
    """``spec`` as the clock will use it, or SpecError: a known dtype, at most ``max_dims``
    non-negative dimensions and strides, aligned, and wholly inside the pool (the pool is where
    the call's allocations come from; an output anywhere else was not made by the call)."""
    if not isinstance(spec, dict):
        raise SpecError("an output description that is not an object")
    dtype, off, shape, stride = (spec.get(k) for k in ("dtype", "offset", "shape", "stride"))
    if dtype not in _ITEM:
        raise SpecError(f"an output of dtype {str(dtype)[:40]!r}")
    if type(off) is not int or not isinstance(shape, list) or not isinstance(stride, list) \
            or len(shape) != len(stride) or len(shape) > max_dims \
            or not all(type(v) is int and 0 <= v < (1 << 40) for v in shape + stride):
        raise SpecError("an output with a malformed offset, shape or stride")
    item = _ITEM[dtype]
    end = off + _span(shape, stride) * item
    if off < 0 or end > pool_size or off % item:
        raise SpecError(f"an output at bytes [{off}, {end}) of the pool, which holds "
                        f"{pool_size}: not allocated by the call")
    return {"offset": off, "shape": shape, "stride": stride, "dtype": dtype}
