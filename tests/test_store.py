"""Tests of the node table (harness/store.py) and `python -m harness merge`, on real SQLite files."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.points import point_key
from harness.rows import RejectedRows
from harness.store import (
    COLUMN_NAMES,
    FAIL_VALUE_US,
    SCHEMA_VERSION,
    MergeReceipt,
    NodeStore,
    RowError,
    RowsFile,
    StoreError,
    default_db_path,
    digest,
    format_receipt,
    read_rows_file,
    row_to_node,
    upsert_decision,
)

REPO = Path(__file__).resolve().parents[1]
H200 = "NVIDIA H200 141GB"
L40S = "NVIDIA L40S"
T0 = "2026-12-02T11:22:33.000000Z"
T1 = "2026-12-02T11:22:34.000000Z"
T2 = "2026-12-02T11:22:35.000000Z"
FIXED = datetime(2026, 12, 2, 11, 22, 33, tzinfo=timezone.utc)


def make_row(**over: Any) -> dict[str, Any]:
    """A complete box row; keyword arguments override fields."""
    gpu = over.pop("gpu", H200)
    m = over.pop("M", 4096)
    spec = over.pop("spec", "BLOCK_K=64,BLOCK_M=128,BLOCK_N=128,num_stages=3,num_warps=4")
    shape_id = f"matmul_M{m}_N4096_K4096_bf16"
    knobs = dict(kv.split("=") for kv in spec.split(","))
    row = {
        "point_key": point_key(gpu, shape_id, spec),
        "gpu": gpu,
        "regime": "deployable",
        "kind": "matmul",
        "shape_id": shape_id,
        "shape": {"M": m, "N": 4096, "K": 4096, "dtype": "bf16"},
        "spec": spec,
        "knobs": knobs,
        "slice": "own",
        "status": "ok",
        "value_us": 12.5,
        "ref_us": 10.0,
        "variance": 0.02,
        "n_samples": 20,
        "error": None,
        "features": {"H_cc": 90, "H_sm_count": 132, "S_M": m, "S_N": 4096, "S_K": 4096, **knobs},
        "cc": [9, 0],
        "compile_s": 1.2,
        "bench_s": 0.3,
        "run_id": "bench-20261202T112233Z-1a2b3c4d",
        "measured_at": T0,
        "provenance": {"host": "box", "triton": "3.1.0"},
    }
    row.update(over)
    return row


def dump(store: NodeStore) -> list[str]:
    """Everything in the DB (schema and every table's rows) as SQL text."""
    return list(store._conn.iterdump())


def node_of(store: NodeStore, row: dict[str, Any]) -> dict[str, Any]:
    key = row_to_node(row)["node_key"]
    (found,) = [n for n in store.rows() if n["node_key"] == key]
    return found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[NodeStore]:
    with NodeStore(tmp_path / "autotune.db", clock=lambda: FIXED) as s:
        yield s


# ---------------------------------------------------------------- schema, files


def test_schema_indices_meta_and_pragmas(store: NodeStore) -> None:
    conn = store._conn
    cols = [r[1] for r in conn.execute("PRAGMA table_info(node)")]
    assert cols == list(COLUMN_NAMES)
    pk = [r[1] for r in conn.execute("PRAGMA table_info(node)") if r[5]]
    assert pk == ["node_key"]
    index_cols = {
        name: [r[2] for r in conn.execute(f"PRAGMA index_info({name})")]
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        if name.startswith("node_")
    }
    assert index_cols == {
        "node_gpu": ["gpu"],
        "node_op": ["context_key", "op_sig"],
        "node_parent": ["parent_key"],
        "node_kind": ["gpu", "kind", "shape_id"],
    }
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version[0]) == SCHEMA_VERSION == 1
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000


