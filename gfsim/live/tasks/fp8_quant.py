"""Per-token-group FP8 quantisation (DeepSeek-V3 style): q = x / s in float8_e4m3fn, s = amax / 448.

x [M, K] is an activation in the task's dtype (bf16 by default, as DeepSeek-V3 and SGLang
quantise bf16 activations; the kernels also take fp16), cut along K into groups of G = 128
columns (K a multiple of 128). For each (row, group): amax = max |x| clamped below at 1e-10 so
that an all-zero group gets a finite scale, s = amax / 448 (448 = the largest float8_e4m3fn),
q = clamp(x / s, -448, 448) rounded to float8_e4m3fn (to nearest, ties to even). Two outputs, in
this order: q [M, K] float8_e4m3fn and s [M, K / G] float32 (row-major). The reference does this
in float32 from exactly upcast inputs; the baseline is the same sequence as a PyTorch user
writes it (abs and amax in the input dtype, the scale and the division in float32, one
elementwise kernel each, with [M, K] intermediates).

Variants:
- ``one_group``: one (row, group) per program: a [G] tile.
- ``multi_group``: GPP consecutive groups of a row per program: a [GPP, G] tile, one amax per
  tile row (fewer, larger programs; groups past the row's end masked).
- ``row_loop``: ROWS whole rows per program, each walked GPP groups at a time in a loop that
  Triton software-pipelines over NUM_STAGES stages.

``SCALE="div"`` computes x / s as the reference does; ``"mul"`` multiplies by 448 / amax, one
division per group instead of one per element, which can land one float8 step away where x / s
is within a float32 rounding of a midpoint (``Fp8GroupQuantTask.compare`` allows that step).

Under Triton's interpreter (``TRITON_INTERPRET=1``) a float32 -> float8e4nv cast rounds wrongly:
it rounds ties away from zero and drops the carry when rounding overflows the mantissa (126.2
becomes 64, not 128), as of Triton 3.9 (triton-lang/triton#8322 and the open fixes for it).
The kernels therefore round onto the e4m3 grid in float32 first (``_e4m3_rtne``, bit arithmetic
on the float32 pattern), only when interpreted: the cast of a value already on the grid is exact
there. On a GPU (and in ``aot_specs``) the kernels store with the hardware conversion
(``cvt.rn.satfinite.e4m3x2.f32`` on sm_90), the path that is timed.
"""

from __future__ import annotations

from gfsim.live.tasks.base import Candidate, Task, render_header, seeded

__all__ = ["Fp8GroupQuantTask"]

_WARPS = (1, 2, 4, 8)
_SCALE = ("div", "mul")

# Shared by every variant: the interpreter's rounding helper, pointer types, the scale.
_COMMON = '''
import os  # after the parameters above: for PREROUND

GROUP = 128  # columns per group; 448.0 (float8_e4m3fn's largest) and 1e-10 are literals below
# Round in float32 before the float8 cast only under the interpreter, whose cast rounds wrongly.
PREROUND = int(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))
_PTR = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}


@triton.jit
def _e4m3_rtne(v):
    """v (|v| <= 448) rounded to the nearest float8_e4m3fn value, ties to even, in float32."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 31) << 31
    a = tl.abs(v)
    # Normal range (|v| >= 2**-6): keep 3 of the 23 mantissa bits, rounding the other 20 to
    # nearest even; a carry out of the mantissa correctly bumps the exponent.
    ab = a.to(tl.int32, bitcast=True)
    ab = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) << 20
    # Subnormal range: a multiple of 2**-9; adding 1.5 * 2**23 rounds a * 512 to an integer.
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * 0.001953125
    r = tl.where(a < 0.015625, sub, ab.to(tl.float32, bitcast=True))
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _scale(amax, SCALE_MUL: tl.constexpr):
    """(s, f) for a group's amax: the scale s, and f with y = x / s (``div``) or x * f (``mul``)."""
    amax = tl.maximum(amax, 1e-10)
    s = amax / 448.0
    if SCALE_MUL:
        f = 448.0 / amax
    else:
        f = s
    return s, f


@triton.jit
def _to_fp8(x, f, q_ty: tl.constexpr, SCALE_MUL: tl.constexpr, PREROUND: tl.constexpr):
    """float32 x scaled by f (as ``_scale`` made it), clamped and converted to q_ty."""
    if SCALE_MUL:
        y = x * f
    else:
        y = x / f
    y = tl.clamp(y, -448.0, 448.0)
    if PREROUND:
        y = _e4m3_rtne(y)
    return y.to(q_ty)
'''

