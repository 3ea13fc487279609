"""Re-time measured rows with ``triton.testing.do_bench`` and print both side by side.

    python bench/compare_do_bench.py ROWS.jsonl [ROWS.jsonl ...] [--n 12] [--best]
        [--where TMA=1] [--kind attention] [--again]

Takes up to ``--n`` ok rows (spread over kinds and shapes), re-times each kernel on the same
inputs with ``do_bench`` (which flushes L2 between calls too) and prints the harness's
median, do_bench's median and their ratio.  ``--best`` takes each shape's fastest
configuration at the shape's reference clock (harness/steady.py: the row a cost model and a
user would pick), its time as measured; ``--where KNOB=VALUE`` (repeated)
keeps rows whose knobs have those values.  ``--again`` also times each row anew with the
harness's own method (``Bencher.measure``: A/B against the reference, L2 flushed and guarded,
the sweep's default calls), just before ``do_bench``: ``now/do_bench`` is the two methods on
the same card at the same moment; ``then/now`` is what changed since the sweep (the card's
clocks, and for ``--best`` the pick itself: the fastest of many near-equal rows is the one
whose timing came out low, so its re-timing is expected to be slower).  Baseline rows
(torch's op, torch.compile) are not Triton configurations and are never taken.  Needs the
GPU the rows were measured on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--best", action="store_true", help="each shape's fastest row")
    ap.add_argument("--where", action="append", default=[], metavar="KNOB=VALUE")
    ap.add_argument("--kind", action="append", default=[])
    ap.add_argument("--again", action="store_true",
                    help="also re-time each row with the harness's method, beside do_bench")
    args = ap.parse_args()
    where = {}
    for w in args.where:
        knob, sep, value = w.partition("=")
        if not sep or not knob:
            ap.error(f"--where {w}: expected KNOB=VALUE, e.g. --where TMA=1")
        where[knob] = value

    import torch
    import triton.testing

    from harness import kinds as registry

    rows = [json.loads(line) for f in args.rows for line in Path(f).read_text().splitlines()
            if line.strip()]
    ok = [r for r in rows if r["status"] == "ok" and r["regime"] == "deployable"
          and "baseline" not in r["knobs"] and (not args.kind or r["kind"] in args.kind)
          and all(str(r["knobs"].get(k)) == v for k, v in where.items())]
    by_shape: dict[str, list[dict]] = defaultdict(list)
    for r in ok:
        by_shape[r["shape_id"]].append(r)
    if args.best:  # each shape's fastest at its reference clock, compared as measured
        from harness.steady import MEASURED, steadied

        def fastest(rs: list[dict]) -> dict:
            r = min(steadied(rs), key=lambda r: r["value_us"])
            return {**r, "value_us": r.get(MEASURED, r["value_us"])}

        by_shape = defaultdict(list, {sid: [fastest(rs)] for sid, rs in by_shape.items()})
    picked: list[dict] = []
    while len(picked) < args.n and any(by_shape.values()):
        for sid in sorted(by_shape):
            if by_shape[sid] and len(picked) < args.n:
                picked.append(by_shape[sid].pop(0))
    bencher = None
    if args.again:
        from harness.box.bench import Bencher
        from harness.contract import ToolsSpec

        o = ToolsSpec()  # the sweep's defaults
        bencher = Bencher("cuda", o.warmup, o.iters, max_cv=o.max_cv, remeasure=o.remeasure)
        bencher.start()
    now_col = f" {'now_us':>9} {'now/do_bench':>12} {'then/now':>8}" if bencher else ""
    print(f"{'kind':8} {'shape':38} {'harness_us':>11} {'do_bench_us':>12} {'ratio':>6}"
          f"{now_col}  spec")
    ratios, now_ratios, drift = [], [], []
    for r in picked:
        kind = registry.get(r["kind"])
        now: float | None = None
        if bencher is not None:
            got = bencher.measure({"kind": r["kind"], "shape": r["shape"], "knobs": r["knobs"]})
            if got["status"] == "ok":
                now = got["value_us"]
        inputs = kind.make_inputs(r["shape"], "cuda", 0)
        launch = kind.prepare(r["knobs"], r["shape"], inputs)
        launch.run()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(launch.run, warmup=25, rep=100, return_mode="median")
        us = ms * 1e3
        ratio = r["value_us"] / us
        ratios.append(ratio)
        cols = ""
        if bencher is not None:
            if now is not None:
                now_ratios.append(now / us)
                drift.append(r["value_us"] / now)
                cols = f" {now:9.2f} {now / us:12.3f} {r['value_us'] / now:8.3f}"
            else:
                cols = f" {'failed':>9} {'-':>12} {'-':>8}"
        print(f"{r['kind']:8} {r['shape_id'][:38]:38} {r['value_us']:11.2f} {us:12.2f} "
              f"{ratio:6.3f}{cols}  {r['spec']}")
        del inputs
    for what, xs in (("harness/do_bench", ratios), ("harness now/do_bench", now_ratios),
                     ("harness then/now", drift)):
        if xs:
            print(f"median ratio {what} over {len(xs)} points: {statistics.median(xs):.3f} "
                  f"(min {min(xs):.3f}, max {max(xs):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
