"""bench/versus_torch.py: each shape's best against torch's op and torch.compile, from rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.points import point_key
from harness.store import NodeStore
from tests.bench_scripts import ROOT, load

H200 = "NVIDIA H200 141GB"


def _row(shape_id: str, spec: str, value: float | None, *, m: int = 4096, n: int = 4096,
         status: str = "ok", kind: str = "matmul") -> dict:
    shape = {"M": m, "N": n, "K": 4096, "dtype": "bf16"}
    return {"point_key": point_key(H200, shape_id, spec), "gpu": H200, "regime": "deployable",
            "kind": kind, "shape_id": shape_id, "shape": shape, "spec": spec, "knobs": {},
            "slice": "own", "status": status, "value_us": value if status == "ok" else None,
            "ref_us": 1.0, "variance": 0.1, "n_samples": 20, "error": None, "features": {},
            "cc": [9, 0], "compile_s": 0.1, "bench_s": 0.1, "run_id": "r1",
            "measured_at": "2026-12-06T00:00:00.000000Z", "provenance": {}}


ROWS = [
    _row("p1", "A=1", 100.0), _row("p1", "A=2", 80.0), _row("p1", "A=3", None, status="bench_fail"),
    _row("p1", "baseline=torch", 88.0), _row("p1", "baseline=compile", 76.0),
    _row("p2", "A=1", 50.0, n=2048), _row("p2", "baseline=torch", 55.0, n=2048),
    _row("p2", "baseline=compile", 60.0, n=2048),
    _row("d1", "A=1", 10.0, m=16), _row("d1", "baseline=torch", 12.0, m=16),
]


def test_each_shapes_best_against_what_a_user_runs_instead() -> None:
    vt = load("versus_torch")
    lines = {ln.shape_id: ln for ln in vt.shape_lines(ROWS)}
    p1 = lines["p1"]
    assert (p1.best_us, p1.spec, p1.failed, p1.phase) == (80.0, "A=2", 1, "prefill")
    assert p1.torch == pytest.approx(1.1) and p1.compile == pytest.approx(0.95)
    assert lines["d1"].phase == "decode" and lines["d1"].compile is None
    (both, decode, prefill) = vt.kind_summary(list(lines.values()))
    assert (decode["phase"], decode["shapes"], decode["compile"]) == ("decode", 1, None)
    assert (both["phase"], both["shapes"]) == ("all", 3)
    assert both["compile"] == prefill["compile"]  # the decode shape has no compile baseline
    assert both["torch"]["of"] == 3 and both["torch"]["ahead"] == 3
    assert both["torch"]["mean"] == pytest.approx((1.1 + 1.1 + 1.2) / 3)
    assert prefill["compile"]["ahead"] == 1 and prefill["compile"]["of"] == 2
    assert prefill["compile"]["min"] == pytest.approx(0.95)
    assert prefill["torch"]["mean"] == pytest.approx((1.1 + 1.1) / 2)


def test_the_script_reads_a_node_table_and_refuses_a_bad_card(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    with NodeStore(db) as s:
        s.merge(ROWS)
    r = subprocess.run([sys.executable, "bench/versus_torch.py", "--db", str(db), "--gpu", "h200"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "p1" in r.stdout and "0.950" in r.stdout and "ours >= on 1/2" in r.stdout
    bad = subprocess.run([sys.executable, "bench/versus_torch.py", "--db", str(db), "--gpu",
                          "h2000"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown card 'h2000'" in bad.stderr
