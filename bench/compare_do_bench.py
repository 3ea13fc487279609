"""Re-time measured rows with ``triton.testing.do_bench`` and print both side by side.

    python bench/compare_do_bench.py ROWS.jsonl [ROWS.jsonl ...] [--n 12] [--best]
        [--where TMA=1] [--kind attention]

Takes up to ``--n`` ok rows (spread over kinds and shapes), re-times each kernel on the same
inputs with ``do_bench`` (which flushes L2 between calls too) and prints the harness's
median, do_bench's median and their ratio.  ``--best`` takes each shape's fastest
configuration (the row a cost model and a user would pick); ``--where KNOB=VALUE`` (repeated)
keeps rows whose knobs have those values.  Baseline rows (torch's op, torch.compile) are not
Triton configurations and are never taken.  Needs the GPU the rows were measured on.
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
    if args.best:
        by_shape = defaultdict(list, {sid: [min(rs, key=lambda r: r["value_us"])]
                                      for sid, rs in by_shape.items()})
    picked: list[dict] = []
    while len(picked) < args.n and any(by_shape.values()):
        for sid in sorted(by_shape):
            if by_shape[sid] and len(picked) < args.n:
                picked.append(by_shape[sid].pop(0))
    print(f"{'kind':8} {'shape':38} {'harness_us':>11} {'do_bench_us':>12} {'ratio':>6}  spec")
    ratios = []
    for r in picked:
        kind = registry.get(r["kind"])
        inputs = kind.make_inputs(r["shape"], "cuda", 0)
        launch = kind.prepare(r["knobs"], r["shape"], inputs)
        launch.run()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(launch.run, warmup=25, rep=100, return_mode="median")
        us = ms * 1e3
        ratio = r["value_us"] / us
        ratios.append(ratio)
        print(f"{r['kind']:8} {r['shape_id'][:38]:38} {r['value_us']:11.2f} {us:12.2f} {ratio:6.3f}  {r['spec']}")
        del inputs
    if ratios:
        print(f"median ratio harness/do_bench over {len(ratios)} points: {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
