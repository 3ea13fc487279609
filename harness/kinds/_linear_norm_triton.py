"""The Triton linear-then-RMSNorm kernels (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def linear_norm_tile_kernel(x_ptr, w_ptr, out_ptr, ss_ptr, M, N, K,
                            stride_xm, stride_xk, stride_wk, stride_wn, stride_om, stride_on,
                            stride_sm,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr):
    """Pass 1 of the tiled scheme: ``z = x @ W.T`` for one tile, written unnormalized, and
    the tile's per-row sum of ``z**2`` written to ``ss[row, pid_n]``."""
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk
    z = acc.to(out_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = offs_cn[None, :] < N
    tl.store(out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :] * stride_on, z,
             mask=(offs_cm[:, None] < M) & cmask)
    zf = z.to(tl.float32)
    ss = tl.sum(tl.where(cmask, zf * zf, 0.0), 1)
    tl.store(ss_ptr + offs_cm * stride_sm + pid_n, ss, mask=offs_cm < M)


@triton.jit
def rms_rows_kernel(y_ptr, ss_ptr, wn_ptr, M, N, n_parts, eps, stride_ym, stride_sm,
                    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass 2 of the tiled scheme: fold one row's partial sums, scale the row in place."""
    row = tl.program_id(0)
    parts = tl.arange(0, BLOCK_P)
    ss = tl.sum(tl.load(ss_ptr + row * stride_sm + parts, mask=parts < n_parts, other=0.0), 0)
    rstd = tl.rsqrt(ss / N + eps)
    cols0 = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        cols = start + cols0
        mask = cols < N
        z = tl.load(y_ptr + row * stride_ym + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(wn_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_ym + cols, (z * rstd * w).to(y_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def linear_norm_row_kernel(x_ptr, w_ptr, wn_ptr, out_ptr, M, N, K, eps,
                           stride_xm, stride_xk, stride_wk, stride_wn, stride_om, stride_on,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The row scheme: one program owns BLOCK_M whole rows.  It computes and writes the
    row's N tiles unnormalized while summing ``z**2``, then rescales what it wrote."""
    pid_m = tl.program_id(0)
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_k = tl.arange(0, BLOCK_K)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = offs_cm[:, None] < M
    ss = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_bn = (n0 + tl.arange(0, BLOCK_N)) % N
        a_ptrs = x_ptr + offs_am[:, None] * stride_xm + offs_k[None, :] * stride_xk
        b_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_bn[None, :] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - kk * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_xk
            b_ptrs += BLOCK_K * stride_wk
        z = acc.to(out_ptr.dtype.element_ty)
        offs_cn = n0 + tl.arange(0, BLOCK_N)
        cmask = offs_cn[None, :] < N
        tl.store(out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :] * stride_on, z,
                 mask=rmask & cmask)
        zf = z.to(tl.float32)
        ss += tl.where(cmask, zf * zf, 0.0)
    rstd = tl.rsqrt(tl.sum(ss, 1) / N + eps)
    tl.debug_barrier()  # this program's writes are visible to all of its threads
    for n0 in range(0, N, BLOCK_N):
        offs_cn = n0 + tl.arange(0, BLOCK_N)
        mask = rmask & (offs_cn[None, :] < N)
        ptrs = out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :] * stride_on
        z = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(wn_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
        tl.store(ptrs, (z * rstd[:, None] * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)
