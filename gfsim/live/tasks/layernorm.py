"""Layer norm over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b.

x [M, N], w [N], b [N] in the task's dtype; statistics in float32; y in the input's dtype.

Variants (one row per program):
- ``two_pass_registers``: the whole row in registers (BLOCK = next power of two >= N): mean,
  then the centred variance, from registers; one read of x. NUM_WARPS is a floor raised so
  that no thread holds more than 128 elements (beyond that it spills and ptxas takes minutes).
- ``welford_looped``: Welford's running mean/M2 per lane over column blocks of BLOCK, the lanes
  merged with Chan's formula; a second loop normalises.
- ``two_loop``: a loop for the mean, a loop for the centred variance, a loop that normalises
  (three reads of the row, the last two from L2).

``AFFINE="fused"`` applies w and b in the normalising kernel; ``"separate"`` writes the
normalised rows to a float32 buffer and applies w, b in a second elementwise kernel (the unfused
baseline design).
"""

from __future__ import annotations

from gfsim.live.tasks.base import Candidate, Task, render_header, seeded, staged

__all__ = ["LayerNormTask"]

_WARPS = (1, 2, 4, 8, 16)
_STAGES = (1, 2, 3)  # software pipelining of the looped variants' loops (Triton's default: 3)
_BLOCKS = (256, 512, 1024, 2048, 4096)

# Shared by every variant: the separate affine kernel and the launcher.
_COMMON = '''

@triton.jit
def layernorm_affine_kernel(z_ptr, w_ptr, b_ptr, y_ptr, n_elements, n_cols,
                            BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    cols = offs % n_cols
    z = tl.load(z_ptr + offs, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (z * w + b).to(y_ptr.dtype.element_ty), mask=mask)


AFFINE_BLOCK = 1024


def run(x, w, b):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    fused = AFFINE == "fused"
    z = y if fused else torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _normalise(x, w, b, z, n_rows, n_cols, int(fused))
    if not fused:
        n = x.numel()
        layernorm_affine_kernel[(triton.cdiv(n, AFFINE_BLOCK),)](
            z, w, b, y, n, n_cols, BLOCK=AFFINE_BLOCK, num_warps=4)
    return y


def aot_specs(dims):
    ptr = "*fp16" if DTYPE == "float16" else "*fp32"
    fused = AFFINE == "fused"
    sig = {"x_ptr": ptr, "w_ptr": ptr, "b_ptr": ptr, "y_ptr": ptr if fused else "*fp32",
           "n_cols": "i32", "x_row_stride": "i32", "y_row_stride": "i32", "eps": "fp32"}
    sig.update({k: "constexpr" for k in _constexprs(dims["N"], 1)})
    specs = [(KERNEL, sig, _constexprs(dims["N"], int(fused)),
              {"num_warps": _warps(dims["N"])[[stages:, "num_stages": NUM_STAGES]]})]
    if not fused:
        sig = {"z_ptr": "*fp32", "w_ptr": ptr, "b_ptr": ptr, "y_ptr": ptr, "n_elements": "i32",
               "n_cols": "i32", "BLOCK": "constexpr"}
        specs.append(("layernorm_affine_kernel", sig, {"BLOCK": AFFINE_BLOCK}, {"num_warps": 4}))
    return specs
'''

_REGISTERS = '''
KERNEL = "layernorm_registers_kernel"


@triton.jit
def layernorm_registers_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                               eps, BLOCK: tl.constexpr, AFFINE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / n_cols
    y = centred * tl.rsqrt(var + eps)
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = y * w + b
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _constexprs(n_cols, affine):
    return {"BLOCK": triton.next_power_of_2(n_cols), "AFFINE": affine}


def _warps(n_cols):
    # NUM_WARPS is a floor: at most 128 row elements per thread (more spills, and ptxas
    # takes minutes over the result).
    return max(NUM_WARPS, min(16, triton.next_power_of_2(n_cols) // 4096))


def _normalise(x, w, b, y, n_rows, n_cols, affine):
    layernorm_registers_kernel[(n_rows,)](x, w, b, y, n_cols, x.stride(0), y.stride(0), EPS,
                                          **_constexprs(n_cols, affine), num_warps=_warps(n_cols))
'''

# The normalising loop shared by the looped variants (mean and rstd known).
_NORMALISE_LOOP = '''
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if AFFINE:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            y = y * w + b
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
'''

_LOOPED_LAUNCH = '''

def _constexprs(n_cols, affine):
    return {"BLOCK": BLOCK, "AFFINE": affine}


def _warps(n_cols):
    return NUM_WARPS


def _normalise(x, w, b, y, n_rows, n_cols, affine):
    args = (x, w, b, y, n_cols, x.stride(0), y.stride(0), EPS)
    NORMALISE_KERNEL[(n_rows,)](*args, **_constexprs(n_cols, affine), num_warps=NUM_WARPS[[stages:, num_stages=NUM_STAGES]])
'''

