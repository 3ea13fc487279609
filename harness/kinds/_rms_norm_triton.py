"""The Triton RMSNorm kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, M, N, eps, stride_xm, stride_ym,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    cols0 = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = rmask[:, None] & (cols0[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols0[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
        w = tl.load(w_ptr + cols0, mask=cols0 < N, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols0[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # sum of squares over column blocks, then a second pass that scales and writes
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            mask = rmask[:, None] & (cols[None, :] < N)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, 1) / N + eps)
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            mask = rmask[:, None] & (cols[None, :] < N)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :],
                     y.to(y_ptr.dtype.element_ty), mask=mask)
