"""What every kernel kind provides: shapes, a knob space, realizability, and a measured kernel.

The knob space, realizability and shape facts are pure Python, so the controller (which has
no GPU and may have no torch) can size pools for any catalog card.  Inputs, the torch
reference and the Triton launch import torch/triton lazily: they run only on the box.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.cards import INTERPRET, Card

Shape = Mapping[str, Any]
Knobs = Mapping[str, Any]

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The tile and launch knobs every matmul-like kind (matmul, mlp_geglu, norm_linear,
# linear_norm) sweeps on a real GPU; a kind adds its own knobs between the two.
# BLOCK_K 256 and GROUP_M 32 and 64 are in vLLM's tuned configs (harness/goldens/vllm.py).
GEMM_TILES: dict[str, list[Any]] = {"BLOCK_M": [16, 32, 64, 128, 256],
                                    "BLOCK_N": [16, 32, 64, 128, 256],
                                    "BLOCK_K": [16, 32, 64, 128, 256],
                                    "GROUP_M": [1, 4, 8, 16, 32, 64]}
GEMM_LAUNCH: dict[str, list[Any]] = {"num_warps": [2, 4, 8], "num_stages": [2, 3, 4, 5]}


# The copy-engine paths of the GEMM template (harness/kinds/_gemm_triton.py), swept only on
# cards of compute capability 9.0 and later; an older card's pool has no such knobs, so its
# configuration keys are what they always were.  PERSISTENT and SUBTILE run on the TMA path.
GEMM_HOPPER: dict[str, list[Any]] = {"TMA": [0, 1], "PERSISTENT": [0, 1], "SUBTILE": [0, 1]}

# The warp-specialized Gluon GEMM (harness/kinds/_gemm_gluon.py): ``GLUON`` 1 ping-pong, 2
# cooperative.  Hopper's warpgroup MMAs, so only a pool of compute capability 9.x takes it,
# and only for the kinds whose GEMM is the plain one or has the per-row sums' epilogue
# (matmul, norm_linear's workspace scheme, linear_norm); GEMM_GLUON_POOL names the forms
# the pools take (README, "The Gluon GEMM": which ones were measured, and how fast).
GEMM_GLUON_FORMS: tuple[int, ...] = (1, 2)
GEMM_GLUON_POOL: tuple[int, ...] = (2,)


# The row kinds' L2 cache hints (reduce, rms_norm, softmax, on a GPU): 0 the hardware's
# default; 1 a read of data read once is ``evict_first`` and a read of data read again (the
# first pass of two, a weight) ``evict_last``, as torch.compile's reductions do.  It never
# changes what a configuration needs, so it is a monotone knob of those kinds.
EVICT: list[int] = [0, 1]


def split_chunk(n: int, block_n: int, split: int) -> tuple[int, int]:
    """A row of ``n`` columns dealt to ``split`` programs (reduce's and softmax's ``SPLIT``):
    (columns per program rounded up to whole blocks, number of non-empty programs)."""
    chunk = cdiv(cdiv(n, split), block_n) * block_n
    return chunk, cdiv(n, chunk)


def completed(knobs: Mapping[str, Any], space: Mapping[str, list[Any]]) -> dict[str, Any]:
    """``knobs`` with every knob of ``space`` it lacks set to that knob's first value.

    A knob added to a kind later (the copy-engine paths of the GEMM kinds, say) keeps the
    configurations written before it (anchors, shipped lists) meaning what they meant: the
    first value of a new knob is the kernel as it ran without it."""
    return {**{k: values[0] for k, values in space.items() if k not in knobs and values},
            **knobs}


def gemm_space(card: Card, own: Mapping[str, list[Any]] | None = None, *,
               gluon: bool = False) -> dict[str, list[Any]]:
    """The knob space of a matmul-like kind on a GPU: tiles, the kind's ``own`` knobs, the
    copy-engine paths where the card has them (and the Gluon GEMM on a 9.x card, where the
    kind runs it: ``gluon``), launch knobs."""
    space: dict[str, list[Any]] = {**GEMM_TILES, **(own or {})}
    if card.cc >= (9, 0):
        space.update(GEMM_HOPPER)
    if gluon and card.cc[0] == 9 and GEMM_GLUON_POOL:
        space["GLUON"] = [0, *GEMM_GLUON_POOL]
    return {**space, **GEMM_LAUNCH}


def gemm_path_misfit(knobs: Mapping[str, Any], shape: Mapping[str, Any],
                     card: Card) -> str | None:
    """Why the template's TMA / persistent / subtiled paths cannot take this configuration."""
    tma = knobs.get("TMA", 0)
    if not tma and (knobs.get("PERSISTENT", 0) or knobs.get("SUBTILE", 0)):
        return "PERSISTENT and SUBTILE run on the TMA path only"
    if knobs.get("GLUON", 0) and (why := gluon_gemm_misfit(knobs, shape, card)):
        return why
    if tma and card.regime != INTERPRET and card.cc < (9, 0):
        return f"TMA needs compute capability 9.0 or later; {card.name} has {card.cc}"
    if tma:
        e = DTYPE_BYTES[shape["dtype"]]
        if (shape["K"] * e) % 16 or (shape["N"] * e) % 16:
            return "a tensor descriptor needs rows of a multiple of 16 bytes (K and N)"
        if knobs.get("SUBTILE", 0) and knobs["BLOCK_N"] < 32:
            return "SUBTILE halves BLOCK_N: it needs BLOCK_N >= 32"
    return None


