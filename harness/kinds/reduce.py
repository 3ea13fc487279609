"""reduce: one value per row of an M×N matrix (``op`` sum, mean, max, min or sumsq), fp32
accumulation, the result in the input dtype.

A row is reduced by one program (``SPLIT=1``) or by ``SPLIT`` programs that each reduce a
contiguous chunk of it into an fp32 workspace, which a second, tiny launch of the same kernel
folds (the split-K of reductions: decode shapes have too few rows to fill the GPU).
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

OPS = ("sum", "mean", "max", "min", "sumsq")
# op -> (kernel OP code: 0 sum, 1 max, 2 min; square the inputs first)
_CODES = {"sum": (0, False), "mean": (0, False), "max": (1, False), "min": (2, False),
          "sumsq": (0, True)}


class Reduce(Kind):
    name = "reduce"
    fields = ("M", "N", "op", "dtype")
    monotone = ("EVICT",)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_N": [16, 32, 128], "ROWS": [1, 4], "SPLIT": [1, 4],
                    "num_warps": [1], "num_stages": [1, 2]}
        top = min(next_pow2(shape["N"]), 16384)
        blocks = [b for b in (128, 256, 512, 1024, 2048, 4096, 8192, 16384) if b <= top]
        return {"BLOCK_N": blocks or [top], "ROWS": [1, 2, 4, 8, 16],
                "SPLIT": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8, 16],
                "num_stages": [1, 2, 3], "EVICT": EVICT}

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bn, rows, split = knobs["BLOCK_N"], knobs["ROWS"], knobs["SPLIT"]
        warps, stages = knobs["num_warps"], knobs["num_stages"]
        m, n = shape["M"], shape["N"]
        if shape["op"] not in OPS:
            return f"op {shape['op']!r} is not one of {', '.join(OPS)}"
        if rows > max(1, next_pow2(m)):
            return "more rows per program than the problem has"
        if bn > max(16, next_pow2(n)):
            return "block wider than the row"
        chunk, used = split_chunk(n, bn, split)
        if used < split:
            return (f"SPLIT={split} leaves {split - used} of its programs no columns "
                    f"(a program takes whole blocks of BLOCK_N={bn})")
        if stages > 1 and chunk <= bn:
            return "one block per program has no loop to pipeline"
        if self.is_interpret(card):
            return None
        if warps * card.warp_size > card.max_threads_per_block:
            return f"{warps} warps exceed {card.max_threads_per_block} threads per block"
        per_thread = rows * bn // (32 * warps)
        # the running (ROWS, BLOCK_N) fp32 tile plus the tile being loaded live in registers
        if 2 * per_thread > 128:
            return f"{per_thread} elements per thread (twice that in registers) exceed the register file"
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
        return (2.0 if shape["op"] == "sumsq" else 1.0) * shape["M"] * shape["N"]

    def bytes(self, shape: Shape) -> float:
        return float(DTYPE_BYTES[shape["dtype"]] * shape["M"] * (shape["N"] + 1))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (1e-4, 1e-4), "fp16": (2e-3, 4e-3), "bf16": (1e-2, 1e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        m, n, op = shape["M"], shape["N"], shape["op"]
        # scaled so every op's result is of order one
        scale = {"sum": n ** -0.5, "sumsq": n ** -0.5, "mean": n ** 0.5}.get(op, 0.25)
        x = (randn(m, n) * scale).to(device=device,
                                                        dtype=torch_dtype(shape["dtype"]))
        return {"x": x, "out": torch.empty(m, device=device, dtype=x.dtype)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        x = inputs["x"].float()
        op = shape["op"]
        if op == "sumsq":
            r = (x * x).sum(-1)
        elif op in ("max", "min"):
            r = getattr(x, op)(-1).values
        else:
            r = getattr(x, op)(-1)
        return r.to(inputs["x"].dtype)

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        x, op = inputs["x"], shape["op"]
        if op == "sumsq":
            return torch.linalg.vector_norm(x, dim=-1).square()
        if op in ("max", "min"):
            return torch.amax(x, -1) if op == "max" else torch.amin(x, -1)
        return getattr(x, op)(-1)

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        import torch

        from harness.kinds._reduce_triton import reduce_kernel

        x, out = inputs["x"], inputs["out"]
        m, n = shape["M"], shape["N"]
        bn, rows = knobs["BLOCK_N"], knobs["ROWS"]
        code, square = _CODES[shape["op"]]
        scale = 1.0 / n if shape["op"] == "mean" else 1.0
        chunk, used = split_chunk(n, bn, knobs["SPLIT"])
        grid = (cdiv(m, rows), used)
        if used == 1:
            def launch() -> Any:
                return reduce_kernel[grid](x, out, m, n, x.stride(0), 1, chunk, scale,
                                           BLOCK_N=bn, ROWS=rows, OP=code, SQUARE=square,
                                           EVICT=knobs.get("EVICT", 0),
                                           num_warps=knobs["num_warps"],
                                           num_stages=knobs["num_stages"])

            return Launch(run=launch, out=out)

        part = torch.empty(m, used, device=x.device, dtype=torch.float32)
        fold_block = max(16, next_pow2(used))

        def launch_split() -> Any:
            handle = reduce_kernel[grid](x, part, m, n, x.stride(0), used, chunk, 1.0,
                                         BLOCK_N=bn, ROWS=rows, OP=code, SQUARE=square,
                                         EVICT=knobs.get("EVICT", 0),
                                         num_warps=knobs["num_warps"],
                                         num_stages=knobs["num_stages"])
            # fold the partials: sums add (mean scales here), max/min fold as themselves
            reduce_kernel[(cdiv(m, 16), 1)](part, out, m, used, used, 1, fold_block, scale,
                                            BLOCK_N=fold_block, ROWS=16, OP=code, SQUARE=False,
                                            num_warps=1, num_stages=1)
            return handle

        return Launch(run=launch_split, out=out)


KIND = Reduce()