def test_new_db_file_and_dirs_are_private(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "autotune.db"
    with NodeStore(path) as s:
        s.merge([make_row()])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700


def test_reopen_keeps_rows(tmp_path: Path) -> None:
    with NodeStore(tmp_path / "db.sqlite") as s:
        s.merge([make_row()])
    with NodeStore(tmp_path / "db.sqlite") as s:
        assert s.counts() == {H200: 1}


def test_default_db_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EMMY_TUNE_DB", raising=False)
    assert default_db_path() == Path.home() / ".cache" / "emmy" / "autotune.db"
    monkeypatch.setenv("EMMY_TUNE_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"


# ---------------------------------------------------------------- row_to_node


def test_node_keys_follow_the_formula() -> None:
    node = row_to_node(make_row())
    context = digest("Context", "9.0", "deployable")
    op = digest("op", "matmul", [["S_K", 4096], ["S_M", 4096], ["S_N", 4096]])
    assert (node["context_key"], node["op_sig"]) == (context, op)
    assert node["node_key"] == digest(context, H200, op, make_row()["spec"])
    assert len(node["node_key"]) == 24


def test_node_key_stable_and_independent_of_measurement() -> None:
    a = row_to_node(make_row())
    b = row_to_node(make_row(value_us=99.0, run_id="other", measured_at=T2, status="timeout"))
    assert a["node_key"] == b["node_key"]


@pytest.mark.parametrize(
    "change",
    [
        {"gpu": L40S},
        {"regime": "interpret"},
        {"spec": "BLOCK_K=32,BLOCK_M=128,BLOCK_N=128,num_stages=3,num_warps=4"},
        {"cc": [8, 9]},
        {"M": 8192},
    ],
    ids=["gpu", "regime", "spec", "cc", "shape"],
)
def test_node_key_differs(change: dict[str, Any]) -> None:
    assert row_to_node(make_row())["node_key"] != row_to_node(make_row(**change))["node_key"]


def test_node_columns() -> None:
    node = row_to_node(make_row(), now="NOW")
    assert tuple(node) == COLUMN_NAMES
    assert (node["depth"], node["is_leaf"], node["parent_key"], node["visits"]) == (0, 1, None, 1)
    assert (node["n_updates"], node["updated_at"], node["value_us"]) == (1, "NOW", 12.5)
    assert json.loads(node["features"]) == make_row()["features"]
    assert list(json.loads(node["features"])) == sorted(make_row()["features"])  # keys sorted
    assert json.loads(node["shape_spec"]) == {
        "kind": "matmul",
        "M": 4096,
        "N": 4096,
        "K": 4096,
        "dtype": "bf16",
    }
    assert json.loads(node["provenance"]) == {"host": "box", "triton": "3.1.0"}


@pytest.mark.parametrize("status", ["bench_fail", "timeout", "error", "crash"])
def test_failure_rows_get_the_sentinel(status: str) -> None:
    node = row_to_node(make_row(status=status, value_us=3.0, error="boom"))
    assert node["value_us"] == FAIL_VALUE_US == 1e9
    assert (node["status"], node["error"]) == (status, "boom")


def test_failure_row_without_features_keys_on_its_shape() -> None:
    crash = row_to_node(make_row(status="crash", value_us=None, features=None))
    assert (
        crash["node_key"]
        != row_to_node(make_row(M=8192, features=None, status="crash"))["node_key"]
    )
    assert crash["features"] == "{}"


def test_missing_keys_are_named() -> None:
    row = make_row()
    del row["cc"], row["measured_at"]
    with pytest.raises(RowError, match=r"missing required keys: measured_at, cc"):
        row_to_node(row)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"regime": "cpu"}, r"regime 'cpu'; valid regimes: deployable, interpret"),
        ({"status": "fine"}, r"status 'fine'; valid statuses: ok, bench_fail"),
        ({"value_us": None}, r"status 'ok' but value_us None"),
        ({"cc": [9]}, r"cc \[9\]; expected \[major, minor\]"),
        ({"measured_at": "yesterday"}, r"measured_at 'yesterday'; expected an ISO-8601"),
    ],
)
def test_bad_values_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(RowError, match=message):
        row_to_node(make_row(**change))


# ---------------------------------------------------------------- upsert rules


def node(**over: Any) -> dict[str, Any]:
    return row_to_node(make_row(**over))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (None, node(), "insert"),
        (node(), node(value_us=1.0), "duplicate"),  # same measured_at and run_id
        (node(), node(run_id="r2"), "keep"),  # equal time never churns
        (node(measured_at=T1), node(measured_at=T2), "replace"),  # strictly newer
        (node(measured_at=T2), node(measured_at=T1), "keep"),  # older
        (node(status="timeout"), node(status="ok", measured_at=T0, run_id="r0"), "replace"),
        (node(status="error", measured_at=T2), node(measured_at=T1), "replace"),  # fail -> ok
        (node(measured_at=T1), node(status="bench_fail", measured_at=T2), "keep"),  # ok stays
        (node(status="crash", measured_at=T1), node(status="timeout", measured_at=T2), "replace"),
        # newer but unambiguously worse: fewer samples AND higher variance
        (
            node(n_samples=30, variance=0.01),
            node(n_samples=20, variance=0.5, measured_at=T1),
            "keep",
        ),
        # only one of the two worse: not unambiguous
        (
            node(n_samples=30, variance=0.5),
            node(n_samples=20, variance=0.01, measured_at=T1),
            "replace",
        ),
        (
            node(n_samples=20, variance=0.01),
            node(n_samples=30, variance=0.5, measured_at=T1),
            "replace",
        ),
        # a quality unknown on either side: not unambiguous
        (
            node(n_samples=30, variance=None),
            node(n_samples=20, variance=0.5, measured_at=T1),
            "replace",
        ),
        (
            node(n_samples=30, variance=0.01),
            node(n_samples=None, variance=0.5, measured_at=T1),
            "replace",
        ),
        # branch / unknown rows keep the minimum value
        ({**node(), "is_leaf": 0}, node(value_us=5.0, measured_at=T1), "replace"),
        ({**node(), "is_leaf": None}, node(value_us=50.0, measured_at=T1), "keep"),
    ],
)
def test_upsert_decision(old: dict[str, Any] | None, new: dict[str, Any], expected: str) -> None:
    assert upsert_decision(old, new) == expected


