"""Reorderings of the attention kernel's TMA path, side by side with it and with SDPA.

    python bench/attention_variants.py [--shapes TEXT] [--variants kernel,gluon_pingpong]  # GPU
    TRITON_INTERPRET=1 python bench/attention_variants.py --check-only --tiny   # on the CPU

The kernel of ``harness/kinds/_attention_triton.py`` computes, per key/value block, the
scores ``Q K^T``, then their softmax, then ``P V``: each step waits for the one before. On a
Hopper GPU the tensor cores run a ``tl.dot`` asynchronously, so work that does not depend on
it can run meanwhile. The variants here give the compiler such work (the same arithmetic, in
another order):

- ``ahead``: the scores of the next block are asked for before the softmax of this one (the
  loop carries them), so the tensor cores compute ``Q K_{j+1}^T`` while the softmax of block
  ``j`` runs (one block's scores more per row: the last iteration's are discarded);
- ``halves``: the program's BLOCK_M query rows as two halves that share every K and V tile:
  the scores of the second half are asked for before the softmax of the first;
- ``gluon``: the kind's Gluon kernel (``GLUON=1``, harness/kinds/_attention_gluon.py, compute
  capability 9.x), whose warpgroup MMAs are issued so that the softmax of block ``j`` runs
  while ``P_{j-1} V_{j-1}`` is on the tensor cores (its own tiles: one warpgroup per 64 query
  rows, ``num_stages`` its K/V ring);
- ``gluon_ws``: the same warp-specialized (``GLUON=2``): a loader warp and two consumer
  warpgroups of 64 rows that meet at no block-wide barrier (128-row tiles, ``num_warps`` 8 the
  consumers');
- ``gluon_ws_regs``: ``gluon_ws`` with P given to ``P V`` in registers (``GLUON=3``): no P
  tiles in shared memory, so a third K/V stage fits at head_dim 128;
- ``gluon_pingpong``: ``gluon_ws_regs`` whose consumers take turns at the tensor cores
  (``GLUON=4``): one issues its MMAs only after the other has issued its own, so one's
  softmax runs while the other's products do.

``gluon_ws_regs`` and ``gluon_pingpong`` also run three consumer warpgroups (192-row tiles,
12 warps) where the kind realizes them.

In ``ahead`` and ``halves`` the blocks wholly below the diagonal (and inside the sequence)
take the variant's loop; the diagonal band and the ragged end go through the kernel's own
masked loop, as in the kernel.
Every configuration is checked against the fp32 reference before it is timed with
``triton.testing.do_bench`` (median, L2 flushed between calls), beside SDPA and the kernel's
own TMA path on the same tiles. ``--check-only`` checks without timing; ``--tiny`` takes small
ragged shapes that the CPU interpreter runs in seconds.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness.kinds._attention_triton import _attend, block_bounds  # noqa: E402

VARIANTS = ("kernel", "ahead", "halves", "gluon", "gluon_ws", "gluon_ws_regs", "gluon_pingpong")
# (BLOCK_M, BLOCK_N, num_warps, num_stages)
# the kernel's: every golden shape's best tile of the H100 sweeps among them (128x128 w8 s3,
# 64x64 w4 s3, 128x64 w8 s3)
TILES = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3),
         (128, 32, 4, 4)]
GLUON_TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3),
               (128, 128, 8, 2)]
GLUON_WS_TILES = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3)]
# and three consumer warpgroups (192 rows, 12 warps): where their registers allow
GLUON_WS_REGS_TILES = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2),
                       (128, 128, 8, 3), (192, 64, 12, 3), (192, 64, 12, 4), (192, 128, 12, 3),
                       (192, 128, 12, 4)]
# the Gluon variants: their GLUON value and tiles
GLUON_VALUE = {"gluon": 1, "gluon_ws": 2, "gluon_ws_regs": 3, "gluon_pingpong": 4}
GLUON_TILES_OF = {"gluon": GLUON_TILES, "gluon_ws": GLUON_WS_TILES,
                  "gluon_ws_regs": GLUON_WS_REGS_TILES, "gluon_pingpong": GLUON_WS_REGS_TILES}
TINY_SHAPES = [{"batch": 1, "heads": 2, "seq": 80, "head_dim": 16, "causal": c, "dtype": "fp16"}
               for c in (0, 1)]
TINY_TILES = [(32, 16, 1, 1), (32, 32, 1, 1)]


@triton.jit
def _fold(acc, l_i, m_i, qk, v, qk_scale):
    """The unmasked online-softmax step of block scores ``qk`` and its values ``v``."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _key_block(k_src, off_hz, start_n, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    return tl.trans(k_src.load([off_hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))


