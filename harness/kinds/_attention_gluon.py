"""Flash-attention forward kernels in Gluon for compute capability 9.x (imported only on the box).

Hopper's instructions are spelled out instead of left to the compiler's pipeliner: Q, K and V
move through TMA into shared memory (K and V in a ring of ``STAGES`` buffers, each with its own
barrier), and the two products run as asynchronous warpgroup MMAs.  Block ``j``'s step asks
for its scores ``Q K_j^T``, rescales the output, asks for ``P_{j-1} V_{j-1}``, waits for the
scores only and runs their softmax, then waits for ``P V``.  Warpgroup MMAs are Hopper's: the
kernels compile for compute capability 9.x only.

- ``gluon_attention_kernel`` (``GLUON=1``): every warp loads and computes; P reaches its MMA
  through shared memory (two buffers), so each warpgroup's softmax runs while its own ``P V``
  is on the tensor cores.  Given in registers, ptxas reuses the operand's registers for the
  softmax and waits for the MMA first, which serializes the two again.
- ``gluon_attention_ws_kernel``: warp-specialized, a loader warp and two or three consumer
  warpgroups of 64 rows (``BLOCK_M`` 128 or 192) that share the K/V ring and meet at no
  block-wide barrier (a stage is refilled when every consumer has arrived on its barrier, so
  the one ahead waits at most for the others to let a stage go).  ``GLUON=2`` passes P
  through shared memory; ``GLUON=3`` in registers (one warpgroup's softmax then overlaps
  another's products rather than its own); ``GLUON=4`` adds a ping-pong: the consumers issue
  their MMAs in turn.  Causal with ``BLOCK_N < BLOCK_M``, a consumer stops at its own
  diagonal block.  ``PERSISTENT``: a program a multiprocessor, taking tile after tile; a
  consumer lets its rows of Q go after its last scores, so the next tile's Q loads while it
  finishes, and stores its output from registers.

The views are two-dimensional, ``(batch * heads * seq, head_dim)``, so a K/V block never
reads into the next head only if the sequence is a multiple of ``BLOCK_N``; the query tiles
of ``gluon_attention_kernel`` likewise.  The warp-specialized kernel needs the sequence to be
a multiple of 64 only: in the last query block, a consumer whose rows start past the
sequence computes the sequence's last 64 rows again and stores nothing (``RAGGED``).  The
kind's ``unrealizable`` says so.  16-bit inputs only (the MMA's K step is 16).

Causal, the warp-specialized kernel's grid is 1-D, its heads in groups of ``HEAD_GROUP``,
each group's programs longest rows first across its heads (``head_group`` in
harness/kinds/attention.py says why); ``gluon_attention_kernel`` keeps the 2-D grid, each
head's programs longest first.
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
def _blocks(start_m, SEQ, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """How many K/V blocks the program of query block ``start_m`` reads."""
    if CAUSAL:
        n = gl.cdiv(gl.minimum((start_m + 1) * BLOCK_M, SEQ), BLOCK_N)
    else:
        n = SEQ // BLOCK_N
    return n


@gluon.jit
def _causal_order(pid, n_m, ZH, GROUP: gl.constexpr):
    """(query block, batch * heads index) of program ``pid`` of a 1-D causal grid: the heads
    in groups of ``GROUP``, each group's programs the longest rows first across its heads."""
    per = n_m * GROUP
    g = pid // per
    r = pid - g * per
    size = gl.minimum(GROUP, ZH - g * GROUP)
    return n_m - 1 - r // size, g * GROUP + r % size


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, first_row, j, ROWS: gl.constexpr,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """The online-softmax step of block ``j``'s scores of the ``ROWS`` queries from
    ``first_row`` on: (p, alpha, m_new, l_new)."""
    if CAUSAL:
        # only the blocks that cross the diagonal are masked
        if (j + 1) * BLOCK_N - 1 > first_row:
            rows = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
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
def _p_operand(p, p_smem, slot, P_REGS: gl.constexpr, o_layout: gl.constexpr):
    """P as the A operand of ``P V``: in registers (``P_REGS``) or ``p_smem[slot]``."""
    if P_REGS:
        a = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=2))
    else:
        a = p_smem.index(slot)
    return a


