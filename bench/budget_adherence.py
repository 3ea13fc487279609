"""How far past its allotment a sweep job runs.

    python bench/budget_adherence.py [--kind matmul] [--slice own] [--allot 10,20,40]
    python bench/budget_adherence.py --summaries DIR [DIR ...]

The first form runs one real job (``python -m harness.box run``, a cold Triton cache each, so
compiles are as slow as they get) per allotment and prints, for each, the allotment, the job's
wall time seen from outside (process start to exit) and the overshoot.  The second reads the
summary files a sweep left on the box (``<box-dir>/summary/RUN/*.json``) and prints the
same from each job's own clock, which starts at its process's start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def from_summaries(dirs: list[str]) -> list[tuple[str, float, float]]:
    out = []
    for d in dirs:
        for f in sorted(Path(d).rglob("*.json")):
            try:
                s = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(s, dict) and "budget_s" in s and "elapsed_s" in s and s["budget_s"]:
                out.append((f"{s['slice']}-{s['kind']} ({s['stop']})", s["budget_s"], s["elapsed_s"]))
    return out


def run_jobs(kind: str, slice_: str, allots: list[float], extra: list[str]) -> list[tuple[str, float, float]]:
    out = []
    for allot in allots:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TRITON_CACHE_DIR=str(Path(tmp) / "cache"))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            cmd = [sys.executable, "-m", "harness.box", "run", "--slice", slice_, "--kind", kind,
                   "--budget-s", str(allot), "--rows", f"{tmp}/rows.jsonl",
                   "--ledger", f"{tmp}/ledger.json", "--summary", f"{tmp}/summary.json", *extra]
            t = time.monotonic()
            proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
            wall = time.monotonic() - t
            if proc.returncode != 0:
                raise SystemExit(f"job failed ({proc.returncode}): {proc.stderr[-2000:]}")
            s = json.loads(Path(tmp, "summary.json").read_text())
            out.append((f"{slice_}-{kind} ({s['benched']} points, {s['stop']})", allot, wall))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", default="matmul")
    ap.add_argument("--slice", default="own")
    ap.add_argument("--allot", default="10,20,40")
    ap.add_argument("--summaries", nargs="*", default=None)
    ap.add_argument("--job-args", default="")
    args = ap.parse_args()
    if args.summaries:
        jobs = from_summaries(args.summaries)
    else:
        jobs = run_jobs(args.kind, args.slice, [float(a) for a in args.allot.split(",")],
                        args.job_args.split())
    if not jobs:
        raise SystemExit("no job summaries found")
    print(f"{'job':50} {'allotted s':>10} {'ran s':>8} {'past s':>7}")
    for name, allot, ran in jobs:
        print(f"{name[:50]:50} {allot:10.1f} {ran:8.1f} {ran - allot:7.1f}")
    worst = max(ran - allot for _, allot, ran in jobs)
    print(f"{len(jobs)} jobs; the most any ran past its allotment: {worst:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
