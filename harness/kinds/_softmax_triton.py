"""The Triton softmax kernels (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl

from harness.kinds._rows_triton import load_tile


@triton.jit
def _row_stats(x_ptr, rows, rmask, stride_xm, lo, hi, BLOCK_N: tl.constexpr,
               ROWS: tl.constexpr, POLICY: tl.constexpr):
    """The running max and sum of exponentials of columns ``[lo, hi)`` of ``rows``.  Until a
    row meets a finite value its max is -inf and its sum 0 (the exponentials are taken against
    0 then, not -inf: a masked block or a masked split adds nothing instead of a NaN)."""
    cols0 = tl.arange(0, BLOCK_N)
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    s = tl.zeros((ROWS,), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + cols0
        mask = rmask[:, None] & (cols[None, :] < hi)
        x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, float("-inf"),
                      POLICY).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_sub) + tl.sum(tl.exp(x - m_sub[:, None]), 1)
        m = m_new
    return m, s


@triton.jit
def _write_rows(x_ptr, y_ptr, rows, rmask, stride_xm, stride_ym, m, s, lo, hi,
                BLOCK_N: tl.constexpr, POLICY: tl.constexpr):
    """Columns ``[lo, hi)`` of ``rows`` of the softmax whose row max and sum are ``m``, ``s``."""
    cols0 = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + cols0
        mask = rmask[:, None] & (cols[None, :] < hi)
        x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, float("-inf"),
                      POLICY).to(tl.float32)
        y = tl.exp(x - m[:, None]) / s[:, None]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr,
                   EVICT: tl.constexpr = 0):
    """``EVICT`` 1: x's last read is ``evict_first``, the first pass of two ``evict_last``
    (read again by the second)."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    if ONE_PASS:
        cols0 = tl.arange(0, BLOCK_N)
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
        m, s = _row_stats(x_ptr, rows, rmask, stride_xm, 0, N, BLOCK_N, ROWS, 2 * EVICT)
        _write_rows(x_ptr, y_ptr, rows, rmask, stride_xm, stride_ym, m, s, 0, N, BLOCK_N,
                    EVICT)


@triton.jit
def softmax_partials(x_ptr, part_ptr, M, N, stride_xm, chunk, used,
                     BLOCK_N: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr = 0):
    """The running (max, sum of exp) of columns ``[pid1 * chunk, (pid1 + 1) * chunk)`` of ROWS
    rows into ``part[row, pid1]`` (fp32 pairs); x is read again by :func:`softmax_write`."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    lo = tl.program_id(1) * chunk
    m, s = _row_stats(x_ptr, rows, rmask, stride_xm, lo, tl.minimum(lo + chunk, N), BLOCK_N,
                      ROWS, 2 * EVICT)
    base = part_ptr + (rows * used + tl.program_id(1)) * 2
    tl.store(base, m, mask=rmask)
    tl.store(base + 1, s, mask=rmask)


@triton.jit
def softmax_write(x_ptr, y_ptr, part_ptr, M, N, stride_xm, stride_ym, chunk, used,
                  BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SPLIT_P2: tl.constexpr,
                  EVICT: tl.constexpr = 0):
    """Fold the ``used`` partials of each of ROWS rows into the row's max and sum, then write
    the softmax of columns ``[pid1 * chunk, (pid1 + 1) * chunk)``."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    sp = tl.arange(0, SPLIT_P2)
    pbase = part_ptr + (rows[:, None] * used + sp[None, :]) * 2
    pmask = rmask[:, None] & (sp[None, :] < used)
    pm = tl.load(pbase, mask=pmask, other=float("-inf"))
    ps = tl.load(pbase + 1, mask=pmask, other=0.0)
    m = tl.max(pm, 1)
    s = tl.sum(ps * tl.exp(pm - m[:, None]), 1)
    lo = tl.program_id(1) * chunk
    _write_rows(x_ptr, y_ptr, rows, rmask, stride_xm, stride_ym, m, s, lo,
                tl.minimum(lo + chunk, N), BLOCK_N, EVICT)
