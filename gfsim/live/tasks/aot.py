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

__all__ = ["compile_for"]


def _target(arch: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


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

    from gfsim.live.tasks import get_task
    from gfsim.live.tasks.base import load_code

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_for needs TRITON_INTERPRET unset (kernels are interpreted)")
    t0 = time.perf_counter()
    done: set[str] = set()
    try:
        ns = load_code(candidate.code, f"<candidate {candidate.candidate_id}>")
        for dims in shapes if shapes is not None else get_task(candidate.task).bench_shapes:
            for name, signature, constexprs, options in ns["aot_specs"](dims):
                key = repr((name, sorted(signature.items()), sorted(constexprs.items()),
                            sorted(options.items())))
                if key in done:
                    continue
                src = ASTSource(ns[name], dict(signature), dict(constexprs))
                triton.compile(src, target=_target(arch), options=dict(options))
                done.add(key)
    except Exception as exc:  # noqa: BLE001 - any failure is the candidate's
        return {"ok": False, "seconds": time.perf_counter() - t0,
                "error": f"{type(exc).__name__}: {str(exc)[:2000]}", "kernels": len(done)}
    return {"ok": True, "seconds": time.perf_counter() - t0, "error": None, "kernels": len(done)}
