"""The Triton flash-attention forward kernel (imported only on the box).

``TMA`` (compute capability 9.0 and later): Q, K, V and the output move through tensor
descriptors over the ``[batch * heads, seq, head_dim]`` view, so the copy engine fills the
tiles (rows past the sequence read as zeros and are never written) and no load needs a mask.

``HEAD_GROUP`` (causal; ``head_group`` in harness/kinds/attention.py): the grid is 1-D, its
heads in groups of that many, each group's programs the longest rows first across its heads.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend(acc, l_i, m_i, q, k_src, v_src, off_hz, offs_m, offs_n0, offs_d, lo, hi, SEQ,
            qk_scale, stride_kn, stride_vn, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr):
    """Fold key/value blocks ``[lo, hi)`` into the running (acc, l_i, m_i) online softmax.
    ``k_src``/``v_src`` are tensor descriptors (TMA) or the head's base pointers."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        if TMA:
            k = tl.trans(k_src.load([off_hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))
            v = v_src.load([off_hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        elif MASKED:
            kmask = offs_n < SEQ
            k = tl.load(k_src + offs_n[None, :] * stride_kn + offs_d[:, None],
                        mask=kmask[None, :], other=0.0)
            v = tl.load(v_src + offs_n[:, None] * stride_vn + offs_d[None, :],
                        mask=kmask[:, None], other=0.0)
        else:
            k = tl.load(k_src + offs_n[None, :] * stride_kn + offs_d[:, None])
            v = tl.load(v_src + offs_n[:, None] * stride_vn + offs_d[None, :])
        qk = tl.dot(q, k)
        if MASKED:
            valid = offs_n[None, :] < SEQ
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            qk = tl.where(valid, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_new[:, None]
        else:
            # the scale folds into the subtraction (one fused multiply-add per score)
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_new[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def block_bounds(start_m, SEQ, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr):
    """(full_hi, end) of query block ``start_m``: key blocks ``[0, full_hi)`` lie wholly inside
    the sequence (and, if causal, wholly below the diagonal) and run without masks; the rest,
    ``[full_hi, end)`` (the diagonal band, the ragged end), are masked."""
    if CAUSAL:
        full_hi = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
        end = tl.minimum((start_m + 1) * BLOCK_M, SEQ)
    else:
        full_hi = SEQ // BLOCK_N * BLOCK_N
        end = SEQ
    return full_hi, end


@triton.jit
def causal_order(pid, n_m, ZH, GROUP: tl.constexpr):
    """(query block, batch * heads index) of program ``pid`` of a 1-D causal grid: the heads
    in groups of ``GROUP``, each group's programs the longest rows first across its heads."""
    per = n_m * GROUP
    g = pid // per
    r = pid - g * per
    size = tl.minimum(GROUP, ZH - g * GROUP)
    return n_m - 1 - r // size, g * GROUP + r % size


@triton.jit
def attention_kernel(q_src, k_src, v_src, o_src, sm_scale, H, SEQ,
                     stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                     stride_vz, stride_vh, stride_vn, stride_oz, stride_oh, stride_om,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, TMA: tl.constexpr, HEAD_GROUP: tl.constexpr):
    """One program: BLOCK_M queries of one (batch, head); the last dim is contiguous.
    The ``*_src`` are tensor descriptors of the ``[batch * heads, seq, head_dim]`` views when
    TMA, else the tensors' pointers.  ``HEAD_GROUP`` 0 (not causal): a 2-D grid (query
    blocks, batch * heads)."""
    if HEAD_GROUP:
        n_m = tl.cdiv(SEQ, BLOCK_M)
        start_m, off_hz = causal_order(tl.program_id(0), n_m, tl.num_programs(0) // n_m,
                                       HEAD_GROUP)
    else:
        start_m = tl.program_id(0)
        off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        k_base = k_src
        v_base = v_src
        q = q_src.load([off_hz, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    else:
        q_base = q_src + off_z * stride_qz + off_h * stride_qh
        k_base = k_src + off_z * stride_kz + off_h * stride_kh
        v_base = v_src + off_z * stride_vz + off_h * stride_vh
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=offs_m[:, None] < SEQ, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # exp2 instead of exp
    full_hi, end = block_bounds(start_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, off_hz, offs_m, offs_n0, offs_d,
                            0, full_hi, SEQ, qk_scale, stride_kn, stride_vn,
                            HEAD_DIM, BLOCK_N, False, CAUSAL, TMA)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, off_hz, offs_m, offs_n0, offs_d,
                            full_hi, end, SEQ, qk_scale, stride_kn, stride_vn,
                            HEAD_DIM, BLOCK_N, True, CAUSAL, TMA)
    o = (acc / l_i[:, None]).to(q.dtype)
    if TMA:
        o_src.store([off_hz, start_m * BLOCK_M, 0], o.reshape(1, BLOCK_M, HEAD_DIM))
    else:
        o_base = o_src + off_z * stride_oz + off_h * stride_oh
        tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], o,
                 mask=offs_m[:, None] < SEQ)
