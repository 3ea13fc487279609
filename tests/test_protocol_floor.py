"""``bench/protocol_floor.py``: the GPU time a sweep's points need under the measuring protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.store import NodeStore
from tests.bench_scripts import load
from tests.test_store import make_row


def test_the_floor_counts_every_call_of_both_sides_and_every_window(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    quiet = make_row(value_us=100.0, ref_us=50.0,
                     provenance={"warmup": 5, "iters": 20, "remeasured": 0})
    noisy = make_row(spec="BLOCK_K=32,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4",
                     value_us=10.0, ref_us=50.0,
                     provenance={"warmup": 5, "iters": 20, "remeasured": 2})
    failed = make_row(spec="BLOCK_K=16,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4",
                      status="bench_fail", value_us=None, error="wrong result")
    with NodeStore(db) as store:
        store.merge([quiet, noisy, failed])
    mod = load("protocol_floor")
    by_kind = mod.floor_by_kind(db)
    # a check call, then 25 calls a window: 26 calls for one window, 76 for three
    n, cand, ref = by_kind["matmul"]
    assert n == 2
    assert cand == pytest.approx((26 * 100 + 76 * 10) / 1e6)
    assert ref == pytest.approx((26 * 50 + 76 * 50) / 1e6)
    lines = mod.report(by_kind, jobs_s=0.01, serial_per_hour=1000)
    rate = 2 / (cand + ref) * 3600
    assert f"at most {rate:,.0f} points per GPU-hour" in lines[-3]
    assert f"at most {rate / 1000:.1f}x" in lines[-1]
    assert mod.main(["--db", str(tmp_path / "missing.db")]) == 2
