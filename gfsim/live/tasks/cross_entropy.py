"""Fused cross-entropy forward: per-row loss logsumexp(x[i]) - x[i, t[i]], in float32.

x [M, V] holds logits in the task's dtype (fp16 by default; the kernels also take bf16), t [M]
int64 class indices in [0, V) (no ``ignore_index``, no label smoothing); the loss is float32
whatever the logits' dtype. The reference is ``F.cross_entropy(x.float(), t, reduction="none")``.
The baseline is what a training loop without autocast calls, ``F.cross_entropy(x, t,
reduction="none")`` on the fp16 logits: on CUDA a log-softmax kernel writes an [M, V] fp16
log-probability tensor and an nll-loss kernel gathers one entry a row from it, so the logits'
size is read twice and written once, where a fused kernel reads it once; it returns fp16 losses
(within the tolerances of the float32 reference, see ``CrossEntropyTask``).

Variants:
- ``one_pass``: one row per program, the whole row in registers when it fits (BLOCK = next power
  of two >= V, up to MAX_BLOCK = 32768): one read, max and sum of exp from registers. Longer
  rows (V = 50257, 128256) take chunks of 16384 columns with an online max/sum. ``GATHER="load"``
  reads x[t] with a separate scalar load, ``"select"`` picks it out of the registers. NUM_WARPS is
  a floor raised so that no thread holds more than 64 row elements (more spills, and ptxas takes
  minutes over the result).
- ``online``: looped online logsumexp over column blocks of BLOCK; ``LANES=1`` keeps a running
  max/sum per lane and reduces once at the end; ``EVICT="first"`` marks the logits, read exactly
  once, as streaming data for the cache.
- ``split_v``: the vocabulary split SPLITS ways over a second grid axis (more programs when M is
  small and V huge): each program writes a partial (max, sum of exp) of its slice to a float32
  buffer, and a second small kernel merges the SPLITS partials of each row and subtracts x[t].
"""

from __future__ import annotations

from gfsim.live.tasks.base import Candidate, Task, render_header, seeded

__all__ = ["CrossEntropyTask"]

_WARPS = (1, 2, 4, 8, 16)

# Shared by every variant: pointer types for aot_specs and the register floor on num_warps.
_COMMON = '''
_PTR = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}


def _warps(live):
    """NUM_WARPS, raised so that a thread holds at most 64 of the ``live`` register-resident
    float32 values (64 per thread: no spills, and ptxas stays fast)."""
    need = triton.next_power_of_2(max(1, live // (32 * 64)))
    return max(NUM_WARPS, min(16, need))

'''

_ONE_PASS = '''
MAX_BLOCK = 32768  # a row up to this long sits in registers (64 values a thread at 16 warps)
CHUNK = 16384  # longer rows: chunks of this many columns (a whole-row-sized chunk spills)


@triton.jit
def ce_one_pass_kernel(x_ptr, t_ptr, loss_ptr, n_cols, x_row_stride,
                       BLOCK: tl.constexpr, SINGLE: tl.constexpr, SELECT: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    target = tl.load(t_ptr + row)
    cols = tl.arange(0, BLOCK)
    if SINGLE:  # the whole row in registers: one read
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        s = tl.sum(tl.exp(x - m), axis=0)
        if SELECT:
            x_t = tl.sum(tl.where(cols == target, x, 0.0), axis=0)
    else:  # register-sized chunks, merged with a running max and a rescaled sum
        m = tl.max(tl.zeros([BLOCK], tl.float32), axis=0) - float("inf")
        s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        x_t = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        for start in range(0, n_cols, BLOCK):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
            if SELECT:
                x_t += tl.sum(tl.where(offs == target, x, 0.0), axis=0)
    if not SELECT:
        x_t = tl.load(x_row + target).to(tl.float32)
    tl.store(loss_ptr + row, m + tl.log(s) - x_t)


def _block(n_cols):
    return triton.next_power_of_2(n_cols) if n_cols <= MAX_BLOCK else CHUNK


def _constexprs(n_cols):
    return {"BLOCK": _block(n_cols), "SINGLE": int(n_cols <= MAX_BLOCK),
            "SELECT": int(GATHER == "select")}


def run(x, t):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    loss = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    ce_one_pass_kernel[(n_rows,)](x, t, loss, n_cols, x.stride(0), **_constexprs(n_cols),
                                  num_warps=_warps(_block(n_cols)))
    return loss


def aot_specs(dims):
    sig = {"x_ptr": _PTR[DTYPE], "t_ptr": "*i64", "loss_ptr": "*fp32", "n_cols": "i32",
           "x_row_stride": "i32", "BLOCK": "constexpr", "SINGLE": "constexpr",
           "SELECT": "constexpr"}
    return [("ce_one_pass_kernel", sig, _constexprs(dims["V"]),
             {"num_warps": _warps(_block(dims["V"]))})]
'''