def test_upsert_decision_null_old_time() -> None:
    # a row always has measured_at; legacy DB rows may not, and NULL is older than anything
    old = {**node(), "measured_at": None}
    assert upsert_decision(old, node()) == "replace"


def test_keep_adds_visits_and_bumps_updates_only(store: NodeStore) -> None:
    store.merge([make_row(measured_at=T2)])
    before = node_of(store, make_row())
    later = datetime(2027, 1, 1, tzinfo=timezone.utc)
    store._clock = lambda: later
    receipt = store.merge([make_row(measured_at=T1, value_us=1.0, run_id="r2")])
    after = node_of(store, make_row())
    assert (receipt.kept, receipt.replaced, receipt.inserted) == (1, 0, 0)
    assert (after["visits"], after["n_updates"]) == (2, 2)
    assert after["updated_at"] == "2027-01-01T00:00:00Z" != before["updated_at"]
    unchanged = {k: v for k, v in after.items() if k not in ("visits", "n_updates", "updated_at")}
    assert unchanged == {k: before[k] for k in unchanged}


def test_replace_updates_measurement_columns(store: NodeStore) -> None:
    store.merge([make_row(measured_at=T1, status="timeout", error="slow", slice="tail")])
    new = make_row(
        measured_at=T0,
        run_id="r2",
        value_us=7.0,
        variance=0.5,
        n_samples=30,
        ref_us=6.0,
        compile_s=2.0,
        bench_s=0.5,
        slice="cross",
        provenance={"v": 2},
        features={**make_row()["features"], "regs": 96},
        feat_ver=3,
    )
    receipt = store.merge([new])
    got = node_of(store, new)
    assert receipt.replaced == 1
    assert got["status"] == "ok" and got["error"] is None
    for col in (
        "value_us",
        "variance",
        "n_samples",
        "ref_us",
        "compile_s",
        "bench_s",
        "slice",
        "provenance",
        "features",
        "run_id",
        "measured_at",
        "feat_ver",
    ):
        assert got[col] == new[col], col
    assert (got["visits"], got["n_updates"], got["depth"], got["is_leaf"]) == (2, 2, 0, 1)


def test_shape_spec_is_coalesce_kept_both_ways(store: NodeStore) -> None:
    row = make_row()
    no_shape = make_row(shape=None, measured_at=T1)
    store.merge([row, no_shape])  # replace with NULL shape_spec keeps the old one
    assert node_of(store, row)["measured_at"] == T1
    assert node_of(store, row)["shape_spec"]["M"] == 4096

    other = make_row(gpu=L40S, shape=None, measured_at=T2)
    store.merge([other, make_row(gpu=L40S, measured_at=T1)])  # keep fills a NULL one
    assert node_of(store, other)["measured_at"] == T2
    assert node_of(store, other)["shape_spec"]["M"] == 4096


def test_duplicate_changes_nothing(store: NodeStore) -> None:
    store.merge([make_row()])
    before = dump(store)
    receipt = store.merge([make_row(value_us=1.0), make_row()])
    assert (receipt.rows_read, receipt.duplicates, receipt.changed) == (2, 2, False)
    assert dump(store) == before


# ---------------------------------------------------------------- properties

SPECS = ("BLOCK_M=64,num_warps=4", "BLOCK_M=128,num_warps=8")
STAMPS = (T0, T1, T2, "2026-12-03T00:00:00Z")

