"""Does a row's time over its reference hold where its time alone does not?

    python bench/steady_clock.py [--kind matmul ...] [--shapes TEXT] [--configs 3] [--rounds 4]

For every golden shape of the kinds (default: every kind), the card's anchor and ``--configs``
minus one seeded random configurations of the pool are each measured ``--rounds`` times the
harness's way (``Bencher.measure``: timed interleaved with the kind's reference, L2 flushed).
Before every other round the GPU is kept busy for ``--heat-ms`` with bf16 GEMMs, so some
rounds start warm and some cool, as the rows of a long sweep do.  Per configuration: the
spread (slowest over fastest) of the measured time and of the time over the reference across
the rounds; per kind the medians of both.  Where the second is the smaller, the reference
moved with the configuration and :mod:`harness.steady`'s times at the shape's reference clock
rank configurations more steadily than the measured times.  Every run is checked against the
reference first; a failure is printed and left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", action="append", default=None, help="kinds to run (repeated)")
    ap.add_argument("--shapes", default="", help="only golden shape ids containing this text")
    ap.add_argument("--configs", type=int, default=3, help="configurations per shape")
    ap.add_argument("--rounds", type=int, default=4, help="measurements per configuration")
    ap.add_argument("--heat-ms", type=float, default=300.0,
                    help="GEMM load before every other round (ms)")
    args = ap.parse_args(argv)
    if args.rounds < 2 or args.configs < 1:
        ap.error("--rounds needs at least 2 and --configs at least 1")

    from harness import kinds as registry

    kinds = args.kind or registry.names()
    for k in kinds:
        if k not in registry.names():
            ap.error(f"--kind {k!r}; valid kinds: {', '.join(registry.names())}")

    import torch
    from _live import live_setup, shape_configs

    from harness import goldens
    from harness.cards import DEPLOYABLE
    from harness.points import make_spec

    live = live_setup()
    if live is None:
        return 2
    card, bencher, anchors = live
    heat_a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def heat() -> None:
        end = time.perf_counter() + args.heat_ms / 1e3
        while time.perf_counter() < end:
            for _ in range(4):
                heat_a @ heat_a
            torch.cuda.synchronize()

    print(f"card: {card.name}; {args.rounds} rounds, {args.heat_ms:.0f} ms of GEMMs before "
          "every other round")
    print(f"{'shape':44} {'time max/min':>12} {'time/ref max/min':>16}  config")
    spread: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for g in goldens.shapes(DEPLOYABLE, kinds=kinds):
        if args.shapes not in g.shape_id:
            continue
        kind = registry.get(g.kind)
        pool = kind.enumerate(g.shape, card)
        first = [anchors[g.shape_id]] if g.shape_id in anchors else []
        configs = shape_configs(g.shape_id, pool, first, args.configs - len(first),
                                 kind.knob_space(g.shape, card))
        times: dict[str, list[tuple[float, float]]] = defaultdict(list)
        failed: set[str] = set()
        for rnd in range(args.rounds):
            if rnd % 2:
                heat()
            for knobs in configs:
                spec = make_spec(knobs)
                if spec in failed:
                    continue
                got = bencher.measure({"kind": g.kind, "shape": g.shape, "knobs": knobs})
                if got["status"] != "ok":
                    failed.add(spec)
                    print(f"{g.shape_id[:44]:44} {got['status']}: {str(got['error'])[:80]}  {spec}")
                    continue
                times[spec].append((got["value_us"], got["ref_us"]))
        for spec, ts in times.items():
            if len(ts) < args.rounds:
                continue
            raw = [v for v, _ in ts]
            ratio = [v / r for v, r in ts]
            a, b = max(raw) / min(raw), max(ratio) / min(ratio)
            spread[g.kind][0].append(a)
            spread[g.kind][1].append(b)
            print(f"{g.shape_id[:44]:44} {a:12.3f} {b:16.3f}  {spec}", flush=True)
    print()
    print(f"{'kind':12} {'configs':>7} {'time max/min median':>20} {'time/ref max/min median':>24}")
    for k, (a, b) in spread.items():
        print(f"{k:12} {len(a):7d} {statistics.median(a):20.3f} {statistics.median(b):24.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
