"""Cold sweeps that differ only in the controller's poll: does the GPU wait for the controller?

    python bench/poll_sweeps.py run --poll-s 60 --budget-s 300 --dir /tmp/p60 [-- PYTEST ARGS]
    python bench/poll_sweeps.py compare /tmp/p1 /tmp/p60

``run`` makes everything new under ``--dir`` (an empty Triton cache, box folder, node table and
state folder: both sides cold) and runs ``pytest collect_tests --gpu=local`` there, with
``--baselines=none`` unless told otherwise.  Times are read from the box's own files (each run's
summary and the session's status), not from the controller: the jobs run, the points benched,
the box seconds charged to jobs, the session's span on the box, and what was left of the
budget.  ``compare`` prints two such folders side by side and the ratio of their points.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_",))}
    env.update(TRITON_CACHE_DIR=str(d / "triton-cache"), EMMY_STATE_DIR=str(d / "state"),
               TORCHINDUCTOR_CACHE_DIR=str(d / "inductor-cache"), PYTHONUNBUFFERED="1")
    env.pop("EMMY_TUNE_DB", None)
    extra = list(args.pytest_args)
    if not any(a.startswith("--baselines") for a in extra):
        extra.append("--baselines=none")
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=local", "-p", "no:cacheprovider",
           f"--budget-s={args.budget_s:g}", f"--poll-s={args.poll_s:g}",
           f"--db={d / 'db.sqlite'}", f"--box-dir={d / 'box'}",
           f"--tmux-socket=poll-{os.getpid()}", *extra]
    t0 = time.monotonic()
    with open(d / "run.txt", "w") as out:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    facts = summarize(d, wall, args.poll_s, args.budget_s, rc)
    (d / "facts.json").write_text(json.dumps(facts, indent=1))
    print(line(facts))
    return rc


def summarize(d: Path, wall: float, poll_s: float, budget_s: float, rc: int) -> dict[str, Any]:
    box = d / "box"
    statuses = [json.loads(f.read_text()) for f in sorted(box.glob("service/*/status.json"))]
    entries = [e for s in statuses for e in s["entries"]]
    ran = [e for e in entries if e["state"] not in ("skipped", "planned")]
    sums = [json.loads(f.read_text()) for f in sorted(box.glob("summary/*/*.json"))]
    span = sum(s["ended_at"] - s["started_at"] for s in statuses
               if s.get("ended_at") and s.get("started_at"))
    charged = sum(e["elapsed_s"] for e in entries)
    return {"poll_s": poll_s, "budget_s": budget_s, "exit": rc, "controller_wall_s": round(wall, 1),
            "jobs": sum(1 for e in entries if e["round"] == 0),
            "jobs_run": sum(1 for e in ran if e["round"] == 0),
            "top_ups": sum(1 for e in ran if e["round"] > 0),
            "points": sum(int(s.get("benched") or 0) for s in sums),
            "box_charged_s": round(charged, 1), "box_span_s": round(span, 1),
            "budget_left_s": round(budget_s - charged, 1),
            "worker_s": round(sum((s.get("time_s") or {}).get("worker", 0.0) for s in sums), 1),
            "compile_wait_s": round(sum((s.get("time_s") or {}).get("compile_wait", 0.0)
                                        for s in sums), 1)}


def line(f: dict[str, Any]) -> str:
    return (f"poll {f['poll_s']:g}s: {f['points']} points in {f['jobs_run']} of {f['jobs']} jobs "
            f"(+{f['top_ups']} top-ups); box: {f['box_charged_s']:.0f}s charged to jobs, span "
            f"{f['box_span_s']:.0f}s, {f['budget_left_s']:.0f}s of {f['budget_s']:.0f}s left, "
            f"compile waits {f['compile_wait_s']:.0f}s; controller wall {f['controller_wall_s']:.0f}s"
            f"; exit {f['exit']}")


def compare(args: argparse.Namespace) -> int:
    a, b = (json.loads((Path(x) / "facts.json").read_text()) for x in (args.first, args.second))
    print(line(a))
    print(line(b))
    print(f"points, poll {b['poll_s']:g}s over poll {a['poll_s']:g}s: "
          f"{b['points'] / max(1, a['points']):.3f}; controller wall: "
          f"{b['controller_wall_s'] / max(1e-9, a['controller_wall_s']):.2f}x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--poll-s", type=float, required=True)
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("pytest_args", nargs="*")
    p.set_defaults(func=run)
    p = sub.add_parser("compare")
    p.add_argument("first")
    p.add_argument("second")
    p.set_defaults(func=compare)
    args = ap.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
