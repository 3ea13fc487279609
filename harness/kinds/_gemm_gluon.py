"""A warp-specialized persistent GEMM in Gluon for compute capability 9.x (imported only on
the box): the template's ``GLUON`` paths (harness/kinds/_gemm_triton.py has the others).

``C = A @ B.T`` with A ``[M, K]`` and B a linear layer's ``[N, K]`` weight, 16-bit, through
tensor descriptors.  Each program (one per SM) walks the output tiles in the template's
grouped order, and splits into three partitions that meet only at mbarriers:

- a loader warp TMA-copies the A and B tiles of every K step of the program's tiles, in
  order, into a ring of ``STAGES`` buffers, each stage as soon as its last reader let it go;
- two consumer warpgroups (240 registers each; the loader keeps 24), in one of two forms:

  ``GLUON=1``, ping-pong (``COOP`` off): they take the program's tiles in turn (the first its
  even tiles, the second its odd ones).  Each runs a whole ``BLOCK_M x BLOCK_N`` tile's K
  loop as asynchronous warpgroup MMAs (one in flight while the next stage's wait runs), then
  its epilogue, which rounds the tile to the output dtype, stages it in its own shared
  buffer and stores it by TMA.  A consumer starts a tile's K loop once the other has waited
  for every stage of the tile before (two mbarriers pass the turn), so one warpgroup's
  epilogue runs while the other's MMAs do, and a store is waited for only when its buffer is
  needed again.  The turn also keeps the ring's waits sound: a wait for a stage's phase
  passes on the parity of the barrier's phase, so a consumer must not ask for a K step while
  the step ``STAGES`` before it has yet to be loaded; the steps before its tile's are all
  the other's, waited for before the turn passed.

  ``GLUON=2``, cooperative (``COOP``): both run every tile of the program, each on its half
  of the rows, so a tile is twice as large for the same accumulator registers, and a stage
  is let go when both have arrived on its barrier.

``EPILOGUE`` 2 also writes the tile's per-row sum of squares of the stored values into
``ss[row, pid_n]`` (linear_norm's partial sums), as the template's epilogue 2 does.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _tile(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """The template's grouped tile order (``tile_coords`` there): (pid_m, pid_n)."""
    in_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // in_group) * GROUP_M
    group_size_m = gl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % in_group) % group_size_m
    return pid_m, (tile_id % in_group) // group_size_m


@gluon.jit
def _gemm_loader(descs, smem, bars, ss_ptr, M, N, K, stride_sm, num_progs,
                 GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPILOGUE: gl.constexpr,
                 COOP: gl.constexpr):
    """One warp: A's and B's tiles of every K step of the program's tiles, into the ring."""
    a_desc, b_desc, c_desc = descs
    a_smem, b_smem, c_smem = smem
    ready, empty, turn = bars
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    step = 0
    for tile_id in range(gl.program_id(0), num_pid_m * num_pid_n, num_progs):
        pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        for ki in range(k_tiles):
            stage = step % STAGES
            # a new barrier passes a wait for the phase before its first: the first STAGES go
            mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(stage),
                            a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, ki * BLOCK_K],
                                            ready.index(stage), a_smem.index(stage))
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, ki * BLOCK_K],
                                            ready.index(stage), b_smem.index(stage))
            step += 1


