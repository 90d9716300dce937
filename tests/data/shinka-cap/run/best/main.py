# EVOLVE-BLOCK-START
# gfsim candidate: task=softmax variant=one_pass
import torch
import triton
import triton.language as tl

DTYPE = 'float32'  # element type that aot_specs() describes
NUM_WARPS = 8
HINTS = 0

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
# EVOLVE-BLOCK-END
