"""The same points measured twice, and against ``triton.testing.do_bench``, side by side.

    python bench/reproducibility.py ROWS.jsonl [ROWS.jsonl ...] [--n 240] [--do-bench-n 120]
                                    [--per-shape 10]

Run on the box that measured the rows.  Takes up to ``--n`` ok deployable rows (``--per-shape``
of each shape, shapes taken in turn over kinds), measures their points again in a fresh bench worker (the sweep's own measuring code
and settings, in a new process, in a shuffled order), then times a sample with ``do_bench``.
Prints per shape the Spearman correlation between the two runs, the median relative difference,
and the agreement with ``do_bench``; then the medians over shapes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def spearman(a: list[float], b: list[float]) -> float:
    from harness.stats import spearman as rho

    r = rho(a, b)
    return float("nan") if r is None else r


def pick(rows: list[dict[str, Any]], n: int, per_shape: int = 0) -> list[dict[str, Any]]:
    """Up to ``n`` rows.  With ``per_shape``, whole shapes of ``per_shape`` rows each (shapes that
    have that many, taken in turn over kinds, so a per-shape Spearman ranks enough points);
    otherwise round-robin over every shape."""
    by_shape: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_shape[r["shape_id"]].append(r)
    for v in by_shape.values():
        random.Random(0).shuffle(v)
    picked: list[dict[str, Any]] = []
    if per_shape:
        by_kind: dict[str, list[str]] = defaultdict(list)
        for sid in sorted(by_shape):
            if len(by_shape[sid]) >= per_shape:
                by_kind[by_shape[sid][0]["kind"]].append(sid)
        for sids in by_kind.values():
            random.Random(0).shuffle(sids)
        while len(picked) + per_shape <= n and any(by_kind.values()):
            for kind in sorted(by_kind):
                if by_kind[kind] and len(picked) + per_shape <= n:
                    picked += by_shape[by_kind[kind].pop()][:per_shape]
        return picked
    while len(picked) < n and any(by_shape.values()):
        for sid in sorted(by_shape):
            if by_shape[sid] and len(picked) < n:
                picked.append(by_shape[sid].pop())
    return picked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--n", type=int, default=240)
    ap.add_argument("--do-bench-n", type=int, default=120)
    ap.add_argument("--per-shape", type=int, default=10,
                    help="points per shape (shapes with fewer are skipped); 0 spreads over all shapes")
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()

    from harness.box.runner import Worker

    rows = [json.loads(line) for f in args.rows for line in Path(f).read_text().splitlines()
            if line.strip()]
    from harness.shipped import is_baseline

    # configurations only: a baseline (torch's op, torch.compile) is no Triton kernel
    ok = [r for r in rows if r["status"] == "ok" and r["regime"] == "deployable"
          and not is_baseline(str(r.get("spec") or ""))]
    picked = pick(ok, args.n, args.per_shape)
    if not picked:
        raise SystemExit("no ok deployable rows in the given files")
    prov = picked[0]["provenance"]
    order = list(range(len(picked)))
    random.Random(1).shuffle(order)
    second: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker("deployable", prov.get("warmup", 5), prov.get("iters", 20), 0,
                        Path(tmp) / "worker.log", max_cv=prov.get("max_cv", 0.05))
        try:
            for i in order:
                r = picked[i]
                res = worker.bench({"kind": r["kind"], "shape": r["shape"], "knobs": r["knobs"]}, 300)
                if res["status"] == "ok":
                    second[i] = res["value_us"]
        finally:
            worker.close()

    import triton.testing

    from harness import kinds as registry

    dob: dict[int, float] = {}
    sample = sorted(random.Random(2).sample(range(len(picked)), min(args.do_bench_n, len(picked))),
                    key=lambda i: picked[i]["shape_id"])
    key, inputs = None, None
    for i in sample:
        r = picked[i]
        kind = registry.get(r["kind"])
        if key != r["shape_id"]:
            inputs, key = kind.make_inputs(r["shape"], "cuda", 0), r["shape_id"]
        launch = kind.prepare(r["knobs"], r["shape"], inputs)
        dob[i] = triton.testing.do_bench(launch.run, return_mode="median") * 1e3

    per_shape: dict[str, list[int]] = defaultdict(list)
    for i in second:
        per_shape[picked[i]["shape_id"]].append(i)
    print(f"{'shape':44} {'pts':>4} {'spearman':>9} {'med rel diff':>13} {'do_bench pts':>12} "
          f"{'med ratio':>10} {'spearman':>9}")
    sp_runs, sp_dob, rel_all, ratio_all = [], [], [], []
    for sid in sorted(per_shape):
        idx = per_shape[sid]
        a = [picked[i]["value_us"] for i in idx]
        b = [second[i] for i in idx]
        rel = [abs(x - y) / x for x, y in zip(a, b, strict=True)]
        rel_all += rel
        s = spearman(a, b) if len(idx) >= 3 else float("nan")
        if len(idx) >= 3:
            sp_runs.append(s)
        di = [i for i in idx if i in dob]
        ratios = [second[i] / dob[i] for i in di]
        ratio_all += ratios
        sd = spearman([second[i] for i in di], [dob[i] for i in di]) if len(di) >= 3 else float("nan")
        if len(di) >= 3:
            sp_dob.append(sd)
        print(f"{sid[:44]:44} {len(idx):4d} {s:9.3f} {statistics.median(rel):13.2%} {len(di):12d} "
              f"{(statistics.median(ratios) if ratios else float('nan')):10.3f} {sd:9.3f}")
    summary = {
        "points": len(picked), "remeasured_ok": len(second), "shapes": len(per_shape),
        "median_shape_spearman": statistics.median(sp_runs) if sp_runs else None,
        "min_shape_spearman": min(sp_runs) if sp_runs else None,
        "median_rel_diff": statistics.median(rel_all) if rel_all else None,
        "p90_rel_diff": sorted(rel_all)[int(0.9 * (len(rel_all) - 1))] if rel_all else None,
        "do_bench_points": len(ratio_all),
        "median_ratio_to_do_bench": statistics.median(ratio_all) if ratio_all else None,
        "within_5pct_of_do_bench": (sum(abs(x - 1) <= 0.05 for x in ratio_all) / len(ratio_all))
        if ratio_all else None,
        "median_shape_spearman_vs_do_bench": statistics.median(sp_dob) if sp_dob else None,
    }
    print(f"\n{summary['points']} points, {summary['remeasured_ok']} ok again, over "
          f"{summary['shapes']} shapes")
    print(f"re-measure: median per-shape Spearman {summary['median_shape_spearman']:.3f} "
          f"(worst {summary['min_shape_spearman']:.3f}); median relative difference "
          f"{summary['median_rel_diff']:.2%} (90th percentile {summary['p90_rel_diff']:.2%})")
    if ratio_all:
        print(f"against do_bench ({len(ratio_all)} points): median ratio harness/do_bench "
              f"{summary['median_ratio_to_do_bench']:.3f}, {summary['within_5pct_of_do_bench']:.0%} "
              f"within 5%, median per-shape Spearman {summary['median_shape_spearman_vs_do_bench']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
