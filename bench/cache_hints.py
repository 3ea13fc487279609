"""The row kinds' L2 cache hints (``EVICT=1``) beside the same configurations without them.

    python bench/cache_hints.py [--kind reduce] [--shapes TEXT] [--n 6]

For every golden shape of reduce, rms_norm and softmax: the card's anchor (where there is
one), the shipped heuristic and ``--n`` seeded random configurations of the pool, each run
with ``EVICT=0`` and ``EVICT=1``, timed by the harness's own method (``Bencher.measure``: A/B
against the reference, L2 flushed and guarded, the sweep's defaults) and by
``triton.testing.do_bench`` (median, L2 flushed), beside torch.compile's kernel measured the
harness's way (do_bench would add torch.compile's host-side call to a kernel of a few
microseconds). Prints each pair's EVICT=1 over EVICT=0, each shape's best of either side over
torch.compile's time, and per kind the medians. Every run is checked against the reference
first (the Bencher's check); a failure is printed, a wrong result also counted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.shipped import ROW_KINDS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", action="append", default=None, choices=ROW_KINDS,
                    help="kinds to run (repeated; default all three)")
    ap.add_argument("--shapes", default="", help="only golden shape ids containing this text")
    ap.add_argument("--n", type=int, default=6, help="random pool configurations per shape")
    args = ap.parse_args(argv)

    import triton.testing
    from _live import live_setup, shape_configs

    from harness import goldens, shipped
    from harness import kinds as registry
    from harness.cards import DEPLOYABLE
    from harness.points import make_spec

    live = live_setup()
    if live is None:
        return 2
    card, bencher, anchors = live
    print(f"card: {card.name}")
    print(f"{'shape':34} {'evict0_us':>9} {'evict1_us':>9} {'1/0':>6} {'do_bench 1/0':>12}  config")
    pairs: dict[str, list[float]] = {}
    db_pairs: dict[str, list[float]] = {}
    over_compile: dict[str, list[tuple[float, float]]] = {}
    wrong = 0
    for g in goldens.shapes(DEPLOYABLE, kinds=list(args.kind or ROW_KINDS)):
        if args.shapes not in g.shape_id:
            continue
        kind = registry.get(g.kind)
        pool = kind.enumerate(g.shape, card)
        first = [anchors[g.shape_id]] if g.shape_id in anchors else []
        if (h := shipped.heuristic(g.kind, g.shape, card)) is not None:
            first.append(h)
        configs = shape_configs(g.shape_id, pool, first, args.n,
                                 kind.knob_space(g.shape, card))
        seen: set[str] = set()
        best = {0: float("inf"), 1: float("inf")}
        inputs = kind.make_inputs(g.shape, "cuda", 0)  # do_bench's; the Bencher has its own
        for knobs in configs:
            base = {k: v for k, v in knobs.items() if k != "EVICT"}
            if make_spec(base) in seen:
                continue
            seen.add(make_spec(base))
            us: dict[int, float] = {}
            db: dict[int, float] = {}
            for evict in (0, 1):
                point = {**base, "EVICT": evict}
                res = bencher.measure({"kind": g.kind, "shape": g.shape, "knobs": point})
                if res["status"] != "ok":
                    wrong += str(res.get("error") or "").startswith("wrong result")
                    print(f"{g.shape_id[:34]:34} EVICT={evict} {res['status']}: {res['error']}")
                    continue
                us[evict] = res["value_us"]
                best[evict] = min(best[evict], us[evict])
                launch = kind.prepare(point, g.shape, inputs)
                db[evict] = 1e3 * triton.testing.do_bench(launch.run, return_mode="median")
            if len(us) == 2:
                pairs.setdefault(g.kind, []).append(us[1] / us[0])
                db_pairs.setdefault(g.kind, []).append(db[1] / db[0])
                print(f"{g.shape_id[:34]:34} {us[0]:9.2f} {us[1]:9.2f} {us[1] / us[0]:6.3f} "
                      f"{db[1] / db[0]:12.3f}  {make_spec(base)}")
        del inputs
        res = bencher.measure({"kind": g.kind, "shape": g.shape,
                               "knobs": {shipped.BASELINE_KNOB: "compile"}})
        if res["status"] == "ok" and best[0] < float("inf") and best[1] < float("inf"):
            c = res["value_us"]
            over_compile.setdefault(g.kind, []).append((c / best[0], c / min(best.values())))
            print(f"{g.shape_id[:34]:34} torch.compile {c:.2f} us over the best: EVICT=0 only "
                  f"{c / best[0]:.3f}, with EVICT=1 {c / min(best.values()):.3f}")
    for k in args.kind or ROW_KINDS:
        if k in pairs:
            oc = over_compile.get(k, [])
            print(f"{k}: EVICT=1 over EVICT=0 median {statistics.median(pairs[k]):.3f} "
                  f"({min(pairs[k]):.3f}-{max(pairs[k]):.3f}, {len(pairs[k])} pairs; do_bench "
                  f"{statistics.median(db_pairs[k]):.3f}); torch.compile over the best, "
                  + (f"mean {statistics.mean(a for a, _ in oc):.3f} without EVICT=1, "
                     f"{statistics.mean(b for _, b in oc):.3f} with it" if oc else "not measured"))
    print(f"wrong results: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
