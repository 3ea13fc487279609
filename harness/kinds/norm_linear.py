"""norm_linear: an RMSNorm fused into the linear that follows it (Llama's input norm + QKV
projection, final norm + LM head): ``out = rmsnorm(x, w_norm) @ W.T`` with x M×K, W N×K.

Three schemes, chosen by the ``PROLOGUE`` knob, all on the GEMM template: 1 computes each
row's rstd in a first pass over K and feeds the normalized rows to the dot; 0 feeds
``x * w_norm`` while summing ``x**2`` and scales the accumulator by rstd at the end; 2
normalizes the rows into a workspace in one pass of their own, then runs the plain GEMM (each
row normalized once rather than once per N tile: the scheme for large M)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.cards import Card
from harness.kinds.base import (
    DTYPE_BYTES,
    GEMM_HOPPER,
    Kind,
    Knobs,
    Launch,
    Shape,
    gemm_launch,
    gemm_path_misfit,
    gemm_smem,
    gemm_space,
    gemm_tile_misfit,
    next_pow2,
    random_normal,
    torch_dtype,
)

EPS = 1e-6


class NormLinear(Kind):
    name = "norm_linear"
    fields = ("M", "N", "K", "dtype")
    monotone = (*GEMM_HOPPER, "GLUON")
    path_knobs = ("GLUON",)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_M": [16, 32], "BLOCK_N": [16, 32], "BLOCK_K": [16, 32],
                    "GROUP_M": [1, 2], "PROLOGUE": [0, 1, 2], "num_warps": [1],
                    "num_stages": [1]}
        return gemm_space(card, {"PROLOGUE": [0, 1, 2]}, gluon=True)

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
        warps, stages = knobs["num_warps"], knobs["num_stages"]
        if knobs.get("GLUON", 0) and knobs["PROLOGUE"] != 2:
            return "the Gluon GEMM runs the workspace scheme only (PROLOGUE=2)"
        if why := gemm_path_misfit(knobs, shape, card) or gemm_tile_misfit(knobs, shape):
            return why
        if self.is_interpret(card):
            return None
        smem = gemm_smem(knobs, shape) + stages * bk * DTYPE_BYTES[shape["dtype"]]
        if smem > card.smem_optin:
            return f"shared memory {smem} B > opt-in {card.smem_optin} B"
        # fp32 accumulator (plus, when the norm is fused into the main loop, the running
        # sum of squares) per thread; past ~128 the kernel spills heavily
        acc_regs = bm * bn // (32 * warps)
        live = acc_regs + (0 if knobs["PROLOGUE"] else bm * bk // (32 * warps))
        if live > 128:
            return f"accumulators need {live} registers per thread"
        if acc_regs < 4:
            return "fewer than 4 accumulator elements per thread"
        return None

    def flops(self, shape: Shape) -> float:
        m, n, k = shape["M"], shape["N"], shape["K"]
        return 2.0 * m * n * k + 4.0 * m * k

    def bytes(self, shape: Shape) -> float:
        e = DTYPE_BYTES[shape["dtype"]]
        m, n, k = shape["M"], shape["N"], shape["K"]
        return float(e * (m * k + k + n * k + m * n))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (5e-3, 5e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 3e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        m, n, k, dt = shape["M"], shape["N"], shape["K"], torch_dtype(shape["dtype"])
        # the normalized rows have unit RMS, so W ~ K**-0.5 gives outputs of order one
        x = (randn(m, k) * 3).to(device=device, dtype=dt)
        wn = (1 + 0.1 * randn(k)).to(device=device, dtype=dt)
        w = (randn(n, k) * k ** -0.5).to(device=device, dtype=dt)
        return {"x": x, "w_norm": wn, "w": w, "out": torch.empty(m, n, device=device, dtype=dt)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        x = inputs["x"].float()
        xn = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * inputs["w_norm"].float()
        return xn.to(inputs["x"].dtype) @ inputs["w"].T

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        f = torch.nn.functional
        return f.linear(f.rms_norm(inputs["x"], (shape["K"],), inputs["w_norm"], EPS),
                        inputs["w"])

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        x, wn, w, out = inputs["x"], inputs["w_norm"], inputs["w"], inputs["out"]
        if knobs["PROLOGUE"] == 2:
            return self._normalized_first(knobs, shape, x, wn, w, out)
        # PROLOGUE=1: rstd first, then the normalized rows (the template's prologue 1);
        # PROLOGUE=0: rstd folded into the epilogue (the template's prologue 2)
        launch = gemm_launch(knobs, x, w, out, wn=wn, prologue=1 if knobs["PROLOGUE"] else 2,
                             eps=EPS)
        return Launch(run=launch, out=out)

    @staticmethod
    def _normalized_first(knobs: Knobs, shape: Shape, x: Any, wn: Any, w: Any,
                          out: Any) -> Launch:
        """PROLOGUE=2: one pass normalizes the rows into a workspace, then the plain GEMM
        reads them: each row is normalized once, not once per N tile, and the GEMM's A
        operand goes from shared memory straight to the tensor cores."""
        import torch

        from harness.kinds._rms_norm_triton import rms_norm_kernel

        m, k = shape["M"], shape["K"]
        xn = torch.empty_like(x)
        block = min(next_pow2(k), 8192)
        gemm = gemm_launch(knobs, xn, w, out)

        def launch() -> Any:
            rms_norm_kernel[(m,)](x, wn, xn, m, k, EPS, x.stride(0), xn.stride(0),
                                  BLOCK_N=block, ROWS=1, ONE_PASS=int(block >= k),
                                  num_warps=8 if block >= 4096 else 4)
            return gemm()

        return Launch(run=launch, out=out)


KIND = NormLinear()
