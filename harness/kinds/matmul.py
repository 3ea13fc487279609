"""matmul: ``C = A @ W.T`` as in a linear layer (A is M×K, W is N×K), fp32 accumulation."""

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
    random_normal,
    torch_dtype,
)


class Matmul(Kind):
    name = "matmul"
    fields = ("M", "N", "K", "dtype")
    monotone = (*GEMM_HOPPER, "GLUON")
    path_knobs = ("GLUON",)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_M": [16, 32], "BLOCK_N": [16, 32], "BLOCK_K": [16, 32],
                    "GROUP_M": [1, 4], "num_warps": [1, 2], "num_stages": [1, 2]}
        return gemm_space(card, gluon=True)

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bm, bn, warps = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["num_warps"]
        if why := gemm_path_misfit(knobs, shape, card) or gemm_tile_misfit(knobs, shape):
            return why
        if self.is_interpret(card):
            return None
        smem = gemm_smem(knobs, shape)
        if smem > card.smem_optin:
            return f"shared memory {smem} B > opt-in {card.smem_optin} B"
        # fp32 accumulator registers per thread; past ~128 the kernel spills heavily
        acc_regs = bm * bn // (32 * warps)
        if acc_regs > 128:
            return f"accumulator needs {acc_regs} registers per thread"
        if acc_regs < 4:
            return "fewer than 4 accumulator elements per thread"
        return None

    def flops(self, shape: Shape) -> float:
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes(self, shape: Shape) -> float:
        e = DTYPE_BYTES[shape["dtype"]]
        return float(e * (shape["M"] * shape["K"] + shape["N"] * shape["K"] + shape["M"] * shape["N"]))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (1e-3, 1e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 3e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        m, n, k, dt = shape["M"], shape["N"], shape["K"], torch_dtype(shape["dtype"])
        scale = k ** -0.25  # outputs of order one, so one tolerance fits every K
        a = (randn(m, k) * scale).to(device=device, dtype=dt)
        w = (randn(n, k) * scale).to(device=device, dtype=dt)
        return {"a": a, "w": w, "out": torch.empty(m, n, device=device, dtype=dt)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        return inputs["a"] @ inputs["w"].T

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        return torch.nn.functional.linear(inputs["a"], inputs["w"])

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        out = inputs["out"]
        return Launch(run=gemm_launch(knobs, inputs["a"], inputs["w"], out), out=out)


KIND = Matmul()