def gluon_gemm_misfit(knobs: Mapping[str, Any], shape: Mapping[str, Any],
                      card: Card) -> str | None:
    """Why the Gluon GEMM (``GLUON`` 1 ping-pong, 2 cooperative) cannot take this
    configuration."""
    if card.regime == INTERPRET:
        return "the Gluon GEMM does not run in the interpreter"
    if card.cc[0] != 9:
        return f"the Gluon GEMM's warpgroup MMAs are Hopper's (compute capability 9.x); " \
               f"{card.name} has {card.cc}"
    if not (knobs.get("TMA", 0) and knobs.get("PERSISTENT", 0)) or knobs.get("SUBTILE", 0):
        return "the Gluon GEMM is persistent and moves whole tiles by TMA: it is measured " \
               "at TMA=1, PERSISTENT=1, SUBTILE=0"
    if shape["dtype"] not in ("fp16", "bf16"):
        return f"the Gluon GEMM takes 16-bit inputs, not {shape['dtype']}"
    if knobs["num_warps"] != 8:
        return f"the Gluon GEMM has two consumer warpgroups: num_warps 8, not " \
               f"{knobs['num_warps']}"
    if knobs["GLUON"] not in GEMM_GLUON_FORMS:
        return f"GLUON takes 0 (the Triton kernel), 1 (ping-pong) or 2 (cooperative), " \
               f"not {knobs['GLUON']}"
    # a consumer warpgroup's rows of a tile: all of them in ping-pong, half if cooperative
    rows = knobs["BLOCK_M"] // knobs["GLUON"]
    if rows < 64:
        return f"a warpgroup's MMA is 64 rows: GLUON={knobs['GLUON']} gives each consumer " \
               f"{rows} rows of BLOCK_M {knobs['BLOCK_M']}"
    if rows * knobs["BLOCK_N"] > 128 * 128:
        return f"a consumer warpgroup's accumulator of {rows} x {knobs['BLOCK_N']} needs " \
               f"more than 128 registers a thread"
    return None