_ONLINE = '''
@triton.jit
def ce_online_kernel(x_ptr, t_ptr, loss_ptr, n_cols, x_row_stride, BLOCK: tl.constexpr,
                     LANES: tl.constexpr, EVICT_FIRST: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    offs = tl.arange(0, BLOCK)
    if LANES:
        # Per lane; -1e30 rather than -inf so that a lane that never sees a column
        # (n_cols < BLOCK) gives exp(0) * 0 instead of exp(-inf + inf) = nan.
        m = tl.zeros([BLOCK], tl.float32) - 1e30
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            if EVICT_FIRST:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"),
                            eviction_policy="evict_first")
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
            if EVICT_FIRST:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"),
                            eviction_policy="evict_first")
            else:
                x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"))
            x = x.to(tl.float32)
            m_new = tl.maximum(m_row, tl.max(x, axis=0))
            s_row = s_row * tl.exp(m_row - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m_row = m_new
    x_t = tl.load(x_row + tl.load(t_ptr + row)).to(tl.float32)
    tl.store(loss_ptr + row, m_row + tl.log(s_row) - x_t)


def _constexprs():
    return {"BLOCK": BLOCK, "LANES": LANES, "EVICT_FIRST": int(EVICT == "first")}


def _num_warps():
    return _warps(BLOCK * (3 if LANES else 1))  # x, and per-lane max and sum with LANES


def run(x, t):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    loss = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    ce_online_kernel[(n_rows,)](x, t, loss, n_cols, x.stride(0), **_constexprs(),
                                num_warps=_num_warps())
    return loss


def aot_specs(dims):
    sig = {"x_ptr": _PTR[DTYPE], "t_ptr": "*i64", "loss_ptr": "*fp32", "n_cols": "i32",
           "x_row_stride": "i32", "BLOCK": "constexpr", "LANES": "constexpr",
           "EVICT_FIRST": "constexpr"}
    return [("ce_online_kernel", sig, _constexprs(), {"num_warps": _num_warps()})]
'''

