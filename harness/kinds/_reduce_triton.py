"""The Triton row-reduction kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl

from harness.kinds._rows_triton import load_tile


@triton.jit
def reduce_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym, chunk, scale,
                  BLOCK_N: tl.constexpr, ROWS: tl.constexpr, OP: tl.constexpr,
                  SQUARE: tl.constexpr, EVICT: tl.constexpr = 0):
    """Reduce columns ``[pid1 * chunk, (pid1 + 1) * chunk)`` of ROWS rows into ``y[row, pid1]``.

    OP 0 sums (times ``scale``), 1 takes the max, 2 the min; SQUARE squares first.  The
    running value is kept elementwise over a (ROWS, BLOCK_N) tile and reduced across threads
    once at the end, so the loop body is loads and FMAs only.  ``EVICT`` 1 reads x with
    ``evict_first`` (each element is read once).
    """
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    cols0 = tl.arange(0, BLOCK_N)
    lo = pid_s * chunk
    hi = tl.minimum(lo + chunk, N)
    if OP == 0:
        neutral = 0.0
    elif OP == 1:
        neutral = float("-inf")
    else:
        neutral = float("inf")
    acc = tl.full((ROWS, BLOCK_N), neutral, tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + cols0
        mask = rmask[:, None] & (cols[None, :] < hi)
        x = load_tile(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask, neutral,
                      EVICT).to(tl.float32)
        if SQUARE:
            x = x * x
        if OP == 0:
            acc += x
        elif OP == 1:
            acc = tl.maximum(acc, x)
        else:
            acc = tl.minimum(acc, x)
    if OP == 0:
        r = tl.sum(acc, 1) * scale
    elif OP == 1:
        r = tl.max(acc, 1)
    else:
        r = tl.min(acc, 1)
    tl.store(y_ptr + rows * stride_ym + pid_s, r.to(y_ptr.dtype.element_ty), mask=rmask)
