"""mlp_geglu: the gate and up projections of a gated MLP with GELU gating fused into one
kernel: ``out = gelu_tanh(x @ Wg.T) * (x @ Wu.T)`` (x M×K, Wg and Wu N×K, out M×N)."""

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


class MlpGeglu(Kind):
    name = "mlp_geglu"
    fields = ("M", "N", "K", "dtype")
    monotone = tuple(GEMM_HOPPER)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_M": [16, 32], "BLOCK_N": [16, 32], "BLOCK_K": [16, 32],
                    "GROUP_M": [1, 2], "num_warps": [1, 2], "num_stages": [1]}
        return gemm_space(card)

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bm, bn, warps = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["num_warps"]
        if why := gemm_path_misfit(knobs, shape, card) or gemm_tile_misfit(knobs, shape):
            return why
        if self.is_interpret(card):
            return None
        smem = gemm_smem(knobs, shape, b_tiles=2)  # an x tile and two weight tiles
        if smem > card.smem_optin:
            return f"shared memory {smem} B > opt-in {card.smem_optin} B"
        acc_regs = 2 * bm * bn // (32 * warps)  # gate and up accumulators, fp32
        if acc_regs > 128:
            return f"accumulators need {acc_regs} registers per thread"
        if acc_regs < 8:
            return "fewer than 4 elements per accumulator per thread"
        return None

    def flops(self, shape: Shape) -> float:
        m, n, k = shape["M"], shape["N"], shape["K"]
        return 4.0 * m * n * k + 10.0 * m * n

    def bytes(self, shape: Shape) -> float:
        e = DTYPE_BYTES[shape["dtype"]]
        m, n, k = shape["M"], shape["N"], shape["K"]
        return float(e * (m * k + 2 * n * k + m * n))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (5e-3, 5e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 3e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        m, n, k, dt = shape["M"], shape["N"], shape["K"], torch_dtype(shape["dtype"])
        scale = k ** -0.25  # gate and up of order one
        x = (randn(m, k) * scale).to(device=device, dtype=dt)
        wg = (randn(n, k) * scale).to(device=device, dtype=dt)
        wu = (randn(n, k) * scale).to(device=device, dtype=dt)
        return {"x": x, "w_gate": wg, "w_up": wu,
                "out": torch.empty(m, n, device=device, dtype=dt)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        x = inputs["x"]
        gate = (x @ inputs["w_gate"].T).float()
        up = (x @ inputs["w_up"].T).float()
        return (torch.nn.functional.gelu(gate, approximate="tanh") * up).to(x.dtype)

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        f = torch.nn.functional
        x = inputs["x"]
        return f.gelu(f.linear(x, inputs["w_gate"]), approximate="tanh") * f.linear(
            x, inputs["w_up"])

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        out = inputs["out"]
        launch = gemm_launch(knobs, inputs["x"], inputs["w_gate"], out, b2=inputs["w_up"],
                             epilogue=1)
        return Launch(run=launch, out=out)


KIND = MlpGeglu()
