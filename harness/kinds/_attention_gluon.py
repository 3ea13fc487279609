"""A flash-attention forward kernel in Gluon for compute capability 9.x (imported only on the box).

Hopper's instructions are spelled out instead of left to the compiler's pipeliner: Q, K and V
move through TMA into shared memory (K and V in a ring of ``STAGES`` buffers, each with its own
barrier), and the two products run as asynchronous warpgroup MMAs in the order that lets the
softmax overlap the tensor cores.  Iteration ``j`` asks for block ``j``'s scores ``Q K_j^T``,
rescales the output, asks for ``P_{j-1} V_{j-1}``, waits for the scores only and runs their
softmax while ``P V`` is still on the tensor cores, then waits for it.  Warpgroup MMAs are
Hopper's: the kernel compiles for compute capability 9.x only.  P reaches its MMA
through shared memory (two buffers, so the softmax of block ``j`` writes one while the MMA of
block ``j - 1`` reads the other): given in registers, ptxas reuses the operand's registers for
the softmax and waits for the MMA before it, which serializes the two again.

The views are two-dimensional, ``(batch * heads * seq, head_dim)``, so the sequence must be a
multiple of both tiles (a block never reads into the next head); the kind's ``unrealizable``
says so.  16-bit inputs only (the MMA's K step is 16).
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
def _softmax_step(s, m_i, l_i, qk_scale, start_m, j, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """The online-softmax step of block ``j``'s scores: (p, alpha, m_new, l_new)."""
    if CAUSAL:
        # only the blocks that cross the diagonal are masked
        if (j + 1) * BLOCK_N - 1 > start_m * BLOCK_M:
            rows = start_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
            s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, stage, row):
    """Ask TMA for the K and V blocks that start at ``row`` into ring buffer ``stage``; each
    lands on its own barrier, so the scores need not wait for V."""
    mbarrier.expect(k_bars.index(stage), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(stage), k_smem.index(stage))
    mbarrier.expect(v_bars.index(stage), v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(stage), v_smem.index(stage))


@gluon.jit
def gluon_attention_kernel(q_desc, k_desc, v_desc, o_desc, qk_scale, SEQ,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """One program: BLOCK_M queries of one (batch, head).  ``qk_scale`` is the softmax scale
    times log2(e).  ``*_desc`` are TMA descriptors of the 2-D views."""
    dtype: gl.constexpr = q_desc.dtype
    start_m = gl.program_id(0)
    if CAUSAL:  # the longest rows first: the last wave is made of the short ones
        start_m = gl.num_programs(0) - 1 - start_m
    head_row = gl.program_id(1) * SEQ
    q_row = head_row + start_m * BLOCK_M
    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum((start_m + 1) * BLOCK_M, SEQ), BLOCK_N)
    else:
        n_blocks = SEQ // BLOCK_N

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    p_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)
    p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, BLOCK_N], p_smem_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        if i < n_blocks:
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, head_row + i * BLOCK_N)

    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))

    # block 0: its scores and softmax
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, start_m, 0, BLOCK_M, BLOCK_N,
                                       CAUSAL, s_layout)
    p_smem.index(0).store(p.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    for j in range(1, n_blocks):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        # the next scores first, then the previous block's P V; wait for the scores only
        mbarrier.wait(k_bars.index(stage), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), zero_s,
                              use_acc=False, is_async=True)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_smem.index((j - 1) % 2), v_smem.index(prev), acc,
                                is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, start_m, j, BLOCK_M,
                                           BLOCK_N, CAUSAL, s_layout)
        p_smem.index(j % 2).store(p.to(dtype))
        fence_async_shared()
        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
        # every warp is done with the previous stage's K and V: refill it
        gl.thread_barrier()
        nxt = j - 1 + STAGES
        if nxt < n_blocks:
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, prev,
                     head_row + nxt * BLOCK_N)
    last = n_blocks - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    acc_tok = warpgroup_mma(p_smem.index(last % 2), v_smem.index(last % STAGES), acc,
                            is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc_tok,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    o = acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)
    q_smem.store(o.to(dtype))  # Q is no longer read: its tile stages the output
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)
