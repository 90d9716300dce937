"""Row softmax over the last dimension of a 2-D tensor; output in the input's dtype.

Variants:
- ``one_pass``: one row per program, the whole row in registers (BLOCK = next power of two >=
  n_cols): one read, one write. ``HINTS=1`` adds alignment/contiguity hints (used only when the
  row strides are multiples of 16; the JIT usually infers as much itself).
- ``online``: looped online softmax: running max and rescaled sum over column blocks of BLOCK,
  then a second loop that writes the outputs. ``LANES=1`` keeps a running max/sum per lane and
  reduces once at the end (no reduction per block); ``EVICT="l2"`` asks the first loop to keep the
  row in L2 for the second; NUM_STAGES is the loops' software-pipelining depth (Triton's
  default, 3, is left out of the code, which is then what it was before the parameter existed).
- ``multi_row``: a [ROWS, next_pow2(n_cols)] tile per program (for short rows); ROWS is capped so
  that a tile holds at most MAX_TILE elements.

Where a whole row or tile sits in registers, NUM_WARPS is a floor raised so that no thread holds
more than 128 elements: beyond that the kernel spills and ptxas takes minutes (a one-warp
32768-column softmax: two minutes on a CPU).
"""

from __future__ import annotations

from gfsim.live.tasks.base import Candidate, Task, render_header, seeded, staged

__all__ = ["SoftmaxTask"]

_WARPS = (1, 2, 4, 8, 16)

_ONE_PASS = '''
@triton.jit
def softmax_one_pass_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                            BLOCK: tl.constexpr, HINTS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x_start = row * x_row_stride
    y_start = row * y_row_stride
    if HINTS:  # only passed when both row strides are multiples of 16 (see run)
        cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK), BLOCK)
        x_start = tl.multiple_of(x_start, 16)
        y_start = tl.multiple_of(y_start, 16)
    mask = cols < n_cols
    x = tl.load(x_ptr + x_start + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(y_ptr + y_start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _warps(block):
    # NUM_WARPS is a floor: at most 128 row elements per thread (more spills, and ptxas
    # takes minutes over the result).
    return max(NUM_WARPS, min(16, block // 4096))


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    hints = int(bool(HINTS) and x.stride(0) % 16 == 0 and y.stride(0) % 16 == 0)
    softmax_one_pass_kernel[(n_rows,)](x, y, n_cols, x.stride(0), y.stride(0),
                                       BLOCK=block, HINTS=hints, num_warps=_warps(block))
    return y


def aot_specs(dims):
    ptr = "*fp16" if DTYPE == "float16" else "*fp32"
    hints = int(bool(HINTS) and dims["N"] % 16 == 0)
    sig = {"x_ptr": ptr, "y_ptr": ptr, "n_cols": "i32", "x_row_stride": "i32",
           "y_row_stride": "i32", "BLOCK": "constexpr", "HINTS": "constexpr"}
    block = triton.next_power_of_2(dims["N"])
    const = {"BLOCK": block, "HINTS": hints}
    return [("softmax_one_pass_kernel", sig, const, {"num_warps": _warps(block)})]
'''

_ONLINE = '''
@triton.jit
def softmax_online_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride,
                          BLOCK: tl.constexpr, LANES: tl.constexpr, EVICT_L2: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    offs = tl.arange(0, BLOCK)
    # Pass 1: running max m and sum s of exp(x - m), rescaled whenever m grows.
    if LANES:
        # Per lane; -1e30 rather than -inf so that a lane that never sees a column
        # (n_cols < BLOCK) gives exp(0) * 0 instead of exp(-inf + inf) = nan.
        m = tl.zeros([BLOCK], tl.float32) - 1e30
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            if EVICT_L2:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"),
                            eviction_policy="evict_last")
            else:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"))
            x = x.to(tl.float32)
            m_new = tl.maximum(m, x)
            s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
        m_row = tl.max(m, axis=0)
        s_row = tl.sum(s * tl.exp(m - m_row), axis=0)
    else:
        m_row = tl.max(tl.zeros([BLOCK], tl.float32), axis=0) - float("inf")
        s_row = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            if EVICT_L2:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"),
                            eviction_policy="evict_last")
            else:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"))
            x = x.to(tl.float32)
            m_new = tl.maximum(m_row, tl.max(x, axis=0))
            s_row = s_row * tl.exp(m_row - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m_row = m_new
    inv_s = 1.0 / s_row
    # Pass 2: normalise and write.
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        if EVICT_L2:
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_row + cols, mask=mask, other=0.0)
        y = tl.exp(x.to(tl.float32) - m_row) * inv_s
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    softmax_online_kernel[(n_rows,)](x, y, n_cols, x.stride(0), y.stride(0), BLOCK=BLOCK,
                                     LANES=LANES, EVICT_L2=int(EVICT == "l2"),
                                     num_warps=NUM_WARPS[[stages:, num_stages=NUM_STAGES]])
    return y


def aot_specs(dims):
    ptr = "*fp16" if DTYPE == "float16" else "*fp32"
    sig = {"x_ptr": ptr, "y_ptr": ptr, "n_cols": "i32", "x_row_stride": "i32",
           "y_row_stride": "i32", "BLOCK": "constexpr", "LANES": "constexpr",
           "EVICT_L2": "constexpr"}
    const = {"BLOCK": BLOCK, "LANES": LANES, "EVICT_L2": int(EVICT == "l2")}
    return [("softmax_online_kernel", sig, const, {"num_warps": NUM_WARPS[[stages:, "num_stages": NUM_STAGES]]})]
'''