_ONE_GROUP = '''

@triton.jit
def fp8_one_group_kernel(x_ptr, q_ptr, s_ptr, n_groups, x_row_stride, q_row_stride,
                         G: tl.constexpr, SCALE_MUL: tl.constexpr, PREROUND: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // n_groups
    group = pid % n_groups
    cols = group * G + tl.arange(0, G)
    x = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + cols).to(tl.float32)
    s, f = _scale(tl.max(tl.abs(x), axis=0), SCALE_MUL)
    q = _to_fp8(x, f, q_ptr.dtype.element_ty, SCALE_MUL, PREROUND)
    tl.store(q_ptr + row.to(tl.int64) * q_row_stride + cols, q)
    tl.store(s_ptr + pid, s)


def _constexprs(preround):
    return {"G": GROUP, "SCALE_MUL": int(SCALE == "mul"), "PREROUND": preround}


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    n_groups = n_cols // GROUP
    q = torch.empty((n_rows, n_cols), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((n_rows, n_groups), dtype=torch.float32, device=x.device)
    fp8_one_group_kernel[(n_rows * n_groups,)](x, q, s, n_groups, x.stride(0), q.stride(0),
                                               **_constexprs(PREROUND), num_warps=NUM_WARPS)
    return q, s


def aot_specs(dims):
    sig = {"x_ptr": _PTR[DTYPE], "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "n_groups": "i32",
           "x_row_stride": "i32", "q_row_stride": "i32", "G": "constexpr",
           "SCALE_MUL": "constexpr", "PREROUND": "constexpr"}
    return [("fp8_one_group_kernel", sig, _constexprs(0), {"num_warps": NUM_WARPS})]
'''

_MULTI_GROUP = '''

@triton.jit
def fp8_multi_group_kernel(x_ptr, q_ptr, s_ptr, n_groups, x_row_stride, q_row_stride,
                           G: tl.constexpr, GPP: tl.constexpr, SCALE_MUL: tl.constexpr,
                           PREROUND: tl.constexpr):
    blocks_per_row = tl.cdiv(n_groups, GPP)
    pid = tl.program_id(0)
    row = pid // blocks_per_row
    groups = (pid % blocks_per_row) * GPP + tl.arange(0, GPP)
    ok = groups < n_groups
    cols = groups[:, None] * G + tl.arange(0, G)[None, :]
    x = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + cols, mask=ok[:, None],
                other=0.0).to(tl.float32)
    s, f = _scale(tl.max(tl.abs(x), axis=1), SCALE_MUL)
    q = _to_fp8(x, f[:, None], q_ptr.dtype.element_ty, SCALE_MUL, PREROUND)
    tl.store(q_ptr + row.to(tl.int64) * q_row_stride + cols, q, mask=ok[:, None])
    tl.store(s_ptr + row * n_groups + groups, s, mask=ok)


def _constexprs(preround):
    return {"G": GROUP, "GPP": GPP, "SCALE_MUL": int(SCALE == "mul"), "PREROUND": preround}


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    n_groups = n_cols // GROUP
    q = torch.empty((n_rows, n_cols), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((n_rows, n_groups), dtype=torch.float32, device=x.device)
    grid = (n_rows * triton.cdiv(n_groups, GPP),)
    fp8_multi_group_kernel[grid](x, q, s, n_groups, x.stride(0), q.stride(0),
                                 **_constexprs(PREROUND), num_warps=NUM_WARPS)
    return q, s


def aot_specs(dims):
    sig = {"x_ptr": _PTR[DTYPE], "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "n_groups": "i32",
           "x_row_stride": "i32", "q_row_stride": "i32", "G": "constexpr", "GPP": "constexpr",
           "SCALE_MUL": "constexpr", "PREROUND": "constexpr"}
    return [("fp8_multi_group_kernel", sig, _constexprs(0), {"num_warps": NUM_WARPS})]
'''

