"""``bench/throughput.py``: how much the serial loop's rate owes to the points it drew."""

from __future__ import annotations

import pytest

from tests.bench_scripts import load


def test_the_serial_interval_holds_the_measured_rate_and_widens_with_mixed_points() -> None:
    bench = load("throughput")
    # 10 s of process start, then 100 points: alike (1 s each) or mixed (0.2 s and 1.8 s)
    alike = [{"point_s": 1.0} for _ in range(100)]
    mixed = [{"point_s": 0.2 if i % 2 else 1.8} for i in range(100)]
    rate = 100 * 3600 / 110.0
    assert bench.serial_interval(alike, 110.0) == pytest.approx((rate, rate))
    lo, hi = bench.serial_interval(mixed, 110.0)
    assert lo < rate < hi
    assert hi / lo > 1.1
    # rows of an older loop carry compile and do_bench times only
    old = [{"compile_s": 0.7, "bench_s": 0.3} for _ in range(100)]
    assert bench.serial_interval(old, 110.0) == pytest.approx((rate, rate))
    with pytest.raises(ValueError, match="no points"):
        bench.serial_interval([], 60.0)