rows_strategy = st.builds(
    lambda gpu, regime, spec, m, status, value, variance, n, when, run: make_row(
        gpu=gpu,
        regime=regime,
        spec=spec,
        M=m,
        status=status,
        value_us=value,
        variance=variance,
        n_samples=n,
        measured_at=when,
        run_id=run,
    ),
    gpu=st.sampled_from([H200, L40S]),
    regime=st.sampled_from(["deployable", "interpret"]),
    spec=st.sampled_from(SPECS),
    m=st.sampled_from([64, 4096]),
    status=st.sampled_from(["ok", "ok", "ok", "bench_fail", "timeout"]),
    value=st.floats(min_value=0.5, max_value=1e4),
    variance=st.none() | st.sampled_from([0.01, 0.1, 0.5]),
    n=st.none() | st.sampled_from([5, 20, 30]),
    when=st.sampled_from(STAMPS),
    run=st.sampled_from(["run-a", "run-b"]),
)

PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(first=st.lists(rows_strategy, max_size=12), again=st.permutations(range(12)))
def test_remerging_the_same_rows_is_a_no_op(first: list[dict[str, Any]], again: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d, NodeStore(Path(d) / "db", clock=lambda: FIXED) as s:
        s.merge(first)
        before = dump(s)
        # the same rows again, in any order, even with a later clock
        s._clock = lambda: datetime(2030, 1, 1, tzinfo=timezone.utc)
        receipt = s.merge([first[i] for i in again if i < len(first)])
        assert receipt.duplicates == receipt.rows_read == len(first)
        assert dump(s) == before


def _unambiguously_worse(new: dict[str, Any], old: dict[str, Any]) -> bool:
    q = (new["n_samples"], new["variance"], old["n_samples"], old["variance"])
    return None not in q and q[0] < q[2] and q[1] > q[3]


@PROPERTY
@given(a=rows_strategy, b=rows_strategy, when=st.permutations(STAMPS))
def test_merge_order_of_two_measurements(
    a: dict[str, Any], b: dict[str, Any], when: list[str]
) -> None:
    """Two distinct measurements of one point end the same whichever merges first, unless the
    newer one is unambiguously worse than the older one of the same status class: then the
    first merged wins (an older row never replaces a newer one), as the next test shows."""
    older = {**a, "measured_at": when[0]}
    newer = {
        **b,
        **{
            k: a[k] for k in ("gpu", "regime", "spec", "shape", "features", "shape_id", "point_key")
        },
        "measured_at": when[1],
    }
    if sorted([when[0], when[1]]) != [when[0], when[1]]:
        older, newer = newer, older
    same_class = (older["status"] == "ok") == (newer["status"] == "ok")
    if same_class and _unambiguously_worse(newer, older):
        return
    ends = []
    for order in ([older, newer], [newer, older]):
        with tempfile.TemporaryDirectory() as d, NodeStore(Path(d) / "db") as s:
            s.merge(order)
            (only,) = s.rows()
            del only["updated_at"]
            ends.append(only)
    assert ends[0] == ends[1]
    winner = older if (older["status"] == "ok") and newer["status"] != "ok" else newer
    assert ends[0]["measured_at"] == winner["measured_at"]
    assert (ends[0]["visits"], ends[0]["n_updates"]) == (2, 2)


def test_newer_but_unambiguously_worse_depends_on_order(tmp_path: Path) -> None:
    good = make_row(measured_at=T0, value_us=10.0, n_samples=30, variance=0.01)
    noisy = make_row(measured_at=T1, value_us=20.0, n_samples=5, variance=0.5, run_id="r2")
    values = []
    for i, order in enumerate(([good, noisy], [noisy, good])):
        with NodeStore(tmp_path / f"{i}.db") as s:
            s.merge(order)
            values.append(s.rows()[0]["value_us"])
    assert values == [10.0, 20.0]


# ---------------------------------------------------------------- transactions


def test_a_bad_row_midway_rolls_the_whole_merge_back(store: NodeStore) -> None:
    store.merge([make_row(), make_row(gpu=L40S)])
    before = dump(store)
    bad = make_row(M=8192)
    del bad["spec"]
    rows = [make_row(M=64), make_row(measured_at=T1, run_id="r2"), bad, make_row(M=128)]
    with pytest.raises(RowError, match=r"row 3 of this merge: .*missing required keys: spec"):
        store.merge(rows)
    assert dump(store) == before
    assert not store._conn.in_transaction


def test_an_exception_from_the_rows_rolls_back_and_propagates(store: NodeStore) -> None:
    store.merge([make_row()])
    before = dump(store)

    def rows() -> Iterator[dict[str, Any]]:
        yield make_row(M=64)
        yield make_row(measured_at=T1, run_id="r2")
        raise RuntimeError("box connection dropped")

    with pytest.raises(RuntimeError, match="box connection dropped"):
        store.merge(rows())
    assert dump(store) == before
    assert store.merge([make_row(M=64)]).inserted == 1  # the store is still usable


# ---------------------------------------------------------------- migration, versions

LEGACY_DDL = """
CREATE TABLE node (
  node_key TEXT PRIMARY KEY, parent_key TEXT, context_key TEXT NOT NULL, op_sig TEXT NOT NULL,
  gpu TEXT NOT NULL DEFAULT '', features TEXT DEFAULT '{}', value_us REAL NOT NULL,
  depth INTEGER NOT NULL, n_updates INTEGER DEFAULT 1, updated_at TEXT NOT NULL,
  visits INTEGER DEFAULT 0, is_leaf INTEGER, variance REAL, n_samples INTEGER,
  status TEXT DEFAULT 'ok', run_id TEXT DEFAULT '', measured_at TEXT, feat_ver INTEGER DEFAULT 1,
  shape_spec TEXT
);
CREATE INDEX node_gpu ON node(gpu);
"""


def test_old_layout_is_migrated_and_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    target = row_to_node(make_row())
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_DDL)
    conn.execute(
        "INSERT INTO node (node_key, context_key, op_sig, gpu, value_us, depth, updated_at, "
        "visits, is_leaf) VALUES (?, ?, ?, ?, 9.0, 0, 'then', 3, 1)",
        (target["node_key"], target["context_key"], target["op_sig"], H200),
    )
    conn.execute(
        "INSERT INTO node (node_key, context_key, op_sig, gpu, value_us, depth, updated_at) "
        "VALUES ('branch', 'c', 'o', 'NVIDIA A100', 4.0, 1, 'then')"
    )
    conn.commit()
    conn.close()

    with NodeStore(path) as s:
        cols = [r[1] for r in s._conn.execute("PRAGMA table_info(node)")]
        assert set(cols) == set(COLUMN_NAMES)
        assert s.counts() == {H200: 1, "NVIDIA A100": 1}
        meta = s._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert meta == ("1",)
        assert {"node_kind", "node_op", "node_parent"} <= {
            r[0] for r in s._conn.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        receipt = s.merge([make_row()])  # legacy measured_at is NULL: older than anything
        assert receipt.replaced == 1
        got = node_of(s, make_row())
        assert (got["value_us"], got["visits"], got["kind"], got["regime"]) == (
            12.5,
            4,
            "matmul",
            "deployable",
        )


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    NodeStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(
        StoreError,
        match=r"schema version 7, but this collect-node-data supports schema version 1 at most; "
        r"upgrade collect-node-data",
    ):
        NodeStore(path)


def test_a_file_that_is_not_a_db_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("just some text, long enough to not look like an empty database" * 20)
    with pytest.raises(StoreError, match="cannot open node DB .*notes.db"):
        NodeStore(path)


# ---------------------------------------------------------------- readers


def test_counts_and_filtered_rows(store: NodeStore) -> None:
    receipt = store.merge(
        [
            make_row(),
            make_row(M=64),
            make_row(gpu=L40S, regime="interpret"),
            make_row(gpu=L40S, M=64, status="timeout", value_us=None, error="timed out"),
        ]
    )
    assert store.counts() == {H200: 2, L40S: 2} == receipt.per_card
    assert receipt.per_card_regime == {
        H200: {"deployable": 2},
        L40S: {"interpret": 1, "deployable": 1},
    }
    assert len(store.rows(gpu=L40S)) == 2
    assert len(store.rows(regime="interpret")) == 1
    (failed,) = store.rows(status="timeout")
    assert (failed["value_us"], failed["error"]) == (FAIL_VALUE_US, "timed out")
    assert store.rows(gpu=H200, kind="matmul")[0]["features"]["S_M"] in (64, 4096)
    assert store.rows(kind="softmax") == []


def test_format_receipt() -> None:
    receipt = MergeReceipt(
        rows_read=42,
        inserted=30,
        replaced=5,
        kept=7,
        duplicates=0,
        per_card={H200: 1234, L40S: 10},
        per_card_regime={H200: {"deployable": 1234}, L40S: {"deployable": 6, "interpret": 4}},
    )
    assert format_receipt(receipt).splitlines() == [
        "merged 42 node rows (30 new, 5 replaced, 7 kept, 0 duplicate)",
        "node rows per card now:",
        f"  {H200}: 1234",
        f"  {L40S}: 10 (4 interpret)",
    ]


# ---------------------------------------------------------------- backups


def test_backups_rotate_to_five_and_are_private(store: NodeStore, tmp_path: Path) -> None:
    store.merge([make_row()])
    made = [store.backup() for _ in range(7)]
    backups = tmp_path / "backups"
    assert made[0] == backups / "autotune-20261202-112233.db"
    assert made[1].name == "autotune-20261202-112233-2.db"
    assert sorted(p.name for p in backups.iterdir()) == sorted(p.name for p in made[2:])
    assert stat.S_IMODE(backups.stat().st_mode) == 0o700
    for p in made[2:]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    with NodeStore(made[-1]) as copy:
        assert copy.counts() == {H200: 1}


def test_backup_keeps_the_newest_by_time(store: NodeStore, tmp_path: Path) -> None:
    dest = tmp_path / "elsewhere"
    for second in (5, 1, 3):
        store._clock = lambda s=second: FIXED.replace(second=s)
        store.backup(dest, keep=2)
    assert sorted(p.name for p in dest.iterdir()) == [
        "autotune-20261202-112203.db",
        "autotune-20261202-112205.db",
    ]


def test_a_new_db_made_through_a_dangling_symlink_is_private(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "autotune.db"
    link.symlink_to(tmp_path / "real" / "table.db")
    old = os.umask(0o022)
    try:
        with NodeStore(link) as s:
            s.merge([make_row()])
    finally:
        os.umask(old)
    assert link.is_symlink()
    assert stat.S_IMODE((tmp_path / "real" / "table.db").stat().st_mode) == 0o600


def test_node_tables_sharing_a_folder_never_prune_each_others_backups(tmp_path: Path) -> None:
    """``autotune.db`` and ``autotune-2.db`` share ``backups/``: their backups carry their own
    table's name, and each rotates only its own (``autotune-2-…`` is not ``autotune``'s)."""
    made: dict[str, list[Path]] = {}
    for name in ("autotune", "autotune-2", "lab"):
        with NodeStore(tmp_path / f"{name}.db", clock=lambda: FIXED) as s:
            s.merge([make_row()])
            made[name] = [s.backup() for _ in range(2 if name != "autotune" else 7)]
    left = {p.name for p in (tmp_path / "backups").iterdir()}
    assert {p.name for p in made["autotune-2"]} <= left and {p.name for p in made["lab"]} <= left
    assert made["lab"][0].name == "lab-20261202-112233.db"
    assert made["autotune-2"][1].name == "autotune-2-20261202-112233-2.db"
    assert sorted(left - {p.name for p in made["autotune-2"] + made["lab"]}) == \
        sorted(p.name for p in made["autotune"][2:])  # its newest five, nobody else's


# ---------------------------------------------------------------- rows files


def test_read_rows_file_skips_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "own-matmul.jsonl"
    good = [make_row(M=m) for m in (64, 128, 256)]
    text = json.dumps(good[0]) + "\n\n" + "[1, 2]\n" + json.dumps(good[1]) + "\n"
    cut = json.dumps(good[2])
    path.write_bytes(text.encode() + cut[: len(cut) // 2].encode())  # a crash mid-line
    rows, n_bad = read_rows_file(path)
    assert (rows, n_bad) == (good[:2], 2)


def test_truncated_last_line_is_set_aside_and_the_whole_lines_merge(
    store: NodeStore, tmp_path: Path
) -> None:
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(make_row(M=m)) for m in (64, 128, 256)]
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    rejected = RejectedRows(tmp_path / "rejected.jsonl")
    receipt = store.merge_files([RowsFile(path, "bench-x/own-matmul.jsonl")], rejected)
    assert (receipt.inserted, receipt.rejected) == (2, 1)
    (entry,) = [json.loads(x) for x in rejected.path.read_text().splitlines()]
    assert entry["line"] == 3 and entry["text"] == lines[2][:40]
    assert "cut off" in entry["reason"]
    assert store.merged_files() == {"bench-x/own-matmul.jsonl": path.stat().st_size}


# ---------------------------------------------------------------- CLI


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EMMY_TUNE_DB": str(cwd / "env-default.db")}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def test_cli_merge_prints_the_receipt_and_backs_up(tmp_path: Path) -> None:
    a, b = tmp_path / "own-matmul.jsonl", tmp_path / "cross-matmul.jsonl"
    a.write_text("\n".join(json.dumps(make_row(M=m)) for m in (64, 128)) + "\n")
    b.write_text(json.dumps(make_row(gpu=L40S)) + "\n")
    db = tmp_path / "nodes.db"

    done = run_cli("merge", str(a), str(b), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[:4] == [
        "merged 3 node rows (3 new, 0 replaced, 0 kept, 0 duplicate)",
        "node rows per card now:",
        f"  {H200}: 2",
        f"  {L40S}: 1",
    ]
    backup = Path(out[-1].removeprefix("backup: "))
    assert backup.parent == tmp_path / "backups" and backup.is_file()

    again = run_cli("merge", str(b), "--db", str(db), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("merged 1 node rows (0 new, 0 replaced, 0 kept, 1 duplicate)")
    assert "backup: skipped (nothing changed)" in again.stdout


def test_cli_merge_sets_bad_rows_aside_merges_the_rest_and_fails(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(make_row()) + "\n" + '{"gpu": \n')
    missing = run_cli("merge", str(rows), str(tmp_path / "nope.jsonl"), cwd=tmp_path)
    assert missing.returncode == 2
    assert f"error: rows file not found: {tmp_path / 'nope.jsonl'}" in missing.stderr
    assert not (tmp_path / "env-default.db").exists()

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**make_row(M=64), "status": "fine"}) + "\n")
    kept = tmp_path / "kept.jsonl"
    done = run_cli("merge", str(rows), str(bad), "--no-backup", f"--rejected={kept}", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.startswith("merged 1 node rows (1 new, 0 replaced, 0 kept, 0 duplicate)")
    assert f"error: rejected 2 row(s) that cannot be merged; they are set aside with their " \
           f"reasons in {kept}" in done.stderr
    reasons = [json.loads(x)["reason"] for x in kept.read_text().splitlines()]
    assert "not valid JSON" in reasons[0] and "status 'fine'" in reasons[1]
    with NodeStore(tmp_path / "env-default.db") as s:  # --db defaulted to $EMMY_TUNE_DB
        assert s.counts() == {H200: 1}


def test_cli_merge_on_a_read_only_file_system_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(make_row()) + "\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root may write anywhere: a read-only mount is read-only even to it
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"needs a read-only mount (root): {mounted.stderr.strip()}")
        why = "Read-only file system"
    else:
        ro.chmod(0o500)
        why = "Permission denied"
    try:
        done = run_cli("merge", str(rows), "--db", str(ro / "new.db"), cwd=tmp_path)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        ro.chmod(0o700)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"error: cannot create node DB {ro / 'new.db'}: {why}" in done.stderr


def test_paces_leave_baselines_out_and_point_cost_is_their_median(store: NodeStore) -> None:
    """A job that measured torch.compile's baselines first (seconds each) must not make the
    kind's pace look slow: the pace counts configurations; a baseline's cost is its own."""
    t = lambda s: f"2026-12-02T11:23:{s:06.3f}Z"  # noqa: E731
    rows = [make_row(spec="baseline=compile", M=m, measured_at=t(10 * i), compile_s=c, bench_s=0.5,
                     features={}, knobs={"baseline": "compile"})
            for i, (m, c) in enumerate([(16, 4.5), (2048, 9.5), (4096, 29.5)])]
    rows += [make_row(spec=f"BLOCK_K=64,BLOCK_M=128,BLOCK_N={n},num_stages=3,num_warps=4",
                      measured_at=t(30 + 0.1 * i)) for i, n in enumerate(range(16, 16 + 20 * 16, 16))]
    rows.append(make_row(spec="baseline=compile", M=8, kind="rms_norm", measured_at=t(40),
                         compile_s=1.5, bench_s=0.5, features={}, knobs={"baseline": "compile"}))
    store.merge(rows)
    assert store.paces(H200, "deployable") == {"matmul": pytest.approx(0.1)}
    assert store.point_cost(H200, "deployable", "baseline=compile") == pytest.approx(10.0)
    assert store.point_cost(L40S, "deployable", "baseline=compile") is None
    assert store.point_cost(H200, "deployable", "baseline=compile", "matmul") == pytest.approx(10.0)
    assert store.point_cost(H200, "deployable", "baseline=compile", "rms_norm") == pytest.approx(2.0)
    assert store.point_cost(H200, "deployable", "baseline=compile", "softmax") is None


def test_paces_are_one_lanes_and_leave_out_the_wait_before_a_top_up(store: NodeStore) -> None:
    """Four lanes write rows four times as often: the pace is one lane's.  A top-up of the job
    later in its session (its rows minutes after the job's) does not make the kind look slow."""
    t = lambda s: f"2026-12-02T11:{20 + int(s // 60):02d}:{s % 60:06.3f}Z"  # noqa: E731
    spec = "BLOCK_K=64,BLOCK_M=128,BLOCK_N={},num_stages=3,num_warps=4"
    four = [make_row(spec=spec.format(16 * (i + 1)), measured_at=t(0.05 * i), run_id="bench-4",
                     provenance={"lane": i % 4}) for i in range(40)]
    one = [make_row(spec=spec.format(16 * (i + 1)), M=2048, measured_at=t(0.2 * i if i < 30 else
                    300 + 0.2 * i), run_id="bench-1", provenance={"lane": 0}) for i in range(40)]
    store.merge(four + one)
    assert store.paces(H200, "deployable") == {"matmul": pytest.approx(0.2)}


def test_a_runs_compile_baseline_cost_is_its_kinds_then_its_cards_then_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile's autotuning of a fused GEMM took 33 s on the H200 where a reduction's
    took 2 s: the plan gives a kind's baselines what that kind's took, a kind never seen on
    this card what the card's took, and a card never seen the default."""
    from harness.contract import COMPILE_BASELINE_S
    from harness.sessions import compile_costs

    db = tmp_path / "autotune.db"
    rows = [make_row(spec="baseline=compile", M=m, kind=kind, compile_s=c, bench_s=0.5,
                     features={}, knobs={"baseline": "compile"})
            for m, kind, c in [(16, "matmul", 32.5), (32, "matmul", 29.5), (64, "rms_norm", 1.5)]]
    with NodeStore(db) as store:
        store.merge(rows)
    kinds = {"matmul", "rms_norm", "softmax"}
    assert compile_costs(db, H200, "deployable", kinds) == pytest.approx(
        {"matmul": 33.0, "rms_norm": 2.0, "softmax": 30.0})
    assert compile_costs(db, L40S, "deployable", kinds) == dict.fromkeys(
        kinds, COMPILE_BASELINE_S)


def test_the_summary_ends_with_each_shapes_best_configuration_of_the_run(store: NodeStore) -> None:
    """This run's fastest non-baseline row per shape, with its ratio to the baselines the node
    table holds for that shape (any run's); another run's faster row is not this run's."""
    from harness.summary import best_per_shape

    mine, other = "bench-a", "bench-b"
    store.merge([
        make_row(spec="BLOCK_K=64,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4", value_us=10.0,
                 run_id=mine),
        make_row(spec="BLOCK_K=64,BLOCK_M=128,BLOCK_N=64,num_stages=3,num_warps=4", value_us=8.0,
                 run_id=mine),
        make_row(spec="BLOCK_K=32,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4", value_us=5.0,
                 run_id=other),
        make_row(spec="baseline=torch", value_us=16.0, run_id=other),
        make_row(spec="baseline=compile", value_us=4.0, run_id=mine),
        make_row(M=64, spec="BLOCK_K=64,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4",
                 value_us=3.0, run_id=mine),
        make_row(M=128, spec="BLOCK_K=64,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4",
                 value_us=1.0, status="bench_fail", run_id=mine),
    ])
    lines = best_per_shape(store._conn, [mine])
    assert lines[0].startswith(f"best configuration per shape measured in this run on {H200}")
    head = next(i for i, line in enumerate(lines) if line.startswith("shape"))
    assert "reference clock" in " ".join(lines[:head])
    assert lines[head].split() == ["shape", "time", "torch", "compile", "best", "configuration",
                                   "this", "run"]
    rows = [line.split() for line in lines[head + 2:]]
    assert rows == [
        ["matmul_M4096_N4096_K4096_bf16", "8.0us", "0.50x", "2.00x",
         "BLOCK_K=64,BLOCK_M=128,BLOCK_N=64,num_stages=3,num_warps=4"],
        ["matmul_M64_N4096_K4096_bf16", "3.0us", "-", "-",
         "BLOCK_K=64,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4"],
    ]
    assert all(len(line) < 120 for line in lines)
    assert best_per_shape(store._conn, ["bench-none"]) == []


def test_the_summarys_best_is_the_fastest_at_the_shapes_reference_clock(store: NodeStore) -> None:
    """A row timed while the card ran fast (its reference beside it fast too) is not the best
    for that: each row is taken at the shape's median reference time (harness/steady.py)."""
    from harness.summary import best_per_shape

    steady = "BLOCK_K=64,BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4"
    lucky = "BLOCK_K=64,BLOCK_M=128,BLOCK_N=64,num_stages=3,num_warps=4"
    store.merge([make_row(spec=steady, value_us=10.0, ref_us=10.0, run_id="bench-a"),
                 make_row(spec=lucky, value_us=9.5, ref_us=8.0, run_id="bench-a"),
                 make_row(spec="baseline=torch", value_us=10.0, ref_us=10.0, run_id="bench-a")])
    lines = best_per_shape(store._conn, ["bench-a"])
    (row,) = [line.split() for line in lines if line.startswith("matmul_")]
    assert row == ["matmul_M4096_N4096_K4096_bf16", "10.0us", "1.00x", steady]
