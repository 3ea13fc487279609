"""Triton helpers shared by the row kinds' kernels (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(ptrs, mask, other, POLICY: tl.constexpr):
    """``tl.load`` with an L2 eviction policy: ``POLICY`` 0 the hardware's default, 1
    ``evict_first`` (data read once: make room for other data first), 2 ``evict_last`` (read
    again soon: the first pass of a two-pass kernel, a weight every row reads).  A kernel's
    ``EVICT`` knob passes 0 or 1 for a last read and 0 or 2 (``2 * EVICT``) for the others."""
    if POLICY == 1:
        tile = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
    elif POLICY == 2:
        tile = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_last")
    else:
        tile = tl.load(ptrs, mask=mask, other=other)
    return tile
