"""The Triton RMSNorm kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl

from harness.kinds._rows_triton import load_tile


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, M, N, eps, stride_xm, stride_ym,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr,
                    EVICT: tl.constexpr = 0):
    """``EVICT`` 1: x's last read is ``evict_first``, the first pass of two and the weight
    ``evict_last`` (read again by the second pass and by every row)."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    cols0 = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = rmask[:, None] & (cols0[None, :] < N)
        x = load_tile(x_ptr + rows[:, None] * stride_xm + cols0[None, :], mask, 0.0,
                      EVICT).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
        w = load_tile(w_ptr + cols0, cols0 < N, 0.0, 2 * EVICT).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols0[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # sum of squares over column blocks, then a second pass that scales and writes
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            mask = rmask[:, None] & (cols[None, :] < N)
            x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, 0.0,
                          2 * EVICT).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, 1) / N + eps)
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            mask = rmask[:, None] & (cols[None, :] < N)
            x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, 0.0,
                          EVICT).to(tl.float32)
            w = load_tile(w_ptr + cols, cols < N, 0.0, 2 * EVICT).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :],
                     y.to(y_ptr.dtype.element_ty), mask=mask)
