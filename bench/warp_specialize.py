"""The compiler's warp specialization (``WS=1``) beside the same configurations without it.

    python bench/warp_specialize.py [--kind matmul] [--shapes TEXT] [--card h200]

On a Hopper card Triton 3.6 can split a loop marked ``tl.range(..., warp_specialize=True)``
into a producer warp group that issues the copy engine's loads and consumer groups that run
the dots. The GEMM template and the attention kernel take it as the ``WS`` knob (TMA path
only). For every golden shape of the kinds asked for (prefill shapes by default: those with
at least 1024 rows, where torch.compile led), this script runs a fixed set of TMA
configurations, plus the card's anchor of the shape where it is a TMA one, with ``WS=0`` and
``WS=1``; each is checked against the fp32 reference before it is timed with
``triton.testing.do_bench`` (median, L2 flushed between calls). It prints each pair's ratio
(WS=1 over WS=0, below 1: specialization is faster), each shape's best of either side
beside torch's op, and the medians.
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

GEMM_KINDS = ("matmul", "norm_linear", "linear_norm", "mlp_geglu")
# BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, PERSISTENT, SUBTILE (GROUP_M 8, TMA 1)
GEMM_TILES = [(128, 256, 64, 8, 3, 1, 1), (128, 128, 64, 8, 4, 1, 0), (128, 128, 64, 4, 4, 1, 0),
              (128, 256, 64, 8, 3, 0, 0), (128, 128, 64, 4, 4, 0, 0)]
# BLOCK_M, BLOCK_N, num_warps, num_stages (TMA 1)
ATTENTION_TILES = [(128, 128, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3)]


def configs(kind: str, shape: dict[str, Any], anchor: dict[str, Any] | None) -> list[dict]:
    if kind == "attention":
        out = [{"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, "TMA": 1}
               for bm, bn, w, s in ATTENTION_TILES]
    else:
        out = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w,
                "num_stages": s, "TMA": 1, "PERSISTENT": p, "SUBTILE": sub}
               for bm, bn, bk, w, s, p, sub in GEMM_TILES]
    if anchor is not None and int(anchor.get("TMA", 0)) and anchor not in out:
        out.insert(0, anchor)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", action="append", default=None,
                    help="kinds to run (repeated; default the four GEMM kinds and attention)")
    ap.add_argument("--shapes", default="", help="only golden shape ids containing this text")
    ap.add_argument("--all-shapes", action="store_true", help="decode shapes too")
    ap.add_argument("--card", default=None,
                    help="whose anchors to add (card alias; default the card this runs on)")
    args = ap.parse_args(argv)

    import torch
    from triton.testing import do_bench

    from harness import goldens
    from harness import kinds as registry
    from harness.box.bench import _mismatch
    from harness.cards import DEPLOYABLE, by_alias, canonicalize
    from harness.points import parse_spec

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    card = canonicalize(torch.cuda.get_device_name()) or by_alias(args.card or "h200")
    alias = args.card or card.aliases[0]
    print(f"card: {torch.cuda.get_device_name()} ({card.name}); anchors of {alias}")
    kinds = args.kind or [*GEMM_KINDS, "attention"]
    anchor_file = ROOT / "harness" / "goldens" / "anchors" / f"{alias}.json"
    anchors: dict[str, dict[str, Any]] = {}
    if anchor_file.exists():
        for a in goldens.load_anchor_file(anchor_file):
            anchors[a.shape_id] = {k: int(v) for k, v in parse_spec(a.spec).items()}
    print(f"{'shape':50} {'ws0_us':>9} {'ws1_us':>9} {'ws1/ws0':>7}  config")
    pair_ratios: dict[str, list[float]] = {}
    best_ratios: dict[str, list[float]] = {}
    wrong = checked = 0
    for g in goldens.shapes(DEPLOYABLE, kinds=kinds):
        if args.shapes not in g.shape_id:
            continue
        if not args.all_shapes and g.kind != "attention" and g.shape["M"] < 1024:
            continue
        kind = registry.get(g.kind)
        inputs = kind.make_inputs(g.shape, "cuda", 0)
        ref = kind.reference(g.shape, inputs)
        atol, rtol = kind.tolerance(g.shape["dtype"])
        torch_op = getattr(kind, "torch_op", kind.reference)
        torch_us = 1e3 * do_bench(functools.partial(torch_op, g.shape, inputs), return_mode="median")
        best = {0: float("inf"), 1: float("inf")}
        for knobs in configs(g.kind, g.shape, anchors.get(g.shape_id)):
            if kind.unrealizable(knobs, g.shape, card):
                continue
            us = {}
            for ws in (0, 1):
                launch = kind.prepare({**knobs, "WS": ws}, g.shape, inputs)
                launch.out.fill_(float("nan"))
                try:
                    launch.run()
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - a configuration that fails is said
                    print(f"{g.shape_id[:50]:50} WS={ws} failed: {type(exc).__name__} "
                          f"{str(exc).splitlines()[0][:100] if str(exc) else ''}")
                    continue
                checked += 1
                if why := _mismatch(launch.out, ref, atol, rtol):
                    wrong += 1
                    print(f"{g.shape_id[:50]:50} WS={ws} {why}")
                    continue
                us[ws] = 1e3 * do_bench(launch.run, return_mode="median")
                best[ws] = min(best[ws], us[ws])
            cfg = ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))
            if len(us) == 2:
                pair_ratios.setdefault(g.kind, []).append(us[1] / us[0])
                print(f"{g.shape_id[:50]:50} {us[0]:9.1f} {us[1]:9.1f} {us[1] / us[0]:7.3f}  {cfg}")
        if best[0] < float("inf") and best[1] < float("inf"):
            best_ratios.setdefault(g.kind, []).append(min(best.values()) / best[0])
            print(f"{g.shape_id[:50]:50} best ws0 {best[0]:.1f} ws1 {best[1]:.1f} "
                  f"torch {torch_us:.1f}: best over torch {min(best.values()) / torch_us:.3f} "
                  f"(ws0 alone {best[0] / torch_us:.3f})")
        del inputs, ref
    for k in kinds:
        if k in pair_ratios:
            xs = pair_ratios[k]
            print(f"{k}: WS=1 over WS=0 median {statistics.median(xs):.3f} "
                  f"({min(xs):.3f}-{max(xs):.3f}) over {len(xs)} pairs; best with WS over best "
                  f"without, median {statistics.median(best_ratios.get(k, [1.0])):.3f}")
    print(f"wrong results: {wrong} of {checked} runs checked")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
