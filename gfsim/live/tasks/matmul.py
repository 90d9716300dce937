"""C = A @ B for fp16 A [M, K], B [K, N]: float32 accumulation, fp16 output.

Variants:
- ``tiled``: one BLOCK_M x BLOCK_N tile of C per program on a 1-D grid, tiles ordered in groups
  of GROUP_M rows of tiles so that concurrently running programs share A and B in L2 (GROUP_M=1:
  plain row-major order); software-pipelined K loop (num_stages).
- ``split_k``: the K loop split SPLIT_K ways over a second grid axis; each program adds its
  partial tile into a float32 buffer with ``tl.atomic_add``; the buffer is cast to fp16 (more
  parallelism when M x N has few tiles and K is long).
- ``naive_k_loop``: small tiles on a 2-D grid in launch order, no swizzle, every load masked.

Tails in M, N and K are masked (or wrapped: see the kernels), so any shape is valid.
"""

from __future__ import annotations

from gfsim.live.tasks.base import Candidate, Task, render_header, seeded

__all__ = ["MatmulTask"]

# Tiles of A and B for one K step; rows past M (columns past N) wrap around with a modulo, so
# those loads need no mask (their results are never stored); K is masked.
_TILE_LOADS = '''
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
'''

_STORE_C = '''
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
'''

_SWIZZLE = '''
    # Grouped order: GROUP_M rows of tiles are walked column by column.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
'''

_SIG = '''
def _signature(c_ptr_type, extra=()):
    sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": c_ptr_type, "M": "i32", "N": "i32",
           "K": "i32", "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32",
           "stride_bn": "i32", "stride_cm": "i32", "stride_cn": "i32"}
    sig.update({k: "constexpr" for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", *extra)})
    return sig
'''

_TILED = '''
@triton.jit
def matmul_tiled_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                        stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
''' + _SWIZZLE + _TILE_LOADS + '''
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
''' + _STORE_C + '''
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def run(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    matmul_tiled_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                              b.stride(1), c.stride(0), c.stride(1), BLOCK_M=BLOCK_M,
                              BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
                              num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return c

''' + _SIG + '''

def aot_specs(dims):
    const = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "GROUP_M": GROUP_M}
    return [("matmul_tiled_kernel", _signature("*fp16", ("GROUP_M",)), const,
             {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})]
'''

_SPLIT_K = '''
@triton.jit
def matmul_split_k_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                          stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          SPLIT_K: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
''' + _SWIZZLE + _TILE_LOADS + '''
    # This program takes the K blocks pid_k, pid_k + SPLIT_K, pid_k + 2 * SPLIT_K, ...
    offs_k = pid_k * BLOCK_K + offs_k
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        k_left = K - k * BLOCK_K * SPLIT_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * SPLIT_K * stride_ak
        b_ptrs += BLOCK_K * SPLIT_K * stride_bk
''' + _STORE_C + '''
    tl.atomic_add(c_ptrs, acc, mask=c_mask)


def run(a, b):
    M, K = a.shape
    N = b.shape[1]
    c32 = torch.zeros((M, N), dtype=torch.float32, device=a.device)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), SPLIT_K)
    matmul_split_k_kernel[grid](a, b, c32, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                b.stride(1), c32.stride(0), c32.stride(1), BLOCK_M=BLOCK_M,
                                BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
                                SPLIT_K=SPLIT_K, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return c32.to(a.dtype)

''' + _SIG + '''

def aot_specs(dims):
    const = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "GROUP_M": GROUP_M,
             "SPLIT_K": SPLIT_K}
    return [("matmul_split_k_kernel", _signature("*fp32", ("GROUP_M", "SPLIT_K")), const,
             {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})]
'''

_NAIVE = '''
@triton.jit
def matmul_naive_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                        stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def run(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    matmul_naive_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                              b.stride(1), c.stride(0), c.stride(1), BLOCK_M=BLOCK_M,
                              BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
                              num_stages=NUM_STAGES)
    return c

''' + _SIG + '''

def aot_specs(dims):
    const = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K}
    return [("matmul_naive_kernel", _signature("*fp16"), const,
             {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})]
'''

_TEMPLATES = {"tiled": _TILED, "split_k": _SPLIT_K, "naive_k_loop": _NAIVE}

