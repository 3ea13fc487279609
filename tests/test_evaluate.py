"""Prior evaluation (harness/evaluate.py), the priors (harness/priors/) and `python -m harness eval`,
on node tables built through NodeStore.merge with known answers."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import kinds as registry
from harness import priors
from harness.__main__ import main
from harness.cards import INTERPRETER, by_alias
from harness.evaluate import (
    CARD_OUT,
    SHAPE_OUT,
    EvalError,
    evaluate,
    format_text,
    pick,
    shape_folds,
    spearman,
    table_regime,
    to_json,
)
from harness.goldens import Anchor
from harness.points import make_spec, point_key
from harness.priors.baselines import OraclePrior, RandomPrior
from harness.priors.learned import LearnedPrior
from harness.priors.roofline import RooflinePrior, estimate
from harness.priors.transfer import TransferPrior
from harness.store import NodeStore

ROOT = Path(__file__).resolve().parent.parent
H200 = by_alias("h200")
L40S = by_alias("l40s")


# ---------------------------------------------------------------- building tables


def _row(knobs: dict[str, Any], value: float | None, *, card: Any = H200, kind: str = "matmul",
         shape: dict[str, Any] | None = None, regime: str | None = None, status: str = "ok",
         slice_: str = "tail") -> dict[str, Any]:
    """One row in the box's format (harness/box/runner.py make_row)."""
    k = registry.get(kind)
    shape = shape or {"M": 64, "N": 64, "K": 64, "dtype": "bf16"}
    sid, spec = k.shape_id(shape), make_spec(knobs)
    regime = regime or card.regime
    return {
        "point_key": point_key(card.name, sid, spec), "gpu": card.name, "regime": regime,
        "kind": kind, "shape_id": sid, "shape": shape, "spec": spec, "knobs": knobs,
        "slice": slice_, "status": status, "value_us": value if status == "ok" else None,
        "ref_us": 10.0, "variance": 0.01, "n_samples": 20,
        "error": None if status == "ok" else "out of resources",
        "features": {**card.features(), **k.shape_features(shape), **knobs},
        "cc": list(card.cc), "compile_s": 0.2, "bench_s": 0.1, "run_id": "r1",
        "measured_at": "2026-12-01T00:00:00.000000Z", "provenance": {},
    }


def _db(tmp_path: Path, rows: list[dict[str, Any]], name: str = "n.db") -> Path:
    db = tmp_path / name
    with NodeStore(db) as s:
        s.merge(rows)
    return db


def _stored(db: Path) -> list[dict[str, Any]]:
    with NodeStore(db) as s:
        return s.rows()


def _shape(m: int, n: int = 64) -> dict[str, Any]:
    return {"M": m, "N": n, "K": 64, "dtype": "bf16"}


def _simple(values: Sequence[float], *, m: int = 64, card: Any = H200, **kw: Any) -> list[dict]:
    """One shape, one row per value, BLOCK_M = 16, 32, ... in order."""
    return [_row({"BLOCK_M": 16 * (i + 1), "num_warps": 4}, v, card=card, shape=_shape(m), **kw)
            for i, v in enumerate(values)]


class Reversed:
    """Scores a row by minus its measured time: exactly backwards."""

    name = "reversed"
    learns = False

    def fit(self, train_rows: Sequence[Any]) -> None:
        pass

    def score(self, rows: Sequence[Any]) -> list[float]:
        return [-r["value_us"] for r in rows]


class Constant:
    name = "constant"
    learns = False

    def fit(self, train_rows: Sequence[Any]) -> None:
        pass

    def score(self, rows: Sequence[Any]) -> list[float]:
        return [1.0] * len(rows)


class Recorder:
    """Learns nothing, but records what it was fitted on (to check the folds)."""

    name = "recorder"

    def __init__(self) -> None:
        self.fits: list[set[str]] = []

    def fit(self, train_rows: Sequence[Any]) -> None:
        self.fits.append({f"{r['gpu']}|{r['shape_id']}" for r in train_rows})

    def score(self, rows: Sequence[Any]) -> list[float]:
        return [0.0] * len(rows)


# ---------------------------------------------------------------- statistics


def test_spearman_known_values() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # average ranks
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1], [1]) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=20, unique=True), st.data())
def test_spearman_invariants(xs: list[float], data: st.DataObject) -> None:
    ys = data.draw(st.lists(st.floats(-1e6, 1e6), min_size=len(xs), max_size=len(xs)))
    rho = spearman(xs, ys)
    if rho is not None:
        assert -1.0 <= rho <= 1.0
        assert spearman(ys, xs) == pytest.approx(rho)
    assert spearman(xs, [2 * x for x in xs]) == pytest.approx(1.0)  # an increasing map
    assert spearman(xs, [-x for x in xs]) == pytest.approx(-1.0)