_SPLIT_V = '''
COMBINE_ROWS = 64  # rows per program of the merging kernel


@triton.jit
def ce_split_partial_kernel(x_ptr, m_ptr, s_ptr, n_cols, x_row_stride, chunk,
                            SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    # Program (row, split) covers columns [split * chunk, min((split + 1) * chunk, n_cols)).
    row = tl.program_id(0)
    split = tl.program_id(1)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_cols)
    offs = tl.arange(0, BLOCK)
    # Per lane, from -1e30 (not -inf: see the merge below); an empty slice (lo >= n_cols)
    # leaves (-1e30, 0), which the merge weighs by exp(-1e30 - max) = 0.
    m = tl.zeros([BLOCK], tl.float32) - 1e30
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(lo, hi, BLOCK):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    m_part = tl.max(m, axis=0)
    s_part = tl.sum(s * tl.exp(m - m_part), axis=0)
    tl.store(m_ptr + row * SPLITS + split, m_part)
    tl.store(s_ptr + row * SPLITS + split, s_part)


@triton.jit
def ce_split_combine_kernel(m_ptr, s_ptr, x_ptr, t_ptr, loss_ptr, n_rows, x_row_stride,
                            SPLITS: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    idx = rows[:, None] * SPLITS + tl.arange(0, SPLITS)[None, :]
    m = tl.load(m_ptr + idx, mask=row_ok[:, None], other=0.0)
    s = tl.load(s_ptr + idx, mask=row_ok[:, None], other=1.0)
    m_row = tl.max(m, axis=1)
    s_row = tl.sum(s * tl.exp(m - m_row[:, None]), axis=1)
    target = tl.load(t_ptr + rows, mask=row_ok, other=0)
    x_t = tl.load(x_ptr + rows.to(tl.int64) * x_row_stride + target, mask=row_ok, other=0.0)
    tl.store(loss_ptr + rows, m_row + tl.log(s_row) - x_t.to(tl.float32), mask=row_ok)


def _chunk(n_cols):
    """Columns per split: a multiple of BLOCK, so that every block but a row's last is full."""
    return triton.cdiv(triton.cdiv(n_cols, SPLITS), BLOCK) * BLOCK


def _num_warps():
    return _warps(3 * BLOCK)  # x and the per-lane max and sum


def run(x, t):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    part_m = torch.empty((n_rows, SPLITS), dtype=torch.float32, device=x.device)
    part_s = torch.empty((n_rows, SPLITS), dtype=torch.float32, device=x.device)
    loss = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    ce_split_partial_kernel[(n_rows, SPLITS)](x, part_m, part_s, n_cols, x.stride(0),
                                              _chunk(n_cols), SPLITS=SPLITS, BLOCK=BLOCK,
                                              num_warps=_num_warps())
    ce_split_combine_kernel[(triton.cdiv(n_rows, COMBINE_ROWS),)](
        part_m, part_s, x, t, loss, n_rows, x.stride(0), SPLITS=SPLITS, ROWS=COMBINE_ROWS,
        num_warps=4)
    return loss


def aot_specs(dims):
    ptr = _PTR[DTYPE]
    partial = {"x_ptr": ptr, "m_ptr": "*fp32", "s_ptr": "*fp32", "n_cols": "i32",
               "x_row_stride": "i32", "chunk": "i32", "SPLITS": "constexpr",
               "BLOCK": "constexpr"}
    combine = {"m_ptr": "*fp32", "s_ptr": "*fp32", "x_ptr": ptr, "t_ptr": "*i64",
               "loss_ptr": "*fp32", "n_rows": "i32", "x_row_stride": "i32",
               "SPLITS": "constexpr", "ROWS": "constexpr"}
    return [("ce_split_partial_kernel", partial, {"SPLITS": SPLITS, "BLOCK": BLOCK},
             {"num_warps": _num_warps()}),
            ("ce_split_combine_kernel", combine, {"SPLITS": SPLITS, "ROWS": COMBINE_ROWS},
             {"num_warps": 4})]
'''

_TEMPLATES = {"one_pass": _ONE_PASS, "online": _ONLINE, "split_v": _SPLIT_V}


