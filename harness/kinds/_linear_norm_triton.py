"""The Triton linear-then-RMSNorm kernels (imported only on the box).  Pass 1 of the tiled
scheme is the GEMM template with its sum-of-squares epilogue (``_gemm_triton``)."""

from __future__ import annotations

import triton
import triton.language as tl

from harness.kinds._gemm_triton import load_k_tile


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
                           stride_xm, stride_wn, stride_om,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           EVEN_K: tl.constexpr):
    """The row scheme: one program owns BLOCK_M whole rows.  It computes and writes the
    row's N tiles unnormalized while summing ``z**2``, then rescales what it wrote."""
    row0 = tl.program_id(0) * BLOCK_M
    offs_cm = row0 + tl.arange(0, BLOCK_M)
    rmask = offs_cm[:, None] < M
    ss = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for n0 in range(0, N, BLOCK_N):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, tl.cdiv(K, BLOCK_K)):
            a = load_k_tile(x_ptr, row0, kk * BLOCK_K, M, K, stride_xm, BLOCK_M, BLOCK_K,
                            False, EVEN_K)
            w = load_k_tile(w_ptr, n0, kk * BLOCK_K, N, K, stride_wn, BLOCK_N, BLOCK_K,
                            False, EVEN_K)
            acc = tl.dot(a, w.T, acc)
        z = acc.to(out_ptr.dtype.element_ty)
        offs_cn = n0 + tl.arange(0, BLOCK_N)
        cmask = offs_cn[None, :] < N
        tl.store(out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :], z,
                 mask=rmask & cmask)
        zf = z.to(tl.float32)
        ss += tl.where(cmask, zf * zf, 0.0)
    rstd = tl.rsqrt(tl.sum(ss, 1) / N + eps)
    tl.debug_barrier()  # this program's writes are visible to all of its threads
    for n0 in range(0, N, BLOCK_N):
        offs_cn = n0 + tl.arange(0, BLOCK_N)
        mask = rmask & (offs_cn[None, :] < N)
        ptrs = out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :]
        z = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(wn_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
        tl.store(ptrs, (z * rstd[:, None] * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)
