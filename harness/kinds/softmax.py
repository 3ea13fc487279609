"""softmax: row-wise softmax of an M×N matrix (attention scores, vocabulary logits).

A row is handled by one program (``SPLIT=1``) or by ``SPLIT`` programs that each take a
contiguous chunk of it: a first launch writes each chunk's running max and sum of exponentials
to an fp32 workspace, a second folds a row's partials and writes its chunk (decode shapes, a
few rows of a vocabulary, have too few rows to fill the GPU one program per row).
"""

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
    cdiv,
    next_pow2,
    random_normal,
    split_chunk,
    torch_dtype,
)


class Softmax(Kind):
    name = "softmax"
    fields = ("M", "N", "dtype")
    monotone = ("EVICT",)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_N": [16, 32, 64], "ROWS": [1, 2], "ONE_PASS": [0, 1], "SPLIT": [1, 2],
                    "num_warps": [1], "num_stages": [1]}
        top = min(next_pow2(shape["N"]), 32768)
        blocks = [b for b in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if b <= top]
        return {"BLOCK_N": blocks or [top], "ROWS": [1, 2, 4, 8], "ONE_PASS": [0, 1],
                "SPLIT": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8, 16],
                "num_stages": [1, 2, 3], "EVICT": EVICT}

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bn, rows, warps = knobs["BLOCK_N"], knobs["ROWS"], knobs["num_warps"]
        if knobs["ONE_PASS"] and bn < shape["N"]:
            return "one pass needs the whole row in one block"
        if knobs["ONE_PASS"] and knobs["num_stages"] > 1:
            return "a single pass has no loop to pipeline"
        if rows > max(1, next_pow2(shape["M"])):
            return "more rows per program than the problem has"
        split = knobs.get("SPLIT", 1)
        if split > 1:
            if knobs["ONE_PASS"]:
                return "one pass holds the whole row in one program"
            chunk, used = split_chunk(shape["N"], bn, split)
            if used < split:
                return (f"SPLIT={split} leaves {split - used} of its programs no columns "
                        f"(a program takes whole blocks of BLOCK_N={bn})")
            if knobs["num_stages"] > 1 and chunk <= bn:
                return "one block per program has no loop to pipeline"
        if self.is_interpret(card):
            return None
        if split > 1 and cdiv(shape["M"], rows) >= card.sm_count:
            return f"{cdiv(shape['M'], rows)} row programs already fill the {card.sm_count} SMs"
        per_thread = rows * bn // (32 * warps)
        if per_thread > 128:
            return f"{per_thread} elements per thread exceed the register file"
        if per_thread < 1:
            return "more threads than elements"
        return None

    def flops(self, shape: Shape) -> float:
        return 5.0 * shape["M"] * shape["N"]

    def bytes(self, shape: Shape) -> float:
        return 2.0 * DTYPE_BYTES[shape["dtype"]] * shape["M"] * shape["N"]

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (1e-5, 1e-4), "fp16": (2e-3, 1e-2), "bf16": (4e-3, 2e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        x = (randn(shape["M"], shape["N"]) * 3).to(
            device=device, dtype=torch_dtype(shape["dtype"]))
        return {"x": x, "out": torch.empty_like(x)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        return torch.softmax(inputs["x"].float(), dim=-1).to(inputs["x"].dtype)

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        return torch.softmax(inputs["x"], dim=-1)

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        from harness.kinds._softmax_triton import softmax_kernel

        if knobs.get("SPLIT", 1) > 1:
            return self._prepare_split(knobs, shape, inputs)
        x, out = inputs["x"], inputs["out"]
        m, n = shape["M"], shape["N"]
        rows = knobs["ROWS"]
        grid = (-(-m // rows),)

        def launch() -> Any:
            return softmax_kernel[grid](x, out, m, n, x.stride(0), out.stride(0),
                                 BLOCK_N=knobs["BLOCK_N"], ROWS=rows, ONE_PASS=knobs["ONE_PASS"],
                                 EVICT=knobs.get("EVICT", 0),
                                 num_warps=knobs["num_warps"], num_stages=knobs["num_stages"])

        return Launch(run=launch, out=out)

    def _prepare_split(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        import torch

        from harness.kinds._softmax_triton import softmax_partials, softmax_write

        x, out = inputs["x"], inputs["out"]
        m, n = shape["M"], shape["N"]
        bn, rows, evict = knobs["BLOCK_N"], knobs["ROWS"], knobs.get("EVICT", 0)
        chunk, used = split_chunk(n, bn, knobs["SPLIT"])
        part = torch.empty(m, used, 2, device=x.device, dtype=torch.float32)
        grid = (cdiv(m, rows), used)
        launch_knobs = {"num_warps": knobs["num_warps"], "num_stages": knobs["num_stages"]}

        def launch() -> Any:
            handle = softmax_partials[grid](x, part, m, n, x.stride(0), chunk, used,
                                            BLOCK_N=bn, ROWS=rows, EVICT=evict, **launch_knobs)
            softmax_write[grid](x, out, part, m, n, x.stride(0), out.stride(0), chunk, used,
                                BLOCK_N=bn, ROWS=rows, SPLIT_P2=next_pow2(used), EVICT=evict,
                                **launch_knobs)
            return handle

        return Launch(run=launch, out=out)


KIND = Softmax()
