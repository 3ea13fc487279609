"""Two ways of writing the kernels' loops, beside the same configurations as they run now.

    python bench/loop_variants.py [--kind matmul] [--shapes TEXT] [--card h200]

- ``nested`` (GEMM kinds, persistent configurations): ``PERSISTENT=2``, the tile loop
  around the K loop as written, where ``PERSISTENT=1`` has the compiler flatten the two
  (Inductor's persistent TMA template does not flatten);
- ``ws``: ``WS=1``, the compiler's automatic warp specialization (``tl.range(...,
  warp_specialize=True)``; Triton 3.6 has a Hopper pass for it): a producer warp group
  issues the copy engine's loads while the others run the dots.

For every golden shape of the kinds asked for (prefill shapes by default: those with at
least 1024 rows, where torch.compile led), a fixed set of TMA configurations, plus the card's
anchor of the shape where it is a TMA one, run as they are and as each variant; each run is
checked against the fp32 reference before it is timed with ``triton.testing.do_bench``
(median, L2 flushed between calls). It prints each variant's time over the configuration's
own (below 1: the variant is faster), each shape's best per variant over torch's op, and
per kind the medians.
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
    print(f"{'shape':50} {'variant':7} {'base_us':>9} {'var_us':>9} {'ratio':>6}  config")
    ratios: dict[tuple[str, str], list[float]] = {}
    best_ratios: dict[tuple[str, str], list[float]] = {}
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
        torch_us = 1e3 * do_bench(functools.partial(torch_op, g.shape, inputs),
                                  return_mode="median")
        best: dict[str, float] = {}
        for knobs in configs(g.kind, g.shape, anchors.get(g.shape_id)):
            if kind.unrealizable(knobs, g.shape, card):
                continue
            cfg = ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))
            us: dict[str, float] = {}
            for variant, extra in variants(g.kind, knobs):
                launch = kind.prepare({**knobs, **extra}, g.shape, inputs)
                launch.out.fill_(float("nan"))
                try:
                    launch.run()
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - a configuration that fails is said
                    first = str(exc).strip().splitlines()[0][:100] if str(exc).strip() else ""
                    print(f"{g.shape_id[:50]:50} {variant:7} failed: {type(exc).__name__} "
                          f"{first}  {cfg}")
                    continue
                checked += 1
                if why := _mismatch(launch.out, ref, atol, rtol):
                    wrong += 1
                    print(f"{g.shape_id[:50]:50} {variant:7} {why}  {cfg}")
                    continue
                us[variant] = 1e3 * do_bench(launch.run, return_mode="median")
                best[variant] = min(best.get(variant, float("inf")), us[variant])
                if variant != "base" and "base" in us:
                    ratios.setdefault((g.kind, variant), []).append(us[variant] / us["base"])
                    print(f"{g.shape_id[:50]:50} {variant:7} {us['base']:9.1f} "
                          f"{us[variant]:9.1f} {us[variant] / us['base']:6.3f}  {cfg}")
        if "base" in best:
            for variant, t in sorted(best.items()):
                if variant != "base":
                    best_ratios.setdefault((g.kind, variant), []).append(t / best["base"])
            print(f"{g.shape_id[:50]:50} best over torch's op ({torch_us:.1f} us): "
                  + ", ".join(f"{v} {t / torch_us:.3f}" for v, t in sorted(best.items())))
        del inputs, ref
    for (k, variant), xs in sorted(ratios.items()):
        bx = best_ratios.get((k, variant), [])
        print(f"{k} {variant}: over the configuration as it runs, median "
              f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}) over {len(xs)} pairs; "
              f"each shape's best over its best as it runs, median "
              f"{statistics.median(bx) if bx else float('nan'):.3f}")
    print(f"wrong results: {wrong} of {checked} runs checked")
    return 1 if wrong else 0


def variants(kind: str, knobs: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """The configuration as it runs (``base``) and the variants that apply to it."""
    out: list[tuple[str, dict[str, int]]] = [("base", {})]
    if kind != "attention" and knobs.get("PERSISTENT", 0):
        out.append(("nested", {"PERSISTENT": 2}))
    out.append(("ws", {"WS": 1}))
    return out

if __name__ == "__main__":
    sys.exit(main())
