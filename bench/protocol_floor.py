"""What the measuring protocol alone costs a sweep: the floor under its time per point.

    python bench/protocol_floor.py --db NODE.db [--gpu NAME] [--jobs-s S] [--serial-per-hour R]

Every point is run once to check it and then, per timing window (one, or more when it was
timed again for noise), ``warmup`` calls and ``iters`` timed calls of the candidate, each
interleaved with a call of the torch reference.  From the rows a sweep left in the node table
(their medians, the reference's median, the warm-up and iteration counts and the windows in
their provenance) this sums the GPU time of those calls alone, per kind, and what it means:
with nothing else (no flush, no launch-gap guard, no host work, no compile wait) a sweep of
these points could not go faster than ``points / floor``.  With ``--jobs-s`` (the sweep's job
wall time) it prints the share of that time the calls themselves took, and with
``--serial-per-hour`` (``bench/throughput.py``'s serial loop on the same points) the ratio
the floor allows.  Reads the DB only; CPU and disk.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path


def floor_by_kind(db: Path, gpu: str | None = None) -> dict[str, tuple[int, float, float]]:
    """kind → (points, seconds of candidate calls, seconds of reference calls) over the ok rows
    of configurations and baselines alike (every one of them was timed the same way)."""
    sql = "SELECT kind, value_us, ref_us, provenance FROM node WHERE status = 'ok'"
    args: tuple[str, ...] = ()
    if gpu:
        sql += " AND gpu = ?"
        args = (gpu,)
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for kind, value_us, ref_us, prov in conn.execute(sql, args):
            p = json.loads(prov or "{}")
            windows = 1 + int(p.get("remeasured") or 0)
            calls = 1 + windows * (int(p.get("warmup", 5)) + int(p.get("iters", 20)))
            acc = out[kind]
            acc[0] += 1
            acc[1] += calls * float(value_us) / 1e6
            acc[2] += calls * float(ref_us or 0.0) / 1e6
    return {k: (int(n), c, r) for k, (n, c, r) in out.items()}


def report(by_kind: dict[str, tuple[int, float, float]], jobs_s: float | None,
           serial_per_hour: float | None) -> list[str]:
    lines = [f"{'kind':12} {'points':>7} {'candidate s':>12} {'reference s':>12} {'ms a point':>11}"]
    for kind, (n, c, r) in sorted(by_kind.items()):
        lines.append(f"{kind:12} {n:>7} {c:>12.1f} {r:>12.1f} {(c + r) / n * 1e3:>11.2f}")
    n = sum(v[0] for v in by_kind.values())
    cand = sum(v[1] for v in by_kind.values())
    ref = sum(v[2] for v in by_kind.values())
    if not n:
        return ["no ok rows"]
    rate = n / (cand + ref) * 3600 if cand + ref else float("inf")
    lines.append(f"all          {n:>7} {cand:>12.1f} {ref:>12.1f} {(cand + ref) / n * 1e3:>11.2f}")
    lines.append(f"the protocol's calls alone: {cand + ref:.1f}s for {n} points -> at most "
                 f"{rate:,.0f} points per GPU-hour")
    if jobs_s:
        lines.append(f"of {jobs_s:g}s of jobs: candidates' calls {cand / jobs_s:.1%}, the "
                     f"reference's {ref / jobs_s:.1%}; the rest ({1 - (cand + ref) / jobs_s:.1%}) "
                     "is flushes, guards, launches, compile waits and the harness")
    if serial_per_hour:
        lines.append(f"against a serial loop of {serial_per_hour:,.0f} points per GPU-hour: at most "
                     f"{rate / serial_per_hour:.1f}x (measured sweeps stay under it); without the "
                     f"reference's calls {n / cand * 3600 / serial_per_hour:.1f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, type=Path, help="a node table a sweep merged into")
    ap.add_argument("--gpu", help="only this card's rows (the gpu column)")
    ap.add_argument("--jobs-s", type=float, help="the sweep's job wall time, seconds")
    ap.add_argument("--serial-per-hour", type=float,
                    help="bench/throughput.py's serial loop on the same points, points per GPU-hour")
    args = ap.parse_args(argv)
    if not args.db.is_file():
        print(f"--db {args.db}: no such file", file=sys.stderr)
        return 2
    print("\n".join(report(floor_by_kind(args.db, args.gpu), args.jobs_s, args.serial_per_hour)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
