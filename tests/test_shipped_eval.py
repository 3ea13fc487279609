"""The priors against what people ship (harness/evaluate.py compare_shipped): regret of each
method, baselines kept out of the priors and the best, measurement counts, win rates, and the
tables of `python -m harness eval` / `report` on node tables built through NodeStore.merge."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness import kinds as registry
from harness import shipped
from harness.cards import INTERPRETER, by_alias
from harness.evaluate import (
    ABSTAINS,
    NO_RULE,
    NOT_EVALUATED,
    NOT_MEASURED,
    SHAPE_OUT,
    compare_shipped,
    compare_shipped_shape,
    evaluate,
    format_shipped,
    score_shape,
    walk_order,
)
from harness.goldens import Anchor
from harness.points import make_spec, parse_spec, point_key
from harness.priors.transfer import TransferPrior
from harness.report import write_report
from harness.store import NodeStore

ROOT = Path(__file__).resolve().parent.parent
H200 = by_alias("h200")
L40S = by_alias("l40s")
SHAPE = {"M": 512, "N": 512, "K": 512, "dtype": "bf16"}
SHAPE2 = {"M": 1024, "N": 512, "K": 512, "dtype": "bf16"}
LIST = [make_spec(k) for k in shipped.autotune_list("matmul", SHAPE, H200)]
LIST2 = [make_spec(k) for k in shipped.autotune_list("matmul", SHAPE2, H200)]
# configurations on no list
X1, X2, X3, X4 = (make_spec({"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1,
                             "num_stages": 2, "num_warps": 4}) for bm in (16, 32, 64, 128))


def _row(spec: str, value: float | None, *, card: Any = H200, kind: str = "matmul",
         shape: dict[str, Any] = SHAPE, status: str = "ok") -> dict[str, Any]:
    """One row in the box's format (harness/box/runner.py make_row); ``baseline=…`` specs too."""
    k = registry.get(kind)
    knobs = parse_spec(spec)
    sid = k.shape_id(shape)
    return {
        "point_key": point_key(card.name, sid, spec), "gpu": card.name, "regime": card.regime,
        "kind": kind, "shape_id": sid, "shape": shape, "spec": spec, "knobs": knobs,
        "slice": "own", "status": status, "value_us": value if status == "ok" else None,
        "ref_us": 10.0, "variance": 0.01, "n_samples": 20,
        "error": None if status == "ok" else "out of resources",
        "features": {**card.features(), **k.shape_features(shape), **knobs},
        "cc": list(card.cc), "compile_s": 0.2, "bench_s": 0.1, "run_id": "r1",
        "measured_at": "2026-12-01T00:00:00.000000Z", "provenance": {},
    }


def _shape1() -> list[dict[str, Any]]:
    """The heuristic (LIST[0]) at 2x the best, 3 of the list measured (best of them 1.2x),
    the best (X1, 10 us) on no list, torch faster than every configuration."""
    return [_row(LIST[0], 20.0), _row(LIST[1], 12.0), _row(LIST[2], 15.0),
            _row(X1, 10.0), _row(X2, 30.0), _row(X3, 10.4), _row(X4, 50.0),
            _row("baseline=torch", 8.0), _row("baseline=compile", 11.0),
            _row(LIST[3], None, status="bench_fail")]


def _shape2() -> list[dict[str, Any]]:
    """The heuristic not measured; the list's best (LIST2[1]) is the best; no baselines."""
    return [_row(LIST2[1], 5.0, shape=SHAPE2), _row(LIST2[2], 5.1, shape=SHAPE2),
            _row(X1, 9.0, shape=SHAPE2), _row(X2, 6.0, shape=SHAPE2)]


# learned scores (lower = predicted faster), per shape: shape 1 walks X2, X4, LIST[1], X3, …
SCORES = {
    registry.get("matmul").shape_id(SHAPE): {X2: 1, X4: 2, LIST[1]: 3, X3: 4, X1: 5,
                                             LIST[0]: 6, LIST[2]: 7},
    registry.get("matmul").shape_id(SHAPE2): {LIST2[2]: 1, X2: 2, LIST2[1]: 3, X1: 4},
}


class Table:
    """A prior named ``learned`` that scores from a fixed table, records every row it is
    fitted on or scores, and fails on a row it has no score for (a baseline)."""

    name = "learned"
    learns = True

    def __init__(self, scores: dict[str, dict[str, float]]) -> None:
        self.scores = scores
        self.seen: list[str] = []

    def fit(self, train_rows: Sequence[Any]) -> None:
        self.seen += [r["spec"] for r in train_rows]

    def score(self, rows: Sequence[Any]) -> list[float]:
        self.seen += [r["spec"] for r in rows]
        return [float(self.scores[r["shape_id"]][r["spec"]]) for r in rows]


