"""The Triton flash-attention forward kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n0, offs_d, lo, hi, SEQ, qk_scale,
            stride_kn, stride_vn, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
            CAUSAL: tl.constexpr):
    """Fold key/value blocks ``[lo, hi)`` into the running (acc, l_i, m_i) online softmax."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        if MASKED:
            kmask = offs_n < SEQ
            k = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None],
                        mask=kmask[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :],
                        mask=kmask[:, None], other=0.0)
        else:
            k = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None])
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :])
        qk = tl.dot(q, k) * qk_scale
        if MASKED:
            valid = kmask[None, :]
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, H, SEQ,
                     stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                     stride_vz, stride_vh, stride_vn, stride_oz, stride_oh, stride_om,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr):
    """One program: BLOCK_M queries of one (batch, head); the last dim is contiguous."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    q_base = q_ptr + off_z * stride_qz + off_h * stride_qh
    k_base = k_ptr + off_z * stride_kz + off_h * stride_kh
    v_base = v_ptr + off_z * stride_vz + off_h * stride_vh
    o_base = o_ptr + off_z * stride_oz + off_h * stride_oh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=offs_m[:, None] < SEQ, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # exp2 instead of exp
    # Blocks wholly inside the sequence (and, if causal, wholly below the diagonal) run
    # without masks; the rest (the diagonal band, the ragged end) are masked.
    if CAUSAL:
        full_hi = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
        end = tl.minimum((start_m + 1) * BLOCK_M, SEQ)
    else:
        full_hi = SEQ // BLOCK_N * BLOCK_N
        end = SEQ
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n0, offs_d,
                            0, full_hi, SEQ, qk_scale, stride_kn, stride_vn,
                            BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n0, offs_d,
                            full_hi, end, SEQ, qk_scale, stride_kn, stride_vn,
                            BLOCK_N, True, CAUSAL)
    o = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < SEQ)
