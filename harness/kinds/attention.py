"""attention: the flash-attention forward pass ``softmax(Q K^T / sqrt(d)) V`` per
(batch, head), causal or not; Q, K, V and the output are (batch, heads, seq, head_dim).

Queries and keys have the same length and every head has its own K/V (the kernel's work per
head is the same under grouped-query attention; only K/V reuse across heads differs).

On cards of compute capability 9.0 and later the pool adds ``TMA`` (the tiles move through
tensor descriptors, harness/kinds/_attention_triton.py); an older card's pool and
configuration keys are what they were, and a configuration without a knob means it at 0.

``GLUON`` runs a Gluon kernel of harness/kinds/_attention_gluon.py instead (Hopper's warpgroup
MMAs: compute capability 9.x only; tiles move by TMA, so it runs at ``TMA=1`` only, 16 query
rows a warp, ``num_stages`` its K/V ring).  ``GLUON=1``: every warp loads and computes, P
through shared memory.  ``GLUON=2``, ``3``, ``4``: warp-specialized, a loader warp and two or
three consumer warpgroups of 64 rows that meet at no block-wide barrier (``num_warps`` 8 or
12 counts the consumers' warps, ``BLOCK_M`` 128 or 192; the program has 12 or 16), P through
shared memory (2) or in registers (3), and in 4 the consumers take turns at the tensor
cores.  The pools of cards of compute capability 9.x take the values in
:attr:`Attention.gluon_pool`: 3 and 4, the fastest on an H100 (1 and 2 were slower there
than the Triton kernel, ``bench/attention_variants.py``), and with them ``BLOCK_M`` 192 and
12 warps, the three consumers' tiles, and where not causal ``PERSISTENT`` (the
warp-specialized kernel with a program a multiprocessor, each taking tile after tile); an older
or newer card's pool and configuration keys are what they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.cards import Card
from harness.kinds.base import (
    DTYPE_BYTES,
    Kind,
    Knobs,
    Launch,
    Shape,
    cdiv,
    next_pow2,
    random_normal,
    sm_count,
    torch_dtype,
)

HEAD_DIMS = (16, 32, 64, 128, 256)
# causal programs go in groups of heads whose K and V take about this much L2 (see head_group)
HEAD_GROUP_BYTES = 8 << 20


def head_group(shape: Shape) -> int:
    """How many heads a causal grid takes at a time (0: not causal, the 2-D grid).

    A causal query block's work grows with its index, so a grid of programs is best run
    longest first; across all heads at once, though, the programs of a wave read as many heads'
    K and V and L2 no longer holds them.  So the grid is 1-D, the heads in groups whose K and V
    fill about :data:`HEAD_GROUP_BYTES`, each group's programs longest first across its heads
    (``causal_order`` in the kernels).  On an H100, for each causal golden shape's anchor,
    8 MiB's group (4 heads at seq 4096 and head_dim 128, 8 at 2048 and 128, 16 at 2048 and
    64) was the fastest of groups of 1, 2, 4, ... and all heads, 0.910-0.975 of one head at
    a time's time (``bench/attention_order.py``)."""
    if not shape["causal"]:
        return 0
    kv = 2 * shape["seq"] * shape["head_dim"] * DTYPE_BYTES[shape["dtype"]]
    return max(1, min(shape["batch"] * shape["heads"], HEAD_GROUP_BYTES // kv))


def attention_grid(shape: Shape, block_m: int, group: int,
                   programs: int = 0) -> tuple[int, ...]:
    """The launch grid: (query blocks * heads,) in groups of ``group`` heads, or (query
    blocks, batch * heads) where ``group`` is 0; a persistent kernel's (at most ``programs``,
    its tiles in either order,) where ``programs`` is given."""
    zh, blocks = shape["batch"] * shape["heads"], cdiv(shape["seq"], block_m)
    if programs:
        return (min(programs, blocks * zh),)
    return (blocks * zh,) if group else (blocks, zh)


class Attention(Kind):
    name = "attention"
    fields = ("batch", "heads", "seq", "head_dim", "causal", "dtype")
    # no monotone knob: a configuration of three consumer warpgroups (BLOCK_M 192, 12 warps)
    # is the Gluon kernel's alone, so its GLUON=0 twin does not realize
    path_knobs = ("GLUON",)
    # the GLUON values the pools of cards of compute capability 9.x take (see the docstring;
    # the tests set every value to check them all)
    gluon_pool: tuple[int, ...] = (3, 4)

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        if self.is_interpret(card):
            return {"BLOCK_M": [16, 32, 64], "BLOCK_N": [16, 32, 64], "num_warps": [1, 2],
                    "num_stages": [1, 2]}
        space: dict[str, list[Any]] = {"BLOCK_M": [16, 32, 64, 128, 256],
                                       "BLOCK_N": [16, 32, 64, 128, 256]}
        warps = [2, 4, 8]
        if card.cc >= (9, 0):
            space["TMA"] = [0, 1]
            if self.gluon_pool and card.cc[0] == 9:  # Hopper's warpgroup MMAs
                space["GLUON"] = [0, *self.gluon_pool]
                if max(self.gluon_pool) >= 2:  # three consumer warpgroups of 64 rows
                    space["BLOCK_M"].append(192)
                    warps.append(12)
                    if not shape["causal"]:
                        # a program a multiprocessor: its tiles in the grid's order are one
                        # length when not causal; causal, each program's share was far from
                        # even (1.05-1.68x the one-tile time on an H100,
                        # bench/attention_persistent.py), so causal pools keep one tile a
                        # program
                        space["PERSISTENT"] = [0, 1]
        return {**space, "num_warps": warps, "num_stages": [1, 2, 3, 4, 5]}

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        bm, bn = knobs["BLOCK_M"], knobs["BLOCK_N"]
        warps, stages = knobs["num_warps"], knobs["num_stages"]
        d, seq = shape["head_dim"], shape["seq"]
        if d not in HEAD_DIMS:
            return f"head_dim {d} is not one of {HEAD_DIMS}"
        if bm > max(16, next_pow2(seq)) or bn > max(16, next_pow2(seq)):
            return "tile larger than the sequence"
        gluon = knobs.get("GLUON", 0)
        if gluon < 2 and knobs.get("PERSISTENT", 0):
            return "PERSISTENT is the warp-specialized Gluon kernel's (GLUON 2, 3 or 4) alone"
        if gluon < 2 and (bm == 192 or warps == 12):
            return f"BLOCK_M {bm} with {warps} warps: three consumer warpgroups are the " \
                   f"warp-specialized Gluon kernel's (GLUON 2, 3 or 4) alone"
        if gluon:
            why = self._gluon_misfit(knobs, shape, card)
            if why:
                return why
        if knobs.get("TMA", 0) and not self.is_interpret(card) and card.cc < (9, 0):
            return f"TMA needs compute capability 9.0 or later; {card.name} has {card.cc}"
        if self.is_interpret(card):
            return None
        e = DTYPE_BYTES[shape["dtype"]]
        # Q tile, plus K and V tiles for every pipeline stage (and the Gluon kernel's two P
        # tiles and its barriers)
        smem = (bm * d + 2 * max(1, stages) * bn * d) * e
        if gluon in (1, 2):
            smem += 2 * bm * bn * e + 1024
        elif gluon:  # P in registers: barriers and a small placeholder
            smem += 3072
        if smem > card.smem_optin:
            return f"shared memory {smem} B > opt-in {card.smem_optin} B"
        # fp32 output accumulator and score tile per thread; past ~192 it spills heavily
        regs = (bm * d + bm * bn) // (32 * warps)
        if gluon >= 3:  # and P, held in registers for its MMA: two 16-bit values a register
            regs += bm * bn // (64 * warps)
        if regs > 192:
            return f"accumulator and scores need {regs} registers per thread"
        if warps == 12:  # three consumers of 160 registers (ptxas, sm_90: the rest spills)
            room = 112 if shape["causal"] else 128
            if regs > room:
                return f"accumulator, scores and P need {regs} registers per thread; three " \
                       f"consumer warpgroups have room for {room}"
        if bm * d // (32 * warps) < 4:
            return "fewer than 4 accumulator elements per thread"
        return None

    def _gluon_misfit(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        """Why the Gluon kernel cannot run this configuration (None if it can)."""
        bm, bn, warps = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["num_warps"]
        if knobs["GLUON"] not in (1, 2, 3, 4):
            return f"GLUON is 0 (the Triton kernel), 1, 2, 3 or 4, not {knobs['GLUON']!r}"
        if self.is_interpret(card):
            return "the Gluon kernel does not run in the interpreter"
        if card.cc[0] != 9:
            return f"the Gluon kernel's warpgroup MMAs are Hopper's (compute capability 9.x); " \
                   f"{card.name} has {card.cc}"
        if not knobs.get("TMA", 0):
            return "the Gluon kernel moves its tiles by TMA: it is measured at TMA=1"
        if shape["dtype"] not in ("fp16", "bf16"):
            return f"the Gluon kernel takes 16-bit inputs, not {shape['dtype']}"
        if warps < 4:
            return f"a warpgroup MMA needs 4 warps, not {warps}"
        if knobs["GLUON"] >= 2 and warps not in (8, 12):
            return f"the warp-specialized Gluon kernel (GLUON={knobs['GLUON']}) has two or " \
                   f"three consumer warpgroups: 8 or 12 warps, not {warps}"
        if knobs["GLUON"] == 1 and warps == 12:
            return "the Gluon kernel of GLUON=1 takes 4 or 8 warps, not 12"
        if bm != 16 * warps:
            return f"the Gluon kernel gives each warp 16 query rows: BLOCK_M {bm} with " \
                   f"{warps} warps"
        # the warp-specialized kernel's last query block may end past the sequence by whole
        # consumers' rows (64): those recompute the last rows and store nothing
        rows = 64 if knobs["GLUON"] >= 2 else bm
        if shape["seq"] % rows or shape["seq"] % bn:
            return f"the Gluon kernel's 2-D views need seq {shape['seq']} to be a multiple " \
                   f"of both tiles ({rows}, {bn})"
        if knobs["num_stages"] < 2:
            return "the Gluon kernel's K/V ring needs at least 2 stages"
        return None

    def flops(self, shape: Shape) -> float:
        f = 4.0 * shape["batch"] * shape["heads"] * shape["seq"] ** 2 * shape["head_dim"]
        return f / 2 if shape["causal"] else f

    def bytes(self, shape: Shape) -> float:
        e = DTYPE_BYTES[shape["dtype"]]
        return 4.0 * e * shape["batch"] * shape["heads"] * shape["seq"] * shape["head_dim"]

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # fp32 dots run as tf32 on the GPU
        return {"fp32": (5e-3, 5e-3), "fp16": (5e-3, 1e-2), "bf16": (2e-2, 2e-2)}[dtype]

    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        import torch

        randn = random_normal(device, seed)
        dims = (shape["batch"], shape["heads"], shape["seq"], shape["head_dim"])
        dt = torch_dtype(shape["dtype"])
        q, k, v = (randn(*dims).to(device=device, dtype=dt) for _ in range(3))
        return {"q": q, "k": k, "v": v, "out": torch.empty_like(q)}

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        import torch

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if q.device.type == "cpu":  # CPU SDPA lacks some half kernels: compute in fp32
            q, k, v = q.float(), k.float(), v.float()
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                               is_causal=bool(shape["causal"]))
        return out.to(inputs["q"].dtype)

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        if knobs.get("GLUON", 0):
            return self._prepare_gluon(knobs, shape, inputs)
        from harness.kinds._attention_triton import attention_kernel

        q, k, v, out = inputs["q"], inputs["k"], inputs["v"], inputs["out"]
        bm, bn, d = knobs["BLOCK_M"], knobs["BLOCK_N"], shape["head_dim"]
        group = head_group(shape)
        grid = attention_grid(shape, bm, group)
        sm_scale = d ** -0.5
        tma = knobs.get("TMA", 0)
        srcs: tuple[Any, ...] = (q, k, v, out)
        if tma:  # descriptors made once, over the (batch * heads, seq, head_dim) views
            from triton.tools.tensor_descriptor import TensorDescriptor

            if not all(t.is_contiguous() for t in srcs):
                raise ValueError("the TMA path needs contiguous Q, K, V and output")
            zh = shape["batch"] * shape["heads"]
            srcs = tuple(TensorDescriptor.from_tensor(t.reshape(zh, shape["seq"], d),
                                                      [1, rows, d])
                         for t, rows in ((q, bm), (k, bn), (v, bn), (out, bm)))

        def launch() -> Any:
            return attention_kernel[grid](
                *srcs, sm_scale, shape["heads"], shape["seq"],
                q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                HEAD_DIM=shape["head_dim"], BLOCK_M=bm, BLOCK_N=knobs["BLOCK_N"],
                CAUSAL=bool(shape["causal"]), TMA=tma, HEAD_GROUP=group,
                num_warps=knobs["num_warps"], num_stages=knobs["num_stages"])

        return Launch(run=launch, out=out)

    def _prepare_gluon(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        # spelled out so that the kind's kernel revision covers the Gluon module
        import harness.kinds._attention_gluon as _attention_gluon

        q, k, v, out = inputs["q"], inputs["k"], inputs["v"], inputs["out"]
        if not all(t.is_contiguous() for t in (q, k, v, out)):
            raise ValueError("the Gluon kernel needs contiguous Q, K, V and output")
        bm, d, seq = knobs["BLOCK_M"], shape["head_dim"], shape["seq"]
        rows = shape["batch"] * shape["heads"] * seq
        gl_dtype = {"fp16": gl.float16, "bf16": gl.bfloat16}[shape["dtype"]]
        name, q_rows, launch_knobs = gluon_launch(knobs, shape)
        kernel = getattr(_attention_gluon, name)
        descs = []
        for t, block in ((q, q_rows), (k, knobs["BLOCK_N"]), (v, knobs["BLOCK_N"]),
                         (out, q_rows)):
            layout = gl.NVMMASharedLayout.get_default_for([block, d], gl_dtype)
            descs.append(TensorDescriptor.from_tensor(t.view(rows, d), [block, d], layout))
        persistent = launch_knobs.get("PERSISTENT", False)
        grid = attention_grid(shape, bm, launch_knobs.get("HEAD_GROUP", 0),
                              sm_count(q) if persistent else 0)
        qk_scale = d ** -0.5 * 1.4426950408889634  # exp2 instead of exp
        # the warp-specialized kernel also takes the output (its persistent form stores
        # through it) and batch * heads
        more = (out, shape["batch"] * shape["heads"]) if knobs["GLUON"] >= 2 else ()

        def launch() -> Any:
            return kernel[grid](*descs, qk_scale, seq, *more, **launch_knobs)

        return Launch(run=launch, out=out)


def gluon_launch(knobs: Knobs, shape: Shape) -> tuple[str, int, dict[str, Any]]:
    """The Gluon kernel of a ``GLUON`` configuration: its name in
    harness/kinds/_attention_gluon.py, the rows of its Q and output descriptors' blocks, and
    its launch's keywords (constexprs and launch options)."""
    bm = knobs["BLOCK_M"]
    common = {"HEAD_DIM": shape["head_dim"], "BLOCK_M": bm, "BLOCK_N": knobs["BLOCK_N"],
              "STAGES": knobs["num_stages"], "CAUSAL": bool(shape["causal"])}
    if knobs["GLUON"] >= 2:
        # two consumer warpgroups: 12 warps (4 + 4 + the loader's warpgroup) of 168
        # registers fill the register file; the loader gives back all but 24, each consumer
        # warpgroup takes 240.  Three: 16 warps of 128, each consumer takes 160
        consumers = knobs["num_warps"] // 4
        regs, maxnreg = (240, 168) if consumers == 2 else (160, 128)
        return ("gluon_attention_ws_kernel", bm // consumers,
                {**common, "P_REGS": knobs["GLUON"] >= 3, "PINGPONG": knobs["GLUON"] == 4,
                 "RAGGED": shape["seq"] % bm != 0, "HEAD_GROUP": head_group(shape),
                 "PERSISTENT": bool(knobs.get("PERSISTENT", 0)),
                 "CONSUMER_REGS": regs, "num_warps": 4, "maxnreg": maxnreg})
    return "gluon_attention_kernel", bm, {**common, "num_warps": knobs["num_warps"]}


KIND = Attention()
