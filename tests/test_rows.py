"""Rows on their way in: whatever a line holds, it becomes a node or is set aside with a reason.

Real SQLite files and real rows files; Hypothesis throws arbitrary JSON at every field.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.points import point_key
from harness.rows import RejectedRows, RowError, read_lines, row_to_node
from harness.store import NodeStore, RowsFile

H200 = "NVIDIA H200 141GB"
NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)


def make_row(i: int = 0, **over: Any) -> dict[str, Any]:
    spec = "BLOCK_K=64,BLOCK_M=128,BLOCK_N=128,num_stages=3,num_warps=4"
    shape_id = f"matmul_M{64 + i}_N4096_K4096_bf16"
    row = {
        "point_key": point_key(H200, shape_id, spec), "gpu": H200, "regime": "deployable",
        "kind": "matmul", "shape_id": shape_id, "spec": spec, "slice": "own", "status": "ok",
        "shape": {"M": 64 + i, "N": 4096, "K": 4096, "dtype": "bf16"},
        "value_us": 12.5, "ref_us": 10.0, "variance": 0.02, "n_samples": 20, "error": None,
        "features": {"H_cc": 90, "S_M": 64 + i, "S_N": 4096, "S_K": 4096, "BLOCK_M": "128"},
        "cc": [9, 0], "compile_s": 1.2, "bench_s": 0.3, "run_id": "bench-20261203T000000Z-1",
        "measured_at": "2026-12-03T11:00:00.000000Z",
        "provenance": {"host": "box", "sm_mhz": [1980, 1975], "cv": 0.01},
    }
    row.update(over)
    return row


def deep(n: int) -> str:
    return "[" * n + "]" * n


# The faults a user met, each as one line of a rows file, and a word of the reason it is set aside.
BAD_LINES = {
    "spec-an-object": (json.dumps(make_row(spec={"a": 1})), "spec of type dict"),
    "deeply-nested": ('{"features": ' + deep(100_000) + "}", "nested too deeply"),
    "huge-int-value": (json.dumps(make_row()).replace('"value_us": 12.5', '"value_us": ' + "9" * 400),
                       "value_us"),
    "features-a-list": (json.dumps(make_row(features=[1, 2, 3])), "features of type list"),
    "value-zero": (json.dumps(make_row(value_us=0)), "value_us 0"),
    "value-negative": (json.dumps(make_row(value_us=-3.5)), "value_us -3.5"),
    "value-a-string": (json.dumps(make_row(value_us="12")), "value_us '12' of type str"),
    "value-true": (json.dumps(make_row(value_us=True)), "value_us True of type bool"),
    "year-9999": (json.dumps(make_row(measured_at="9999-01-01T00:00:00Z")), "more than a day after"),
    "two-days-ahead": (json.dumps(make_row(measured_at="2026-12-05T12:00:01Z")), "more than a day"),
    "cc-strings": (json.dumps(make_row(cc=["9", "0"])), "cc ['9', '0']"),
    "n-samples-float": (json.dumps(make_row(n_samples=2.5)), "n_samples 2.5"),
    "gpu-a-number": (json.dumps(make_row(gpu=7)), "gpu of type int"),
    "key-of-another-point": (json.dumps(make_row(point_key=f"{H200}|x|0123456789abcdef")),
                             "does not match"),
    "spec-not-canonical": (json.dumps(make_row(spec="num_warps=4,BLOCK_K=64")), "canonical"),
    "nested-feature": (json.dumps(make_row(features={"S_M": {"a": [1]}})), "features['S_M'] of type dict"),
    "lone-surrogate": (json.dumps(make_row(error="x\ud800y", status="crash")), "not valid Unicode"),
    "nan": (json.dumps(make_row()).replace('"variance": 0.02', '"variance": NaN'), "variance nan"),
    "not-an-object": ("[1, 2, 3]", "a JSON list"),
    "not-json": ("{'gpu': 1}", "not valid JSON"),
    "not-utf8": (b'{"gpu": "\xff\xfe"}'.decode("latin-1"), "not UTF-8"),
    "unknown-status": (json.dumps(make_row(status="fine")), "status 'fine'"),
    "huge-error-text": (json.dumps(make_row(status="crash", error="e" * 70_000)), "at most 65536"),
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_bad_line_is_set_aside_with_its_reason_and_the_others_merge(tmp_path: Path, name: str) -> None:
    text, reason = BAD_LINES[name]
    path = tmp_path / "bench-x" / "own-matmul.jsonl"
    path.parent.mkdir()
    raw = text.encode("latin-1") if name == "not-utf8" else text.encode("utf-8", "surrogatepass")
    with path.open("wb") as f:
        f.write((json.dumps(make_row(1)) + "\n").encode())
        f.write(raw + b"\n")
        f.write((json.dumps(make_row(2)) + "\n").encode())
    rejected = RejectedRows(tmp_path / "rejected.jsonl")
    with NodeStore(tmp_path / "db.sqlite", clock=lambda: NOW) as store:
        receipt = store.merge_files([RowsFile(path, "bench-x/own-matmul.jsonl")], rejected)
        assert (receipt.inserted, receipt.rejected) == (2, 1)
        assert store.counts() == {H200: 2}
    (entry,) = [json.loads(x) for x in rejected.path.read_text().splitlines()]
    assert entry["source"] == str(path) and entry["line"] == 2
    assert reason in entry["reason"], entry["reason"]
    assert receipt.first_rejected == f"{path}:2: {entry['reason']}"


def test_a_line_longer_than_the_bound_is_rejected_unread(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    with path.open("wb") as f:
        f.write(b'{"x": "' + b"a" * 3000 + b'"}\n')
        f.write((json.dumps(make_row()) + "\n").encode())
    with path.open("rb") as f:
        lines = list(read_lines(f, max_bytes=1000))
    assert [ln.reason is None for ln in lines] == [False, True]
    assert "longer than 1000 bytes" in (lines[0].reason or "")
    assert len(lines[0].raw) == 256 and lines[1].lineno == 2


def test_a_day_ahead_is_tolerated_more_is_not() -> None:
    ok = (NOW + timedelta(hours=23)).isoformat()
    assert row_to_node(make_row(measured_at=ok), at=NOW)["measured_at"] == ok
    with pytest.raises(RowError, match="more than a day after"):
        row_to_node(make_row(measured_at=(NOW + timedelta(hours=25)).isoformat()), at=NOW)


def test_an_integer_past_64_bits_is_read_as_the_float_it_can_only_be(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(make_row(features={"S_M": 10**30, "S_N": 2**70})) + "\n")
    with NodeStore(tmp_path / "db.sqlite", clock=lambda: NOW) as store:
        assert store.merge_files([RowsFile(path)], RejectedRows(tmp_path / "r.jsonl")).inserted == 1
        (node,) = store.rows()
    assert node["features"] == {"S_M": 1e30, "S_N": float(2**70)}
    with pytest.raises(RowError, match=r"features\['S_M'\] 1000000000000000000000000000000: out of "
                                        r"the 64-bit integer range"):
        row_to_node(make_row(features={"S_M": 10**30}), at=NOW)  # a Python int given directly


def test_failure_rows_may_have_any_value_us() -> None:
    node = row_to_node(make_row(status="timeout", value_us=None, error="slow"), at=NOW)
    assert node["value_us"] == 1e9 and node["status"] == "timeout"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
FIELDS = sorted(make_row())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(FIELDS), JSON, min_size=1, max_size=4))
def test_any_values_become_a_node_or_a_row_error_never_anything_else(changes: dict[str, Any]) -> None:
    row = make_row(**changes)
    try:
        node = row_to_node(row, at=NOW)
    except RowError:
        return
    # what passed must bind into SQLite and round-trip as JSON
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE TABLE t ({', '.join(node)})")
    conn.execute(f"INSERT INTO t VALUES ({', '.join('?' * len(node))})", list(node.values()))
    json.loads(node["features"])


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.one_of(st.sampled_from(sorted(BAD_LINES)), st.integers(0, 5)), max_size=12))
def test_a_file_of_any_mix_merges_every_good_row_and_sets_aside_every_bad_one(lines: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rows.jsonl"
        good = set()
        with path.open("wb") as f:
            for item in lines:
                if isinstance(item, int):
                    good.add(item)
                    f.write((json.dumps(make_row(item)) + "\n").encode())
                else:
                    text = BAD_LINES[item][0]
                    raw = text.encode("latin-1") if item == "not-utf8" else text.encode("utf-8", "surrogatepass")
                    f.write(raw + b"\n")
        rejected = RejectedRows(Path(d) / "rejected.jsonl")
        with NodeStore(Path(d) / "db.sqlite", clock=lambda: NOW) as store:
            receipt = store.merge_files([RowsFile(path)], rejected)
            assert receipt.rejected == sum(1 for x in lines if not isinstance(x, int))
            assert sum(store.counts().values()) == len(good)