def _db(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    db = tmp_path / "n.db"
    with NodeStore(db) as s:
        s.merge(rows)
    return db


def _stored(db: Path) -> list[dict[str, Any]]:
    with NodeStore(db) as s:
        return s.rows()


def _compare(tmp_path: Path, rows: list[dict[str, Any]], *priors: Any) -> Any:
    stored = _stored(_db(tmp_path, rows))
    blocks = evaluate(stored, list(priors) or [Table(SCORES)])
    (ev,) = compare_shipped(stored, blocks)
    return blocks, ev


# ---------------------------------------------------------------- per shape


def test_every_method_regret_on_a_shape(tmp_path: Path) -> None:
    anchor = Anchor(gpu=L40S.name, kind="matmul", shape_id=registry.get("matmul").shape_id(SHAPE),
                    spec=X3)
    _, ev = _compare(tmp_path, _shape1() + _shape2(), Table(SCORES), TransferPrior([anchor]))
    s = next(s for s in ev.shapes if s.shape_id == anchor.shape_id)
    assert (s.best_spec, s.best_us, s.n_rows) == (X1, 10.0, 7)
    regret = {m: p.regret for m, p in s.picks.items()}
    assert regret == pytest.approx({
        "learned": 3.0,  # X2, the lowest score
        "learned_top3": 1.2,  # X2, X4, LIST[1]: best 12
        "learned_top8": 1.0,  # every row
        "heuristic": 2.0,  # LIST[0]
        "autotune_list": 1.2,  # LIST[1], the best of the three measured
        "transfer": 1.04,  # X3, the anchor of the other card
        "torch": 0.8, "compile": 1.1})
    assert s.picks["heuristic"].spec == LIST[0] == make_spec(
        shipped.heuristic("matmul", SHAPE, H200))
    assert s.picks["autotune_list"].spec == LIST[1]
    assert (s.listed, s.listed_measured) == (len(LIST), 3)
    assert s.missing == {}
    assert ev.learned == "learned" and ev.transfer == "transfer"


def test_measurements_to_come_within_five_percent(tmp_path: Path) -> None:
    _, ev = _compare(tmp_path, _shape1() + _shape2())
    s1, s2 = sorted(ev.shapes, key=lambda s: s.shape_id != registry.get("matmul").shape_id(SHAPE))
    # X2 30, X4 50, LIST[1] 12, X3 10.4 <= 1.05 x 10: the fourth
    assert s1.picks["learned"].to_within == 4
    assert s1.picks["heuristic"].to_within is None  # 2x: never
    assert s1.picks["autotune_list"].to_within is None  # 1.2x: never
    # shape 2: LIST2[2] 5.1 is within 5% of 5.0 at once; the list reaches it in its 2 rows
    assert s2.picks["learned"].to_within == 1
    assert s2.picks["autotune_list"].to_within == 2
    assert s2.picks["autotune_list"].regret == 1.0
    summary = ev.summary()["methods"]
    assert (summary["learned"]["within"], summary["learned"]["to_within_median"]) == (2, 2.5)
    assert (summary["autotune_list"]["within"], summary["autotune_list"]["n"]) == (1, 2)
    assert summary["heuristic"]["within"] == 0


def test_baselines_never_reach_a_prior_nor_count_as_the_best(tmp_path: Path) -> None:
    prior = Table(SCORES)  # it has no score for a baseline: scoring one would fail
    blocks, ev = _compare(tmp_path, _shape1() + _shape2(), prior)
    assert prior.seen and not any(shipped.is_baseline(s) for s in prior.seen)
    (block,) = blocks
    assert (block.baselines, block.stale, block.ok) == (2, 0, 13)
    (res,) = [e for e in block.evals if e.mode == SHAPE_OUT]
    r1 = next(r for r in res.shapes if r.n_rows == 7)
    assert (r1.best_us, r1.regret) == (10.0, 3.0)  # not torch's 8 us
    assert not any(shipped.is_baseline(s) for s in r1.specs)
    s1 = next(s for s in ev.shapes if s.n_rows == 7)
    assert s1.best_us == 10.0 and s1.picks["torch"].regret == pytest.approx(0.8)


def test_a_shape_of_baselines_and_too_few_configurations_is_not_evaluated(tmp_path: Path) -> None:
    rows = _shape1() + [_row(X1, 3.0, shape=SHAPE2), _row(X2, 4.0, shape=SHAPE2),
                        _row("baseline=torch", 1.0, shape=SHAPE2),
                        _row("baseline=compile", 1.0, shape=SHAPE2)]
    blocks, ev = _compare(tmp_path, rows, Table(SCORES))
    (block,) = blocks
    assert [k[1] for k in block.evaluated] == [registry.get("matmul").shape_id(SHAPE)]
    assert block.skipped == [("matmul", registry.get("matmul").shape_id(SHAPE2), 2)]
    assert len(ev.shapes) == 1


def test_heuristic_not_measured_or_without_rule_is_not_counted(tmp_path: Path) -> None:
    big = {"M": 4, "N": 100000, "dtype": "bf16"}  # calculate_settings refuses N > 65536
    soft = [_row(make_spec({"BLOCK_N": bn, "ROWS": 1, "ONE_PASS": 0, "num_warps": 8,
                            "num_stages": 2}), v, kind="softmax", shape=big)
            for bn, v in ((1024, 4.0), (2048, 3.0), (4096, 5.0))]
    scores = {**SCORES, registry.get("softmax").shape_id(big): {r["spec"]: 1 for r in soft}}
    _, ev = _compare(tmp_path, _shape1() + _shape2() + soft, Table(scores))
    by_id = {s.shape_id: s for s in ev.shapes}
    s2 = by_id[registry.get("matmul").shape_id(SHAPE2)]
    assert "heuristic" not in s2.picks and s2.missing["heuristic"] == NOT_MEASURED
    s3 = by_id[registry.get("softmax").shape_id(big)]
    # every row scored 1: learned abstains there, no pick, none of its top-k either
    assert s3.missing == {"heuristic": NO_RULE, "autotune_list": "no list",
                          "transfer": NOT_EVALUATED, "torch": NOT_MEASURED,
                          "compile": NOT_MEASURED, "learned": ABSTAINS,
                          "learned_top3": ABSTAINS, "learned_top8": ABSTAINS}
    assert s3.abstained == ["learned"] and "learned" not in s3.picks
    total = ev.summary()
    assert total["methods"]["learned"]["n"] == 2 and total["methods"]["learned"]["abstained"] == 1
    assert total["methods"]["learned"]["missing"] == {ABSTAINS: 1}
    h = total["methods"]["heuristic"]
    assert h["n"] == 1 and h["regret_mean"] == 2.0
    assert h["missing"] == {NO_RULE: 1, NOT_MEASURED: 1}
    assert total["win_rates"]["learned<=heuristic"] == {"wins": 0, "n": 1, "rate": 0.0}
    assert ev.summary("softmax")["methods"]["heuristic"]["n"] == 0


def test_win_rates_per_kind_and_overall(tmp_path: Path) -> None:
    _, ev = _compare(tmp_path, _shape1() + _shape2())
    total = ev.summary()
    # shape 1: learned 30 us vs heuristic 20 us (loses); shape 2 has no heuristic
    assert total["win_rates"]["learned<=heuristic"] == {"wins": 0, "n": 1, "rate": 0.0}
    # top-8: 10 vs 12 (wins); 5.0 vs 5.0 (a tie is a win)
    assert total["win_rates"]["learned_top8<=autotune_list"] == {"wins": 2, "n": 2, "rate": 1.0}
    assert ev.summary("matmul")["win_rates"] == total["win_rates"]
    assert total["methods"]["learned"]["regret_mean"] == pytest.approx((3.0 + 5.1 / 5.0) / 2)
    assert total["methods"]["torch"]["n"] == 1
    assert total["autotune_list"] == {"listed": len(LIST) + len(LIST2), "measured": 5}


def test_ties_are_broken_towards_the_slowest() -> None:
    rows = [_row(X1, 10.0), _row(X2, 20.0), _row(X3, 11.0), _row(X4, 40.0),
            _row(LIST[0], 30.0)]
    # X1 and X2 tie lowest; X3 and X4 tie next
    result = score_shape([1.0, 1.0, 2.0, 2.0, 3.0], rows)
    assert walk_order(result.scores, result.values) == [1, 0, 3, 2, 4]
    s = compare_shipped_shape(rows, learned=result, shipped_specs=(LIST[0], LIST))
    assert s.picks["learned"].regret == 2.0  # X2, the slower of the tied pair
    assert s.picks["learned"].to_within == 2
    assert s.picks["learned_top3"].regret == 1.0
    # the third place is a tie of X3 (11) and X4 (40): top-3 takes X4, not the faster X3
    s = compare_shipped_shape(rows, learned=score_shape([3.0, 1.0, 2.0, 2.0, 0.0], rows),
                              shipped_specs=(LIST[0], LIST))
    assert [s.picks[m].spec for m in ("learned", "learned_top3")] == [LIST[0], X2]
    assert s.picks["learned_top3"].regret == 2.0
    assert s.picks["heuristic"].regret == 3.0 and s.picks["heuristic"].to_within is None


def test_learned_not_evaluated_leaves_its_columns_empty(tmp_path: Path) -> None:
    from harness.priors.baselines import OraclePrior

    _, ev = _compare(tmp_path, _shape1() + _shape2(), OraclePrior())
    assert ev.learned is None and ev.transfer is None
    s = ev.shapes[0]
    assert all(s.missing[m] == NOT_EVALUATED for m in ("learned", "learned_top3", "learned_top8",
                                                       "transfer"))
    text = format_shipped([ev])
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("all"))
    assert row[2:5] == ["-", "-", "-"] and row[7] == "-" and row[-2:] == ["-", "-"]
    assert "the learned prior was not evaluated" in text