@gluon.jit
def _my_turn(turn_bars, k, C: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong of the consumer warpgroups, in turn: before consumer ``C`` issues its
    ``k``-th round of MMAs, the last consumer has issued its round ``k - 1`` (``C`` 0) or
    consumer ``C - 1`` its round ``k``, so one warpgroup's MMAs run while another's softmax
    does."""
    if PINGPONG:
        if C == 0:
            if k > 0:
                mbarrier.wait(turn_bars.index(0), (k - 1) & 1)
        else:
            mbarrier.wait(turn_bars.index(C), k & 1)


@gluon.jit
def _your_turn(turn_bars, C: gl.constexpr, PINGPONG: gl.constexpr):
    """Consumer ``C`` has issued its round of MMAs: the next one's turn."""
    if PINGPONG:
        mbarrier.arrive(turn_bars.index((C + 1) % turn_bars.shape[0]), count=1)


@gluon.jit
def _first_block(q, k_smem, k_bars, p_smem, p_base, zero_s, m_i, l_i, qk_scale, first_row,
                 turn_bars, g0, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, P_REGS: gl.constexpr,
                 C: gl.constexpr, PINGPONG: gl.constexpr, s_layout: gl.constexpr):
    """Block 0's scores and softmax: (P in 16 bits, alpha, m, l).  ``g0`` counts the blocks
    the program's earlier tiles read (the ring's stage and phase and the turns go on from
    there; 0 but in the persistent kernel).  Unless ``P_REGS``, P lands in
    ``p_smem[p_base]`` too; the caller makes the store visible (a barrier of the warps that
    wrote it) before its MMA reads it."""
    mbarrier.wait(k_bars.index(g0 % STAGES), (g0 // STAGES) & 1)
    _my_turn(turn_bars, g0, C, PINGPONG)
    s_tok = warpgroup_mma(q, k_smem.index(g0 % STAGES).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
    _your_turn(turn_bars, C, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, first_row, 0, ROWS, BLOCK_N,
                                       CAUSAL, s_layout)
    p = p.to(q.dtype)
    if not P_REGS:
        p_smem.index(p_base).store(p)
        fence_async_shared()
    return p, alpha, m_i, l_i


@gluon.jit
def _next_block(j, g0, q, k_smem, v_smem, k_bars, v_bars, p_smem, p_base, zero_s, p, acc,
                alpha, m_i, l_i, qk_scale, first_row, turn_bars, ROWS: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                P_REGS: gl.constexpr, C: gl.constexpr, PINGPONG: gl.constexpr,
                s_layout: gl.constexpr, o_layout: gl.constexpr):
    """Block ``j`` (> 0), given block ``j - 1``'s P: ask for block ``j``'s scores, then for
    ``P V`` of block ``j - 1``; wait for the scores only and run their softmax while ``P V``
    is on the tensor cores, then wait for it.  Returns block ``j``'s P (16 bits) and the
    running state; ring stage ``(g0 + j - 1) % STAGES`` is no longer read by these warps
    (``g0``: see :func:`_first_block`)."""
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    g = g0 + j
    stage = g % STAGES
    prev = (g - 1) % STAGES
    mbarrier.wait(k_bars.index(stage), (g // STAGES) & 1)
    _my_turn(turn_bars, g, C, PINGPONG)
    s_tok = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    mbarrier.wait(v_bars.index(prev), ((g - 1) // STAGES) & 1)
    a = _p_operand(p, p_smem, p_base + (j - 1) % 2, P_REGS, o_layout)
    acc_tok = warpgroup_mma(a, v_smem.index(prev), acc, is_async=True)
    _your_turn(turn_bars, C, PINGPONG)
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, first_row, j, ROWS, BLOCK_N,
                                       CAUSAL, s_layout)
    p = p.to(q.dtype)
    if not P_REGS:
        p_smem.index(p_base + j % 2).store(p)
        fence_async_shared()
    acc = warpgroup_mma_wait(0, deps=(acc_tok,))
    return p, acc, alpha, m_i, l_i


@gluon.jit
def _last_product(last, g0, v_smem, v_bars, p_smem, p_base, p, acc, alpha, l_i,
                  STAGES: gl.constexpr, P_REGS: gl.constexpr, o_layout: gl.constexpr):
    """The last block's ``P V``, then the output rows normalized by their sums."""
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    g = g0 + last
    mbarrier.wait(v_bars.index(g % STAGES), (g // STAGES) & 1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    a = _p_operand(p, p_smem, p_base + last % 2, P_REGS, o_layout)
    acc_tok = warpgroup_mma(a, v_smem.index(g % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc_tok,))
    return acc / gl.expand_dims(gl.convert_layout(l_i, o_rows), 1)


@gluon.jit
def gluon_attention_kernel(q_desc, k_desc, v_desc, o_desc, qk_scale, SEQ,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """``GLUON=1``: one program, BLOCK_M queries of one (batch, head), every warp loads and
    computes.  ``qk_scale`` is the softmax scale times log2(e).  ``*_desc`` are TMA
    descriptors of the 2-D views."""
    dtype: gl.constexpr = q_desc.dtype
    start_m = gl.program_id(0)
    if CAUSAL:  # the longest rows first: the last wave is made of the short ones
        start_m = gl.num_programs(0) - 1 - start_m
    head_row = gl.program_id(1) * SEQ
    q_row = head_row + start_m * BLOCK_M
    n_blocks = _blocks(start_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])

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
    first_row = start_m * BLOCK_M

    mbarrier.wait(q_bar, 0)
    # no ping-pong here: the turn barriers and consumer index passed are not used
    p, alpha, m_i, l_i = _first_block(q_smem, k_smem, k_bars, p_smem, 0, zero_s, m_i, l_i,
                                      qk_scale, first_row, k_bars, 0, BLOCK_M, BLOCK_N, STAGES,
                                      CAUSAL, False, 0, False, s_layout)
    gl.thread_barrier()
    for j in range(1, n_blocks):
        p, acc, alpha, m_i, l_i = _next_block(j, 0, q_smem, k_smem, v_smem, k_bars, v_bars,
                                              p_smem, 0, zero_s, p, acc, alpha, m_i, l_i,
                                              qk_scale, first_row, k_bars, BLOCK_M, BLOCK_N, STAGES,
                                              CAUSAL, False, 0, False, s_layout, o_layout)
        # every warp is done with the previous stage's K and V: refill it
        gl.thread_barrier()
        nxt = j - 1 + STAGES
        if nxt < n_blocks:
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, (j - 1) % STAGES,
                     head_row + nxt * BLOCK_N)
    o = _last_product(n_blocks - 1, 0, v_smem, v_bars, p_smem, 0, p, acc, alpha, l_i, STAGES,
                      False, o_layout)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    q_smem.store(o.to(dtype))  # Q is no longer read: its tile stages the output
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


# -- GLUON=2, 3, 4: a loader warp and two or three consumer warpgroups ------------------------
# The partitions take the descriptors, the shared buffers and barriers as tuples, then the
# program's scalars and constexprs (a consumer also its index).  A consumer's rows are the
# Q descriptor's block; the program's BLOCK_M is a whole number of them.  ``PERSISTENT``: a
# program a multiprocessor, each taking tiles ``pid``, ``pid + programs``, ... of the tile
# order (the 2-D grid's, or the causal groups'); the K/V ring, the turns and Q's barriers go
# on from one tile to the next, so the next tile's first blocks and Q load while the
# consumers finish this one.

@gluon.jit
def _ws_first_row(start_m, SEQ, BLOCK_M: gl.constexpr, ROWS: gl.constexpr, C: gl.constexpr,
                  RAGGED: gl.constexpr):
    """The first query row consumer ``C`` computes.  ``RAGGED`` (a sequence that is not a
    multiple of BLOCK_M): a consumer whose rows start past the sequence computes its last
    ``ROWS`` rows again, and stores nothing (:func:`_ws_store`)."""
    first = start_m * BLOCK_M + C * ROWS
    if RAGGED:
        first = gl.minimum(first, SEQ - ROWS)
    return first


@gluon.jit
def _ws_tile(t, n_m, ZH, SEQ, HEAD_GROUP: gl.constexpr):
    """(query block, first row of the head) of a persistent program's tile ``t``: the 2-D
    grid's order (a head's query blocks, then the next head's), or the causal groups'."""
    if HEAD_GROUP:
        start_m, off_hz = _causal_order(t, n_m, ZH, HEAD_GROUP)
    else:
        start_m = t % n_m
        off_hz = t // n_m
    return start_m, off_hz * SEQ


@gluon.jit
def _ws_store(o, q, o_desc, out, head_row, first_row, PERSISTENT: gl.constexpr,
              o_layout: gl.constexpr):
    """A consumer's output rows: staged in its rows of Q (no longer read) for a TMA store, or
    (``PERSISTENT``: Q's tile may hold the next tile's rows already) from registers."""
    if PERSISTENT:
        ROWS: gl.constexpr = o_desc.block_type.shape[0]
        HEAD_DIM: gl.constexpr = o_desc.block_type.shape[1]
        rows = head_row + first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        offs = gl.expand_dims(rows.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
        gl.store(out + offs, o.to(o_desc.dtype))
    else:
        q.store(o.to(o_desc.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [head_row + first_row, 0], q)
        tma.store_wait(pendings=0)


@gluon.jit
def _ws_load_q(q_desc, q_smem, q_bars, q_free, start_m, head_row, SEQ, it,
               BLOCK_M: gl.constexpr, RAGGED: gl.constexpr, PERSISTENT: gl.constexpr):
    """Every consumer's rows of Q of the program's ``it``-th tile (``PERSISTENT``: once the
    consumer is done with the previous tile's)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    for c in gl.static_range(BLOCK_M // ROWS):
        first = _ws_first_row(start_m, SEQ, BLOCK_M, ROWS, c, RAGGED)
        if PERSISTENT:  # a new barrier passes a wait for the phase before its first
            mbarrier.wait(q_free.index(c), (it & 1) ^ 1)
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [head_row + first, 0], q_bars.index(c),
                                        q_smem.index(c))


@gluon.jit
def _ws_load_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, free_bars, g, row,
                   STAGES: gl.constexpr):
    """The program's ``g``-th K/V block (rows from ``row``) into its ring stage, as soon as
    every consumer has let the stage go (a new barrier passes a wait for the phase before its
    first: the first STAGES go)."""
    stage = g % STAGES
    mbarrier.wait(free_bars.index(stage), ((g // STAGES) & 1) ^ 1)
    _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, stage, row)


@gluon.jit
def _ws_loader(descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, P_REGS: gl.constexpr, PINGPONG: gl.constexpr,
               RAGGED: gl.constexpr, PERSISTENT: gl.constexpr, HEAD_GROUP: gl.constexpr):
    """One warp: every consumer's rows of Q, then K and V of every block into the ring, each
    stage as soon as every consumer has let it go; ``PERSISTENT``, tile after tile (each
    tile's first block before its Q: that block's stage is let go before the consumers are
    done with the previous tile's Q)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, p_smem = smem
    q_bars, k_bars, v_bars, free_bars, turn_bars, q_free = bars
    if PERSISTENT:
        n_m = gl.cdiv(SEQ, BLOCK_M)
        g0 = 0
        it = 0
        for t in range(gl.program_id(0), n_m * ZH, gl.num_programs(0)):
            tile_m, tile_row = _ws_tile(t, n_m, ZH, SEQ, HEAD_GROUP)
            n_blocks = _blocks(tile_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)
            for j in range(n_blocks):
                _ws_load_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, free_bars, g0 + j,
                               tile_row + j * BLOCK_N, STAGES)
                if j == 0:
                    _ws_load_q(q_desc, q_smem, q_bars, q_free, tile_m, tile_row, SEQ, it,
                               BLOCK_M, RAGGED, PERSISTENT)
            g0 += n_blocks
            it += 1
    else:
        _ws_load_q(q_desc, q_smem, q_bars, q_free, start_m, head_row, SEQ, 0, BLOCK_M, RAGGED,
                   PERSISTENT)
        for j in range(_blocks(start_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)):
            _ws_load_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, free_bars, j,
                           head_row + j * BLOCK_N, STAGES)


@gluon.jit
def _let_go(k_bars, free_bars, g):
    """Let block ``g``'s stage go unread, once it is loaded (an arrival before the load would
    count towards the stage's previous round)."""
    STAGES: gl.constexpr = k_bars.shape[0]
    mbarrier.wait(k_bars.index(g % STAGES), (g // STAGES) & 1)
    mbarrier.arrive(free_bars.index(g % STAGES), count=1)


@gluon.jit
def _ws_consumer_tile(descs, smem, bars, out, start_m, head_row, SEQ, qk_scale, g0, it,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr, P_REGS: gl.constexpr, PINGPONG: gl.constexpr,
                      RAGGED: gl.constexpr, PERSISTENT: gl.constexpr, C: gl.constexpr):
    """Consumer ``C``'s rows of one tile (the program's ``it``-th, whose first block is the
    program's ``g0``-th): softmax and both products over the K/V blocks they read.  Causal
    with BLOCK_N < BLOCK_M, its rows may end blocks before the program's: it computes up to
    its own diagonal, then only lets the later blocks go."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, p_smem = smem
    q_bars, k_bars, v_bars, free_bars, turn_bars, q_free = bars
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    q = q_smem.index(C)
    first_row = _ws_first_row(start_m, SEQ, BLOCK_M, ROWS, C, RAGGED)
    n_blocks = _blocks(start_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)
    mine = n_blocks
    if CAUSAL:
        if BLOCK_N < BLOCK_M:
            mine = gl.cdiv(first_row + ROWS, BLOCK_N)

    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))

    mbarrier.wait(q_bars.index(C), it & 1)
    p, alpha, m_i, l_i = _first_block(q, k_smem, k_bars, p_smem, 2 * C, zero_s, m_i, l_i,
                                      qk_scale, first_row, turn_bars, g0, ROWS, BLOCK_N, STAGES,
                                      CAUSAL, P_REGS, C, PINGPONG, s_layout)
    gl.thread_barrier()  # of this partition's warps only
    for j in range(1, mine):
        p, acc, alpha, m_i, l_i = _next_block(j, g0, q, k_smem, v_smem, k_bars, v_bars, p_smem,
                                              2 * C, zero_s, p, acc, alpha, m_i, l_i, qk_scale,
                                              first_row, turn_bars, ROWS, BLOCK_N, STAGES,
                                              CAUSAL, P_REGS, C, PINGPONG, s_layout, o_layout)
        mbarrier.arrive(free_bars.index((g0 + j - 1) % STAGES), count=1)
        gl.thread_barrier()
    if PERSISTENT:  # every score is computed: the loader may bring the next tile's Q
        mbarrier.arrive(q_free.index(C), count=1)
    o = _last_product(mine - 1, g0, v_smem, v_bars, p_smem, 2 * C, p, acc, alpha, l_i, STAGES,
                      P_REGS, o_layout)
    if PERSISTENT:  # the loader goes on into the next tile: every stage is let go
        mbarrier.arrive(free_bars.index((g0 + mine - 1) % STAGES), count=1)
    if CAUSAL:
        if BLOCK_N < BLOCK_M:
            # the program's blocks past its rows: it gives up its turn at once and lets each
            # block go once it is loaded; a single tile's loader waits for no block past
            # n_blocks - 1 - STAGES
            if not PERSISTENT:
                if mine - 1 < n_blocks - STAGES:
                    mbarrier.arrive(free_bars.index((mine - 1) % STAGES), count=1)
            for j in range(mine, n_blocks):
                _my_turn(turn_bars, g0 + j, C, PINGPONG)
                _your_turn(turn_bars, C, PINGPONG)
                if PERSISTENT:
                    _let_go(k_bars, free_bars, g0 + j)
                elif j < n_blocks - STAGES:
                    _let_go(k_bars, free_bars, j)
    if RAGGED:
        if start_m * BLOCK_M + C * ROWS < SEQ:
            _ws_store(o, q, o_desc, out, head_row, first_row, PERSISTENT, o_layout)
    else:
        _ws_store(o, q, o_desc, out, head_row, first_row, PERSISTENT, o_layout)


@gluon.jit
def _ws_consumer(descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 CAUSAL: gl.constexpr, P_REGS: gl.constexpr, PINGPONG: gl.constexpr,
                 RAGGED: gl.constexpr, PERSISTENT: gl.constexpr, HEAD_GROUP: gl.constexpr,
                 C: gl.constexpr):
    """One warpgroup: its ``ROWS`` query rows of the program's tile, or (``PERSISTENT``) of
    each of its tiles in turn (:func:`_ws_consumer_tile`)."""
    if PERSISTENT:
        n_m = gl.cdiv(SEQ, BLOCK_M)
        g0 = 0
        it = 0
        for t in range(gl.program_id(0), n_m * ZH, gl.num_programs(0)):
            tile_m, tile_row = _ws_tile(t, n_m, ZH, SEQ, HEAD_GROUP)
            _ws_consumer_tile(descs, smem, bars, out, tile_m, tile_row, SEQ, qk_scale, g0, it,
                              BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                              PERSISTENT, C)
            g0 += _blocks(tile_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)
            it += 1
    else:
        _ws_consumer_tile(descs, smem, bars, out, start_m, head_row, SEQ, qk_scale, 0, 0,
                          BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                          PERSISTENT, C)


@gluon.jit
def gluon_attention_ws_kernel(q_desc, k_desc, v_desc, o_desc, qk_scale, SEQ, out, ZH,
                              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                              BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                              CAUSAL: gl.constexpr, P_REGS: gl.constexpr,
                              PINGPONG: gl.constexpr, RAGGED: gl.constexpr,
                              CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
                              HEAD_GROUP: gl.constexpr, PERSISTENT: gl.constexpr):
    """``GLUON=2``, ``3``, ``4``: BLOCK_M queries of one (batch, head) a tile, as two or three
    consumer warpgroups of the Q descriptor's block of rows (the default partition of 4 warps
    and workers of 4) and a loader warp; a tile a program, or (``PERSISTENT``) a program a
    multiprocessor that takes tile after tile.  No barrier spans the program inside the loop:
    a consumer waits for its own MMAs, the loader and (``PINGPONG``) its turn, and lets a K/V
    stage go by arriving on its barrier (one arrival a consumer frees it).  ``q_desc`` and
    ``o_desc`` are of BLOCK_M / 2 or BLOCK_M / 3 rows; ``out`` is the output (the persistent
    kernel stores through it), ``ZH`` batch times heads."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    CONSUMERS: gl.constexpr = BLOCK_M // ROWS
    if PERSISTENT:  # not read: the partitions take their tiles
        start_m = gl.program_id(0)
        head_row = start_m * SEQ
    elif HEAD_GROUP:
        n_m = gl.cdiv(SEQ, BLOCK_M)
        start_m, off_hz = _causal_order(gl.program_id(0), n_m, gl.num_programs(0) // n_m,
                                        HEAD_GROUP)
        head_row = off_hz * SEQ
    else:  # not causal: a 2-D grid
        start_m = gl.program_id(0)
        head_row = gl.program_id(1) * SEQ

    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    if P_REGS:  # not read: a placeholder the partitions' signatures take
        p_smem = gl.allocate_shared_memory(
            dtype, [1, ROWS, 16], gl.NVMMASharedLayout.get_default_for([ROWS, 16], dtype))
    else:  # two a consumer
        p_smem = gl.allocate_shared_memory(
            dtype, [2 * CONSUMERS, ROWS, BLOCK_N],
            gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], dtype))
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turn_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(free_bars.index(i), count=CONSUMERS)
    if PERSISTENT:  # a consumer is done with its rows of Q
        q_free = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(q_free.index(i), count=1)
    else:  # not waited on: a placeholder the partitions' signatures take
        q_free = q_bars

    descs = (q_desc, k_desc, v_desc, o_desc)
    smem = (q_smem, k_smem, v_smem, p_smem)
    bars = (q_bars, k_bars, v_bars, free_bars, turn_bars, q_free)
    # the argument tuples are written out: a tuple assigned to a name would turn the
    # constexprs in it into tensors
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_ws_consumer, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                            BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                            PERSISTENT, HEAD_GROUP, 0)),
            (_ws_consumer, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                            BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                            PERSISTENT, HEAD_GROUP, 1)),
            (_ws_consumer, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                            BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                            PERSISTENT, HEAD_GROUP, 2)),
            (_ws_loader, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                          BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                          PERSISTENT, HEAD_GROUP)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_ws_consumer, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                            BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                            PERSISTENT, HEAD_GROUP, 0)),
            (_ws_consumer, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                            BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                            PERSISTENT, HEAD_GROUP, 1)),
            (_ws_loader, (descs, smem, bars, out, start_m, head_row, SEQ, ZH, qk_scale,
                          BLOCK_M, BLOCK_N, STAGES, CAUSAL, P_REGS, PINGPONG, RAGGED,
                          PERSISTENT, HEAD_GROUP)),
        ], [4, 1], [CONSUMER_REGS, 24])
