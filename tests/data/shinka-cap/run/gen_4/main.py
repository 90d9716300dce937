# EVOLVE-BLOCK-START
# gfsim candidate: task=softmax variant=online
import torch
import triton
import triton.language as tl

DTYPE = 'float32'  # element type that aot_specs() describes
NUM_WARPS = 8
BLOCK = 1024
LANES = 0
EVICT = 'none'
NUM_STAGES = 2

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
                                     num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return y


def aot_specs(dims):
    ptr = "*fp16" if DTYPE == "float16" else "*fp32"
    sig = {"x_ptr": ptr, "y_ptr": ptr, "n_cols": "i32", "x_row_stride": "i32",
           "y_row_stride": "i32", "BLOCK": "constexpr", "LANES": "constexpr",
           "EVICT_L2": "constexpr"}
    const = {"BLOCK": BLOCK, "LANES": LANES, "EVICT_L2": int(EVICT == "l2")}
    return [("softmax_online_kernel", sig, const, {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})]
# EVOLVE-BLOCK-END
