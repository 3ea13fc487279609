"""attention's persistent warp-specialized kernel (``PERSISTENT=1``) beside its one tile a
program (``PERSISTENT=0``), side by side, on the kind's own launches.

    python bench/attention_persistent.py [--gpu h100] [--shapes TEXT] [--rounds 3]   # GPU
    python bench/attention_persistent.py --list [--gpu h100]          # the plan, no GPU

Each golden attention shape's warp-specialized tilings of :data:`TILINGS` that realize on the
card (and the card's anchor, where it is one, and ``--spec``, repeated) run both ways: one
program a tile, and a program a multiprocessor that takes tile after tile (its next tile's
first K/V blocks and Q load while it finishes the current one). The points are compiled ahead
on the machine's cores (the box's compile pool), each launch is checked against the fp32
reference, then timed with ``triton.testing.do_bench`` (median, L2 flushed between calls), the
rounds interleaved, beside SDPA. Prints, per shape, each tiling's persistent time over its
one-tile time and the best of each form over SDPA's time.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (BLOCK_M, BLOCK_N, GLUON, num_stages): two consumer warpgroups (128 rows) and three (192)
TILINGS = [(128, 128, 3, 3), (128, 128, 4, 3), (128, 128, 3, 2), (128, 128, 4, 2),
           (128, 64, 3, 3), (128, 64, 4, 4), (192, 128, 3, 3), (192, 128, 4, 3),
           (192, 128, 4, 4), (192, 64, 3, 3), (192, 64, 4, 3), (192, 64, 4, 4)]


def plan(card: Any, gpu: str, shapes: str, specs: list[str]) -> list[tuple[Any, list[dict]]]:
    """(golden shape, configurations at PERSISTENT=0) for each shape: the tilings, the card's
    anchor where it is a warp-specialized one, ``specs``; those whose persistent twin
    realizes on ``card``."""
    from _live import card_anchors

    from harness import goldens
    from harness import kinds as registry
    from harness.cards import DEPLOYABLE, by_alias
    from harness.kinds.base import completed
    from harness.points import make_spec, parse_spec

    kind = registry.get("attention")
    anchors = card_anchors(by_alias(gpu).name, goldens.anchors())
    extra = [{k: int(v) for k, v in parse_spec(s).items()} for s in specs]
    out = []
    for g in goldens.shapes(DEPLOYABLE, kinds=["attention"]):
        if shapes not in g.shape_id:
            continue
        space = kind.knob_space(g.shape, card)
        first = [anchors[g.shape_id]] if g.shape_id in anchors else []
        tiles = [{"BLOCK_M": bm, "BLOCK_N": bn, "TMA": 1, "GLUON": gl, "num_warps": bm // 16,
                  "num_stages": st} for bm, bn, gl, st in TILINGS]
        configs: dict[str, dict] = {}
        for k in first + extra + tiles:
            k = completed({**k, "PERSISTENT": 0}, space)
            if kind.realizable({**k, "PERSISTENT": 1}, g.shape, card):
                configs.setdefault(make_spec(k), k)
        out.append((g, list(configs.values())))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="h100", help="whose anchors (a card alias); on a GPU the "
                                                  "live card's realizability decides")
    ap.add_argument("--spec", action="append", default=[],
                    help="another configuration, e.g. "
                         "BLOCK_M=128,BLOCK_N=128,GLUON=3,TMA=1,num_stages=3,num_warps=8")
    ap.add_argument("--shapes", default="", help="only golden shape ids containing this text")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--list", action="store_true", help="print the plan for --gpu and stop")
    args = ap.parse_args(argv)

    from harness.cards import by_alias
    from harness.points import make_spec

    if args.list:
        for g, configs in plan(by_alias(args.gpu), args.gpu, args.shapes, args.spec):
            print(f"{g.shape_id}: {len(configs)} configurations, each both ways")
            for k in configs:
                print(f"  {make_spec(k)}")
        return 0

    import torch
    from triton.testing import do_bench

    from harness.cards import canonicalize

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (--list prints the plan without one)", file=sys.stderr)
        return 2
    card = canonicalize(torch.cuda.get_device_name())
    if card is None:
        print(f"{torch.cuda.get_device_name()} is not in the card catalog", file=sys.stderr)
        return 2

    from harness import kinds as registry
    from harness.box.bench import _mismatch
    from harness.box.compiler import CompilePool, default_workers

    kind = registry.get("attention")
    cases = plan(card, args.gpu, args.shapes, args.spec)
    t0 = time.time()
    pool = CompilePool(default_workers(), target=("cuda", card.cc[0] * 10 + card.cc[1], 32))
    todo = [(g, {**k, "PERSISTENT": p}) for g, configs in cases for k in configs for p in (0, 1)]
    for i, (g, k) in enumerate(todo):
        pool.submit(str(i), "attention", g.shape, k)
    for i in range(len(todo)):
        pool.wait(str(i), 600)
    pool.close()
    print(f"{card.name}: {len(todo)} points compiled ahead in {time.time() - t0:.0f} s")
    wrong = checked = 0
    rows = []
    for g, configs in cases:
        shape = g.shape
        inputs = kind.make_inputs(shape, "cuda", 0)
        ref = kind.reference(shape, inputs)
        tol = kind.tolerance(shape["dtype"])
        runs: dict[tuple[str, int], Any] = {}
        for k in configs:
            for p in (0, 1):
                run = kind.prepare({**k, "PERSISTENT": p}, shape, inputs).run
                inputs["out"].fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                checked += 1
                if _mismatch(inputs["out"], ref, *tol):
                    wrong += 1
                    print(f"{g.shape_id} {make_spec(k)} PERSISTENT={p}: WRONG")
                    continue
                runs[(make_spec(k), p)] = run
        sdpa = functools.partial(kind.reference, shape, inputs)
        times: dict[Any, list[float]] = {key: [] for key in [*runs, "sdpa"]}
        for _ in range(args.rounds):
            for key in times:
                fn = sdpa if key == "sdpa" else runs[key]
                times[key].append(1e3 * do_bench(fn, return_mode="median"))
        med = {key: statistics.median(v) for key, v in times.items()}
        sdpa_us = med.pop("sdpa")
        print(f"\n{g.shape_id}: SDPA {sdpa_us:.1f} us")
        print(f"  {'one tile':>9} {'persistent':>10} {'ratio':>6}  configuration (PERSISTENT=0)")
        for spec in sorted({s for s, _ in med}, key=lambda s: med.get((s, 0), 1e9)):
            a, b = med.get((spec, 0)), med.get((spec, 1))
            ratio = f"{b / a:6.3f}" if a and b else f"{'-':>6}"
            print(f"  {a or 0:9.1f} {b or 0:10.1f} {ratio}  {spec}")
        best = [min((us for (_, p), us in med.items() if p == form), default=None)
                for form in (0, 1)]
        if None not in best:
            rows.append((g.shape_id, best[1] / best[0], best[0] / sdpa_us, best[1] / sdpa_us))
    if rows:
        print(f"\n{'shape':58} {'best p/1':>8} {'1/SDPA':>7} {'p/SDPA':>7}")
        for shape_id, r, a, b in rows:
            print(f"{shape_id:58} {r:8.3f} {a:7.3f} {b:7.3f}")
    print(f"wrong results: {wrong} of {checked} launches checked")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