_MULTI_ROW = '''
MAX_TILE = 16384  # elements per program: ROWS is capped for long rows


@triton.jit
def softmax_multi_row_kernel(x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride,
                             ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    # Rows past the end read the last row (no all -inf rows, hence no nan) and are not stored.
    safe_rows = tl.minimum(rows, n_rows - 1)
    col_mask = cols[None, :] < n_cols
    x = tl.load(x_ptr + safe_rows[:, None] * x_row_stride + cols[None, :], mask=col_mask,
                other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=1)[:, None]
    num = tl.exp(x)
    y = num / tl.sum(num, axis=1)[:, None]
    mask = (rows[:, None] < n_rows) & col_mask
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :],
             y.to(y_ptr.dtype.element_ty), mask=mask)


def _tile(n_cols):
    """(rows, BLOCK, num_warps): NUM_WARPS is a floor, at most 128 tile elements per thread."""
    block = triton.next_power_of_2(n_cols)
    rows = max(1, min(ROWS, MAX_TILE // block))
    return rows, block, max(NUM_WARPS, min(16, rows * block // 4096))


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    rows, block, warps = _tile(n_cols)
    softmax_multi_row_kernel[(triton.cdiv(n_rows, rows),)](
        x, y, n_rows, n_cols, x.stride(0), y.stride(0), ROWS=rows, BLOCK=block,
        num_warps=warps)
    return y


def aot_specs(dims):
    ptr = "*fp16" if DTYPE == "float16" else "*fp32"
    rows, block, warps = _tile(dims["N"])
    sig = {"x_ptr": ptr, "y_ptr": ptr, "n_rows": "i32", "n_cols": "i32", "x_row_stride": "i32",
           "y_row_stride": "i32", "ROWS": "constexpr", "BLOCK": "constexpr"}
    return [("softmax_multi_row_kernel", sig, {"ROWS": rows, "BLOCK": block},
             {"num_warps": warps})]
'''

_TEMPLATES = {"one_pass": _ONE_PASS, "online": _ONLINE, "multi_row": _MULTI_ROW}


class SoftmaxTask(Task):
    """``softmax(x, dim=-1)`` for x [M, N]; dims ``{"M", "N"}``."""

    name = "softmax"
    blocked = ("torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
               "torch.special.softmax", "torch._softmax", "torch.log_softmax",
               "torch.nn.functional.log_softmax", "torch.Tensor.log_softmax",
               "torch.special.log_softmax", "torch._log_softmax", "torch.nn.functional.softmin")
    bench_shapes = [{"M": 8192, "N": 8192}, {"M": 32768, "N": 1024}, {"M": 4096, "N": 32000}]
    check_shapes = [{"M": 3, "N": 130}, {"M": 5, "N": 1000}, {"M": 1, "N": 7},
                    {"M": 9, "N": 257}, {"M": 2, "N": 5000}]
    space = {
        "one_pass": {"NUM_WARPS": _WARPS, "HINTS": (0, 1)},
        "online": {"NUM_WARPS": _WARPS, "BLOCK": (256, 512, 1024, 2048, 4096),
                   "LANES": (0, 1), "EVICT": ("none", "l2"), "NUM_STAGES": (1, 2, 3)},
        "multi_row": {"NUM_WARPS": _WARPS, "ROWS": (2, 4, 8, 16)},
    }
    implicit = {"online": {"NUM_STAGES": 3}}  # Triton's default: not written into the code
    defaults = {
        "one_pass": {"NUM_WARPS": 8, "HINTS": 0},
        "online": {"NUM_WARPS": 4, "BLOCK": 1024, "LANES": 0, "EVICT": "none",
                   "NUM_STAGES": 3},
        "multi_row": {"NUM_WARPS": 4, "ROWS": 4},
    }

    def __init__(self, dtype: str = "float32"):
        self.dtype = dtype
        self.atol, self.rtol = (1e-6, 1e-4) if dtype == "float32" else (1e-4, 1e-2)

    def make_inputs(self, dims, seed, device):
        import torch

        gen = seeded(seed, device)
        x = torch.randn(dims["M"], dims["N"], generator=gen, device=device) * 3.0 + 1.0
        return (x.to(getattr(torch, self.dtype)).to(device),)

    def reference(self, x):
        import torch

        return torch.softmax(x.float(), dim=-1).to(x.dtype)

    def baseline(self, x):
        import torch

        return torch.softmax(x, dim=-1)

    def candidates(self) -> list[Candidate]:
        c = self.candidate
        return [
            c("one_pass", NUM_WARPS=8),
            c("one_pass", NUM_WARPS=16, HINTS=1),
            c("online", NUM_WARPS=4, BLOCK=1024),
            c("online", NUM_WARPS=8, BLOCK=2048, LANES=1),
            c("online", NUM_WARPS=8, BLOCK=4096, LANES=1, EVICT="l2"),
            c("online", NUM_WARPS=2, BLOCK=512, EVICT="l2"),
            c("multi_row", NUM_WARPS=4, ROWS=4),
            c("multi_row", NUM_WARPS=8, ROWS=16),
        ]

    def render(self, variant, params):
        self.validate(variant, params)
        written = self.written(variant, params)
        return render_header(self, variant, written, {}) + staged(_TEMPLATES[variant], written)
