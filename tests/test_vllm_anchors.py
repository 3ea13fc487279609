"""Other cards' anchors from vLLM's tuned configs (harness/goldens/vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cards, goldens, pools
from harness.goldens import vllm
from harness.points import parse_spec


def test_the_nearest_m_key_on_a_log_scale() -> None:
    keys = [1, 16, 64, 2048, 4096]
    assert vllm.nearest_key(16, keys) == 16
    assert vllm.nearest_key(3000, keys) == 4096 and vllm.nearest_key(2500, keys) == 2048
    assert vllm.nearest_key(40, keys) == 64 and vllm.nearest_key(1_000_000, keys) == 4096


def test_an_entry_becomes_the_kinds_knobs_in_one_spelling() -> None:
    small = {"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}
    # A100's entry for 16 tokens: GROUP_SIZE_M 64 over one M tile launches as no grouping
    knobs = vllm.to_knobs("matmul", small, (16, 64, 256, 64, 4, 4))
    assert knobs == {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1,
                     "num_warps": 4, "num_stages": 4}
    big = {"M": 2048, "N": 4096, "K": 4096, "dtype": "bf16"}
    # 16 M tiles in a group of 32: the group of 16 that holds them all
    assert vllm.to_knobs("matmul", big, (128, 128, 64, 32, 4, 3))["GROUP_M"] == 16
    assert vllm.to_knobs("norm_linear", big, (128, 128, 64, 8, 4, 3))["PROLOGUE"] == 0
    assert vllm.to_knobs("linear_norm", big, (128, 128, 64, 8, 4, 3))["ROW_PROGRAM"] == 0


@pytest.mark.parametrize("alias", sorted(vllm.TABLES))
def test_the_shipped_anchor_files_are_what_the_tables_give_and_name_their_source(
        alias: str) -> None:
    path = goldens.ANCHOR_DIR / f"vllm-{alias}.json"
    data = json.loads(path.read_text())
    file, commit, _ = vllm.TABLES[alias]
    assert commit in data["comment"] and file in data["comment"]
    assert data["gpu"] == cards.by_alias(alias).name
    want = {(a.kind, a.shape_id, a.spec) for a in vllm.anchors_for(alias)}
    assert {(a["kind"], a["shape_id"], a["spec"]) for a in data["anchors"]} == want
    assert all("vllm-project/vllm" in a["source"] for a in data["anchors"])


def test_the_knob_spaces_hold_every_vllm_anchor_their_card_can_run() -> None:
    for alias in vllm.TABLES:
        card = cards.by_alias(alias)
        mine = [a for a in goldens.anchors() if a.gpu == card.name and "vllm" in a.source]
        pool = pools.build(card, kinds=list(vllm.GEMM_KINDS))
        assert not [a for a in pool.skipped_anchors if a in mine], alias


def test_an_h200_now_has_other_cards_neighbours_in_its_cross_slice() -> None:
    h200 = cards.by_alias("h200")
    pool = pools.build(h200, kinds=["matmul"])
    cross = [p for p in pool.points("cross")]
    assert cross
    others = {a.gpu for sp in pool.shapes for a in goldens.anchors()
              if a.kind == "matmul" and a.shape_id == sp.golden.shape_id and a.gpu != h200.name}
    assert {"NVIDIA A100 80GB", "NVIDIA B200"} <= others


def test_the_values_beyond_the_old_knob_space_are_in_it_now() -> None:
    from harness.kinds.base import GEMM_TILES

    used = {(k, v) for alias in vllm.TABLES for a in vllm.anchors_for(alias)
            for k, v in parse_spec(a.spec).items()}
    assert ("BLOCK_K", "256") in used
    assert 256 in GEMM_TILES["BLOCK_K"] and {32, 64} <= set(GEMM_TILES["GROUP_M"])


def test_writing_the_files_again_changes_nothing(tmp_path: Path) -> None:
    for written in vllm.write(tmp_path):
        assert written.read_text() == (goldens.ANCHOR_DIR / written.name).read_text()
