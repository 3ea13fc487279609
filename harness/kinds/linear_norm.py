"""linear_norm: a linear whose output is RMS-normalized over N (a post-norm, as after Gemma-2's
attention output projection): ``out = rmsnorm(x @ W.T, w_norm)`` with x M×K, W N×K.

The norm needs whole rows of the linear's output, and one N-tile holds only part of a row.
Two correct schemes, chosen by the ``ROW_PROGRAM`` knob:

* ``ROW_PROGRAM=0`` (tiled, two launches): the GEMM template writes ``z = x @ W.T``
  unnormalized plus each tile's per-row sum of ``z**2`` into an fp32 workspace; a second
  launch folds a row's partial sums and rescales the row in place.
* ``ROW_PROGRAM=1`` (one launch): each program owns BLOCK_M whole rows, walks the row's N
  tiles (writing them unnormalized and summing ``z**2``), then re-reads and rescales what it
  wrote.  Only as many programs as row blocks, so it is offered only where those fill the GPU;
  it runs on pointers (no TMA knobs).

Both round ``z`` to the output dtype before normalizing, as the unfused pair of ops does.
"""

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
    cdiv,
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


def fold_config(m: int, n: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) of the tiled scheme's second launch, one program a row: the whole
    row in one block up to 8192 columns, 8 warps once the block reaches 2048 columns
    (``bench/linear_norm_fold.py``)."""
    block = min(max(16, next_pow2(n)), 8192)
    return block, 8 if block >= 2048 else 4


class LinearNorm(Kind):
    name = "linear_norm"
    fields = ("M", "N", "K", "dtype")
    monotone = (*GEMM_HOPPER, "GLUON")
    path_knobs = ("GLUON",)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_M": [16, 32], "BLOCK_N": [16, 32], "BLOCK_K": [16, 32],
                    "GROUP_M": [1, 2], "ROW_PROGRAM": [0, 1], "num_warps": [1],
                    "num_stages": [1]}
        return gemm_space(card, {"ROW_PROGRAM": [0, 1]}, gluon=True)

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bm, bn = knobs["BLOCK_M"], knobs["BLOCK_N"]
        warps, row_program = knobs["num_warps"], knobs["ROW_PROGRAM"]
        m = shape["M"]
        if row_program and knobs["GROUP_M"] > 1:
            return "a row program walks its own N tiles: GROUP_M does not apply"
        if row_program and knobs.get("TMA", 0):
            return "the row program runs on pointers only"
        if why := gemm_path_misfit(knobs, shape, card) or gemm_tile_misfit(knobs, shape):
            return why
        if self.is_interpret(card):
            return None
        if row_program and cdiv(m, bm) < card.sm_count // 4:
            return (f"{cdiv(m, bm)} row programs leave most of the {card.sm_count} SMs idle")
        smem = gemm_smem(knobs, shape)
        if smem > card.smem_optin:
            return f"shared memory {smem} B > opt-in {card.smem_optin} B"
        # fp32 accumulator (plus the row program's running z**2 tile) per thread
        acc_regs = bm * bn // (32 * warps)
        live = 2 * acc_regs if row_program else acc_regs
        if live > 128:
            return f"accumulators need {live} registers per thread"
        if acc_regs < 4:
            return "fewer than 4 accumulator elements per thread"
        return None

    def flops(self, shape: Shape) -> float:
        m, n, k = shape["M"], shape["N"], shape["K"]
        return 2.0 * m * n * k + 4.0 * m * n

    def bytes(self, shape: Shape) -> float:
        e = DTYPE_BYTES[shape["dtype"]]
        m, n, k = shape["M"], shape["N"], shape["K"]
        return float(e * (m * k + n * k + n + m * n))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return {"fp32": (5e-3, 5e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 3e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        m, n, k, dt = shape["M"], shape["N"], shape["K"], torch_dtype(shape["dtype"])
        scale = k ** -0.25
        x = (randn(m, k) * scale).to(device=device, dtype=dt)
        w = (randn(n, k) * scale).to(device=device, dtype=dt)
        wn = (1 + 0.1 * randn(n)).to(device=device, dtype=dt)
        return {"x": x, "w": w, "w_norm": wn, "out": torch.empty(m, n, device=device, dtype=dt)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        z = (inputs["x"] @ inputs["w"].T).float()
        y = z * torch.rsqrt((z * z).mean(-1, keepdim=True) + EPS) * inputs["w_norm"].float()
        return y.to(inputs["x"].dtype)

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        f = torch.nn.functional
        return f.rms_norm(f.linear(inputs["x"], inputs["w"]), (shape["N"],), inputs["w_norm"],
                          EPS)

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        import torch

        from harness.kinds._linear_norm_triton import linear_norm_row_kernel, rms_rows_kernel

        x, w, wn, out = inputs["x"], inputs["w"], inputs["w_norm"], inputs["out"]
        m, n, k = shape["M"], shape["N"], shape["K"]
        bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
        warps, stages = knobs["num_warps"], knobs["num_stages"]
        if knobs["ROW_PROGRAM"]:
            def launch_rows() -> Any:
                return linear_norm_row_kernel[(cdiv(m, bm),)](
                    x, w, wn, out, m, n, k, EPS, x.stride(0), w.stride(0), out.stride(0),
                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=int(k % bk == 0),
                    num_warps=warps, num_stages=stages)

            return Launch(run=launch_rows, out=out)

        parts = cdiv(n, bn)
        ss = torch.empty(m, parts, device=x.device, dtype=torch.float32)
        fold_p = max(16, next_pow2(parts))
        fold_n, fold_warps = fold_config(m, n)
        tiles = gemm_launch(knobs, x, w, out, ss=ss, epilogue=2)

        def launch_tiles() -> Any:
            handle = tiles()
            rms_rows_kernel[(m,)](out, ss, wn, m, n, parts, EPS, out.stride(0), ss.stride(0),
                                  BLOCK_P=fold_p, BLOCK_N=fold_n, num_warps=fold_warps)
            return handle

        return Launch(run=launch_tiles, out=out)


KIND = LinearNorm()
