"""Golden shapes, anchor files and ``python -m harness goldens record``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import goldens, pools
from harness.cards import INTERPRETER, by_alias
from harness.goldens.record import best_anchors, record
from harness.points import make_spec, parse_spec, point_key
from harness.store import NodeStore

ROOT = Path(__file__).resolve().parent.parent


def ANY(kind: str, shape_id: str, spec: str) -> bool:  # noqa: N802 - every spec in the pool
    return True


def _row(spec: str, value: float, *, gpu: str = "NVIDIA H200 141GB", regime: str = "deployable",
         status: str = "ok", variance: float = 0.1, shape_id: str = "matmul_M16_N16_K16_bf16",
         t: str = "2026-12-01T00:00:00.000000Z") -> dict:
    return {"point_key": point_key(gpu, shape_id, spec), "gpu": gpu, "regime": regime, "kind": "matmul",
            "shape_id": shape_id, "shape": {"M": 16, "N": 16, "K": 16, "dtype": "bf16"},
            "spec": spec, "knobs": {}, "slice": "tail", "status": status,
            "value_us": value if status == "ok" else None, "ref_us": 1.0, "variance": variance,
            "n_samples": 20, "error": None, "features": {"S_M": 16}, "cc": [9, 0],
            "compile_s": 0.1, "bench_s": 0.1, "run_id": "r1", "measured_at": t, "provenance": {}}


def test_best_anchor_is_fastest_ok_deployable_with_variance_tiebreak() -> None:
    rows = [_row("A=1", 5.0), _row("A=2", 4.0, variance=0.5), _row("A=3", 4.0, variance=0.2),
            _row("A=4", 1.0, regime="interpret"), _row("A=5", 1.0, status="bench_fail"),
            _row("A=6", 0.5, gpu="NVIDIA L40S"), _row("baseline=torch", 0.5),
            _row("baseline=compile", 0.4)]  # faster, but no configuration: never an anchor
    (a,) = best_anchors(rows, "NVIDIA H200 141GB")
    assert a.spec == "A=3" and a.value_us == 4.0


SOFTMAX = "softmax_M512_N32000_bf16"


def _softmax_row(spec: str, value: float) -> dict:
    return {**_row(spec, value, shape_id=SOFTMAX), "kind": "softmax",
            "shape": {"M": 512, "N": 32000, "dtype": "bf16"}}


def test_record_cli_writes_anchor_file_from_db(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    with NodeStore(db) as s:
        s.merge([_softmax_row("BLOCK_N=4096,ONE_PASS=0,ROWS=1,num_stages=2,num_warps=8", 5.0),
                 _softmax_row("BLOCK_N=32768,ONE_PASS=1,ROWS=1,num_stages=1,num_warps=16", 3.0),
                 {**_softmax_row("BLOCK_N=32768,ONE_PASS=1,ROWS=1,num_stages=1,num_warps=8",
                                 0.1), "regime": "interpret"}])
    out = tmp_path / "h200.json"
    r = subprocess.run([sys.executable, "-m", "harness", "goldens", "record", "--db", str(db),
                        "--gpu", "h200", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "1 shapes" in r.stdout
    (a,) = goldens.load_anchor_file(out)
    assert (a.gpu, a.spec) == ("NVIDIA H200 141GB",
                               "BLOCK_N=32768,ONE_PASS=1,ROWS=1,num_stages=1,num_warps=16")


def test_record_takes_the_fastest_configuration_of_the_cards_pool(tmp_path: Path) -> None:
    """The shipped rule's 32 warps lie beyond softmax's knob space (up to 16): measured early
    in every sweep, but no anchor, since a slice is drawn around an anchor in the pool."""
    shipped_rule = _softmax_row("BLOCK_N=32768,ONE_PASS=1,ROWS=1,num_stages=1,num_warps=32", 2.0)
    in_space = _softmax_row("BLOCK_N=32768,ONE_PASS=1,ROWS=1,num_stages=1,num_warps=16", 3.0)
    out = tmp_path / "a.json"
    done = record([shipped_rule, in_space], by_alias("h200"), out)
    assert done.written == 1 and goldens.load_anchor_file(done.path)[0].spec == in_space["spec"]
    assert record([shipped_rule], by_alias("h200"), tmp_path / "b.json").written == 0
    assert pools.build(by_alias("h200"), kinds=["softmax"],
                       anchors=goldens.load_anchor_file(out)).skipped_anchors == []


def test_record_keeps_anchors_of_shapes_not_measured(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    record([_row("A=1", 1.0, shape_id="s1")], by_alias("h200"), out, in_pool=ANY)
    done = record([_row("A=2", 1.0, shape_id="s2")], by_alias("h200"), out, in_pool=ANY)
    assert done[1:] == (2, 1, 0)
    assert {a.shape_id for a in goldens.load_anchor_file(done.path)} == {"s1", "s2"}


def test_record_keep_faster_keeps_the_faster_anchor_of_a_longer_sweep(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    record([_row("A=1", 1.0, shape_id="s1"), _row("A=1", 2.0, shape_id="s2")], by_alias("h200"),
           out, in_pool=ANY)
    # a short sweep: slower on s1 (keeps A=1), faster on s2 (takes A=3), new on s3
    rows = [_row("A=2", 1.5, shape_id="s1"), _row("A=3", 1.9, shape_id="s2"),
            _row("A=4", 3.0, shape_id="s3")]
    done = record(rows, by_alias("h200"), out, keep_faster=True, in_pool=ANY)
    assert done[1:] == (3, 2, 0)
    got = {a.shape_id: (a.spec, a.value_us) for a in goldens.load_anchor_file(done.path)}
    assert got == {"s1": ("A=1", 1.0), "s2": ("A=3", 1.9), "s3": ("A=4", 3.0)}
    # the same configuration measured faster: not another anchor, but a new time, said apart
    done = record([_row("A=1", 0.9, shape_id="s1")], by_alias("h200"), out, keep_faster=True,
                  in_pool=ANY)
    assert done[1:] == (3, 0, 1)
    assert {a.shape_id: a.value_us for a in goldens.load_anchor_file(out)}["s1"] == 0.9
    # without it the table's best replaces every measured shape
    record(rows, by_alias("h200"), out, in_pool=ANY)
    assert {a.shape_id: a.spec for a in goldens.load_anchor_file(out)}["s1"] == "A=2"


def test_record_counts_a_spec_from_before_a_knob_as_the_same_configuration(tmp_path: Path) -> None:
    """An anchor written before the copy-engine knobs existed is the pointer path: the same
    configuration measured with them at their first values is a new time, not another
    configuration; the TMA path is another."""
    shape_id = "matmul_M4096_N4096_K4096_bf16"  # golden: its knob space completes the specs
    old = "BLOCK_K=64,BLOCK_M=128,BLOCK_N=128,GROUP_M=8,num_stages=3,num_warps=4"
    out = tmp_path / "a.json"
    record([_row(old, 2.0, shape_id=shape_id)], by_alias("h200"), out, in_pool=ANY)
    same = make_spec({**dict(parse_spec(old)), "TMA": 0, "PERSISTENT": 0, "SUBTILE": 0})
    assert record([_row(same, 1.9, shape_id=shape_id)], by_alias("h200"), out, keep_faster=True,
                  in_pool=ANY)[1:] == (1, 0, 1)
    other = make_spec({**dict(parse_spec(same)), "TMA": 1})
    assert record([_row(other, 1.8, shape_id=shape_id)], by_alias("h200"), out,
                  keep_faster=True, in_pool=ANY)[1:] == (1, 1, 0)
    assert goldens.load_anchor_file(out)[0].spec == other


def test_record_refuses_a_db_without_rows_of_the_card(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    with NodeStore(db) as s:
        s.merge([_row("A=1", 5.0, regime="interpret")])
    r = subprocess.run([sys.executable, "-m", "harness", "goldens", "record", "--db", str(db),
                        "--gpu", "h200"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "no deployable ok rows of NVIDIA H200 141GB" in r.stderr


def test_shipped_shapes_have_unique_ids_and_real_model_names() -> None:
    for regime in ("deployable", "interpret"):
        shapes = goldens.shapes(regime)
        ids = [g.shape_id for g in shapes]
        assert len(ids) == len(set(ids))
        assert all(g.name and g.model for g in shapes)


def test_interpret_anchors_realize_and_fill_every_slice() -> None:
    pool = pools.build(INTERPRETER)
    assert pool.skipped_anchors == []
    assert {p.slice for p in pool.points()} == {"own", "cross", "tail"}


def test_filter_keeps_shapes_whose_name_contains_it() -> None:
    shapes = goldens.shapes("deployable", filter="llama3-8b")
    assert shapes and all("llama3-8b" in g.name for g in shapes)
    assert goldens.shapes("deployable", filter="no such model") == []


def test_anchor_files_are_valid_json_with_known_kinds() -> None:
    from harness import kinds as registry

    for path in goldens.ANCHOR_DIR.glob("*.json"):
        data = json.loads(path.read_text())
        assert all(a["kind"] in registry.names() for a in data["anchors"])


def test_record_keep_faster_into_a_new_file_starts_from_the_cards_anchors(
        tmp_path: Path, monkeypatch) -> None:
    """``--out`` elsewhere with ``--keep-faster`` compares with the card's recorded anchors
    (a new file has none) and writes them all, the faster of each kept."""
    import harness.goldens.record as rec

    shipped = tmp_path / "anchors"
    shipped.mkdir()
    record([_row("A=1", 1.0, shape_id="s1"), _row("A=1", 2.0, shape_id="s2")], by_alias("h200"),
           shipped / "h200.json", in_pool=ANY)
    monkeypatch.setattr(rec, "ANCHOR_DIR", shipped)
    out = tmp_path / "new.json"
    done = record([_row("A=2", 1.5, shape_id="s1")], by_alias("h200"), out, keep_faster=True,
                  in_pool=ANY)
    assert done == (out, 2, 0, 0)
    assert {a.shape_id: (a.spec, a.value_us) for a in goldens.load_anchor_file(out)} == {
        "s1": ("A=1", 1.0), "s2": ("A=1", 2.0)}
    # without --keep-faster a new file holds this table's anchors only
    assert record([_row("A=2", 1.5, shape_id="s1")], by_alias("h200"), tmp_path / "b.json",
                  in_pool=ANY).written == 1