def gemm_smem(knobs: Mapping[str, Any], shape: Mapping[str, Any], b_tiles: int = 1) -> int:
    """Shared memory of one program of the template: A and ``b_tiles`` B tiles per pipeline
    stage, plus the staging buffer of a TMA store.  A subtiled store whose accumulator is
    split across warps along N (more warps than BLOCK_M / 16 rows of them) also converts the
    tile's layout through shared memory: a whole tile more (on an H100, the 191 compiles of
    BLOCK_M 64 at 8 warps took up to 1.01 tiles more than the rest of this sum; every other
    group of BLOCK_M and warps at most 0.13)."""
    e = DTYPE_BYTES[shape["dtype"]]
    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    smem = knobs["num_stages"] * (bm * bk + b_tiles * bn * bk) * e
    if knobs.get("GLUON", 0):  # a staging buffer for each consumer's rows, and barriers
        return smem + 2 * (bm // knobs["GLUON"]) * bn * e + 1024
    if knobs.get("TMA", 0):
        if knobs.get("SUBTILE", 0):
            smem += bm * bn * e // 2
            if knobs["num_warps"] * 16 > bm:
                smem += bm * bn * e
        else:
            smem += bm * bn * e
    return smem


def gemm_tile_misfit(knobs: Mapping[str, Any], shape: Mapping[str, Any]) -> str | None:
    """Tiles that only repeat a smaller configuration's work on this M×N×K problem."""
    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    m, n, k = shape["M"], shape["N"], shape["K"]
    if bm > max(16, next_pow2(m)) or bn > max(16, next_pow2(n)) or bk > max(16, next_pow2(k)):
        return "tile larger than the problem"
    if knobs["GROUP_M"] > 1 and cdiv(m, bm) <= knobs["GROUP_M"] // 2:
        return "GROUP_M larger than the M tiles it would group"
    return None


def gemm_launch(knobs: Knobs, a: Any, b: Any, c: Any, *, b2: Any = None, wn: Any = None,
                ss: Any = None, prologue: int = 0, epilogue: int = 0,
                eps: float = 0.0) -> Callable[[], Any]:
    """The template configured by ``knobs`` on ``a`` [M, K], ``b`` [N, K] and ``c`` [M, N]
    (contiguous in their last dimension): a function that launches it once.  The tensor
    descriptors of the TMA path are made here, once, not per launch."""
    from harness.kinds._gemm_triton import gemm_kernel

    m, k = a.shape
    n = b.shape[0]
    for name, t in (("a", a), ("b", b), ("c", c), ("b2", b2)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"the GEMM template needs {name} contiguous in its last dimension")
    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    if knobs.get("GLUON", 0):
        if prologue or epilogue not in (0, 2):
            raise ValueError(f"the Gluon GEMM has no prologue {prologue} or epilogue {epilogue}")
        return _gluon_gemm_launch(knobs, a, b, c, ss, epilogue)
    tma, persistent = knobs.get("TMA", 0), knobs.get("PERSISTENT", 0)
    subtile = knobs.get("SUBTILE", 0)
    tiles = cdiv(m, bm) * cdiv(n, bn)
    progs = tiles
    if persistent:
        progs = min(tiles, sm_count(a))
    args: list[Any] = [a, b, b if b2 is None else b2, c]
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        args = [TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bn, bk]),
                TensorDescriptor.from_tensor(b if b2 is None else b2, [bn, bk]),
                TensorDescriptor.from_tensor(c, [bm, bn // 2 if subtile else bn])]
    a_, b_, b2_, c_ = args
    # pointers the kernel never reads where the kind has no norm weight or partial sums
    wn_ = a if wn is None else wn
    ss_ = a if ss is None else ss
    stride_sm = 0 if ss is None else ss.stride(0)

    def launch() -> Any:
        return gemm_kernel[(progs,)](
            a_, a, b_, b2_, wn_, c_, ss_, m, n, k, eps,
            a.stride(0), b.stride(0), c.stride(0), stride_sm, progs,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=knobs["GROUP_M"],
            PROLOGUE=prologue, EPILOGUE=epilogue, TMA=tma, PERSISTENT=persistent,
            SUBTILE=subtile, EVEN_K=int(k % bk == 0),
            num_warps=knobs["num_warps"], num_stages=knobs["num_stages"])

    return launch


def _gluon_gemm_launch(knobs: Knobs, a: Any, b: Any, c: Any, ss: Any,
                       epilogue: int) -> Callable[[], Any]:
    """``GLUON`` 1 or 2: the warp-specialized GEMM of harness/kinds/_gemm_gluon.py, one program
    per SM; epilogue 2 also writes the tiles' per-row sums of squares into ``ss``."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from harness.kinds._gemm_gluon import gluon_gemm_kernel

    bm, bn, bk = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"]
    coop = knobs["GLUON"] == 2  # each consumer stores half of a tile's rows
    descs = []
    for t, block in ((a, [bm, bk]), (b, [bn, bk]), (c, [bm // 2 if coop else bm, bn])):
        gl_dtype = {"torch.float16": gl.float16, "torch.bfloat16": gl.bfloat16}[str(t.dtype)]
        layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
        descs.append(TensorDescriptor.from_tensor(t, block, layout))
    m, n = c.shape
    progs = min(cdiv(m, bm) * cdiv(n, bn), sm_count(a))
    ss_ = a if ss is None else ss  # a pointer the kernel never reads without the sums
    stride_sm = 0 if ss is None else ss.stride(0)
    # 12 warps (two consumer warpgroups and the loader's) of 168 registers fill the register
    # file; the loader gives back all but 24, each consumer warpgroup takes 240
    def launch() -> Any:
        return gluon_gemm_kernel[(progs,)](
            *descs, ss_, m, n, a.shape[1], stride_sm, progs, GROUP_M=knobs["GROUP_M"],
            STAGES=knobs["num_stages"], EPILOGUE=epilogue, COOP=coop, CONSUMER_REGS=240,
            num_warps=4, maxnreg=168)

    return launch


def sm_count(t: Any) -> int:
    """Multiprocessors of the tensor's GPU; on ``meta`` inputs (compile ahead, where CUDA is
    never started) a stand-in: the count is a run-time argument, so the kernel is the same."""
    if t.device.type != "cuda":
        return 2
    import torch

    return int(torch.cuda.get_device_properties(t.device).multi_processor_count)


@dataclass
class Launch:
    """A configured kernel: ``run()`` launches it (returning Triton's compiled-kernel handle,
    None under the interpreter) and writes ``out``."""

    run: Callable[[], Any]
    out: Any


class Kind:
    """One kernel family.  Subclasses fill in the class attributes and the abstract methods."""

    name: str = ""
    fields: tuple[str, ...] = ()  # shape fields, in shape-id order
    # knobs whose other values only ever add to what a configuration needs (shared memory,
    # a newer card): where a configuration fails with their first values, it fails with all
    monotone: tuple[str, ...] = ()
    # knobs that pick another kernel (GLUON): a sweep measures, with an anchor's neighbours,
    # the configurations of each value the anchor does not take nearest to it (pools.path_twins)
    path_knobs: tuple[str, ...] = ()

    # -- pure part ---------------------------------------------------------------------------
    def shape_id(self, shape: Shape) -> str:
        """Stable id of one problem: ``matmul_M4096_N4096_K4096_bf16``."""
        parts = []
        for f in self.fields:
            v = shape[f]
            if f == "dtype":
                parts.append(str(v))
            elif isinstance(v, bool):
                parts.append(f"{f}{int(v)}")
            else:
                parts.append(f"{f}{v}")
        return "_".join([self.name, *parts])

    def knob_space(self, shape: Shape, card: Card) -> dict[str, list[Any]]:
        """Ordered candidate values per knob (before realizability)."""
        raise NotImplementedError

    def unrealizable(self, knobs: Knobs, shape: Shape, card: Card) -> str | None:
        """Why this configuration cannot run on ``card`` (None if it can)."""
        raise NotImplementedError

    def realizable(self, knobs: Knobs, shape: Shape, card: Card) -> bool:
        return self.unrealizable(knobs, shape, card) is None

    def enumerate(self, shape: Shape, card: Card) -> list[dict[str, Any]]:
        """Every realizable configuration of ``shape`` on ``card``: the pool, in the order of
        the product of the knob space.  The values of a :attr:`monotone` knob are tried only
        where its first value realizes."""
        space = self.knob_space(shape, card)
        keys = list(space)
        lazy = [k for k in keys if k in self.monotone and len(space[k]) > 1]
        if not lazy:
            out = []
            for values in itertools.product(*(space[k] for k in keys)):
                knobs = dict(zip(keys, values, strict=True))
                if self.realizable(knobs, shape, card):
                    out.append(knobs)
            return out
        eager = [k for k in keys if k not in lazy]
        found: list[tuple[tuple[int, ...], dict[str, Any]]] = []
        for at in itertools.product(*(range(len(space[k])) for k in eager)):
            index = dict(zip(eager, at, strict=True))
            first = {k: space[k][index[k]] if k in index else space[k][0] for k in keys}
            if not self.realizable(first, shape, card):
                continue
            for lazy_at in itertools.product(*(range(len(space[k])) for k in lazy)):
                index.update(zip(lazy, lazy_at, strict=True))
                knobs = {k: space[k][index[k]] for k in keys}
                if not any(lazy_at) or self.realizable(knobs, shape, card):
                    found.append((tuple(index[k] for k in keys), knobs))
        found.sort(key=lambda item: item[0])
        return [knobs for _, knobs in found]

    def shape_features(self, shape: Shape) -> dict[str, Any]:
        """``S_*`` facts of the problem that a prior may see."""
        feats: dict[str, Any] = {f"S_{f}": (int(v) if isinstance(v, bool) else v)
                                 for f, v in shape.items() if f in self.fields}
        feats["S_kind"] = self.name
        feats["S_flops"] = self.flops(shape)
        feats["S_bytes"] = self.bytes(shape)
        return feats

    def flops(self, shape: Shape) -> float:
        raise NotImplementedError

    def bytes(self, shape: Shape) -> float:
        raise NotImplementedError

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for comparing the kernel with the reference."""
        return {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2), "bf16": (4e-2, 4e-2)}[dtype]

    # -- box part (torch / triton) ------------------------------------------------------------
    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, Any]:
        """Random inputs (never zeros) on ``device``; the reference output is computed once."""
        raise NotImplementedError

    def reference(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        """The torch implementation: the B side of the A/B and the correctness oracle."""
        raise NotImplementedError

    def prepare(self, knobs: Knobs, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        """The Triton kernel configured by ``knobs``, ready to launch on ``inputs``."""
        raise NotImplementedError

    def torch_op(self, shape: Shape, inputs: Mapping[str, Any]) -> Any:
        """What a user would run in torch instead of a Triton kernel: torch's own best op, in
        the input dtype (default: the reference, where that already is it)."""
        return self.reference(shape, inputs)

    def baseline(self, name: str, shape: Shape, inputs: Mapping[str, Any]) -> Launch:
        """A baseline (:mod:`harness.shipped`) as a launch: ``torch`` (:meth:`torch_op`) or
        ``compile`` (``torch.compile(mode="max-autotune-no-cudagraphs")`` of the reference,
        compiled on its first launch).  ``out`` is its result once it has run."""
        if name == "torch":
            def fn() -> Any:
                return self.torch_op(shape, inputs)
        elif name == "compile":
            import torch

            torch._dynamo.reset()  # one graph per shape; never a fallback to eager
            compiled = torch.compile(self.reference, mode="max-autotune-no-cudagraphs",
                                     fullgraph=True, dynamic=False)

            def fn() -> Any:
                return compiled(shape, inputs)
        else:
            raise ValueError(f"unknown baseline {name!r}; baselines: torch, compile")
        launch = Launch(run=fn, out=None)

        def run() -> None:
            launch.out = fn()

        launch.run = run
        return launch

    @staticmethod
    def is_interpret(card: Card) -> bool:
        return card.regime == INTERPRET


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def random_normal(device: str, seed: int) -> Callable[..., Any]:
    """``randn(*size)``: standard normal draws from one generator seeded with ``seed``, made on
    the device itself where it is a GPU (drawing a large weight on the CPU takes seconds);
    on the CPU otherwise (the interpreter, and ``meta`` inputs, whose values are never read)."""
    import torch

    where = device if str(device).startswith("cuda") else "cpu"
    g = torch.Generator(device=where).manual_seed(seed)

    def randn(*size: int) -> Any:
        return torch.randn(*size, generator=g, device=where)

    return randn
