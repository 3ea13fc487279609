"""A trivial Triton kernel that a compile-pool process compiles when it starts, so that the
compiler (and, where the pool was not given the target, the CUDA runtime) is loaded before
the first real point."""

import triton
import triton.language as tl


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def compile_once() -> None:
    import torch

    x = torch.empty(128, device="meta")
    _copy.run(x, x, 128, BLOCK=128, grid=(1,), warmup=True)