_TILE = (32, 64, 128)


class MatmulTask(Task):
    """``A @ B`` for fp16 A [M, K], B [K, N]; dims ``{"M", "N", "K"}``."""

    name = "matmul"
    dtype = "float16"
    atol, rtol = 1e-2, 1e-2
    blocked = ("torch.matmul", "torch.mm", "torch.bmm", "torch.addmm", "torch.addbmm",
               "torch.baddbmm", "torch.einsum", "torch.tensordot", "torch.inner", "torch.mv",
               "torch.chain_matmul", "torch.linalg.matmul", "torch.linalg.multi_dot",
               "torch.nn.functional.linear", "torch.nn.functional.bilinear",
               "torch.Tensor.matmul", "torch.Tensor.mm", "torch.Tensor.bmm",
               "torch.Tensor.addmm", "torch.Tensor.inner", "torch.Tensor.__matmul__",
               "torch.Tensor.__rmatmul__", "torch._addmm_activation")
    bench_shapes = [{"M": 4096, "N": 4096, "K": 4096}, {"M": 8192, "N": 8192, "K": 2048},
                    {"M": 1024, "N": 1024, "K": 16384}]
    check_shapes = [{"M": 33, "N": 47, "K": 65}, {"M": 64, "N": 32, "K": 16},
                    {"M": 1, "N": 7, "K": 5}, {"M": 140, "N": 24, "K": 40}]
    space = {
        "tiled": {"BLOCK_M": _TILE, "BLOCK_N": _TILE, "BLOCK_K": (32, 64), "GROUP_M": (1, 4, 8),
                  "NUM_STAGES": (2, 3, 4), "NUM_WARPS": (4, 8)},
        "split_k": {"BLOCK_M": _TILE, "BLOCK_N": _TILE, "BLOCK_K": (32, 64), "GROUP_M": (1, 8),
                    "SPLIT_K": (2, 4, 8), "NUM_STAGES": (2, 3, 4), "NUM_WARPS": (4, 8)},
        "naive_k_loop": {"BLOCK_M": (16, 32, 64), "BLOCK_N": (16, 32, 64), "BLOCK_K": (16, 32),
                         "NUM_STAGES": (1, 2, 3), "NUM_WARPS": (1, 2, 4)},
    }
    defaults = {
        "tiled": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "NUM_STAGES": 3,
                  "NUM_WARPS": 4},
        "split_k": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 4,
                    "NUM_STAGES": 3, "NUM_WARPS": 4},
        "naive_k_loop": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "NUM_STAGES": 1,
                         "NUM_WARPS": 4},
    }

    def make_inputs(self, dims, seed, device):
        import torch

        gen = seeded(seed, device)
        m, n, k = dims["M"], dims["N"], dims["K"]
        # Unit-variance products: C ~ N(0, 1) whatever K, well inside fp16's range.
        a = torch.randn(m, k, generator=gen, device=device) * k ** -0.25
        b = torch.randn(k, n, generator=gen, device=device) * k ** -0.25
        return a.to(torch.float16).to(device), b.to(torch.float16).to(device)

    def reference(self, a, b):
        import torch

        return torch.matmul(a.float(), b.float()).to(a.dtype)

    def baseline(self, a, b):
        import torch

        return torch.matmul(a, b)

    def candidates(self) -> list[Candidate]:
        c = self.candidate
        return [
            c("tiled", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, NUM_STAGES=3,
              NUM_WARPS=8),
            c("tiled", BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, NUM_STAGES=4,
              NUM_WARPS=4),
            c("tiled", BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, NUM_STAGES=2,
              NUM_WARPS=4),
            c("tiled", BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=1, NUM_STAGES=4,
              NUM_WARPS=8),
            c("split_k", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, SPLIT_K=4,
              NUM_STAGES=3, NUM_WARPS=4),
            c("split_k", BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, SPLIT_K=2,
              NUM_STAGES=3, NUM_WARPS=8),
            c("naive_k_loop", BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, NUM_STAGES=1, NUM_WARPS=4),
            c("naive_k_loop", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, NUM_STAGES=1, NUM_WARPS=1),
        ]

    def render(self, variant, params):
        self.validate(variant, params)
        return render_header(self, variant, params, {}) + _TEMPLATES[variant]