_ROW_LOOP = '''

@triton.jit
def fp8_row_loop_kernel(x_ptr, q_ptr, s_ptr, n_rows, n_groups, x_row_stride, q_row_stride,
                        G: tl.constexpr, GPP: tl.constexpr, ROWS: tl.constexpr,
                        SCALE_MUL: tl.constexpr, PREROUND: tl.constexpr):
    first = tl.program_id(0) * ROWS
    last = tl.minimum(first + ROWS, n_rows)
    offs_g = tl.arange(0, GPP)
    offs_c = tl.arange(0, G)
    # Row pointers advanced row by row (64-bit offsets from the first row).
    x_row = x_ptr + first.to(tl.int64) * x_row_stride
    q_row = q_ptr + first.to(tl.int64) * q_row_stride
    s_row = s_ptr + first.to(tl.int64) * n_groups
    for _ in range(first, last):
        for g0 in range(0, n_groups, GPP):
            groups = g0 + offs_g
            ok = groups < n_groups
            cols = groups[:, None] * G + offs_c[None, :]
            x = tl.load(x_row + cols, mask=ok[:, None], other=0.0).to(tl.float32)
            s, f = _scale(tl.max(tl.abs(x), axis=1), SCALE_MUL)
            q = _to_fp8(x, f[:, None], q_ptr.dtype.element_ty, SCALE_MUL, PREROUND)
            tl.store(q_row + cols, q, mask=ok[:, None])
            tl.store(s_row + groups, s, mask=ok)
        x_row += x_row_stride
        q_row += q_row_stride
        s_row += n_groups


def _constexprs(preround):
    return {"G": GROUP, "GPP": GPP, "ROWS": ROWS, "SCALE_MUL": int(SCALE == "mul"),
            "PREROUND": preround}


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    n_groups = n_cols // GROUP
    q = torch.empty((n_rows, n_cols), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((n_rows, n_groups), dtype=torch.float32, device=x.device)
    fp8_row_loop_kernel[(triton.cdiv(n_rows, ROWS),)](
        x, q, s, n_rows, n_groups, x.stride(0), q.stride(0), **_constexprs(PREROUND),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return q, s


def aot_specs(dims):
    sig = {"x_ptr": _PTR[DTYPE], "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "n_rows": "i32",
           "n_groups": "i32", "x_row_stride": "i32", "q_row_stride": "i32", "G": "constexpr",
           "GPP": "constexpr", "ROWS": "constexpr", "SCALE_MUL": "constexpr",
           "PREROUND": "constexpr"}
    return [("fp8_row_loop_kernel", sig, _constexprs(0),
             {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})]
'''

_TEMPLATES = {"one_group": _ONE_GROUP, "multi_group": _MULTI_GROUP, "row_loop": _ROW_LOOP}


