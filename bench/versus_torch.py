"""Each golden shape's best measured configuration against what a user runs instead.

    python bench/versus_torch.py --db NODE.db --gpu h200 [--kind K ...] [--as-measured]

From the node table alone (no GPU): per shape, the best ok configuration's time, torch's op
(``baseline=torch``: cuBLAS for the linears, SDPA for attention) over it and
``torch.compile``'s kernel (``baseline=compile``) over it (below 1: theirs is faster), and
how many configurations failed; then per kind and phase (decode: M or batch rows of at most
64, else prefill; ``all``: both, where a kind has both) the range of both ratios, their mean
and on how many shapes ours is at least as fast.  Shapes without a baseline row show ``-``.  Every ratio is the harness's own
measurement of both sides, timed the same way in the same sweep, each at its shape's
reference clock (harness/steady.py: a row's time over its interleaved reference's, times the
shape's median reference time) unless ``--as-measured``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DECODE_ROWS = 64  # a GEMM of at most this many rows is a decode step


@dataclass
class ShapeLine:
    kind: str
    shape_id: str
    phase: str
    best_us: float
    spec: str
    torch: float | None  # torch's time over the best
    compile: float | None  # torch.compile's time over the best
    failed: int


def phase_of(shape: Mapping[str, Any]) -> str:
    """``decode`` for GEMM-like and row shapes of at most DECODE_ROWS rows, else ``prefill``
    (attention is prefill)."""
    rows = shape.get("M")
    return "decode" if rows is not None and rows <= DECODE_ROWS else "prefill"


def shape_lines(rows: Iterable[Mapping[str, Any]]) -> list[ShapeLine]:
    """One line per shape that has an ok configuration (rows as ``NodeStore.rows`` gives them,
    the shape under ``shape_spec``, or as the box writes them, under ``shape``)."""
    from harness.shipped import BASELINE_KNOB, is_baseline

    best: dict[str, Mapping[str, Any]] = {}
    base: dict[tuple[str, str], float] = {}
    failed: dict[str, int] = defaultdict(int)
    for r in rows:
        sid, spec = r["shape_id"], str(r["spec"])
        if r["status"] != "ok":
            failed[sid] += 1
        elif is_baseline(spec):
            base[(sid, spec.removeprefix(f"{BASELINE_KNOB}="))] = r["value_us"]
        elif sid not in best or r["value_us"] < best[sid]["value_us"]:
            best[sid] = r
    out = []
    for sid, r in sorted(best.items(), key=lambda kv: (kv[1]["kind"], kv[0])):
        v = r["value_us"]
        t, c = base.get((sid, "torch")), base.get((sid, "compile"))
        shape = r.get("shape") or r.get("shape_spec") or {}
        out.append(ShapeLine(r["kind"], sid, phase_of(shape), v, str(r["spec"]),
                             t / v if t else None, c / v if c else None, failed[sid]))
    return out


def kind_summary(lines: list[ShapeLine]) -> list[dict[str, Any]]:
    """Per (kind, phase), and per kind over both phases (``all``) where it has both: shapes,
    and for torch and compile the min, max and mean of their time over the best and the
    shapes where the best is at least as fast (ratio >= 1)."""
    groups: dict[tuple[str, str], list[ShapeLine]] = defaultdict(list)
    for ln in lines:
        groups[(ln.kind, ln.phase)].append(ln)
    for kind in {k for k, _ in groups}:
        if (kind, "decode") in groups and (kind, "prefill") in groups:
            groups[(kind, "all")] = groups[(kind, "decode")] + groups[(kind, "prefill")]
    out = []
    for (kind, phase), ls in sorted(groups.items()):
        row: dict[str, Any] = {"kind": kind, "phase": phase, "shapes": len(ls)}
        for name in ("torch", "compile"):
            xs = [getattr(ln, name) for ln in ls if getattr(ln, name) is not None]
            row[name] = ({"min": min(xs), "max": max(xs), "mean": statistics.fmean(xs),
                          "ahead": sum(x >= 1.0 for x in xs), "of": len(xs)} if xs else None)
        out.append(row)
    return out


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _span(s: Mapping[str, Any] | None) -> str:
    if s is None:
        return "-"
    return (f"{s['min']:.2f}-{s['max']:.2f} mean {s['mean']:.3f}, "
            f"ours >= on {s['ahead']}/{s['of']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, required=True, help="the node table")
    ap.add_argument("--gpu", required=True, help="card alias, e.g. h200")
    ap.add_argument("--kind", action="append", default=None, help="only this kind (repeated)")
    ap.add_argument("--as-measured", action="store_true",
                    help="compare the times as measured, not at each shape's reference clock "
                    "(harness/steady.py)")
    args = ap.parse_args(argv)

    from harness.cards import UnknownCardError, by_alias
    from harness.steady import steadied
    from harness.store import NodeStore

    try:
        card = by_alias(args.gpu)
    except UnknownCardError as exc:
        ap.error(f"--gpu: {exc}")
    if not args.db.is_file():
        ap.error(f"--db {args.db}: no such file")
    with NodeStore(args.db) as store:
        rows = [r for r in store.rows(gpu=card.name, regime="deployable")
                if args.kind is None or r["kind"] in args.kind]
    lines = shape_lines(rows if args.as_measured else steadied(rows))
    if not lines:
        print(f"{args.db} has no ok deployable configuration of {card.name}", file=sys.stderr)
        return 1
    print(f"{card.name}: {len(lines)} shapes; torch / compile: their time over the best "
          "configuration's (below 1: theirs is faster); times "
          + ("as measured" if args.as_measured else "at each shape's reference clock"))
    print(f"{'shape':52} {'best_us':>9} {'torch':>6} {'compile':>7} {'failed':>6}  best")
    for ln in lines:
        print(f"{ln.shape_id[:52]:52} {ln.best_us:9.1f} {_ratio(ln.torch):>6} "
              f"{_ratio(ln.compile):>7} {ln.failed:6d}  {ln.spec}")
    print()
    print(f"{'kind':12} {'phase':8} {'shapes':>6}  {'torch over best':38}  compile over best")
    for s in kind_summary(lines):
        print(f"{s['kind']:12} {s['phase']:8} {s['shapes']:6d}  {_span(s['torch']):38}  "
              f"{_span(s['compile'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
