"""The Triton softmax kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl

from harness.kinds._rows_triton import load_tile


@triton.jit
def softmax_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr,
                   EVICT: tl.constexpr = 0):
    """``EVICT`` 1: x's last read is ``evict_first``, the first pass of two ``evict_last``
    (read again by the second)."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    cols0 = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = rmask[:, None] & (cols0[None, :] < N)
        x = load_tile(x_ptr + rows[:, None] * stride_xm + cols0[None, :], mask, float("-inf"),
                      EVICT).to(tl.float32)
        m = tl.max(x, 1)
        e = tl.exp(x - m[:, None])
        y = e / tl.sum(e, 1)[:, None]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols0[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # online max/sum over column blocks, then a second pass that writes
        m = tl.full((ROWS,), float("-inf"), tl.float32)
        s = tl.zeros((ROWS,), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            mask = rmask[:, None] & (cols[None, :] < N)
            x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, float("-inf"),
                          2 * EVICT).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 1))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
            m = m_new
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            mask = rmask[:, None] & (cols[None, :] < N)
            x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, float("-inf"),
                          EVICT).to(tl.float32)
            y = tl.exp(x - m[:, None]) / s[:, None]
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :],
                     y.to(y_ptr.dtype.element_ty), mask=mask)