class CrossEntropyTask(Task):
    """``F.cross_entropy(x, t, reduction="none")`` as float32 for logits x [M, V] and int64
    targets t [M]; dims ``{"M", "V"}``.

    Tolerances: the loss is about log(V) + 2 (10 to 14 here) and is computed in float32 from
    exactly upcast logits by both sides; summation order and the GPU's approximate exp/log
    move it by ~1e-5, so ``atol = rtol = 1e-4`` (about 1e-3 at a loss of 12) leaves a wide
    margin, while a kernel that rounds the loss (or the log-probabilities) to fp16, an error up
    to 4e-3 at that size, fails; the fp16 baseline is within ten times the tolerances.
    """

    name = "cross_entropy"
    blocked = ("torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss",
               "torch._C._nn.cross_entropy_loss", "torch._C._nn.nll_loss",
               "torch._C._nn.nll_loss_nd", "torch._C._nn.nll_loss2d",
               "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.Tensor.log_softmax",
               "torch.special.log_softmax", "torch._log_softmax",
               "torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
               "torch.special.softmax", "torch._softmax", "torch.nn.functional.softmin",
               "torch.logsumexp", "torch.Tensor.logsumexp", "torch.special.logsumexp",
               "torch.logcumsumexp", "torch.Tensor.logcumsumexp")
    bench_shapes = [{"M": 4096, "V": 32000}, {"M": 8192, "V": 50257}, {"M": 2048, "V": 128256}]
    check_shapes = [{"M": 3, "V": 130}, {"M": 5, "V": 1000}, {"M": 1, "V": 7},
                    {"M": 9, "V": 257}, {"M": 2, "V": 5000}]
    space = {
        "one_pass": {"NUM_WARPS": _WARPS, "GATHER": ("load", "select")},
        "online": {"NUM_WARPS": _WARPS, "BLOCK": (512, 1024, 2048, 4096, 8192),
                   "LANES": (0, 1), "EVICT": ("none", "first")},
        "split_v": {"NUM_WARPS": _WARPS, "BLOCK": (512, 1024, 2048, 4096),
                    "SPLITS": (2, 4, 8, 16)},
    }
    defaults = {
        "one_pass": {"NUM_WARPS": 8, "GATHER": "load"},
        "online": {"NUM_WARPS": 4, "BLOCK": 2048, "LANES": 0, "EVICT": "none"},
        "split_v": {"NUM_WARPS": 4, "BLOCK": 2048, "SPLITS": 4},
    }

    def __init__(self, dtype: str = "float16"):
        self.dtype = dtype
        self.atol, self.rtol = 1e-4, 1e-4

    def make_inputs(self, dims, seed, device):
        """Logits ~ N(0.5, 2^2), about one in a thousand raised by 6, targets uniform; where
        M >= 2, row 0's target is the last column (and its largest logit), row M-1's the
        first column."""
        import torch

        gen = seeded(seed, device)
        m, v = dims["M"], dims["V"]
        # Drawn in the logits' own dtype and changed in place: the GPU clock draws fresh
        # inputs inside every timed window, and the bench shapes hold up to 411M logits (drawn
        # in float32 with five out-of-place passes, a window took 2.5-7.1 ms on the H200).
        x = torch.randn(m, v, generator=gen, device=device, dtype=getattr(torch, self.dtype))
        x.mul_(2.0).add_(0.5)
        spikes = torch.randint(0, m * v, (max(1, m * v // 1000),), generator=gen,
                               device=device)
        flat = x.view(-1)
        flat[spikes] = flat[spikes] + 6.0  # about one logit in a thousand: large ones
        t = torch.randint(0, v, (m,), generator=gen, device=device, dtype=torch.int64)
        if m >= 2:
            # fills and copies into one-element views: no host read, so no device sync
            t[:1].fill_(v - 1)
            t[m - 1:].fill_(0)
            x[0, v - 1:].copy_(x[0].max().reshape(1) + 1.0)
        return x, t

    def reference(self, x, t):
        import torch

        return torch.nn.functional.cross_entropy(x.float(), t, reduction="none")

    def baseline(self, x, t):
        import torch

        return torch.nn.functional.cross_entropy(x, t, reduction="none")

    def candidates(self) -> list[Candidate]:
        c = self.candidate
        return [
            c("one_pass", NUM_WARPS=8),
            c("one_pass", NUM_WARPS=16, GATHER="select"),
            c("online", NUM_WARPS=4, BLOCK=2048),
            c("online", NUM_WARPS=8, BLOCK=4096, LANES=1),
            c("online", NUM_WARPS=8, BLOCK=8192, EVICT="first"),
            c("online", NUM_WARPS=2, BLOCK=1024, LANES=1, EVICT="first"),
            c("split_v", NUM_WARPS=4, BLOCK=2048, SPLITS=4),
            c("split_v", NUM_WARPS=8, BLOCK=4096, SPLITS=16),
        ]

    def render(self, variant, params):
        self.validate(variant, params)
        return render_header(self, variant, params, {}) + _COMMON + _TEMPLATES[variant]