def test_pick_breaks_ties_towards_the_slowest() -> None:
    assert pick([2.0, 1.0, 1.0, 3.0], [1.0, 5.0, 7.0, 0.5]) == 2
    assert pick([0.0, 0.0, 0.0], [3.0, 9.0, 1.0]) == 1


# ---------------------------------------------------------------- evaluate on known tables


def test_oracle_is_perfect_and_reversed_is_backwards(tmp_path: Path) -> None:
    rows = _stored(_db(tmp_path, _simple([5.0, 2.0, 8.0, 4.0]) + _simple([1.0, 3.0, 2.0], m=128)))
    (block,) = evaluate(rows, [OraclePrior(), Reversed()])
    oracle, rev = block.evals
    assert (oracle.mode, len(oracle.shapes)) == (SHAPE_OUT, 2)
    assert oracle.spearman_median == pytest.approx(1.0)
    assert oracle.summary()["regret_worst"] == pytest.approx(1.0)
    assert rev.spearman_median == pytest.approx(-1.0)
    regrets = sorted(s.regret for s in rev.shapes)
    assert regrets == pytest.approx([3.0, 4.0])  # 3/1 and 8/2
    assert {m.shape_id for m in rev.misses} == {s.shape_id for s in rev.shapes}
    assert rev.summary()["regret_mean"] == pytest.approx(3.5)


def test_constant_scores_abstain_and_ties_pick_the_slowest(tmp_path: Path) -> None:
    rows = _stored(_db(tmp_path, _simple([5.0, 2.0, 8.0, 4.0])))
    (block,) = evaluate(rows, [Constant()])
    (shape,) = block.evals[0].shapes
    assert shape.abstained and (shape.regret, shape.pick_spec, shape.spearman) == (None, None, None)
    s = block.evals[0].summary()
    assert (s["n_shapes"], s["n_abstained"], s["regret_mean"], s["spearman_median"]) == (
        1, 1, None, None)

    class TwoLevels(Constant):
        """Scores the two slowest rows 0 and the rest 1: an opinion, with a tie."""

        def score(self, rows: Sequence[Any]) -> list[float]:
            return [0.0 if r["value_us"] >= 5.0 else 1.0 for r in rows]

    (block,) = evaluate(rows, [TwoLevels()])
    (shape,) = block.evals[0].shapes
    assert not shape.abstained and shape.regret == pytest.approx(4.0) and shape.pick_us == 8.0


class Opinionated(Constant):
    """No opinion (NaN) on the M=64 shape; exactly right elsewhere."""

    name = "opinionated"

    def score(self, rows: Sequence[Any]) -> list[float]:
        return [math.nan if r["shape_id"] == "matmul_M64_N64_K64_bf16" else r["value_us"]
                for r in rows]


def test_an_abstaining_prior_is_left_out_of_its_means(tmp_path: Path) -> None:
    rows = _stored(_db(tmp_path, _simple([5.0, 2.0, 8.0, 4.0]) + _simple([1.0, 3.0, 2.0], m=128)))
    (block,) = evaluate(rows, [Opinionated(), Reversed()])
    mine, rev = block.evals
    assert [s.shape_id for s in mine.abstained] == ["matmul_M64_N64_K64_bf16"]
    s = mine.summary()
    # the shape it abstains on (whose slowest row is 4x the best) counts in no figure
    assert (s["n_shapes"], s["n_abstained"], s["n_spearman"]) == (2, 1, 1)
    assert (s["regret_mean"], s["regret_worst"], s["spearman_median"]) == (1.0, 1.0, 1.0)
    assert mine.misses == [] and rev.summary()["n_abstained"] == 0
    data = json.loads(json.dumps(to_json([block])))
    ev = data["cards"][0]["evaluations"][0]
    assert ev["abstained"] == ["matmul_M64_N64_K64_bf16"] and ev["regret_mean"] == 1.0
    text = format_text([block])
    line = next(ln.split() for ln in text.splitlines() if ln.strip().startswith("opinionated"))
    assert line[1:5] == ["shape-out", "2", "1", "1.000"]
    assert "abstains: every row of the shape scored alike" in text
    assert "opinionated/shape-out abstains on: matmul_M64_N64_K64_bf16" in format_text(
        [block], verbose=True)


def test_shape_with_two_ok_rows_is_skipped_and_failures_do_not_count(tmp_path: Path) -> None:
    rows = _simple([5.0, 2.0, 8.0]) + _simple([1.0, 3.0], m=128)
    rows.append(_row({"BLOCK_M": 64, "num_warps": 4}, None, shape=_shape(128), status="bench_fail"))
    (block,) = evaluate(_stored(_db(tmp_path, rows)), [OraclePrior()])
    assert [s for _, s, _ in block.skipped] == ["matmul_M128_N64_K64_bf16"]
    assert block.skipped[0][2] == 2
    assert len(block.evaluated) == 1 and (block.nodes, block.ok) == (6, 5)
    assert "skipped matmul_M128_N64_K64_bf16: 2 ok rows (needs 3)" in format_text(
        [block], verbose=True)
    assert "skipped 1 shape with fewer than 3 ok rows" in format_text([block])


