"""The ledger's cost over a long run: saved after every batch against saved every few seconds.

    python bench/ledger_saves.py [--points 30000] [--batch 6] [--batch-s 0.3] [--dir DIR]

A box's ledger holds every point it has marked, across jobs and runs, so late in a long run it
is large.  This marks ``--points`` points in batches of ``--batch`` (each batch standing for
``--batch-s`` seconds of measuring, not slept: the figure is the saves' own time) into a real
ledger file on ``--dir``'s disk (default: a temporary folder; give the box's disk for its
figures) two ways, side by side: a save (tmp + fsync + rename) after every batch, as the
job once did; and the job's policy now, a save when ``LEDGER_SAVE_S`` of measuring has passed
or twenty times the last save's time, whichever is longer.  It prints each way's total
save time, that time as a share of the run's measuring time, and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.box.runner import LEDGER_SAVE_S  # noqa: E402
from harness.ledger import Ledger  # noqa: E402

SPEC = "BLOCK_M=64,BLOCK_N=128,BLOCK_K=32,GROUP_M=8,num_warps=4,num_stages={}"


def run(path: Path, points: int, batch: int, batch_s: float, every_batch: bool) -> tuple[float, int]:
    ledger, spent, saves = Ledger(), 0.0, 0
    measured, next_save = 0.0, LEDGER_SAVE_S
    for i in range(0, points, batch):
        for j in range(i, min(points, i + batch)):
            ledger.mark(f"{j:08d}-{'ab' * 16}", SPEC.format(j % 7), "deployable", "ok")
        measured += batch_s
        if every_batch or measured >= next_save:
            t = time.perf_counter()
            ledger.save(path)
            took = time.perf_counter() - t
            spent, saves = spent + took, saves + 1
            next_save = measured + max(LEDGER_SAVE_S, 20 * took)
    t = time.perf_counter()
    ledger.save(path)  # the job's last save
    return spent + time.perf_counter() - t, saves + 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=30000)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--batch-s", type=float, default=0.3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "ledger.json"
        measuring = -(-args.points // args.batch) * args.batch_s
        print(f"{args.points} points in batches of {args.batch}, {measuring:.0f}s of measuring; "
              f"ledger on {d}")
        res = {}
        for name, every in (("after every batch", True), (f"every >= {LEDGER_SAVE_S:.0f}s", False)):
            spent, saves = run(path, args.points, args.batch, args.batch_s, every)
            res[name] = spent
            print(f"  {name:18} {saves:6d} saves, {spent:8.1f}s saving = "
                  f"{spent / measuring:7.1%} of the measuring time", flush=True)
            path.unlink()
        a, b = res.values()
        print(f"saving after every batch takes {a / b:.0f}x the time of the spaced saves; "
              f"final ledger {args.points} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
