"""Triton helpers shared by the row kinds' kernels (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl

# what the ``EVICT`` knob asks of L2 for a load (``POLICY`` of :func:`load_tile`)
KEEP = 0   # the hardware's default
ONCE = 1   # ``evict_first``: read once, make room for other data first
AGAIN = 2  # ``evict_last``: read again soon (the first pass of a two-pass kernel, weights)


@triton.jit
def load_tile(ptrs, mask, other, POLICY: tl.constexpr):
    """``tl.load`` with the L2 eviction policy ``POLICY`` (KEEP, ONCE or AGAIN)."""
    if POLICY == 1:
        tile = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
    elif POLICY == 2:
        tile = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_last")
    else:
        tile = tl.load(ptrs, mask=mask, other=other)
    return tile