def test_no_shipped_rows_no_comparison(tmp_path: Path) -> None:
    rows = [_row(X1, 3.0), _row(X2, 4.0), _row(X3, 5.0)]
    _, ev = _compare(tmp_path, rows, Table({rows[0]["shape_id"]: {X1: 1, X2: 2, X3: 3}}))
    assert not ev.has_shipped
    # the interpreter has no shipped configurations
    from harness.priors.baselines import OraclePrior

    rows = [_row(make_spec({"BLOCK_M": 16 * i, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1,
                            "num_stages": 1, "num_warps": 1}), float(i), card=INTERPRETER,
                 shape={"M": 48, "N": 40, "K": 72, "dtype": "fp32"}) for i in (1, 2, 3)]
    (tmp_path / "interpret").mkdir()
    stored = _stored(_db(tmp_path / "interpret", rows))
    (ev,) = compare_shipped(stored, evaluate(stored, [OraclePrior()], regime="interpret"))
    assert not ev.has_shipped and ev.shapes[0].missing["heuristic"] == "no card or shape"


# ---------------------------------------------------------------- the command line and report


def test_eval_prints_the_comparison(tmp_path: Path) -> None:
    db = _db(tmp_path, _shape1() + _shape2())
    cmd = [sys.executable, "-m", "harness", "eval", "--db", str(db), "--prior", "oracle",
           "--prior", "learned"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "2 ok baselines (not configurations)" in out
    head, table = out.split("against what people ship (deployable, 2 shapes)")
    lines: dict[str, list[str]] = {}
    for line in table.splitlines():
        if line.strip():
            lines.setdefault(line.split()[0], line.split())
    for m in ("learned", "learned_top3", "learned_top8", "heuristic", "autotune_list",
              "transfer", "torch", "compile"):
        assert m in lines, m
    assert lines["heuristic"][1:6] == ["1", "2.000", "2.000", "2.000", "0/1"]
    assert lines["autotune_list"][1:3] == ["2", "1.100"]
    assert lines["torch"][1:3] == ["1", "0.800"] and lines["compile"][2] == "1.100"
    assert lines["learned"][1] == "2" and lines["transfer"][1] == "0"
    assert lines["matmul"][1] == "2"

    run = subprocess.run(cmd + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    (card,) = data["cards"]
    assert card["baselines"] == 2 and card["stale"] == 0
    (ev,) = data["shipped"]
    assert ev["gpu"] == H200.name and ev["learned"] == "learned"
    assert ev["summary"]["methods"]["heuristic"]["regret_mean"] == 2.0
    assert set(ev["kinds"]) == {"matmul"} and len(ev["shapes"]) == 2


def test_eval_without_shipped_rows_prints_no_comparison(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.__main__ import main

    db = _db(tmp_path, [_row(X1, 3.0), _row(X2, 4.0), _row(X3, 5.0)])
    assert main(["eval", "--db", str(db), "--prior", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "oracle" in out and "people ship" not in out and "baselines" not in out
    assert main(["eval", "--db", str(db), "--prior", "oracle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shipped"] == []


def test_report_has_the_comparison(tmp_path: Path) -> None:
    stored = _stored(_db(tmp_path, _shape1() + _shape2()))
    blocks = evaluate(stored, [Table(SCORES)])
    index = write_report(tmp_path / "out", stored, blocks, [])
    doc = index.read_text()
    for plot in ("shipped", "baselines", "regret"):
        png = next((tmp_path / "out").glob(f"{plot}-*.png"))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{png.name}"' in doc
    assert "Against what people ship" in doc
    assert "Best time per shape against torch and torch.compile" in doc
    assert "<td>autotune_list</td><td>2</td><td>1.100</td>" in doc
    assert "<td>matmul</td><td>2</td><td>2.01 / 2.01</td>" in doc
