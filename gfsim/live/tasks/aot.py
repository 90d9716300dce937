"""Ahead-of-time compilation of a candidate's kernels for a CUDA target, without a GPU.

Triton's JIT learns a kernel's signature from the arguments of a launch, which needs a driver;
``triton.compile`` does not. Each candidate's code therefore exposes ``aot_specs(dims)``: the
``(kernel_name, signature, constexprs, options)`` of every kernel ``run`` would launch on a shape
of that size. Here the code is executed (in this process, not under ``TRITON_INTERPRET``: an
interpreted kernel cannot be compiled), and each spec goes through

    triton.compile(triton.compiler.ASTSource(fn, signature, constexprs),
                   target=triton.backends.compiler.GPUTarget("cuda", arch, 32),
                   options={"num_warps": ..., "num_stages": ...})

which is the API of Triton 3.x (signature: argument name -> "*fp16", "i32", "fp32" or
"constexpr"; constexprs by name). The pipeline runs through PTX and ptxas to a cubin, so
register and shared-memory limits of the target are checked too.
"""

from __future__ import annotations

import time
from pathlib import Path

from gfsim.forecasts.learned import (
    BINARY_FEATURES as FEATURES,  # what binary_features reads
)

__all__ = ["compile_for", "binary_features", "FEATURES"]


def _target(arch: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


def _specs(candidate, shapes):
    """(key, jit function, signature, constexprs, options) of each distinct kernel ``candidate``
    launches on ``shapes`` (default: its task's benchmark shapes), in order."""
    from gfsim.live.tasks import get_task
    from gfsim.live.tasks.base import load_code

    ns = load_code(candidate.code, f"<candidate {candidate.candidate_id}>")
    seen: set[str] = set()
    for dims in shapes if shapes is not None else get_task(candidate.task).bench_shapes:
        for name, signature, constexprs, options in ns["aot_specs"](dims):
            key = repr((name, sorted(signature.items()), sorted(constexprs.items()),
                        sorted(options.items())))
            if key not in seen:
                seen.add(key)
                yield key, ns[name], dict(signature), dict(constexprs), dict(options)


def _cuda_tool(name: str) -> str:
    """A CUDA binary utility that Triton's NVIDIA backend ships (cuobjdump, nvdisasm)."""
    import shutil

    import triton.backends.nvidia as nv

    path = Path(nv.__file__).parent / "bin" / name
    if path.is_file():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name}: not in Triton's NVIDIA backend ({path.parent}) nor on PATH")
    return found


def _resource_usage(cubin: Path) -> dict:
    """REG and LOCAL of a cubin's (only) function, from ``cuobjdump -res-usage``."""
    import re
    import subprocess

    out = subprocess.run([_cuda_tool("cuobjdump"), "-res-usage", str(cubin)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    found = {k: int(v) for k, v in re.findall(r"\b(REG|LOCAL|SHARED|STACK):(\d+)", out)}
    if "REG" not in found:
        raise RuntimeError(f"cuobjdump -res-usage gave no REG count: {out[-300:]!r}")
    return found


def _sass_instructions(cubin: Path) -> int:
    """Instructions in a cubin's SASS (``nvdisasm``: one ``/*addr*/ OP ... ;`` per line)."""
    import re
    import subprocess

    out = subprocess.run([_cuda_tool("nvdisasm"), "-c", str(cubin)], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    return sum(1 for line in out.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+\S.*;", line))


def binary_features(candidate, arch: int = 90, shapes: list[dict] | None = None) -> dict:
    """Compile ``candidate``'s kernels for ``sm_{arch}`` (no GPU needed) and describe the
    binaries: ``binary_sha256`` (SHA-256 over the sorted SHA-256s of every distinct kernel's
    cubin: two candidates with the same value compile to the same machine code) and
    ``FEATURES``. On a compile failure: ``ok`` False and ``error``, no features.

    Trusted side only: the candidate's code is executed here to learn its kernels (the task
    suite's own templates; never an untrusted candidate's code).
    """
    import hashlib
    import tempfile

    import triton
    from triton.compiler import ASTSource

    t0 = time.perf_counter()
    digests, regs, shared, local, sass = [], [], [], [], 0
    try:
        with tempfile.TemporaryDirectory(prefix="gfsim-aot-") as tmp:
            for k, (_key, fn, signature, constexprs, options) in enumerate(
                    _specs(candidate, shapes)):
                kernel = triton.compile(ASTSource(fn, signature, constexprs),
                                        target=_target(arch), options=options)
                cubin = kernel.asm["cubin"]
                digests.append(hashlib.sha256(cubin).hexdigest())
                path = Path(tmp) / f"k{k}.cubin"
                path.write_bytes(cubin)
                usage = _resource_usage(path)
                regs.append(usage["REG"])
                local.append(usage.get("LOCAL", 0))
                shared.append(int(getattr(kernel.metadata, "shared", 0) or 0))
                sass += _sass_instructions(path)
    except Exception as exc:  # noqa: BLE001 - a compile failure is the candidate's
        return {"ok": False, "seconds": round(time.perf_counter() - t0, 3),
                "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    binary = hashlib.sha256("\n".join(sorted(set(digests))).encode()).hexdigest()
    return {"ok": True, "seconds": round(time.perf_counter() - t0, 3), "error": None,
            "binary_sha256": binary, "kernels": len(digests), "regs_max": max(regs),
            "shared_max": max(shared), "local_max": max(local), "sass_instructions": sass}


def compile_for(candidate, arch: int = 90, shapes: list[dict] | None = None) -> dict:
    """Compile every kernel of ``candidate`` for ``sm_{arch}``.

    ``shapes`` defaults to the task's benchmark shapes; identical specs are compiled once.
    Returns ``{"ok", "seconds", "error", "kernels"}``: ``kernels`` counts the distinct kernels
    compiled, ``error`` is the first failure as ``"Type: message"`` (None when ok). Triton's
    on-disk cache applies (set ``TRITON_CACHE_DIR`` for a cold measurement).
    """
    import os

    import triton
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_for needs TRITON_INTERPRET unset (kernels are interpreted)")
    t0 = time.perf_counter()
    done = 0
    try:
        for _key, fn, signature, constexprs, options in _specs(candidate, shapes):
            triton.compile(ASTSource(fn, signature, constexprs), target=_target(arch),
                           options=options)
            done += 1
    except Exception as exc:  # noqa: BLE001 - any failure is the candidate's
        return {"ok": False, "seconds": time.perf_counter() - t0,
                "error": f"{type(exc).__name__}: {str(exc)[:2000]}", "kernels": done}
    return {"ok": True, "seconds": time.perf_counter() - t0, "error": None, "kernels": done}
