"""`python -m harness report`: PNG plots and an index.html over a node table built by merge."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from harness import kinds as registry
from harness.__main__ import main
from harness.cards import INTERPRETER, by_alias
from harness.evaluate import evaluate
from harness.goldens import Anchor
from harness.points import make_spec, point_key
from harness.priors.baselines import OraclePrior, RandomPrior
from harness.report import anchor_distances, coverage, slug, write_report
from harness.store import NodeStore

H200 = by_alias("h200")
L40S = by_alias("l40s")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHAPE = {"M": 256, "N": 256, "K": 128, "dtype": "bf16"}
SID = registry.get("matmul").shape_id(SHAPE)


def _row(card: Any, bm: int, bn: int, value: float | None, *, slice_: str = "own",
         shape: dict[str, Any] = SHAPE) -> dict[str, Any]:
    """One matmul row in the box's format (harness/box/runner.py make_row)."""
    kind = registry.get("matmul")
    knobs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 1, "num_stages": 3,
             "num_warps": 4}
    sid, spec = kind.shape_id(shape), make_spec(knobs)
    status = "ok" if value is not None else "bench_fail"
    return {
        "point_key": point_key(card.name, sid, spec), "gpu": card.name, "regime": card.regime,
        "kind": "matmul", "shape_id": sid, "shape": shape, "spec": spec, "knobs": knobs,
        "slice": slice_, "status": status, "value_us": value, "ref_us": 5.0, "variance": 0.01,
        "n_samples": 20, "error": None if value is not None else "out of resources",
        "features": {**card.features(), **kind.shape_features(shape), **knobs},
        "cc": list(card.cc), "compile_s": 0.1, "bench_s": 0.1, "run_id": "r1",
        "measured_at": "2026-12-01T00:00:00.000000Z", "provenance": {},
    }


def _table(tmp_path: Path) -> Path:
    rows = []
    for card, speed in ((H200, 1.0), (L40S, 2.5)):
        for i, (bm, bn) in enumerate([(16, 16), (32, 32), (64, 64), (128, 64), (64, 128),
                                      (128, 128), (32, 128), (128, 32)]):
            rows.append(_row(card, bm, bn, speed * (3.0 + abs(i - 4)),
                             slice_=("own", "cross", "tail")[i % 3]))
        rows.append(_row(card, 256, 256, None, slice_="tail"))
    rows += [_row(INTERPRETER, 16, 16, 900.0), _row(INTERPRETER, 32, 32, 400.0)]
    db = tmp_path / "n.db"
    with NodeStore(db) as s:
        s.merge(rows)
    return db


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _anchor_dir(tmp_path: Path) -> Path:
    d = tmp_path / "anchors"
    d.mkdir()
    spec = "BLOCK_K=32,BLOCK_M=64,BLOCK_N=128,GROUP_M=1,num_stages=3,num_warps=4"
    (d / "l40s.json").write_text(json.dumps(
        {"gpu": L40S.name, "anchors": [{"kind": "matmul", "shape_id": SID, "spec": spec}]}))
    return d


def test_coverage_and_distances_are_counted_per_card_kind_slice(tmp_path: Path) -> None:
    with NodeStore(_table(tmp_path)) as s:
        rows = s.rows()
    cov = coverage(rows)
    assert set(cov) == {(H200.name, "deployable"), (L40S.name, "deployable"),
                        (INTERPRETER.name, "interpret")}
    h200 = cov[(H200.name, "deployable")]
    assert h200[("matmul", "tail")] == {"ok": 2, "failed": 1}
    assert sum(c["ok"] for c in h200.values()) == 8
    anchor = Anchor(gpu=L40S.name, kind="matmul", shape_id=SID,
                    spec="BLOCK_K=32,BLOCK_M=64,BLOCK_N=128,GROUP_M=1,num_stages=3,num_warps=4")
    pts = anchor_distances([r for r in rows if r["gpu"] == H200.name], [anchor])
    assert len(pts) == 8 and min(p[1] for p in pts) == 1.0
    assert (0, 1.0, "cross") in pts  # the anchor's own spec is the best on H200 here
    assert slug(H200.name, "deployable") == "nvidia-h200-141gb-deployable"