@gluon.jit
def _gemm_consumer(descs, smem, bars, ss_ptr, M, N, K, stride_sm, num_progs,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPILOGUE: gl.constexpr,
                   COOP: gl.constexpr, C: gl.constexpr):
    """One warpgroup: the K loop and epilogue of the program's tiles ``C``, ``C + 2``, ...
    (``COOP``: of every tile's rows ``C * BLOCK_M / 2`` on)."""
    a_desc, b_desc, c_desc = descs
    a_smem, b_smem, c_smem = smem
    ready, empty, turn = bars
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    ROWS: gl.constexpr = c_desc.block_type.shape[0]  # this warpgroup's rows of a tile
    FIRST: gl.constexpr = 0 if COOP else C
    EVERY: gl.constexpr = 1 if COOP else 2
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    c_buf = c_smem.index(C)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
    n_mine = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), num_progs)
    for local in range(FIRST, n_mine, EVERY):
        tile_id = gl.program_id(0) + local * num_progs
        pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        step = local * k_tiles  # the ring's count of K steps before this tile's
        if not COOP:  # the other has waited for every stage of the tile before this one
            if C == 0:
                if local > 0:
                    mbarrier.wait(turn.index(0), ((local // 2) - 1) & 1)
            else:
                mbarrier.wait(turn.index(1), (local // 2) & 1)
        acc = zero
        for ki in range(k_tiles):
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
            a = a_smem.index(stage)
            if COOP:
                a = a.slice(C * ROWS, ROWS)
            acc = warpgroup_mma(a, b_smem.index(stage).permute((1, 0)), acc, use_acc=ki > 0,
                                is_async=True)
            # the MMA before this one is done: its stage can be refilled
            acc = warpgroup_mma_wait(1, deps=(acc,))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), count=1, pred=ki > 0)
            step += 1
        if not COOP:
            mbarrier.arrive(turn.index(1 - C), count=1)  # the other's turn
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), count=1)

        tile = acc.to(c_desc.dtype)
        tma.store_wait(pendings=0)  # this warpgroup's previous tile has left c_buf
        c_buf.store(tile)
        fence_async_shared()
        gl.thread_barrier()  # of this partition's warps only
        row0 = pid_m * BLOCK_M + (C * ROWS if COOP else 0)
        tma.async_copy_shared_to_global(c_desc, [row0, pid_n * BLOCK_N], c_buf)
        if EPILOGUE == 2:
            zf = tile.to(gl.float32)
            rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
            # columns past N were read as zeros from B: they add nothing
            gl.store(ss_ptr + rows * stride_sm + pid_n, gl.sum(zf * zf, 1), mask=rows < M)
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["num_progs"])
def gluon_gemm_kernel(a_desc, b_desc, c_desc, ss_ptr, M, N, K, stride_sm, num_progs,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPILOGUE: gl.constexpr,
                      COOP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                      num_warps: gl.constexpr):
    """``num_progs`` programs of two consumer warpgroups (the default partition of 4 warps
    and a worker of 4) and a loader warp.  The tiles are the descriptors' blocks: A's
    ``[BLOCK_M, BLOCK_K]``, B's ``[BLOCK_N, BLOCK_K]``, C's a consumer's rows of a tile:
    ``[BLOCK_M, BLOCK_N]`` in ping-pong, ``[BLOCK_M / 2, BLOCK_N]`` if ``COOP``."""
    dtype: gl.constexpr = a_desc.dtype
    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape,
                                       c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2 if COOP else 1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    # the argument tuples are written out: a tuple assigned to a name would turn the
    # constexprs in it into tensors
    gl.warp_specialize([
        (_gemm_consumer, ((a_desc, b_desc, c_desc), (a_smem, b_smem, c_smem),
                          (ready, empty, turn), ss_ptr, M, N, K, stride_sm, num_progs, GROUP_M,
                          STAGES, EPILOGUE, COOP, 0)),
        (_gemm_consumer, ((a_desc, b_desc, c_desc), (a_smem, b_smem, c_smem),
                          (ready, empty, turn), ss_ptr, M, N, K, stride_sm, num_progs, GROUP_M,
                          STAGES, EPILOGUE, COOP, 1)),
        (_gemm_loader, ((a_desc, b_desc, c_desc), (a_smem, b_smem, c_smem),
                        (ready, empty, turn), ss_ptr, M, N, K, stride_sm, num_progs, GROUP_M,
                        STAGES, EPILOGUE, COOP)),
    ], [4, 1], [CONSUMER_REGS, 24])