_WELFORD = '''
KERNEL = "layernorm_welford_kernel"


@triton.jit
def layernorm_welford_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                             eps, BLOCK: tl.constexpr, AFFINE: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    offs = tl.arange(0, BLOCK)
    # Welford per lane: count, mean and M2 (sum of squared deviations) of the lane's columns.
    count = tl.zeros([BLOCK], tl.float32)
    lane_mean = tl.zeros([BLOCK], tl.float32)
    lane_m2 = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        count_new = count + mask.to(tl.float32)
        delta = x - lane_mean
        mean_new = lane_mean + delta / tl.maximum(count_new, 1.0)
        lane_m2 = tl.where(mask, lane_m2 + delta * (x - mean_new), lane_m2)
        lane_mean = tl.where(mask, mean_new, lane_mean)
        count = count_new
    # Chan's merge of the lanes: M2 = sum(M2_i + n_i * (mean_i - mean)^2).
    mean = tl.sum(lane_mean * count, axis=0) / n_cols
    spread = lane_mean - mean
    var = tl.sum(lane_m2 + count * spread * spread, axis=0) / n_cols
    rstd = tl.rsqrt(var + eps)
''' + _NORMALISE_LOOP + _LOOPED_LAUNCH.replace("NORMALISE_KERNEL", "layernorm_welford_kernel")

_TWO_LOOP = '''
KERNEL = "layernorm_two_loop_kernel"


@triton.jit
def layernorm_two_loop_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                              eps, BLOCK: tl.constexpr, AFFINE: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        acc += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        centred = tl.where(mask, x - mean, 0.0)
        acc += centred * centred
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
''' + _NORMALISE_LOOP + _LOOPED_LAUNCH.replace("NORMALISE_KERNEL", "layernorm_two_loop_kernel")

_TEMPLATES = {"two_pass_registers": _REGISTERS, "welford_looped": _WELFORD,
              "two_loop": _TWO_LOOP}


class LayerNormTask(Task):
    """``layer_norm(x, (N,), w, b, eps=1e-5)`` for x [M, N]; dims ``{"M", "N"}``."""

    name = "layernorm"
    eps = 1e-5
    blocked = ("torch.nn.functional.layer_norm", "torch.layer_norm", "torch.native_layer_norm",
               "torch.nn.functional.group_norm", "torch.group_norm", "torch.native_group_norm",
               "torch.nn.functional.instance_norm", "torch.instance_norm",
               "torch.nn.functional.batch_norm", "torch.batch_norm", "torch.native_batch_norm")
    bench_shapes = [{"M": 16384, "N": 4096}, {"M": 4096, "N": 12288}, {"M": 1024, "N": 65536}]
    check_shapes = [{"M": 3, "N": 130}, {"M": 5, "N": 1000}, {"M": 1, "N": 7},
                    {"M": 2, "N": 5000}]
    space = {
        "two_pass_registers": {"NUM_WARPS": _WARPS, "AFFINE": ("fused", "separate")},
        "welford_looped": {"NUM_WARPS": _WARPS, "BLOCK": _BLOCKS,
                           "AFFINE": ("fused", "separate"), "NUM_STAGES": _STAGES},
        "two_loop": {"NUM_WARPS": _WARPS, "BLOCK": _BLOCKS, "AFFINE": ("fused", "separate"),
                     "NUM_STAGES": _STAGES},
    }
    # Triton's default pipelining depth is not written into the code, which is then what it
    # was before NUM_STAGES existed.
    implicit = {"welford_looped": {"NUM_STAGES": 3}, "two_loop": {"NUM_STAGES": 3}}
    defaults = {
        "two_pass_registers": {"NUM_WARPS": 8, "AFFINE": "fused"},
        "welford_looped": {"NUM_WARPS": 4, "BLOCK": 1024, "AFFINE": "fused", "NUM_STAGES": 3},
        "two_loop": {"NUM_WARPS": 4, "BLOCK": 1024, "AFFINE": "fused", "NUM_STAGES": 3},
    }

    def __init__(self, dtype: str = "float16"):
        self.dtype = dtype
        self.atol, self.rtol = (1e-4, 1e-4) if dtype == "float32" else (1e-2, 1e-2)

    def make_inputs(self, dims, seed, device):
        import torch

        gen = seeded(seed, device)
        m, n = dims["M"], dims["N"]
        x = torch.randn(m, n, generator=gen, device=device) * 2.0 + 0.5
        w = 1.0 + 0.1 * torch.randn(n, generator=gen, device=device)
        b = 0.1 * torch.randn(n, generator=gen, device=device)
        dtype = getattr(torch, self.dtype)
        return tuple(t.to(dtype).to(device) for t in (x, w, b))

    def reference(self, x, w, b):
        import torch

        return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(),
                                              self.eps).to(x.dtype)

    def baseline(self, x, w, b):
        import torch

        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, self.eps)

    def candidates(self) -> list[Candidate]:
        c = self.candidate
        return [
            c("two_pass_registers", NUM_WARPS=8),
            c("two_pass_registers", NUM_WARPS=16),
            c("two_pass_registers", NUM_WARPS=4, AFFINE="separate"),
            c("welford_looped", NUM_WARPS=4, BLOCK=1024),
            c("welford_looped", NUM_WARPS=8, BLOCK=4096),
            c("two_loop", NUM_WARPS=4, BLOCK=1024),
            c("two_loop", NUM_WARPS=8, BLOCK=2048),
            c("two_loop", NUM_WARPS=2, BLOCK=512, AFFINE="separate"),
        ]

    def render(self, variant, params):
        self.validate(variant, params)
        written = self.written(variant, params)
        return (render_header(self, variant, written, {"EPS": self.eps})
                + staged(_TEMPLATES[variant] + _COMMON, written))