@triton.jit
def _value_block(v_src, off_hz, start_n, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    return v_src.load([off_hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)


@triton.jit
def ahead_kernel(q_src, k_src, v_src, o_src, sm_scale, SEQ, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    off_hz = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = q_src.load([off_hz, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    full_hi, end = block_bounds(start_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)
    if full_hi > 0:
        qk = tl.dot(q, _key_block(k_src, off_hz, 0, BLOCK_N, HEAD_DIM))
        for start_n in range(0, full_hi, BLOCK_N):
            # the next block's scores first (past the end: rows read as zeros, never used)
            qk_next = tl.dot(q, _key_block(k_src, off_hz, start_n + BLOCK_N, BLOCK_N,
                                           HEAD_DIM))
            v = _value_block(v_src, off_hz, start_n, BLOCK_N, HEAD_DIM)
            acc, l_i, m_i = _fold(acc, l_i, m_i, qk, v, qk_scale)
            qk = qk_next
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_src, v_src, off_hz, offs_m, offs_n0, offs_d,
                            full_hi, end, SEQ, qk_scale, 0, 0, HEAD_DIM, BLOCK_N, True, CAUSAL,
                            True)
    o = (acc / l_i[:, None]).to(q.dtype)
    o_src.store([off_hz, start_m * BLOCK_M, 0], o.reshape(1, BLOCK_M, HEAD_DIM))


@triton.jit
def halves_kernel(q_src, k_src, v_src, o_src, sm_scale, SEQ, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """``q_src`` and ``o_src`` are descriptors of BLOCK_M // 2 rows."""
    HALF: tl.constexpr = BLOCK_M // 2
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    off_hz = tl.program_id(1)
    row0 = start_m * BLOCK_M
    offs_m0 = row0 + tl.arange(0, HALF)
    offs_m1 = row0 + HALF + tl.arange(0, HALF)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q0 = q_src.load([off_hz, row0, 0]).reshape(HALF, HEAD_DIM)
    q1 = q_src.load([off_hz, row0 + HALF, 0]).reshape(HALF, HEAD_DIM)
    m0 = tl.full((HALF,), float("-inf"), tl.float32)
    m1 = tl.full((HALF,), float("-inf"), tl.float32)
    l0 = tl.zeros((HALF,), tl.float32)
    l1 = tl.zeros((HALF,), tl.float32)
    acc0 = tl.zeros((HALF, HEAD_DIM), tl.float32)
    acc1 = tl.zeros((HALF, HEAD_DIM), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    full_hi, end = block_bounds(start_m, SEQ, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, full_hi, BLOCK_N):
        k = _key_block(k_src, off_hz, start_n, BLOCK_N, HEAD_DIM)
        v = _value_block(v_src, off_hz, start_n, BLOCK_N, HEAD_DIM)
        qk0 = tl.dot(q0, k)
        qk1 = tl.dot(q1, k)  # asked for before the first half's softmax
        acc0, l0, m0 = _fold(acc0, l0, m0, qk0, v, qk_scale)
        acc1, l1, m1 = _fold(acc1, l1, m1, qk1, v, qk_scale)
    acc0, l0, m0 = _attend(acc0, l0, m0, q0, k_src, v_src, off_hz, offs_m0, offs_n0, offs_d,
                           full_hi, end, SEQ, qk_scale, 0, 0, HEAD_DIM, BLOCK_N, True, CAUSAL,
                           True)
    acc1, l1, m1 = _attend(acc1, l1, m1, q1, k_src, v_src, off_hz, offs_m1, offs_n0, offs_d,
                           full_hi, end, SEQ, qk_scale, 0, 0, HEAD_DIM, BLOCK_N, True, CAUSAL,
                           True)
    o_src.store([off_hz, row0, 0], (acc0 / l0[:, None]).to(q0.dtype).reshape(1, HALF, HEAD_DIM))
    o_src.store([off_hz, row0 + HALF, 0],
                (acc1 / l1[:, None]).to(q1.dtype).reshape(1, HALF, HEAD_DIM))


def launch_of(variant: str, shape: dict[str, Any], knobs: dict[str, Any],
              inputs: dict[str, Any]) -> Any:
    """A no-argument launch of ``variant`` on ``inputs`` (the kind's own for ``kernel``)."""
    from harness import kinds as registry

    if variant == "kernel" or variant in GLUON_VALUE:
        return registry.get("attention").prepare(
            {**knobs, "TMA": 1, "GLUON": GLUON_VALUE.get(variant, 0)}, shape, inputs).run
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, d = knobs["BLOCK_M"], knobs["BLOCK_N"], shape["head_dim"]
    zh, seq = shape["batch"] * shape["heads"], shape["seq"]
    q_rows = bm // 2 if variant == "halves" else bm
    q, k, v, out = (inputs[n].reshape(zh, seq, d) for n in ("q", "k", "v", "out"))
    descs = (TensorDescriptor.from_tensor(q, [1, q_rows, d]),
             TensorDescriptor.from_tensor(k, [1, bn, d]),
             TensorDescriptor.from_tensor(v, [1, bn, d]),
             TensorDescriptor.from_tensor(out, [1, q_rows, d]))
    kernel = ahead_kernel if variant == "ahead" else halves_kernel
    grid = (triton.cdiv(seq, bm), zh)

    def run() -> Any:
        return kernel[grid](*descs, d ** -0.5, seq, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn,
                            CAUSAL=bool(shape["causal"]), num_warps=knobs["num_warps"],
                            num_stages=knobs["num_stages"])

    return run


@functools.cache
def _live_card() -> Any:
    from harness.box.probe import probe
    from harness.cards import card_from_probe

    return card_from_probe(probe())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="only golden shape ids containing this text")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--check-only", action="store_true", help="check every variant, time none")
    ap.add_argument("--tiny", action="store_true",
                    help="small ragged shapes and tiles (the CPU interpreter runs them)")
    args = ap.parse_args(argv)

    import torch

    from harness import goldens
    from harness import kinds as registry
    from harness.box.bench import _mismatch
    from harness.cards import DEPLOYABLE

    kind = registry.get("attention")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants {','.join(unknown)}: not one of {', '.join(VARIANTS)}")
    for variant in [v for v in variants if v in GLUON_VALUE and device == "cpu"]:
        print(f"{variant}: skipped (it runs on a GPU of compute capability 9.x)")
        variants.remove(variant)
    if args.tiny:
        shapes, tiles = [(f"tiny_causal{s['causal']}", s) for s in TINY_SHAPES], TINY_TILES
    else:
        shapes = [(g.shape_id, g.shape) for g in goldens.shapes(DEPLOYABLE, kinds=["attention"])
                  if args.shapes in g.shape_id]
        tiles = TILES
    print(f"{'shape':52} {'variant':14} {'best_us':>9} {'over SDPA':>9} {'wrong':>5}  tile")
    wrong_total, checked_total, lines = 0, 0, []
    for shape_id, shape in shapes:
        inputs = kind.make_inputs(shape, device, 0)
        ref = kind.reference(shape, inputs)
        atol, rtol = kind.tolerance(shape["dtype"])
        sdpa_us = None
        if not args.check_only:
            from triton.testing import do_bench

            sdpa_us = 1e3 * do_bench(functools.partial(kind.reference, shape, inputs),
                                     return_mode="median")
        for variant in variants:
            best: tuple[float, str] | None = None
            wrong = checked = 0
            for bm, bn, warps, stages in GLUON_TILES_OF.get(variant, tiles):
                knobs = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
                if bn > shape["seq"] or bm > max(16, triton.next_power_of_2(shape["seq"])):
                    continue
                if variant in GLUON_VALUE and kind.unrealizable(
                        {**knobs, "TMA": 1, "GLUON": GLUON_VALUE[variant]}, shape, _live_card()):
                    continue
                run = launch_of(variant, shape, knobs, inputs)
                inputs["out"].fill_(float("nan"))
                try:
                    run()
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile is said
                    print(f"{shape_id[:52]:52} {variant:14} {'-':>9} {'-':>9} {'-':>5}  "
                          f"{bm}x{bn} w{warps} s{stages}: {type(exc).__name__} {str(exc)[:80]}")
                    continue
                if device == "cuda":
                    torch.cuda.synchronize()
                checked += 1
                if _mismatch(inputs["out"], ref, atol, rtol):
                    wrong += 1
                    continue
                if not args.check_only:
                    us = 1e3 * do_bench(run, return_mode="median")
                    if best is None or us < best[0]:
                        best = (us, f"{bm}x{bn} w{warps} s{stages}")
            wrong_total += wrong
            checked_total += checked
            if args.check_only:
                print(f"{shape_id[:52]:52} {variant:14} {'-':>9} {'-':>9} {wrong:5d}  "
                      f"{checked} tiles checked")
            elif best is not None and sdpa_us:
                lines.append((variant, best[0] / sdpa_us))
                print(f"{shape_id[:52]:52} {variant:14} {best[0]:9.1f} {best[0] / sdpa_us:9.3f} "
                      f"{wrong:5d}  {best[1]}")
    for variant in variants:
        xs = [r for v, r in lines if v == variant]
        if xs:
            print(f"{variant}: best over SDPA median {statistics.median(xs):.3f} "
                  f"({min(xs):.3f}-{max(xs):.3f}) over {len(xs)} shapes")
    print(f"wrong results: {wrong_total} of {checked_total} configurations checked")
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())

