"""rms_norm: ``y = x * rsqrt(mean(x**2) + eps) * w`` over the last dim of an M×N matrix
(Llama's RMSNorm, eps 1e-6), fp32 math, the result in the input dtype."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.cards import Card
from harness.kinds.base import (
    DTYPE_BYTES,
    EVICT,
    Kind,
    Knobs,
    Launch,
    Shape,
    next_pow2,
    random_normal,
    torch_dtype,
)

EPS = 1e-6


class RmsNorm(Kind):
    name = "rms_norm"
    fields = ("M", "N", "dtype")
    monotone = ("EVICT",)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_N": [16, 32, 64], "ROWS": [1, 2, 4], "ONE_PASS": [0, 1],
                    "num_warps": [1], "num_stages": [1, 2]}
        top = min(next_pow2(shape["N"]), 16384)
        blocks = [b for b in (128, 256, 512, 1024, 2048, 4096, 8192, 16384) if b <= top]
        return {"BLOCK_N": blocks or [top], "ROWS": [1, 2, 4, 8, 16], "ONE_PASS": [0, 1],
                "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3], "EVICT": EVICT}

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bn, rows, warps, stages = (knobs["BLOCK_N"], knobs["ROWS"], knobs["num_warps"],
                                   knobs["num_stages"])
        m, n = shape["M"], shape["N"]
        if rows > max(1, next_pow2(m)):
            return "more rows per program than the problem has"
        if bn > max(16, next_pow2(n)):
            return "block wider than the row"
        if knobs["ONE_PASS"]:
            if bn < n:
                return "one pass needs the whole row in one block"
            if stages > 1:
                return "a single pass has no loop to pipeline"
        elif stages > 1 and bn >= n:
            return "one block per row has no loop to pipeline"
        if self.is_interpret(card):
            return None
        if warps * card.warp_size > card.max_threads_per_block:
            return f"{warps} warps exceed {card.max_threads_per_block} threads per block"
        per_thread = rows * bn // (32 * warps)
        # one pass holds the row tile; the loop holds its fp32 accumulator plus the tile loaded
        live = per_thread if knobs["ONE_PASS"] else 2 * per_thread
        if live > 128:
            return f"{live} live values per thread exceed the register file"
        if per_thread < 1:
            return "more threads than elements"
        # Triton stages none of these loads through shared memory (an H200 compile showed at
        # most 4 KiB for any spec): only the cross-warp reduction scratch, bounded here, which
        # binds on no catalog card.  Registers and threads decide realizability.
        smem = 32 * rows * warps
        if smem > card.smem_optin:
            return f"reduction scratch {smem} B > shared memory opt-in {card.smem_optin} B"
        return None

    def flops(self, shape: Shape) -> float:
        return 4.0 * shape["M"] * shape["N"]

    def bytes(self, shape: Shape) -> float:
        e = DTYPE_BYTES[shape["dtype"]]
        return float(e * (2 * shape["M"] * shape["N"] + shape["N"]))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (1e-5, 1e-4), "fp16": (4e-3, 1e-2), "bf16": (2e-2, 2e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        dt = torch_dtype(shape["dtype"])
        x = (randn(shape["M"], shape["N"]) * 2).to(device=device, dtype=dt)
        w = (1 + 0.1 * randn(shape["N"])).to(device=device, dtype=dt)
        return {"x": x, "w": w, "out": torch.empty_like(x)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        x = inputs["x"].float()
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * inputs["w"].float()
        return y.to(inputs["x"].dtype)

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        return torch.nn.functional.rms_norm(inputs["x"], (shape["N"],), inputs["w"], EPS)

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        from harness.kinds._rms_norm_triton import rms_norm_kernel

        x, w, out = inputs["x"], inputs["w"], inputs["out"]
        m, n = shape["M"], shape["N"]
        rows = knobs["ROWS"]
        grid = (-(-m // rows),)

        def launch() -> Any:
            return rms_norm_kernel[grid](x, w, out, m, n, EPS, x.stride(0), out.stride(0),
                                         BLOCK_N=knobs["BLOCK_N"], ROWS=rows,
                                         ONE_PASS=knobs["ONE_PASS"],
                                         EVICT=knobs.get("EVICT", 0),
                                         num_warps=knobs["num_warps"],
                                         num_stages=knobs["num_stages"])

        return Launch(run=launch, out=out)


KIND = RmsNorm()