def test_report_writes_pngs_and_an_index_that_references_them(tmp_path: Path) -> None:
    with NodeStore(_table(tmp_path)) as s:
        rows = s.rows()
    blocks = evaluate(rows, [OraclePrior(), RandomPrior()])
    index = write_report(tmp_path / "out", rows, blocks, [], db="n.db")
    html = index.read_text()
    srcs = re.findall(r'<img src="([^"]+)"', html)
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert sorted(srcs) == pngs
    # coverage + distance for the three card x regime blocks; regret per prior and kind and
    # priors for the two evaluated
    assert len(pngs) == 3 + 3 + 2 + 2
    for name in pngs:
        w, h = _png_size(tmp_path / "out" / name)
        assert w >= 300 and h >= 200 and (tmp_path / "out" / name).stat().st_size > 5000
    assert {"priors-nvidia-h200-141gb-deployable.png",
            "regret-nvidia-h200-141gb-deployable.png"} <= set(pngs)
    assert "<td>oracle</td><td>shape-out</td><td>1</td><td>0</td><td>1.000</td>" in html
    assert "--regime interpret</code> evaluates these" in html
    assert "http" not in html and "<script" not in html  # no external assets


def _sections(doc: str) -> dict[str, str]:
    """index.html's sections by their card × regime heading."""
    parts = doc.split("<h2>")[1:]
    return {p.split("</h2>")[0]: p for p in parts}


def test_a_section_with_a_priors_table_never_says_the_priors_were_not_evaluated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _table(tmp_path)
    for regime in ("interpret", "deployable"):
        out = tmp_path / regime
        assert main(["report", "--db", str(db), "--out", str(out), "--regime", regime,
                     "--prior", "oracle", "random", "--min-rows", "2"]) == 0
        sections = _sections((out / "index.html").read_text())
        assert len(sections) == 3
        for head, text in sections.items():
            evaluated = f"({regime})" in head
            assert ("<h3>Priors</h3>" in text) == evaluated, head
            assert ("not evaluated" in text) != evaluated, head
    capsys.readouterr()
    # a table of interpret rows only: the report evaluates them without being asked
    only = tmp_path / "interp.db"
    with NodeStore(only) as s:
        s.merge([_row(INTERPRETER, bm, 16, v) for bm, v in ((16, 900.0), (32, 400.0),
                                                           (64, 500.0))])
    assert main(["report", "--db", str(only), "--out", str(tmp_path / "r3"), "--prior",
                 "oracle"]) == 0
    doc = (tmp_path / "r3" / "index.html").read_text()
    assert "<h3>Priors</h3>" in doc and "not evaluated" not in doc
    assert "priors evaluated on the interpret regime" in doc


def test_report_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _table(tmp_path)
    out = tmp_path / "report"
    code = main(["report", "--db", str(db), "--out", str(out), "--prior", "oracle", "roofline",
                 "transfer", "--anchors", str(_anchor_dir(tmp_path))])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert stdout.strip() == f"report: {out / 'index.html'}"
    html = (out / "index.html").read_text()
    for src in re.findall(r'<img src="([^"]+)"', html):
        _png_size(out / src)
    assert f"[{H200.name}] 9 nodes (deployable)" in html
    assert "<td>transfer</td>" in html and "<td>roofline</td>" in html
    # an interpret-only table still gets its coverage, and says why nothing was evaluated
    only = tmp_path / "interp.db"
    with NodeStore(only) as s:
        s.merge([_row(INTERPRETER, 16, 16, 900.0)])
    code = main(["report", "--db", str(only), "--out", str(tmp_path / "r2")])
    assert code == 0
    assert (tmp_path / "r2" / "coverage-triton-cpu-interpreter-interpret.png").is_file()
