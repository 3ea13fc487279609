"""The Triton RMSNorm-then-linear kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def norm_linear_kernel(x_ptr, wn_ptr, w_ptr, out_ptr, M, N, K, eps,
                       stride_xm, stride_xk, stride_wk, stride_wn, stride_om, stride_on,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, PROLOGUE: tl.constexpr):
    """``out = rmsnorm(x, wn) @ W.T`` for one BLOCK_M×BLOCK_N tile.

    PROLOGUE=1: a first loop over K computes each row's rstd, then the main loop feeds
    ``x * rstd * wn`` to the dot.  PROLOGUE=0: one loop feeds ``x * wn`` to the dot while
    summing ``x**2``, and rstd (a per-row factor) scales the accumulator in the epilogue.
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + offs_am[:, None] * stride_xm + offs_k[None, :] * stride_xk
    b_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_bn[None, :] * stride_wn
    ss = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)  # running x**2, reduced once at the end
    if PROLOGUE:
        for kk in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs + kk * BLOCK_K * stride_xk,
                        mask=offs_k[None, :] < K - kk * BLOCK_K, other=0.0).to(tl.float32)
            ss += a * a
        scale = tl.rsqrt(tl.sum(ss, 1) / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        wn = tl.load(wn_ptr + kk * BLOCK_K + offs_k, mask=offs_k < k_left, other=0.0)
        af = a.to(tl.float32)
        if PROLOGUE:
            an = af * scale[:, None] * wn.to(tl.float32)[None, :]
        else:
            ss += af * af
            an = af * wn.to(tl.float32)[None, :]
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(an.to(b.dtype), b, acc)
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk
    if not PROLOGUE:
        acc = acc * tl.rsqrt(tl.sum(ss, 1) / K + eps)[:, None]
    c = acc.to(out_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :] * stride_on
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