class Fp8GroupQuantTask(Task):
    """Per-(row, 128-column group) float8_e4m3fn quantisation of x [M, K]; dims ``{"M", "K"}``
    (K a multiple of 128); outputs ``(q, s)``.

    ``compare`` (the verdict) dequantises: q * s, broadcast over each group, against the
    reference's q * s. Float8 e4m3 keeps 3 mantissa bits, so neighbouring values are 2^(e-3)
    apart in the binade [2^e, 2^(e+1)): at most 2^-3 of the value's magnitude (at the binade's
    bottom), and 2^-9 below the smallest normal 2^-6 (subnormals). A correct kernel whose
    x / s differs from the reference's by a float32 rounding or two (an approximate division
    on the GPU, ``SCALE="mul"``) can round to the neighbouring float8 value, never further, so
    the tolerance is one step: |q s - q_ref s_ref| <= (rtol |q_ref| + atol) s_ref with
    rtol = 2^-3 and atol = 2^-9 (in units of q), widened by 1e-5 relative for the scale's own
    float32 differences. Two steps up in magnitude exceed it anywhere (by >= 6 %; two steps
    down from the bottom of a binade, where the steps below are half as wide, span one step of
    the upper binade and pass), and so does a q of the wrong sign, a saturated value that
    should not be, or NaN. The scales themselves must match to ``scale_rtol = 1e-6`` (8 float32
    ulps: room for an approximate amax / 448, none for another formula or eps), so a scale
    doubled with q halved, which dequantises the same, is still wrong.
    """

    name = "fp8_quant"
    group = 128
    fp8_max = 448.0
    eps = 1e-10
    atol, rtol = 2.0 ** -9, 2.0 ** -3  # one float8 step, in units of q (see compare)
    scale_rtol = 1e-6
    # The reference's one non-elementwise step is the group amax: every torch reduction that
    # computes it directly (amax, max, aminmax, and the infinity norm) is refused to candidates.
    blocked = ("torch.amax", "torch.Tensor.amax", "torch.max", "torch.Tensor.max",
               "torch.aminmax", "torch.Tensor.aminmax", "torch.linalg.vector_norm",
               "torch.linalg.norm", "torch.norm", "torch.Tensor.norm")
    shape_steps = {"K": 128}  # whole groups
    bench_shapes = [{"M": 8192, "K": 7168}, {"M": 4096, "K": 16384}, {"M": 16384, "K": 2048}]
    check_shapes = [{"M": 3, "K": 384}, {"M": 1, "K": 128}, {"M": 5, "K": 1024},
                    {"M": 9, "K": 256}, {"M": 2, "K": 2048}]
    space = {
        "one_group": {"NUM_WARPS": (1, 2, 4), "SCALE": _SCALE},
        "multi_group": {"NUM_WARPS": _WARPS, "GPP": (2, 4, 8, 16), "SCALE": _SCALE},
        "row_loop": {"NUM_WARPS": _WARPS, "GPP": (1, 2, 4, 8), "ROWS": (1, 2, 4, 8),
                     "NUM_STAGES": (1, 2, 3), "SCALE": _SCALE},
    }
    defaults = {
        "one_group": {"NUM_WARPS": 1, "SCALE": "div"},
        "multi_group": {"NUM_WARPS": 4, "GPP": 4, "SCALE": "div"},
        "row_loop": {"NUM_WARPS": 4, "GPP": 4, "ROWS": 2, "NUM_STAGES": 2, "SCALE": "div"},
    }

    def __init__(self, dtype: str = "bfloat16"):
        self.dtype = dtype

    def make_inputs(self, dims, seed, device):
        """Activations N(0, 1) times a log-normal scale per row, a few outlier columns; where
        M >= 2 and K >= 256, group (0, 0) is all zeros and group (1, last) holds one value 1000
        times its neighbours (the rest of that group lands in float8's subnormal range)."""
        import torch

        gen = seeded(seed, device)
        m, k = dims["M"], dims["K"]
        if k % self.group:
            raise ValueError(f"K={k} is not a multiple of the group size {self.group}")
        row_scale = torch.exp(0.5 * torch.randn(m, 1, generator=gen, device=device))
        col_scale = 1.0 + 9.0 * (torch.rand(1, k, generator=gen, device=device) < 0.01)
        x = torch.randn(m, k, generator=gen, device=device) * row_scale * col_scale
        if m >= 2 and k >= 2 * self.group:
            x[0, :self.group] = 0.0
            # copy_ of a one-element view: no host read of the scale (no device sync)
            x[1, k - 1:].copy_(1000.0 * row_scale[1, :1])
        return (x.to(getattr(torch, self.dtype)).to(device),)

    def reference(self, x):
        import torch

        m, k = x.shape
        groups = x.float().reshape(m, k // self.group, self.group)
        amax = groups.abs().amax(dim=-1, keepdim=True).clamp(min=self.eps)
        s = amax / self.fp8_max
        q = (groups / s).clamp(-self.fp8_max, self.fp8_max).to(torch.float8_e4m3fn)
        return q.reshape(m, k), s.reshape(m, k // self.group)

    def baseline(self, x):
        import torch

        m, k = x.shape
        groups = x.reshape(m, k // self.group, self.group)
        amax = groups.abs().amax(dim=-1, keepdim=True).float().clamp(min=self.eps)
        s = amax / self.fp8_max
        q = (groups / s).clamp(-self.fp8_max, self.fp8_max).to(torch.float8_e4m3fn)
        return q.reshape(m, k), s.reshape(m, k // self.group)

    def compare(self, got: list, ref: list) -> str | None:
        """Scales to ``scale_rtol``; values dequantised, to one float8 step (class docstring)."""
        import numpy as np

        if len(got) != 2 or len(ref) != 2:
            return f"{len(got)} outputs where the reference has (q, s)"
        (q, s), (q_ref, s_ref) = got, ref
        for what, g, r in (("q", q, q_ref), ("s", s, s_ref)):
            if g.shape != r.shape:
                return f"{what} shape {tuple(g.shape)} != reference {tuple(r.shape)}"
            if not np.all(np.isfinite(g)):
                return f"{what} has NaN or inf"
        if not np.allclose(s, s_ref, rtol=self.scale_rtol, atol=0.0):
            worst = float(np.max(np.abs(s.astype(np.float64) - s_ref) / s_ref))
            return f"s differs from the reference (worst relative error {worst:.3g})"
        m, k = q_ref.shape
        shape = (m, k // self.group, self.group)
        scale = s_ref.astype(np.float64).reshape(m, -1, 1)
        deq = q.astype(np.float64).reshape(shape) * s.astype(np.float64).reshape(m, -1, 1)
        deq_ref = q_ref.astype(np.float64).reshape(shape) * scale
        bound = (1.0 + 1e-5) * scale * (self.rtol * np.abs(q_ref.reshape(shape)) + self.atol)
        steps = np.abs(deq - deq_ref) / bound
        if np.any(steps > 1.0):
            i = np.unravel_index(int(np.argmax(steps)), steps.shape)
            return (f"q * s differs from the reference by more than one float8 step (row "
                    f"{i[0]}, column {i[1] * self.group + i[2]}: q {q.reshape(shape)[i]:g} "
                    f"where the reference has {q_ref.reshape(shape)[i]:g})")
        return None

    def candidates(self) -> list[Candidate]:
        c = self.candidate
        return [
            c("one_group", NUM_WARPS=1),
            c("one_group", NUM_WARPS=2, SCALE="mul"),
            c("multi_group", NUM_WARPS=4, GPP=4),
            c("multi_group", NUM_WARPS=8, GPP=16, SCALE="mul"),
            c("multi_group", NUM_WARPS=2, GPP=2),
            c("row_loop", NUM_WARPS=4, GPP=4, ROWS=2, NUM_STAGES=2),
            c("row_loop", NUM_WARPS=8, GPP=8, ROWS=4, NUM_STAGES=3, SCALE="mul"),
            c("row_loop", NUM_WARPS=2, GPP=1, ROWS=1, NUM_STAGES=1),
        ]

    def render(self, variant, params):
        self.validate(variant, params)
        return render_header(self, variant, params, {}) + _COMMON + _TEMPLATES[variant]
