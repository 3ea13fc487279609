"""The Triton GeGLU gate/up projection kernel (imported only on the box)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mlp_geglu_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K,
                     stride_xm, stride_xk, stride_wk, stride_wn, stride_om, stride_on,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """``gelu_tanh(x @ Wg.T) * (x @ Wu.T)`` for one tile: each x tile feeds both dots."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + offs_am[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_offs = offs_k[:, None] * stride_wk + offs_bn[None, :] * stride_wn
    g_ptrs = wg_ptr + w_offs
    u_ptrs = wu_ptr + w_offs
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        bg = tl.load(g_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        bu = tl.load(u_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc_g = tl.dot(a, bg, acc_g)
        acc_u = tl.dot(a, bu, acc_u)
        a_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk
    # the gate and up outputs round to the output dtype first, as two separate linears do;
    # gelu_tanh(g) = g * sigmoid(2 * sqrt(2 / pi) * (g + 0.044715 g**3))
    g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)
    u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
    h = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g)) * u
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = out_ptr + offs_cm[:, None] * stride_om + offs_cn[None, :] * stride_on
    tl.store(c_ptrs, h.to(out_ptr.dtype.element_ty),
             mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
