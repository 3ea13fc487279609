"""The one GEMM template of every matmul-like kind (imported only on the box).

``gemm_kernel`` computes ``C = prologue(A) @ B.T`` tile by tile, where A is ``[M, K]`` and B
is a linear layer's ``[N, K]`` weight, both contiguous in K, and ends each tile with an
epilogue.  The kinds differ only in their constexpr hooks:

- ``PROLOGUE``: 0 feeds A as it is; 1 normalizes A's rows by RMS with ``wn`` (a first pass
  over K computes each row's rstd, the main loop feeds ``a * rstd * wn``); 2 feeds
  ``a * wn`` while summing ``a**2`` and scales the accumulator by rstd at the end.
- ``EPILOGUE``: 0 stores the tile; 1 is the GeGLU gate/up pair (a second weight ``b2``
  shares every A tile; the output is ``gelu_tanh(gate) * up``); 2 stores the tile and the
  tile's per-row sum of squares of the stored values into ``ss[row, pid_n]``.

and in the paths the card can run, chosen by knobs:

- ``TMA``: A, B and C move through tensor descriptors (the copy engine of compute
  capability 9.0 and later), made once on the host; out-of-range rows and columns read as
  zero and are never written, so no tile needs a mask.  Without it, pointers: rows past M or
  N wrap around (their results are never stored) and K is masked only where K is not a
  multiple of BLOCK_K (``EVEN_K``).
- ``PERSISTENT``: ``num_progs`` programs (one per SM) walk the tiles in a flattened loop
  instead of one program a tile.
- ``SUBTILE``: the epilogue stores the tile as two halves of BLOCK_N / 2 columns, which
  halves the staging buffer of a TMA store.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share the B tiles they stream while in L2."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def load_k_tile(src, row0, k0, ROWS, K, stride_r, BLOCK_R: tl.constexpr,
                BLOCK_K: tl.constexpr, TMA: tl.constexpr, EVEN_K: tl.constexpr):
    """Rows ``row0 .. row0 + BLOCK_R`` and columns ``k0 .. k0 + BLOCK_K`` of a row-major
    ``[ROWS, K]`` operand: ``src`` is its tensor descriptor (TMA) or its pointer."""
    if TMA:
        tile = src.load([row0, k0])
    else:
        rows = (row0 + tl.arange(0, BLOCK_R)) % ROWS
        cols = k0 + tl.arange(0, BLOCK_K)
        ptrs = src + rows[:, None] * stride_r + cols[None, :]
        if EVEN_K:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=cols[None, :] < K, other=0.0)
    return tile


@triton.jit
def store_c_tile(dst, tile, row0, col0, M, N, stride_cm, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, TMA: tl.constexpr, SUBTILE: tl.constexpr):
    """Write one output tile (already in the output dtype)."""
    if TMA:
        if SUBTILE:
            halves = tl.permute(tl.reshape(tile, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            dst.store([row0, col0], left)
            dst.store([row0, col0 + BLOCK_N // 2], right)
        else:
            dst.store([row0, col0], tile)
    else:
        rows = row0 + tl.arange(0, BLOCK_M)
        cols = col0 + tl.arange(0, BLOCK_N)
        tl.store(dst + rows[:, None] * stride_cm + cols[None, :], tile,
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def gemm_tile(tile_id, a, x_ptr, b, b2, wn_ptr, c, ss_ptr, M, N, K, eps,
              stride_am, stride_bn, stride_cm, stride_sm, num_pid_m, num_pid_n,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr,
              TMA: tl.constexpr, SUBTILE: tl.constexpr, EVEN_K: tl.constexpr):
    """One BLOCK_M × BLOCK_N output tile: prologue, the K loop, epilogue, store."""
    pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    if PROLOGUE != 0:
        ss = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)  # running a**2, reduced once
    if PROLOGUE == 1:
        # through pointers on every path: the main loop alone streams A's descriptor (the
        # same descriptor pipelined in two loops gave wrong results on an H200, Triton 3.6)
        for ki in range(0, k_tiles):
            af = load_k_tile(x_ptr, row0, ki * BLOCK_K, M, K, stride_am, BLOCK_M, BLOCK_K,
                             False, EVEN_K).to(tl.float32)
            ss += af * af
        rstd = tl.rsqrt(tl.sum(ss, 1) / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if EPILOGUE == 1:
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for ki in range(0, k_tiles):
        k0 = ki * BLOCK_K
        x = load_k_tile(a, row0, k0, M, K, stride_am, BLOCK_M, BLOCK_K, TMA, EVEN_K)
        if PROLOGUE != 0:
            if EVEN_K:
                wn = tl.load(wn_ptr + k0 + offs_k).to(tl.float32)
            else:
                wn = tl.load(wn_ptr + k0 + offs_k, mask=k0 + offs_k < K, other=0.0)
                wn = wn.to(tl.float32)
            xf = x.to(tl.float32)
            if PROLOGUE == 1:
                x = (xf * rstd[:, None] * wn[None, :]).to(x.dtype)
            else:
                ss += xf * xf
                x = (xf * wn[None, :]).to(x.dtype)
        w = load_k_tile(b, col0, k0, N, K, stride_bn, BLOCK_N, BLOCK_K, TMA, EVEN_K)
        acc = tl.dot(x, w.T, acc)
        if EPILOGUE == 1:
            w2 = load_k_tile(b2, col0, k0, N, K, stride_bn, BLOCK_N, BLOCK_K, TMA, EVEN_K)
            acc2 = tl.dot(x, w2.T, acc2)
    if PROLOGUE == 2:
        acc = acc * tl.rsqrt(tl.sum(ss, 1) / K + eps)[:, None]
    out_ty = c.dtype.element_ty if not TMA else c.dtype
    if EPILOGUE == 1:
        # the gate and up outputs round to the output dtype first, as two linears do;
        # gelu_tanh(g) = g * sigmoid(2 * sqrt(2 / pi) * (g + 0.044715 g**3))
        g = acc.to(out_ty).to(tl.float32)
        u = acc2.to(out_ty).to(tl.float32)
        tile = (g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g)) * u).to(out_ty)
    else:
        tile = acc.to(out_ty)
    store_c_tile(c, tile, row0, col0, M, N, stride_cm, BLOCK_M, BLOCK_N, TMA, SUBTILE)
    if EPILOGUE == 2:
        rows = row0 + tl.arange(0, BLOCK_M)
        cols = col0 + tl.arange(0, BLOCK_N)
        zf = tile.to(tl.float32)
        part = tl.sum(tl.where(cols[None, :] < N, zf * zf, 0.0), 1)
        tl.store(ss_ptr + rows * stride_sm + pid_n, part, mask=rows < M)


@triton.jit(do_not_specialize=["num_progs"])
def gemm_kernel(a, x_ptr, b, b2, wn_ptr, c, ss_ptr, M, N, K, eps,
                stride_am, stride_bn, stride_cm, stride_sm, num_progs,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr,
                TMA: tl.constexpr, PERSISTENT: tl.constexpr, SUBTILE: tl.constexpr,
                EVEN_K: tl.constexpr):
    """``a``, ``b``, ``b2`` and ``c`` are tensor descriptors when TMA, else pointers;
    ``x_ptr`` is A's pointer on every path."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, num_progs,
                                flatten=True):
            gemm_tile(tile_id, a, x_ptr, b, b2, wn_ptr, c, ss_ptr, M, N, K, eps,
                      stride_am, stride_bn, stride_cm, stride_sm, num_pid_m, num_pid_n,
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PROLOGUE, EPILOGUE, TMA, SUBTILE,
                      EVEN_K)
    else:
        gemm_tile(tl.program_id(0), a, x_ptr, b, b2, wn_ptr, c, ss_ptr, M, N, K, eps,
                  stride_am, stride_bn, stride_cm, stride_sm, num_pid_m, num_pid_n,
                  BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PROLOGUE, EPILOGUE, TMA, SUBTILE, EVEN_K)
