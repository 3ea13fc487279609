"""Merging a large rows file: time and peak memory of ``python -m harness merge``.

    python bench/merge.py [--rows 1000000] [--dir DIR]

Writes ``--rows`` rows shaped like a box's (the same fields, features and provenance as
``harness.box.runner.make_row`` writes; about 1.3 KB a line, spread over many shapes and two
regimes) into one rows file, then runs the merge CLI on it twice in fresh processes: into a
new DB (every row new), and again (every row a duplicate).  Prints each run's wall time, rows
per second and peak resident memory (the child's ``ru_maxrss``), and the DB's size.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.points import make_spec, point_key  # noqa: E402

GPU = "NVIDIA H200 141GB"
CARD = {"H_cc": 90, "H_l2_mb": 60, "H_mem_gb": 141, "H_regs_per_block": 65536, "H_sm_count": 132,
        "H_smem_optin": 232448, "H_smem_per_sm": 233472, "H_tc_gen": 4, "H_warp_size": 32}


def row(i: int) -> dict:
    shape = i // 997
    m, n, k = 16 << (shape % 9), 4096 + 128 * (shape % 31), 4096
    knobs = {"BLOCK_K": 32 << (i % 3), "BLOCK_M": 16 << (i % 4), "BLOCK_N": 32 << (i % 5),
             "GROUP_M": 1 << (i % 4), "num_stages": 2 + i % 4, "num_warps": 2 << (i % 3),
             "SPLIT": i % 997}
    spec = make_spec(knobs)
    shape_id = f"matmul_M{m}_N{n}_K{k}_bf16_s{shape}"
    regime = "deployable" if i % 2 == 0 else "interpret"
    feats = {**CARD, "S_M": m, "S_N": n, "S_K": k, "S_dtype": "bf16", "S_kind": "matmul",
             "S_shape": shape, "S_flops": 2 * m * n * k, "S_bytes": 2 * (m * k + n * k + m * n),
             **{kk: str(v) for kk, v in knobs.items()},
             "C_regs": 128 + i % 64, "C_spills": 0, "C_shared": 49152, "C_num_warps": knobs["num_warps"]}
    return {
        "point_key": point_key(GPU, shape_id, spec), "gpu": GPU, "regime": regime,
        "kind": "matmul", "shape_id": shape_id, "shape": {"M": m, "N": n, "K": k, "dtype": "bf16"},
        "spec": spec, "knobs": knobs, "slice": ("own", "cross", "tail")[i % 3], "status": "ok",
        "value_us": 10.0 + (i % 1000) / 7, "ref_us": 31.5, "variance": 0.0123, "n_samples": 20,
        "error": None, "features": feats, "cc": [9, 0], "compile_s": 0.31, "bench_s": 0.028,
        "run_id": "bench-20261203T000000Z-0badcafe", "measured_at": f"2026-12-03T10:{i // 60000 % 60:02d}:"
        f"{i // 1000 % 60:02d}.{i % 1000:03d}000Z",
        "provenance": {"host": "h200-box", "device_name": "NVIDIA H200", "gpu_uuid": "GPU-1b2c3d4e",
                       "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0",
                       "warmup": 5, "iters": 20, "max_cv": 0.05, "cv": 0.011, "remeasured": 0,
                       "compiled_ahead": True, "first_launch_s": 0.0012, "guard_us": 20.0,
                       "sm_mhz": [1980, 1980], "temp_c": [41, 42]},
    }


def merge(rows_file: Path, db: Path) -> tuple[float, float, str]:
    """(seconds, peak RSS MiB, first line of output) of one merge in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "harness", "merge", str(rows_file), "--db", str(db),
                        "--no-backup"], cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"merge failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest child so far: each merge is measured as the max
    return took, max(peak, before) / 1024, p.stdout.splitlines()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        rows_file, db = Path(d) / "bench-20261203T000000Z-0badcafe" / "own-matmul.jsonl", Path(d) / "db.sqlite"
        rows_file.parent.mkdir()
        t = time.perf_counter()
        with rows_file.open("w") as f:
            for i in range(args.rows):
                f.write(json.dumps(row(i), sort_keys=True) + "\n")
        size = rows_file.stat().st_size
        print(f"rows file: {args.rows} rows, {size / 2**20:.0f} MiB ({size / args.rows:.0f} B a row), "
              f"written in {time.perf_counter() - t:.0f}s; {os.cpu_count()} CPUs")
        for what in ("fresh DB", "again (all duplicates)"):
            took, peak, first = merge(rows_file, db)
            print(f"{what:24} {took:7.1f} s  {args.rows / took:9.0f} rows/s  peak RSS {peak:6.0f} MiB  "
                  f"DB {db.stat().st_size / 2**20:.0f} MiB  | {first}")


if __name__ == "__main__":
    main()
