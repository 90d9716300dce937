# EVOLVE-BLOCK-START
# gfsim candidate: task=softmax variant=multi_row
import torch
import triton
import triton.language as tl

DTYPE = 'float32'  # element type that aot_specs() describes
NUM_WARPS = 16
ROWS = 4

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
# EVOLVE-BLOCK-END