def test_deployable_only_unless_asked(tmp_path: Path) -> None:
    rows = _simple([5.0, 2.0, 8.0]) + _simple([9.0, 1.0, 3.0, 4.0], card=INTERPRETER, m=32)
    stored = _stored(_db(tmp_path, rows))
    (block,) = evaluate(stored, [OraclePrior()])
    assert (block.gpu, block.regime, block.nodes) == (H200.name, "deployable", 3)
    (block,) = evaluate(stored, [OraclePrior()], regime="interpret")
    assert (block.gpu, block.nodes) == (INTERPRETER.name, 4)


def test_shape_out_folds_hide_the_scored_shape_and_card_out_needs_two_cards(tmp_path: Path) -> None:
    rows = _simple([1.0, 2.0, 3.0]) + _simple([1.0, 2.0, 3.0], m=128)
    stored = _stored(_db(tmp_path, rows))
    rec = Recorder()
    (block,) = evaluate(stored, [rec])
    assert [e.mode for e in block.evals] == [SHAPE_OUT]
    h = H200.name
    # shapes in shape_id order: holding out M128 trains on M64, and back
    assert rec.fits == [{f"{h}|matmul_M64_N64_K64_bf16"}, {f"{h}|matmul_M128_N64_K64_bf16"}]

    stored = _stored(_db(tmp_path, rows + _simple([3.0, 2.0, 1.0], card=L40S), "two.db"))
    rec = Recorder()
    blocks = evaluate(stored, [rec, OraclePrior()])
    assert [b.gpu for b in blocks] == sorted([H200.name, L40S.name])
    h200 = next(b for b in blocks if b.gpu == H200.name)
    # card-out for the learning prior only (the oracle's numbers would repeat)
    assert [(e.prior, e.mode) for e in h200.evals] == [
        ("recorder", SHAPE_OUT), ("recorder", CARD_OUT), ("oracle", SHAPE_OUT)]
    assert {f"{L40S.name}|matmul_M64_N64_K64_bf16"} in rec.fits  # H200's card-out fold
    # --gpu chooses what is evaluated, not what is trained on
    (only,) = evaluate(stored, [Recorder()], gpus=[H200.name])
    assert only.gpu == H200.name and [e.mode for e in only.evals] == [SHAPE_OUT, CARD_OUT]


def test_a_prior_breaking_its_contract_is_named(tmp_path: Path) -> None:
    class Short(Constant):
        name = "short"

        def score(self, rows: Sequence[Any]) -> list[float]:
            return [1.0]

    rows = _stored(_db(tmp_path, _simple([5.0, 2.0, 8.0])))
    with pytest.raises(EvalError, match="prior 'short' returned 1 scores for 3 rows"):
        evaluate(rows, [Short()])


# ---------------------------------------------------------------- the priors


def test_random_is_seeded_and_order_free(tmp_path: Path) -> None:
    rows = _stored(_db(tmp_path, _simple([5.0, 2.0, 8.0, 4.0])))
    a = RandomPrior(seed=1).score(rows)
    assert RandomPrior(seed=1).score(rows[::-1]) == a[::-1]
    assert RandomPrior(seed=2).score(rows) != a


def test_transfer_uses_other_cards_anchors_only(tmp_path: Path) -> None:
    sid = registry.get("matmul").shape_id(_shape(64))
    own = Anchor(gpu=H200.name, kind="matmul", shape_id=sid, spec="BLOCK_M=16,num_warps=4")
    other = Anchor(gpu=L40S.name, kind="matmul", shape_id=sid, spec="BLOCK_M=64,num_warps=8")
    rows = _stored(_db(tmp_path, _simple([5.0, 2.0, 8.0, 4.0]) + _simple([1.0, 2.0, 3.0], m=128)))
    p = TransferPrior([own, other])
    by_shape = {r["shape_id"]: [] for r in rows}
    for r, s in zip(rows, p.score(rows), strict=True):
        by_shape[r["shape_id"]].append((r["spec"], s))
    # distance to the L40S anchor (BLOCK_M=64,num_warps=8), never to H200's own
    assert dict(by_shape[sid]) == {"BLOCK_M=16,num_warps=4": 2.0, "BLOCK_M=32,num_warps=4": 2.0,
                                   "BLOCK_M=48,num_warps=4": 2.0, "BLOCK_M=64,num_warps=4": 1.0}
    # no other-card anchor: one constant score, so the prior abstains on that shape
    assert {s for _, s in by_shape["matmul_M128_N64_K64_bf16"]} == {0.0}
    (block,) = evaluate(rows, [p])
    far = next(s for s in block.evals[0].shapes if s.shape_id == "matmul_M128_N64_K64_bf16")
    assert far.abstained and block.evals[0].summary()["n_abstained"] == 1


