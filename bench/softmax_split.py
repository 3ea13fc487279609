"""softmax's ``SPLIT`` (a row dealt to several programs) beside one program per row.

    python bench/softmax_split.py [--n 12] [--max-rows 512]

For every golden softmax shape of at most ``--max-rows`` rows: ``--n`` seeded random pool
configurations with ``SPLIT=1`` and ``--n`` with ``SPLIT>1``, the card's anchor, and the
anchor's split twins (``SPLIT`` 4 to 32, ``BLOCK_N`` 1024 to 8192, ``EVICT`` 0 and 1, one stage,
where they realize), each measured the harness's way (``Bencher.measure``: checked against
the reference, then timed interleaved with it, L2 flushed), and ``torch.compile``'s kernel
the same way.  Per shape: the best of each side (by time over the reference, the clock-steady
ratio of harness/steady.py), the split side over the other, and ``torch.compile`` over the
best without and with splits.  A failed check is printed and counted.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=12, help="random configurations a side per shape")
    ap.add_argument("--max-rows", type=int, default=512, help="only shapes of at most M rows")
    args = ap.parse_args(argv)

    from _live import live_setup

    from harness import goldens
    from harness import kinds as registry
    from harness.cards import DEPLOYABLE
    from harness.points import make_spec
    from harness.shipped import BASELINE_KNOB

    live = live_setup()
    if live is None:
        return 2
    card, bencher, anchors = live
    kind = registry.get("softmax")
    failed = 0
    print(f"card: {card.name}")
    for g in goldens.shapes(DEPLOYABLE, kinds=["softmax"]):
        if g.shape["M"] > args.max_rows:
            continue
        pool = kind.enumerate(g.shape, card)
        rnd = random.Random(g.shape_id)
        whole = [p for p in pool if p.get("SPLIT", 1) == 1]
        split = [p for p in pool if p.get("SPLIT", 1) > 1]
        configs: list[dict[str, Any]] = (rnd.sample(whole, min(args.n, len(whole)))
                                         + rnd.sample(split, min(args.n, len(split))))
        if g.shape_id in anchors:
            anchor = anchors[g.shape_id]
            configs.append(anchor)
            configs += [c for e in (0, 1) for s in (4, 8, 16, 32) for bn in (1024, 2048, 4096, 8192)
                        if kind.unrealizable(c := dict(anchor, SPLIT=s, EVICT=e, ONE_PASS=0,
                                                       BLOCK_N=bn, num_stages=1),
                                             g.shape, card) is None]
        best: dict[bool, tuple[float, float, str]] = {}
        for knobs in configs:
            got = bencher.measure({"kind": "softmax", "shape": g.shape, "knobs": knobs})
            if got["status"] != "ok":
                failed += 1
                print(f"  {got['status']}: {str(got['error'])[:100]}  {make_spec(knobs)}")
                continue
            side = knobs.get("SPLIT", 1) > 1
            entry = (got["value_us"] / got["ref_us"], got["value_us"], make_spec(knobs))
            if side not in best or entry < best[side]:
                best[side] = entry
        comp = bencher.measure({"kind": "softmax", "shape": g.shape,
                                "knobs": {BASELINE_KNOB: "compile"}})
        if False not in best or True not in best or comp["status"] != "ok":
            print(f"{g.shape_id}: a side or torch.compile has no time")
            continue
        c = comp["value_us"] / comp["ref_us"]
        (w, wus, wspec), (s, sus, sspec) = best[False], best[True]
        print(f"{g.shape_id}: one program a row {wus:.1f} us, split {sus:.1f} us, "
              f"torch.compile {comp['value_us']:.1f} us; split over one {s / w:.3f}; "
              f"torch.compile over the best {c / min(w, s):.3f} (without splits {c / w:.3f})")
        print(f"    best split: {sspec}\n    best one:   {wspec}", flush=True)
    print(f"failed checks: {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
