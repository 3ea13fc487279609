"""``python -m harness eval`` fitted once per shape against once per fold, side by side.

    python bench/eval_speed.py [--db PATH] [--rows 8400] [--folds 6] [--prior NAME ...]

Evaluates the same node table twice, as the eval CLI does, each in a fresh process: *before*, one fit of
each learning prior per shape (``--folds 0``, leave-one-shape-out: how eval fitted before
folds), and *after*, one fit per fold (``--folds N``, the default).  Prints, side by side, each
run's wall time, CPU time (the child's user + system), the lines of its default output, and
per prior its shapes abstained on, median Spearman and mean / median / worst regret, with
the learned prior's best of its top-3 and top-8 where the table holds shipped configurations.

Without ``--db`` it builds a table shaped like a real H200 sweep's (``bench/eval_table.py``,
``--rows`` rows) in a temporary folder.  Run it on idle cores: the wall times are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DEFAULT_FOLDS = 6  # harness.evaluate.FOLDS, without importing scikit-learn here


def child(db: Path, folds: int, priors: list[str]) -> None:
    """In the child process: what ``python -m harness eval --db DB --folds N`` does (read,
    fit, score, render), then one JSON line: the default output's line count and the results
    (``harness.evaluate.to_json``), so one evaluation gives both."""
    from harness.evaluate import EvalRequest, compare_shipped, format_eval, run_request, to_json

    run = run_request(EvalRequest(db=db, priors=priors, folds=folds))
    versus = [e for e in compare_shipped(run.rows, run.blocks) if e.has_shipped]
    text = format_eval(run.blocks, versus)
    print(json.dumps({"lines": len(text.splitlines()),
                      "data": to_json(run.blocks, shipped=[e.to_json() for e in versus])}))


def run_eval(db: Path, folds: int, priors: list[str]) -> dict[str, Any]:
    """:func:`child` in a fresh process (imports counted, as the CLI's): its wall and CPU
    seconds, lines and results."""
    cmd = [sys.executable, __file__, "--child", "--db", str(db), "--folds", str(folds)]
    if priors:
        cmd += ["--prior", *priors]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    got = json.loads(done.stdout.splitlines()[-1])
    return {"wall_s": wall, "lines": got["lines"], "figures": figures(got["data"]),
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def figures(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per "card | prior mode" (and "card | learned topK vs shipped"): the figures compared."""
    out: dict[str, dict[str, Any]] = {}
    for card in data["cards"]:
        for ev in card["evaluations"]:
            out[f"{card['gpu']} | {ev['prior']} {ev['mode']}"] = {
                "abstains": ev.get("n_abstained", 0), "rho": ev["spearman_median"],
                "mean": ev["regret_mean"], "median": ev["regret_median"],
                "worst": ev["regret_worst"]}
    for ev in data.get("shipped", []):
        for m in ("learned_top3", "learned_top8"):  # its top-1 is the shape-out row above
            e = ev["summary"]["methods"][m]
            if e["n"]:
                out[f"{ev['gpu']} | {m} vs shipped"] = {
                    "abstains": e.get("abstained", 0), "rho": None, "mean": e["regret_mean"],
                    "median": e["regret_median"], "worst": e["regret_worst"]}
    return out


def _f(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def side_by_side(before: dict[str, Any], after: dict[str, Any], folds: int) -> str:
    """The comparison table (tabulate)."""
    from tabulate import tabulate

    rows = [["wall s", f"{before['wall_s']:.1f}", f"{after['wall_s']:.1f}"],
            ["CPU s", f"{before['cpu_s']:.1f}", f"{after['cpu_s']:.1f}"],
            ["output lines", str(before["lines"]), str(after["lines"])]]
    fb, fa = before["figures"], after["figures"]
    for key in sorted(set(fb) | set(fa)):
        for name in ("abstains", "rho", "mean", "median", "worst"):
            b, a = fb.get(key, {}).get(name), fa.get(key, {}).get(name)
            if b is None and a is None:
                continue
            rows.append([f"{key}: {'regret ' if name in ('mean', 'median', 'worst') else ''}"
                         f"{name}", _f(b), _f(a)])
    return tabulate(rows, headers=("", "before: --folds 0 (a fit per shape)",
                                   f"after: --folds {folds}"),
                    colalign=("left", "right", "right"), disable_numparse=True)


def measure(db: Path, folds: int, priors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, n in (("before", 0), ("after", folds)):
        print(f"eval --folds {n} …", file=sys.stderr, flush=True)
        out[side] = run_eval(db, n, priors)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, default=None,
                   help="node table to evaluate (default: build one, bench/eval_table.py)")
    p.add_argument("--rows", type=int, default=8400, help="rows of the table built (no --db)")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="folds of the 'after' run")
    p.add_argument("--prior", nargs="+", action="extend", default=[],
                   help="priors to evaluate (default: eval's own)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.db, args.folds, args.prior)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db
        if db is None:
            import eval_table

            db = eval_table.build(Path(tmp) / "table.db", args.rows)
        if not db.is_file():
            raise SystemExit(f"no node table at {db}")
        got = measure(db, args.folds, args.prior)
    print(f"node table: {args.db or f'built, {args.rows} rows (bench/eval_table.py)'}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(side_by_side(got["before"], got["after"], args.folds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