def test_roofline_ranks_within_a_shape_by_the_knobs() -> None:
    def t(shape: dict[str, Any], **knobs: Any) -> float:
        base = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
                "num_stages": 3}
        return RooflinePrior().score([_row({**base, **knobs}, 1.0, shape=shape)])[0]

    big = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    # compute-bound: 16x16 tiles cannot feed the tensor cores and re-read the operands
    assert t(big) < t(big, BLOCK_M=16, BLOCK_N=16, num_warps=2) / 3
    # one pipeline stage cannot hide the loads of a long K loop
    assert t(big) < t(big, num_stages=1)
    # M=136: 128-row tiles pad it to 256 rows (twice the work), 64-row tiles to 192
    odd = {**big, "M": 136}
    assert t(odd, BLOCK_M=64, num_warps=4) < t(odd)
    skinny = {"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}
    est = estimate(_row({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8},
                        1.0, shape=skinny)["features"])
    assert est["R_programs"] == 32 and est["R_pad_eff"] == pytest.approx(1 / 8)
    # row kernels: a one-pass softmax reads its input once
    sm = {"M": 4096, "N": 4096, "dtype": "bf16"}
    knobs = {"BLOCK_N": 4096, "ROWS": 1, "num_warps": 8, "num_stages": 1}
    one = RooflinePrior().score([_row({**knobs, "ONE_PASS": 1}, 1.0, kind="softmax", shape=sm)])
    two = RooflinePrior().score([_row({**knobs, "ONE_PASS": 0}, 1.0, kind="softmax", shape=sm)])
    assert one[0] < two[0]
    # a split row: 256 programs each hold a chunk of 8192 columns (8.4 MB together), so the
    # second pass re-reads from L2 (0.3 of the input again), plus the partials' 8 B a chunk
    vocab = {"M": 16, "N": 128256, "dtype": "fp32"}
    split = {"BLOCK_N": 8192, "ROWS": 1, "ONE_PASS": 0, "SPLIT": 16, "num_warps": 16,
             "num_stages": 1}
    est = estimate(_row(split, 1.0, kind="softmax", shape=vocab)["features"])
    m_n_bytes = 16 * 128256 * 4
    assert est["R_programs"] == 256
    assert est["R_dram_bytes"] == pytest.approx(2 * m_n_bytes + 0.3 * m_n_bytes + 8 * 16 * 16)


def _synthetic(card: Any, ms: Sequence[int], per_shape: int = 40, seed: int = 0) -> list[dict]:
    """matmul rows whose time is a smooth function of the knobs; the best BLOCK_M follows M."""
    rng = random.Random(seed)
    grid = list(itertools.product([16, 32, 64, 128, 256], [32, 64, 128, 256], [32, 64],
                                  [2, 3, 4], [4, 8]))
    scale = 989.0 / card.peak_fp16_tflops
    rows = []
    for m in ms:
        shape = {"M": m, "N": 4096, "K": 4096, "dtype": "bf16"}
        best_bm = min(7.0, max(4.0, math.log2(m) - 3))
        for bm, bn, bk, st_, w in rng.sample(grid, per_shape):
            cost = (1 + 0.25 * (math.log2(bm) - best_bm) ** 2 + 0.15 * (math.log2(bn) - 7) ** 2
                    + 0.1 * (math.log2(bk) - 6) ** 2 + 0.1 * (st_ - 3) ** 2
                    + 0.05 * (math.log2(w) - 2) ** 2)
            value = scale * 2 * m * 4096 * 4096 / 5e8 * cost * rng.uniform(0.98, 1.02)
            rows.append(_row({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1,
                              "num_stages": st_, "num_warps": w}, value, card=card, shape=shape))
    return rows


def test_learned_generalizes_to_held_out_shapes(tmp_path: Path) -> None:
    ms = [32, 64, 128, 256, 512, 1024, 2048]
    rows = _stored(_db(tmp_path, _synthetic(H200, ms)))
    (block,) = evaluate(rows, [LearnedPrior(relative=False), RandomPrior()])
    learned, rnd = block.evals
    assert [e.mode for e in block.evals] == [SHAPE_OUT, SHAPE_OUT]
    assert len(learned.shapes) == len(ms)
    assert learned.spearman_median >= 0.8, learned.summary()
    # top-1 is harsher: one octave off the best BLOCK_M costs 1.25x here (seen: 1.08 to 1.11)
    assert learned.summary()["regret_mean"] <= 1.2, learned.summary()
    assert learned.summary()["regret_mean"] < rnd.summary()["regret_mean"] - 0.3
    assert learned.spearman_median > rnd.spearman_median + 0.4


def test_learned_relative_ranks_held_out_shapes_and_keeps_a_microsecond_scale(
        tmp_path: Path) -> None:
    ms = [32, 64, 128, 256, 512, 1024, 2048]
    rows = _stored(_db(tmp_path, _synthetic(H200, ms)))
    (block,) = evaluate(rows, [LearnedPrior(relative=True), RandomPrior()])
    rel, rnd = block.evals
    assert rel.prior == "learned"
    assert rel.spearman_median >= 0.8, rel.summary()
    assert rel.spearman_median > rnd.spearman_median + 0.4
    # scores are back in µs: within a decade of the measured times on held-out shapes
    prior = LearnedPrior(relative=True)
    prior.fit([r for r in rows if r["shape_id"] != rows[0]["shape_id"]])
    held = [r for r in rows if r["shape_id"] == rows[0]["shape_id"]]
    ratios = sorted(s / r["value_us"] for s, r in zip(prior.score(held), held, strict=True))
    assert 0.1 < ratios[len(ratios) // 2] < 10, ratios


def test_learned_card_out_transfers_across_cards(tmp_path: Path) -> None:
    rows = _synthetic(H200, [64, 256, 1024], per_shape=30) + _synthetic(L40S, [64, 256, 1024],
                                                                      per_shape=30, seed=1)
    blocks = evaluate(_stored(_db(tmp_path, rows)), [LearnedPrior(max_iter=80)])
    for b in blocks:
        assert [e.mode for e in b.evals] == [SHAPE_OUT, CARD_OUT]
        card_out = b.evals[1]
        assert card_out.spearman_median >= 0.7, (b.gpu, card_out.summary())


def test_learned_carries_a_configuration_that_wins_on_the_other_shapes(tmp_path: Path) -> None:
    """One configuration is the fastest of every shape, the others' times are noise: held out,
    each shape is still given that configuration (the ``T_*`` encoding carries it), and the
    scores are the same on a second fit."""
    rng = random.Random(3)
    grid = list(itertools.product([16, 32, 64, 128], [32, 64, 128], [32, 64], [2, 3, 4]))
    winner = (64, 64, 32, 3)
    rows = []
    for m in (64, 128, 256, 512, 1024, 2048):
        shape = {"M": m, "N": 4096, "K": 4096, "dtype": "bf16"}
        for bm, bn, bk, st_ in [winner, *rng.sample([g for g in grid if g != winner], 20)]:
            value = m * (1.0 if (bm, bn, bk, st_) == winner else rng.uniform(1.3, 3.0))
            rows.append(_row({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1,
                              "num_stages": st_, "num_warps": 4}, value, shape=shape))
    rows = _stored(_db(tmp_path, rows))
    (block,) = evaluate(rows, [LearnedPrior(max_iter=80)])
    (learned,) = block.evals
    assert [s.regret for s in learned.shapes] == [1.0] * 6, learned.to_json()["misses"]
    held = [r for r in rows if r["shape_id"] == rows[0]["shape_id"]]
    train = [r for r in rows if r["shape_id"] != rows[0]["shape_id"]]
    first, second = LearnedPrior(max_iter=80), LearnedPrior(max_iter=80)
    first.fit(train)
    second.fit(train)
    assert first.score(held) == second.score(held)


def test_learned_encoding_leaves_a_training_rows_own_shape_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In ``fit`` a row's ``T_*`` come from the other shapes only: a configuration measured
    on one shape alone has none, one measured on two has the other shape's result."""
    shared = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_stages": 3, "num_warps": 4}
    rows = [_row(shared, 10.0, shape=_shape(256)),
            _row({**shared, "BLOCK_M": 128}, 20.0, shape=_shape(256)),
            _row(shared, 30.0, shape=_shape(512)),
            _row({**shared, "BLOCK_N": 32}, 15.0, shape=_shape(512))]
    trained_on: list[list[dict[str, Any]]] = []
    matrix = LearnedPrior._matrix

    def recording(self: LearnedPrior, raws: Any, columns: Any = None) -> Any:
        trained_on.append([dict(r) for r in raws])
        return matrix(self, raws, columns)

    monkeypatch.setattr(LearnedPrior, "_matrix", recording)
    LearnedPrior(max_iter=5).fit(rows)
    # the first model learns the relative time itself: log(time / the shape's best)
    shared_a, alone, shared_b, _ = trained_on[0]
    assert alone["T_n"] == 0 and math.isnan(alone["T_mean"]) and math.isnan(alone["T_similar"])
    # on shape 512 the shared configuration is twice the best: log 2, not its own 0 on 256
    assert shared_a["T_n"] == 1 and shared_a["T_mean"] == pytest.approx(math.log(2.0))
    assert shared_a["T_similar"] == pytest.approx(math.log(2.0))
    assert shared_b["T_n"] == 1 and shared_b["T_mean"] == pytest.approx(0.0)
    assert "R_rel_time" not in shared_a and "R_rel_time" in trained_on[1][0]


# ---------------------------------------------------------------- registry

PLUGIN = """
class Reversed:
    name = "reversed"
    learns = False

    def __init__(self, ctx):
        self.seed = ctx.seed

    def fit(self, train_rows):
        pass

    def score(self, rows):
        return [-r["value_us"] for r in rows]

INSTANCE = Reversed(type("Ctx", (), {"seed": 7})())
NOT_A_PRIOR = 3
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's own prior module, importable as ``user_priors``."""
    (tmp_path / "user_priors.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_priors"


def test_registry_names_and_module_attr_specs(plugin: str) -> None:
    assert {"oracle", "random", "transfer", "roofline", "learned"} <= set(priors.names())
    assert priors.make("oracle").name == "oracle"
    made = priors.make(f"{plugin}:Reversed", priors.PriorContext(seed=3))  # a class: called
    assert made.name == "reversed" and made.seed == 3
    assert priors.make(f"{plugin}:INSTANCE").seed == 7  # an instance: used as is
    with pytest.raises(priors.PriorError, match="unknown prior 'nope'; registered priors: .*oracle"):
        priors.make("nope")
    with pytest.raises(priors.PriorError, match="has no 'Nope'"):
        priors.make(f"{plugin}:Nope")
    with pytest.raises(priors.PriorError, match="is a int; expected an object with fit"):
        priors.make(f"{plugin}:NOT_A_PRIOR")
    with pytest.raises(priors.PriorError, match="cannot import 'no_such_module_x'"):
        priors.make("no_such_module_x:P")
    priors.register("reversed-for-test", lambda ctx: Reversed())
    assert priors.make("reversed-for-test").name == "reversed"


# ---------------------------------------------------------------- the command line


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin: str) -> None:
    rows = (_simple([5.0, 2.0, 8.0, 4.0]) + _simple([1.0, 3.0, 2.0], m=128)
            + _simple([1.0, 2.0], m=256) + _simple([4.0, 1.0, 2.0], card=INTERPRETER, m=32))
    db = str(_db(tmp_path, rows))
    code, out, _ = _cli(capsys, "eval", "--db", db, "--prior", "oracle", "random",
                        "--prior", f"{plugin}:Reversed")
    assert code == 0
    lines = out.splitlines()
    # the table has deployable rows: those are evaluated, the interpret ones are not
    assert lines[0] == f"[{H200.name}] deployable: 9 rows, 9 ok, 0 failed"
    assert "2 shapes evaluated (>= 3 ok configurations), 1 skipped" in out
    oracle = next(line.split() for line in lines if line.strip().startswith("oracle"))
    assert oracle[1:] == ["shape-out", "2", "-", "1.000", "1.000", "1.000", "1.000", "0"]
    reversed_ = next(line.split() for line in lines if line.strip().startswith("reversed"))
    assert reversed_[4] == "-1.000" and reversed_[-1] == "2"
    assert "Triton CPU interpreter" not in out
    # the per-shape lists only with -v
    assert "misses best" not in out and "skipped matmul_M256" not in out
    assert "picks over 1.2x the best (-v lists them" in out
    assert "skipped 1 shape with fewer than 3 ok rows (-v lists them)" in out
    code, verbose, _ = _cli(capsys, "eval", "--db", db, "--prior", "oracle",
                            f"{plugin}:Reversed", "-v")
    assert code == 0 and "misses best" in verbose
    assert "reversed/shape-out matmul_M64_N64_K64_bf16: 4.00x" in verbose
    assert "skipped matmul_M256_N64_K64_bf16: 2 ok rows (needs 3)" in verbose

    code, out, _ = _cli(capsys, "eval", "--db", db, "--gpu", "h200", "--json", "--prior", "oracle")
    data = json.loads(out)
    (card,) = data["cards"]
    assert (card["gpu"], card["regime"], card["nodes"], card["shapes_evaluated"]) == (
        H200.name, "deployable", 9, 2)
    assert card["skipped"] == [{"kind": "matmul", "shape_id": "matmul_M256_N64_K64_bf16",
                                "ok_rows": 2}]
    (ev,) = card["evaluations"]
    assert (ev["prior"], ev["mode"], ev["spearman_median"], ev["regret_mean"]) == (
        "oracle", "shape-out", 1.0, 1.0)
    assert {s["shape_id"] for s in ev["shapes"]} == {"matmul_M64_N64_K64_bf16",
                                                    "matmul_M128_N64_K64_bf16"}
    assert json.loads(json.dumps(to_json([]))) == {"miss_ratio": 1.2, "cards": []}


def test_the_regime_is_the_tables_unless_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(_db(tmp_path, _simple([4.0, 1.0, 2.0], card=INTERPRETER, m=32)))
    code, out, _ = _cli(capsys, "eval", "--db", db, "--prior", "oracle")
    assert code == 0 and out.startswith(f"[{INTERPRETER.name}] interpret: 3 rows, 3 ok")
    code, out, _ = _cli(capsys, "eval", "--db", db, "--prior", "oracle", "--json")
    assert json.loads(out)["regime"] == "interpret"
    both = _stored(_db(tmp_path, _simple([4.0, 1.0, 2.0], card=INTERPRETER, m=32)
                       + _simple([5.0, 2.0, 8.0]), "both.db"))
    assert table_regime(both) == "deployable"  # the only regime priors train on
    assert table_regime([r for r in both if r["regime"] == "interpret"]) == "interpret"
    assert table_regime([]) == "deployable"


def test_cli_errors_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(_db(tmp_path, _simple([4.0, 1.0, 2.0], card=INTERPRETER, m=32)))
    code, _, err = _cli(capsys, "eval", "--db", db, "--regime", "deployable")
    assert code == 2 and "has no deployable rows (it has interpret rows: try --regime interpret)" in err
    code, _, err = _cli(capsys, "eval", "--db", db, "--folds", "-1")
    assert code == 2 and "--folds -1: give a number of folds, or 0 for one fold per shape" in err
    code, _, err = _cli(capsys, "eval", "--db", db, "--regime", "interpret", "--gpu", "h300")
    assert code == 2 and "--gpu 'h300' names no card; aliases: l40s" in err
    code, _, err = _cli(capsys, "eval", "--db", db, "--regime", "interpret", "--kind", "conv")
    assert code == 2 and "--kind 'conv'; valid kinds: attention" in err
    code, _, err = _cli(capsys, "eval", "--db", db, "--regime", "interpret", "--prior", "nope")
    assert code == 2 and "unknown prior 'nope'" in err
    code, _, err = _cli(capsys, "eval", "--db", str(tmp_path / "missing.db"))
    assert code == 2 and "no node table at" in err


def test_eval_of_a_real_interpret_run(tmp_path: Path) -> None:
    """The box measures softmax with the interpreter; merge; eval --regime interpret."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    rows, ledger, db = tmp_path / "r.jsonl", tmp_path / "l.json", tmp_path / "n.db"
    # The interpreter's softmax points all fall in the own/cross slices (the tail is empty):
    # 12 own points over two shapes, all measured well within the budget, even under load.
    run = subprocess.run([sys.executable, "-m", "harness.box", "run", "--slice", "own",
                          "--kind", "softmax", "--budget-s", "120", "--batch", "4",
                          "--rows", str(rows), "--ledger", str(ledger)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    merge = subprocess.run([sys.executable, "-m", "harness", "merge", str(rows), "--db", str(db),
                            "--no-backup"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert merge.returncode == 0, merge.stderr
    # the table holds interpret rows only: eval evaluates them without --regime
    out = subprocess.run([sys.executable, "-m", "harness", "eval", "--db", str(db),
                          "--json", "--prior", "oracle", "roofline", "transfer"],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (card,) = data["cards"]
    ok_per_shape: dict[str, int] = {}
    for line in rows.read_text().splitlines():
        r = json.loads(line)
        ok_per_shape[r["shape_id"]] = ok_per_shape.get(r["shape_id"], 0) + (r["status"] == "ok")
    expected = {s for s, n in ok_per_shape.items() if n >= 3}
    assert expected, ok_per_shape
    assert card["gpu"] == "Triton CPU interpreter" and card["regime"] == "interpret"
    for ev in card["evaluations"]:
        assert {s["shape_id"] for s in ev["shapes"]} == expected
        assert all(s["abstained"] or s["regret"] >= 1.0 for s in ev["shapes"])
    oracle = next(e for e in card["evaluations"] if e["prior"] == "oracle")
    assert oracle["regret_worst"] == 1.0


def test_learned_refuses_a_bag_or_feature_share_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="bag must be >= 1 .got 0"):
        LearnedPrior(bag=0)
    with pytest.raises(ValueError, match=r"max_features in \(0, 1\] .got 1.5"):
        LearnedPrior(max_features=1.5)


# ---------------------------------------------------------------- folds, progress, output size


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["attention", "matmul", "reduce", "softmax"]),
                          st.integers(1, 40)), unique=True, max_size=60),
       st.integers(0, 12))
def test_shape_folds_partition_the_shapes_holding_out_few_of_a_kind(
        shapes: list[tuple[str, int]], folds: int) -> None:
    keys = [(kind, f"{kind}_{i}") for kind, i in shapes]
    dealt = shape_folds(keys, folds)
    flat = [k for fold in dealt for k in fold]
    assert sorted(flat) == sorted(keys) and len(flat) == len(set(flat))  # a partition
    assert all(dealt)  # no empty fold
    if folds == 0 or folds >= len(keys):
        assert all(len(f) == 1 for f in dealt)  # leave-one-shape-out
        return
    assert len(dealt) == folds
    assert max(map(len, dealt)) - min(map(len, dealt)) <= 1
    for kind in {k for k, _ in keys}:
        n = sum(1 for k, _ in keys if k == kind)
        assert max(sum(1 for k, _ in f if k == kind) for f in dealt) == -(-n // folds)


def test_a_fold_is_scored_by_the_fit_that_did_not_see_it(tmp_path: Path) -> None:
    ms = [16, 32, 64, 128, 256]
    rows = _stored(_db(tmp_path, [r for m in ms for r in _simple([3.0, 1.0, 2.0], m=m)]))

    class Blind(Recorder):
        """Records each fit and, when scoring, that no row scored was in the last fit."""

        def score(self, rows: Sequence[Any]) -> list[float]:
            seen = self.fits[-1]
            assert not any(f"{r['gpu']}|{r['shape_id']}" in seen for r in rows)
            return [r["value_us"] for r in rows]

    calls: list[tuple[str, int, int]] = []
    prior = Blind()
    (block,) = evaluate(rows, [prior], folds=2, progress=lambda *a: calls.append(a))
    (ev,) = block.evals
    assert ev.folds == 2 and len(prior.fits) == 2 and len(ev.shapes) == 5
    # every shape trained on by exactly one of the two fits: the one it was not scored by
    assert sorted(len(f) for f in prior.fits) == [2, 3]
    what = f"[{H200.name}] recorder shape-out"
    assert calls == [(what, 0, 2), (what, 1, 2), (what, 2, 2)]
    prior = Blind()
    (block,) = evaluate(rows, [prior], folds=0)
    assert len(prior.fits) == 5 and block.evals[0].folds == 5


QUICK_LEARNED = """
from harness.priors.roofline import RooflinePrior


class Quick(RooflinePrior):
    '''Stands in for the learned prior: the roofline, refitted per fold.'''

    name = "learned"
    learns = True


def make(ctx):
    return Quick()
"""


def test_default_output_fits_a_screen_and_fits_go_to_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of every golden H200 shape and kind, with shipped configurations and baselines,
    as a sweep leaves it: stdout is the tables in at most 40 lines, the fits go by on stderr."""
    from tests.bench_scripts import load

    (tmp_path / "quick_prior.py").write_text(QUICK_LEARNED)
    db = tmp_path / "big.db"
    load("eval_table").build(db, n_rows=1500)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    cmd = [sys.executable, "-m", "harness", "eval", "--db", str(db), "--prior", "oracle",
           "random", "transfer", "roofline", "quick_prior:make"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) <= 40, run.stdout
    assert "shape-out (6 folds)" in run.stdout and "against what people ship" in run.stdout
    assert "transfer" in run.stdout and "abstains" in run.stdout
    assert "eval:" not in run.stdout
    fits = [ln for ln in run.stderr.splitlines() if ln.startswith("eval: ")]
    assert fits[-1].startswith(f"eval: [{H200.name}] learned shape-out: 6/6 fits")
    verbose = subprocess.run(cmd + ["-v"], cwd=ROOT, capture_output=True, text=True, env=env,
                             timeout=300)
    assert verbose.returncode == 0 and "misses best" in verbose.stdout
    assert len(verbose.stdout.splitlines()) > len(lines)


def test_eval_and_record_say_when_rows_are_of_other_kernel_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    here = registry.source_rev("matmul")
    rows = _simple([5.0, 2.0, 8.0, 4.0]) + _simple([1.0, 3.0, 2.0], m=128)
    for i, row in enumerate(rows):
        row["provenance"] = {"kernel_rev": here if i % 2 else "0123456789ab"}
    rows[0]["provenance"] = {}  # a row from before kernel_rev
    mixed = str(_db(tmp_path, rows, "mixed.db"))
    code, _, err = _cli(capsys, "eval", "--db", mixed, "--prior", "oracle")
    assert code == 0
    (note,) = [line for line in err.splitlines() if line.startswith("note: matmul")]
    assert note.startswith("note: matmul: rows of 3 kernel revisions (")
    assert note.endswith(", 1 of no recorded revision); their times are ranked together")
    assert "3 of 0123456789ab" in note and f"3 of this code ({here})" in note
    code, _, err = _cli(capsys, "goldens", "record", "--db", mixed, "--gpu", "h200",
                        "--out", str(tmp_path / "a.json"))
    assert code == 0 and "note: matmul: rows of 3 kernel revisions" in err

    for row in rows:
        row["provenance"] = {"kernel_rev": "0123456789ab"}
    old = str(_db(tmp_path, rows, "old.db"))
    _, _, err = _cli(capsys, "eval", "--db", old, "--prior", "oracle")
    assert (f"note: matmul: all 7 rows were measured with kernel revision 0123456789ab, not "
            f"this code's ({here})") in err

    # rows of this code only, or all from before kernel_rev: nothing to say
    for revs, name in (({"kernel_rev": here}, "here.db"), ({}, "before.db")):
        for row in rows:
            row["provenance"] = dict(revs)
        _, _, err = _cli(capsys, "eval", "--db", str(_db(tmp_path, rows, name)),
                         "--prior", "oracle")
        assert "kernel revision" not in err
