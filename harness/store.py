"""The node table: the cross-hardware SQLite store that measured rows are merged into.

One file holds every card (``gpu`` is part of the node key).  Writes are explicit
``BEGIN IMMEDIATE … COMMIT`` transactions: a merge is all its rows or none.  Besides ``node``
the file holds ``node_measurement`` (which measurements each node absorbed, so merging the same
rows again changes nothing), ``merged_file`` (which rows files, up to which byte, reached this
DB: what a run still has to bring home is what is not in it) and ``meta`` (schema version and
the DB's own id, which runs and ledgers name to say which node table they belong to).
"""

from __future__ import annotations

import glob
import json
import os
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlite_utils

from harness.rows import (
    FAIL_VALUE_US,
    FEAT_VER,
    NODE_FIELDS,
    REGIMES,
    REQUIRED_ROW_KEYS,
    STATUSES,
    RejectedRows,
    RowError,
    check_lines,
    digest,
    iso,
    node_values,
    raw_lines,
    read_rows_file,
    row_to_node,
    utcnow,
    when,
)

__all__ = [
    "COLUMN_NAMES",
    "FAIL_VALUE_US",
    "FEAT_VER",
    "REGIMES",
    "REQUIRED_ROW_KEYS",
    "SCHEMA_VERSION",
    "STATUSES",
    "MergeReceipt",
    "NodeStore",
    "RowError",
    "RowsFile",
    "StoreError",
    "check_db",
    "default_db_path",
    "digest",
    "format_receipt",
    "read_rows_file",
    "receipt_dict",
    "row_to_node",
    "upsert_decision",
]

SCHEMA_VERSION = 1
"""The newest node-table layout this code knows; bump it with a migration step."""

BUSY_TIMEOUT_MS = 30_000
CHUNK = 500  # rows looked up and written together: memory stays flat, lookups stay few
PACE_GAP_S = 120.0  # rows of one job further apart than this: the job waited (a later top-up)

# (name, SQL type, NOT NULL, default SQL literal or None); order is the table's column order.
NODE_COLUMNS: tuple[tuple[str, str, bool, str | None], ...] = (
    ("node_key", "TEXT", True, None),
    ("parent_key", "TEXT", False, None),
    ("context_key", "TEXT", True, None),
    ("op_sig", "TEXT", True, None),
    ("gpu", "TEXT", True, "''"),
    ("features", "TEXT", False, "'{}'"),
    ("value_us", "REAL", True, None),
    ("depth", "INTEGER", True, None),
    ("n_updates", "INTEGER", False, "1"),
    ("updated_at", "TEXT", True, None),
    ("visits", "INTEGER", False, "0"),
    ("is_leaf", "INTEGER", False, None),
    ("variance", "REAL", False, None),
    ("n_samples", "INTEGER", False, None),
    ("status", "TEXT", False, "'ok'"),
    ("run_id", "TEXT", False, "''"),
    ("measured_at", "TEXT", False, None),
    ("feat_ver", "INTEGER", False, "1"),
    ("shape_spec", "TEXT", False, None),
    # Added by this project (per-column migrations on older files).
    ("regime", "TEXT", False, None),
    ("kind", "TEXT", False, None),
    ("shape_id", "TEXT", False, None),
    ("spec", "TEXT", False, None),
    ("slice", "TEXT", False, None),
    ("point_key", "TEXT", False, None),
    ("ref_us", "REAL", False, None),
    ("error", "TEXT", False, None),
    ("compile_s", "REAL", False, None),
    ("bench_s", "REAL", False, None),
    ("provenance", "TEXT", False, None),
)
COLUMN_NAMES = tuple(c[0] for c in NODE_COLUMNS)
assert COLUMN_NAMES == NODE_FIELDS, "harness.rows.NODE_FIELDS must follow the table's columns"
NODE_INDEXES = {
    "node_gpu": ("gpu",),
    "node_op": ("context_key", "op_sig"),
    "node_parent": ("parent_key",),
    "node_kind": ("gpu", "kind", "shape_id"),
}
JSON_COLUMNS = ("features", "shape_spec", "provenance")

# Columns a "replace" overwrites with the new measurement's values.
_REPLACED = (
    "value_us",
    "features",
    "variance",
    "n_samples",
    "status",
    "error",
    "ref_us",
    "compile_s",
    "bench_s",
    "run_id",
    "measured_at",
    "feat_ver",
    "provenance",
    "slice",
)
# Columns fixed by the node key: filled in when a legacy row lacks them, never overwritten.
_IDENTITY = ("regime", "kind", "shape_id", "spec", "point_key")
# What an upsert decision reads of the stored row.
_DECISION_COLUMNS = "node_key, measured_at, run_id, status, is_leaf, n_samples, variance, value_us"
_KEY, _RUN_ID, _MEASURED_AT = (
    COLUMN_NAMES.index("node_key"), COLUMN_NAMES.index("run_id"), COLUMN_NAMES.index("measured_at")
)
_MARK_SQL = "INSERT OR IGNORE INTO node_measurement VALUES (?, ?, ?)"
_INSERT_SQL = (
    f"INSERT INTO node ({', '.join(COLUMN_NAMES)}) VALUES ({', '.join('?' * len(COLUMN_NAMES))})"
)
_COMMON_SETS = [
    "visits = COALESCE(visits, 0) + :visits",
    "n_updates = COALESCE(n_updates, 1) + 1",
    "updated_at = :updated_at",
    *(f"{c} = COALESCE({c}, :{c})" for c in _IDENTITY),
]
_KEEP_SQL = (
    f"UPDATE node SET {', '.join([*_COMMON_SETS, 'shape_spec = COALESCE(shape_spec, :shape_spec)'])} "
    "WHERE node_key = :node_key"
)
_REPLACE_SQL = (
    "UPDATE node SET "
    + ", ".join([*_COMMON_SETS, *(f"{c} = :{c}" for c in _REPLACED),
                 "shape_spec = COALESCE(:shape_spec, shape_spec)"])
    + " WHERE node_key = :node_key"
)


class StoreError(Exception):
    """The node table cannot be opened or written as asked."""


@dataclass(frozen=True)
class RowsFile:
    """A rows file to merge.  ``source`` names it for ``merged_file`` (``<run_id>/<name>``);
    None for a file that is only merged, not recorded."""

    path: Path
    source: str | None = None


@dataclass(frozen=True)
class MergeReceipt:
    """What one merge did, and how many node rows each card has afterwards."""

    rows_read: int = 0
    inserted: int = 0
    replaced: int = 0
    kept: int = 0
    duplicates: int = 0
    per_card: dict[str, int] = field(default_factory=dict)
    per_card_regime: dict[str, dict[str, int]] = field(default_factory=dict)
    rejected: int = 0  # lines set aside, never merged
    rejected_file: Path | None = None
    first_rejected: str | None = None
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    files: int = 0

    @property
    def changed(self) -> bool:
        """Whether the merge wrote anything (duplicates write nothing)."""
        return bool(self.inserted or self.replaced or self.kept)

    def __add__(self, other: MergeReceipt) -> MergeReceipt:
        reasons = dict(self.rejected_reasons)
        for k, v in other.rejected_reasons.items():
            reasons[k] = reasons.get(k, 0) + v
        return MergeReceipt(
            rows_read=self.rows_read + other.rows_read, inserted=self.inserted + other.inserted,
            replaced=self.replaced + other.replaced, kept=self.kept + other.kept,
            duplicates=self.duplicates + other.duplicates,
            per_card=other.per_card or self.per_card,
            per_card_regime=other.per_card_regime or self.per_card_regime,
            rejected=self.rejected + other.rejected,
            rejected_file=other.rejected_file or self.rejected_file,
            first_rejected=self.first_rejected or other.first_rejected,
            rejected_reasons=reasons, files=self.files + other.files)


# ---------------------------------------------------------------- upsert rules


def _unambiguously_worse(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    quality = (new.get("n_samples"), new.get("variance"), old.get("n_samples"), old.get("variance"))
    if any(q is None for q in quality):
        return False
    new_n, new_var, old_n, old_var = quality
    return new_n < old_n and new_var > old_var


def upsert_decision(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> str:
    """What merging node ``new`` over the stored ``old`` does: insert, replace, keep or duplicate."""
    if old is None:
        return "insert"
    if old.get("measured_at") == new.get("measured_at") and (old.get("run_id") or "") == (
        new.get("run_id") or ""
    ):
        return "duplicate"
    old_ok = (old.get("status") or "ok") == "ok"
    new_ok = (new.get("status") or "ok") == "ok"
    if old_ok != new_ok:
        return "replace" if new_ok else "keep"
    if old.get("is_leaf"):
        old_t, new_t = when(old.get("measured_at")), when(new.get("measured_at"))
        newer = new_t is not None and (old_t is None or new_t > old_t)
        return "replace" if newer and not _unambiguously_worse(new, old) else "keep"
    # Branch or unknown rows aggregate several leaves: keep the minimum.
    return "replace" if new["value_us"] < old["value_us"] else "keep"


# ---------------------------------------------------------------- files and paths


def default_db_path() -> Path:
    """The node DB used when none is named: ``$EMMY_TUNE_DB``, else ``~/.cache/emmy/autotune.db``."""
    env = os.environ.get("EMMY_TUNE_DB")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "emmy" / "autotune.db"


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and missing parents; the ones created here are 0700."""
    missing = []
    for d in (directory, *directory.parents):
        if d.exists():
            break
        missing.append(d)
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)  # exist_ok: another process may race us here


def _create_private_file(path: Path) -> bool:
    """Create ``path`` empty with mode 0600; False if it already exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    os.chmod(path, 0o600)  # the umask may have narrowed it; never widened
    return True


def _newer_schema(path: Path, version: int) -> str:
    return (
        f"node DB {path} has schema version {version}, but this collect-node-data supports "
        f"schema version {SCHEMA_VERSION} at most; upgrade collect-node-data to open it"
    )


def _unreadable_version(path: Path, value: Any) -> str:
    return (
        f"node DB {path} has an unreadable schema_version {value!r} in its meta table; "
        f"restore it from a backup (backups/{path.stem}-*.db beside it)"
    )


_LEDGER_SQL = (
    "SELECT point_key, spec, regime, status, visits, error FROM node "
    "WHERE point_key IS NOT NULL AND spec IS NOT NULL AND regime IS NOT NULL "
    "AND COALESCE(is_leaf, 1) = 1"
)


def _read_only(path: Path) -> sqlite3.Connection | None:
    if not path.is_file():
        return None
    try:
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None


def read_db_id(path: str | os.PathLike[str]) -> str | None:
    """The id of the node table at ``path``, read without writing anything (None: no DB yet,
    or one never opened by this version)."""
    conn = _read_only(Path(path))
    if conn is None:
        return None
    try:
        found = conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
        return str(found[0]) if found else None
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def read_ledger_records(path: str | os.PathLike[str]) -> list[tuple[Any, ...]]:
    """:meth:`NodeStore.ledger_records` of the DB at ``path``, read without writing anything
    (for ``--no-merge``, which must leave the node table as it is)."""
    conn = _read_only(Path(path))
    if conn is None:
        return []
    try:
        return conn.execute(_LEDGER_SQL).fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def check_db(path: str | os.PathLike[str]) -> None:
    """Preflight of a run: raise :class:`StoreError` now if merging into ``path`` would fail later.

    Read-only and creates nothing: a missing file is fine (the merge creates it); an existing
    one must be a writable file holding an SQLite DB of a schema version this code knows.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise StoreError(f"node DB path {path} is a directory; give a file path")
    if not path.exists():
        return
    if not path.is_file():
        raise StoreError(f"node DB path {path} is not a regular file; give a file path")
    if not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(
            f"node DB {path} is not readable and writable by this user; fix its permissions "
            "or give another path"
        )
    # Without a WAL beside it the file is all there is: read it as immutable, so that not even
    # the -wal/-shm files of a read-only connection are left behind.
    wal = path.with_name(path.name + "-wal").exists()
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro{'' if wal else '&immutable=1'}", uri=True
        )
    except sqlite3.Error as e:
        raise StoreError(f"cannot open node DB {path}: {e}") from e
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        found = None
        if "meta" in tables:
            found = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.Error as e:
        raise StoreError(f"cannot open node DB {path}: {e}") from e
    finally:
        conn.close()
    if found is None:
        return  # an empty file or an older layout: migrated when the merge opens it
    try:
        version = int(found[0])
    except (TypeError, ValueError):
        raise StoreError(_unreadable_version(path, found[0])) from None
    if version > SCHEMA_VERSION:
        raise StoreError(_newer_schema(path, version))


def receipt_dict(r: MergeReceipt) -> dict[str, Any]:
    """A merge receipt as plain JSON-able values (for job reports and --report-json)."""
    return {"merged": r.rows_read, "new": r.inserted, "replaced": r.replaced, "kept": r.kept,
            "duplicate": r.duplicates, "rejected": r.rejected,
            "rejected_file": str(r.rejected_file) if r.rejected_file else None,
            "first_rejected": r.first_rejected, "changed": r.changed}


def format_receipt(receipt: MergeReceipt) -> str:
    """The merge receipt as the lines a user reads after a merge."""
    r = receipt
    lines = [
        f"merged {r.rows_read} node rows ({r.inserted} new, {r.replaced} replaced, "
        f"{r.kept} kept, {r.duplicates} duplicate)",
        "node rows per card now:",
    ]
    for gpu, n in sorted(r.per_card.items()):
        inert = {k: v for k, v in r.per_card_regime.get(gpu, {}).items() if k != "deployable"}
        note = ", ".join(f"{v} {k or 'unknown regime'}" for k, v in sorted(inert.items(), key=str))
        lines.append(f"  {gpu or '(no gpu)'}: {n}" + (f" ({note})" if note else ""))
    if not r.per_card:
        lines.append("  (none)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the store


class NodeStore:
    """An open node DB: created or migrated on open, merged into, read, backed up, closed.

    One connection in autocommit mode; every write is an explicit ``BEGIN IMMEDIATE …
    COMMIT`` so a merge is all rows or none and concurrent writers wait (busy_timeout) instead
    of failing on a lock upgrade.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.path = Path(path).expanduser()
        self._clock = clock
        if self.path.is_dir():
            raise StoreError(f"node DB path {self.path} is a directory; give a file path")
        try:
            make_private_dirs(self.path.parent)
            # A --db that is a symlink to a file not made yet: the file it names is made 0600
            # here, before SQLite would make it through the link with the umask's mode.
            _create_private_file(Path(os.path.realpath(self.path)))
        except OSError as e:
            raise StoreError(
                f"cannot create node DB {self.path}: {e.strerror or e}; give a --db on a "
                "writable file system (or make this one writable)"
            ) from None
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open node DB {self.path}: {e}") from e
        try:
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: big merges stay in memory
            self.db = sqlite_utils.Database(self._conn, execute_plugins=False)
            self._ensure_schema()  # first: a refused (newer) DB is left untouched
            self._conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise StoreError(f"cannot open node DB {self.path}: {e}") from e
        except BaseException:
            self._conn.close()
            raise

    # ---- lifecycle

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> NodeStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE … COMMIT``; any exception rolls everything back and propagates."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # ---- schema

    def _schema_version(self) -> int:
        if "meta" not in self.db.table_names():
            return 0
        found = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if found is None:
            return 0
        try:
            return int(found[0])
        except (TypeError, ValueError):
            raise StoreError(_unreadable_version(self.path, found[0])) from None

    def _ensure_schema(self) -> None:
        with self._transaction():
            version = self._schema_version()
            if version > SCHEMA_VERSION:
                raise StoreError(_newer_schema(self.path, version))
            node = self.db["node"]
            if not node.exists():
                node.create(
                    {name: _PY_TYPES[sql_type] for name, sql_type, _, _ in NODE_COLUMNS},
                    pk="node_key",
                    not_null={name for name, _, not_null, _ in NODE_COLUMNS if not_null},
                    defaults={
                        name: _default_value(default)
                        for name, _, _, default in NODE_COLUMNS
                        if default is not None
                    },
                )
            else:
                have = set(node.columns_dict)
                if "node_key" not in have:
                    raise StoreError(
                        f"{self.path} has a 'node' table without node_key; it is not a node DB"
                    )
                for name, sql_type, not_null, default in NODE_COLUMNS:
                    if name not in have:
                        self._conn.execute(_add_column_sql(name, sql_type, not_null, default))
            for index, columns in NODE_INDEXES.items():
                node.create_index(columns, index_name=index, if_not_exists=True)
            # Which measurements each node has absorbed, so re-merging the same rows is a no-op
            # even for rows that an earlier row superseded (see docs in upsert_decision).
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS node_measurement ("
                "node_key TEXT NOT NULL, run_id TEXT NOT NULL, measured_at TEXT NOT NULL, "
                "PRIMARY KEY (node_key, run_id, measured_at)) WITHOUT ROWID"
            )
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS merged_file ("
                "source TEXT PRIMARY KEY, bytes INTEGER NOT NULL, rows INTEGER NOT NULL, "
                "rejected INTEGER NOT NULL, merged_at TEXT NOT NULL)"
            )
            self._conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            self._conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('db_id', ?)", (uuid.uuid4().hex,)
            )
            if version != SCHEMA_VERSION:
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )

    # ---- writing

    @property
    def db_id(self) -> str:
        """This node table's own id (made when the file is first opened, kept by its backups):
        runs and ledgers name it to say which node table they belong to."""
        return str(self._conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()[0])

    def merge(self, rows: Iterable[Mapping[str, Any]]) -> MergeReceipt:
        """Upsert measured rows in one transaction: all of them or, on any error, none.

        A row that cannot become a node raises :class:`RowError` (nothing merged); to set such
        rows aside and merge the rest, use :meth:`merge_files`."""
        now_t = self._clock()
        now = iso(now_t)
        count = [0]

        def nodes() -> Iterator[tuple[Any, ...]]:
            for n, row in enumerate(rows, start=1):
                count[0] = n
                try:
                    yield node_values(row, now, now_t)
                except RowError as e:
                    raise RowError(f"row {n} of this merge: {e}; nothing was merged") from e

        with self._transaction() as conn:
            tally = self._upsert_all(conn, nodes())
            per_card_regime = self._per_card_regime(conn)
        return self._receipt(count[0], tally, per_card_regime)

    def merge_files(
        self, files: Sequence[RowsFile], rejected: RejectedRows | None = None
    ) -> MergeReceipt:
        """Merge rows files in one transaction, streaming (constant memory whatever their size).

        Every line is checked before it reaches the transaction: one that cannot become a node
        (not JSON, wrong types, impossible values) is set aside in ``rejected`` with its reason
        and the others merge (without ``rejected``, such a line raises :class:`RowError` and
        nothing is merged).  A file with a ``source`` is recorded in ``merged_file`` (its size
        and counts) in the same transaction, so what reached this DB is known exactly.  Large
        files are parsed and checked by helper processes while this one writes."""
        now_t = self._clock()
        now = iso(now_t)
        totals = {"rows": 0}
        big = sum(f.path.stat().st_size for f in files) >= PARALLEL_BYTES
        pool = _parse_pool() if big else None
        try:
            with self._transaction() as conn:
                tally: dict[str, int] = {"insert": 0, "replace": 0, "keep": 0, "duplicate": 0}
                for f in files:
                    size = f.path.stat().st_size
                    counts = {"rows": 0, "rejected": 0}

                    def reject(lineno: int, raw: bytes, reason: str, f: RowsFile = f,
                               counts: dict[str, int] = counts) -> None:
                        counts["rejected"] += 1
                        if rejected is None:
                            raise RowError(f"{f.path}:{lineno}: {reason}; nothing was merged")
                        rejected.add(str(f.path), lineno, raw, reason)

                    nodes = _checked_nodes(f.path, now, now_t, reject, counts, pool)
                    for k, v in self._upsert_all(conn, nodes).items():
                        tally[k] += v
                    totals["rows"] += counts["rows"]
                    if f.source is not None:
                        conn.execute(
                            "INSERT OR REPLACE INTO merged_file VALUES (?, ?, ?, ?, ?)",
                            (f.source, size, counts["rows"], counts["rejected"], now),
                        )
                per_card_regime = self._per_card_regime(conn)
        except BaseException:
            if rejected is not None:
                rejected.discard()
            raise
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        rejected_file = rejected.commit() if rejected is not None else None
        n_rejected = rejected.count if rejected else 0
        receipt = self._receipt(totals["rows"] - n_rejected, tally, per_card_regime)
        return MergeReceipt(
            **{**receipt.__dict__, "files": len(files),
               "rejected": rejected.count if rejected else 0, "rejected_file": rejected_file,
               "first_rejected": rejected.first if rejected else None,
               "rejected_reasons": dict(rejected.reasons) if rejected else {}}
        )

    def merged_files(self) -> dict[str, int]:
        """source → bytes of every rows file recorded as merged into this DB."""
        return dict(self._conn.execute("SELECT source, bytes FROM merged_file"))

    @staticmethod
    def _per_card_regime(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for gpu, regime, count in conn.execute(
            "SELECT gpu, regime, COUNT(*) FROM node GROUP BY gpu, regime"
        ):
            out.setdefault(gpu, {})[regime] = count
        return out

    @staticmethod
    def _receipt(n: int, tally: Mapping[str, int], per_card_regime: dict[str, dict[str, int]]
                 ) -> MergeReceipt:
        return MergeReceipt(
            rows_read=n,
            inserted=tally["insert"],
            replaced=tally["replace"],
            kept=tally["keep"],
            duplicates=tally["duplicate"],
            per_card={gpu: sum(r.values()) for gpu, r in per_card_regime.items()},
            per_card_regime=per_card_regime,
        )

    def _upsert_all(self, conn: sqlite3.Connection, nodes: Iterable[tuple[Any, ...]]
                    ) -> dict[str, int]:
        """Upsert node values (:data:`NODE_FIELDS` order) chunk by chunk inside the open
        transaction; the tally of decisions."""
        tally = {"insert": 0, "replace": 0, "keep": 0, "duplicate": 0}
        chunk: list[tuple[Any, ...]] = []
        for node in nodes:
            chunk.append(node)
            if len(chunk) >= CHUNK:
                self._upsert_chunk(conn, chunk, tally)
                chunk = []
        if chunk:
            self._upsert_chunk(conn, chunk, tally)
        return tally

    def _upsert_chunk(self, conn: sqlite3.Connection, chunk: list[tuple[Any, ...]],
                      tally: dict[str, int]) -> None:
        """One chunk: two lookups for all its keys, then the writes batched by kind.  A key seen
        twice in the chunk flushes the batches and is looked up again, so each row is decided
        against what the DB holds at that moment, exactly as one row at a time would be.

        ``node_measurement`` records the measurements a node absorbed besides its current one
        (which the node row itself names): a fresh insert writes nothing there."""
        keys = list({n[_KEY] for n in chunk})
        existing, measured = self._lookup(conn, keys)
        touched: set[str] = set()
        inserts: list[tuple[Any, ...]] = []
        keeps: list[dict[str, Any]] = []
        replaces: list[dict[str, Any]] = []
        marks: list[tuple[str, str, str]] = []

        def flush() -> None:
            for sql, batch in ((_INSERT_SQL, inserts), (_KEEP_SQL, keeps),
                               (_REPLACE_SQL, replaces), (_MARK_SQL, marks)):
                if batch:
                    conn.executemany(sql, batch)
                    batch.clear()

        for values in chunk:
            key = values[_KEY]
            if key in touched:  # seen earlier in this chunk: decide against the DB as it is now
                flush()
                again, again_measured = self._lookup(conn, list(touched))
                existing.update(again)
                measured |= again_measured
                touched.clear()
            old = existing.get(key)
            measurement = (key, values[_RUN_ID] or "", values[_MEASURED_AT])
            if old is None:
                tally["insert"] += 1
                inserts.append(values)
                touched.add(key)
                continue
            if measurement in measured:
                tally["duplicate"] += 1
                continue
            new = dict(zip(COLUMN_NAMES, values, strict=True))
            decision = upsert_decision(old, new)
            tally[decision] += 1
            if decision == "duplicate":
                continue
            (replaces if decision == "replace" else keeps).append(new)
            marks.append((key, old.get("run_id") or "", old.get("measured_at") or ""))
            marks.append(measurement)
            measured.add(measurement)
            touched.add(key)
        flush()

    @staticmethod
    def _lookup(conn: sqlite3.Connection, keys: list[str]
                ) -> tuple[dict[str, dict[str, Any]], set[tuple[str, str, str]]]:
        marks = ",".join("?" * len(keys))
        cur = conn.execute(f"SELECT {_DECISION_COLUMNS} FROM node WHERE node_key IN ({marks})", keys)
        names = [d[0] for d in cur.description]
        existing = {r[0]: dict(zip(names, r, strict=True)) for r in cur}
        if not existing:  # measurements are recorded only for nodes that exist
            return existing, set()
        found = list(existing)
        measured = set(conn.execute(
            "SELECT node_key, run_id, measured_at FROM node_measurement WHERE node_key IN "
            f"({','.join('?' * len(found))})", found))
        return existing, measured

    def paces(self, gpu: str, regime: str, min_rows: int = 20) -> dict[str, float]:
        """kind → median seconds one lane took a configuration in this card's earlier jobs.
        Each job (run, slice, kind) with at least ``min_rows`` rows of configurations
        (baselines left out: they cost what they cost, see :meth:`point_cost`) counts its time
        from its first row to its last, less the gaps of over ``PACE_GAP_S`` between rows (a
        top-up of the job, later in its session), over its rows, times the lanes that measured
        it: a run on four GPUs does not make the kind look four times faster on one."""
        groups: dict[tuple[str, str, str], tuple[list[str], set[Any]]] = {}
        for kind, run, slice_, at, lane in self._conn.execute(
                "SELECT kind, run_id, slice, measured_at, json_extract(provenance, '$.lane') "
                "FROM node WHERE gpu = ? AND regime = ? AND COALESCE(spec, '') NOT LIKE "
                "'baseline=%' ORDER BY kind, run_id, slice, measured_at", (gpu, regime)):
            times, lanes = groups.setdefault((kind, run, slice_), ([], set()))
            times.append(at)
            lanes.add(lane)
        spans: dict[str, list[float]] = {}
        for (kind, _, _), (times, lanes) in groups.items():
            if len(times) < min_rows:
                continue
            moments = [when(t) for t in times]
            if any(m is None for m in moments):
                continue
            gaps = [(b - a).total_seconds()  # type: ignore[operator]
                    for a, b in zip(moments, moments[1:], strict=False)]
            busy = [g for g in gaps if g <= PACE_GAP_S]
            if sum(busy) > 0:
                spans.setdefault(kind, []).append(
                    sum(busy) / len(busy) * max(1, len(lanes - {None})))
        return {k: sorted(v)[len(v) // 2] for k, v in spans.items()}

    def point_cost(self, gpu: str, regime: str, spec: str,
                   kind: str | None = None) -> float | None:
        """Median seconds (compile and timing) the measured rows of ``spec`` took on this
        card, e.g. ``baseline=compile`` over its shapes (of ``kind`` only, if given); None
        without such rows."""
        sql = ("SELECT COALESCE(compile_s, 0) + COALESCE(bench_s, 0) FROM node "
               "WHERE gpu = ? AND regime = ? AND spec = ? AND status = 'ok'")
        args = [gpu, regime, spec]
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        costs = sorted(c for (c,) in self._conn.execute(sql, args))
        return costs[len(costs) // 2] if costs else None

    def ledger_records(self, gpus: Iterable[str] | None = None
                       ) -> Iterator[tuple[str, str, str, str, int, str | None]]:
        """(point_key, spec, regime, status, visits, error) of every measured leaf: what a
        ledger bound to this DB may call done (or tried)."""
        sql = _LEDGER_SQL
        args: list[str] = []
        if gpus is not None:
            gpus = list(gpus)
            sql += f" AND gpu IN ({','.join('?' * len(gpus))})"
            args = gpus
        yield from self._conn.execute(sql, args)

    # ---- reading

    def counts(self) -> dict[str, int]:
        """Node rows per card (gpu), every regime included."""
        return dict(self._conn.execute("SELECT gpu, COUNT(*) FROM node GROUP BY gpu ORDER BY gpu"))

    def rows(
        self,
        gpu: str | None = None,
        kind: str | None = None,
        regime: str | None = None,
        status: str | None = None,
    ) -> list[dict[str, Any]]:
        """Node rows matching every filter given, JSON columns decoded, in a stable order."""
        filters = {"gpu": gpu, "kind": kind, "regime": regime, "status": status}
        where = " AND ".join(f"{k} = :{k}" for k, v in filters.items() if v is not None)
        cur = self._conn.execute(
            f"SELECT * FROM node {'WHERE ' + where if where else ''} "
            "ORDER BY gpu, kind, shape_id, spec, node_key",
            {k: v for k, v in filters.items() if v is not None},
        )
        names = [d[0] for d in cur.description]
        out = []
        for values in cur:
            node = dict(zip(names, values, strict=True))
            for col in JSON_COLUMNS:
                if node.get(col) is not None:
                    node[col] = json.loads(node[col])
            out.append(node)
        return out

    # ---- backups

    def backup(self, dest_dir: str | os.PathLike[str] | None = None, keep: int = 5) -> Path:
        """Snapshot the DB with ``VACUUM INTO`` (WAL-safe) as ``<db stem>-<UTC stamp>.db`` and
        keep only this table's newest ``keep`` backups: node tables sharing a folder (and so
        ``backups/``) never prune each other's."""
        if keep < 1:
            raise StoreError(f"keep must be at least 1 (the backup just made), got {keep}")
        directory = Path(dest_dir) if dest_dir is not None else self.path.parent / "backups"
        make_private_dirs(directory)
        mine = _backup_name(self.path.stem)
        stem = f"{self.path.stem}-{self._clock().astimezone(timezone.utc):%Y%m%d-%H%M%S}"
        # Number past every backup of this second, so a name freed by rotation is never reused
        # (a reused name would sort as older than its neighbours).
        taken = [_backup_age(p, mine)[1] for p in directory.glob(f"{glob.escape(stem)}*.db")
                 if mine.fullmatch(p.name)]
        n = max(taken, default=0) + 1
        # Creating the empty 0600 file first reserves the name and fixes its mode before any data.
        while not _create_private_file(
            dest := directory / (f"{stem}-{n}.db" if n > 1 else f"{stem}.db")
        ):
            n += 1
        try:
            self._conn.execute("VACUUM INTO ?", (str(dest),))
        except sqlite3.Error:
            dest.unlink(missing_ok=True)
            raise
        except BaseException:
            # A signal cannot cut VACUUM INTO itself (SQLite runs it to its end before Python
            # sees the signal): a file it wrote is a whole backup and is kept; only the empty
            # reservation of one that never began goes.
            if not dest.stat().st_size:
                dest.unlink(missing_ok=True)
            raise
        os.chmod(dest, 0o600)
        ours = [p for p in directory.glob(f"{glob.escape(self.path.stem)}-*.db")
                if mine.fullmatch(p.name)]
        for old in sorted(ours, key=lambda p: _backup_age(p, mine), reverse=True)[keep:]:
            old.unlink(missing_ok=True)
        return dest


_PY_TYPES: dict[str, type] = {"TEXT": str, "REAL": float, "INTEGER": int}
def _backup_name(stem: str) -> re.Pattern[str]:
    """The names of the node table ``<stem>.db``'s backups: ``<stem>-YYYYmmdd-HHMMSS[-N].db``."""
    return re.compile(re.escape(stem) + r"-(\d{8}-\d{6})(?:-(\d+))?\.db")


def _default_value(literal: str) -> Any:
    if literal.startswith("'"):
        return literal[1:-1]
    return int(literal)


def _add_column_sql(name: str, sql_type: str, not_null: bool, default: str | None) -> str:
    # SQLite can add a NOT NULL column only with a default; legacy rows get the default.
    sql = f'ALTER TABLE node ADD COLUMN "{name}" {sql_type}'
    if default is not None:
        sql += f"{' NOT NULL' if not_null else ''} DEFAULT {default}"
    return sql


def _backup_age(path: Path, names: re.Pattern[str]) -> tuple[str, int, float]:
    """Sort key, oldest first: the stamp and -N suffix in the name, then the file time."""
    stat_time = path.stat().st_mtime
    m = names.fullmatch(path.name)
    if m is None:
        return (
            datetime.fromtimestamp(stat_time, timezone.utc).strftime("%Y%m%d-%H%M%S"),
            0,
            stat_time,
        )
    return (m.group(1), int(m.group(2) or 1), stat_time)


# ---------------------------------------------------------------- reading rows files

PARALLEL_BYTES = 8 << 20
"""Rows files at least this large (together) are parsed by helper processes."""
LINES_PER_TASK = 2000


def _parse_pool() -> Any:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = int(os.environ.get("EMMY_MERGE_WORKERS", 0)) or max(1, min(4, cpus or 1))
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                               initializer=_die_with_parent)


def _die_with_parent() -> None:
    """A helper of a merge ends with the merge's process, and only with it: the terminal's
    Ctrl-C and hang-up reach every process of its group, but the merge decides what a signal
    means (it finishes first), so a helper ignores them; a merge that is killed (SIGKILL)
    takes its helpers with it (Linux; elsewhere they end when they next read their closed
    queue)."""
    import signal

    for sig in (signal.SIGINT, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _checked_nodes(path: Path, now: str, at: datetime,
                   reject: Callable[[int, bytes, str], None], counts: dict[str, int],
                   pool: Any) -> Iterator[tuple[Any, ...]]:
    """The node values of every good line of ``path``, in file order; each bad line goes to
    ``reject``.  With ``pool``, chunks of lines are checked in helper processes, a bounded
    number in flight (memory stays flat); if the helpers cannot run (a broken pool), the
    chunks are checked here instead."""
    from collections import deque
    from concurrent.futures.process import BrokenProcessPool

    in_flight: deque[tuple[Any, list[tuple[int, bytes]]]] = deque()
    window = 2 * pool._max_workers + 2 if pool is not None else 0
    broken = pool is None

    def settle(item: tuple[Any, list[tuple[int, bytes]]]) -> Iterator[tuple[Any, ...]]:
        nonlocal broken
        future, lines = item
        if future is None:
            checked = check_lines(lines, now, at)
        else:
            try:
                checked = future.result()
            except BrokenProcessPool:  # e.g. a __main__ the helpers cannot import
                broken = True
                checked = check_lines(lines, now, at)
        yield from _settle(checked, reject)

    with open(path, "rb") as fh:
        chunk: list[tuple[int, bytes]] = []
        size = CHUNK if broken else LINES_PER_TASK
        for lineno, raw, reason in raw_lines(fh):
            counts["rows"] += 1
            if reason is not None:
                if in_flight:  # keep file order
                    in_flight.append((None, []))
                    while in_flight:
                        yield from settle(in_flight.popleft())
                reject(lineno, raw, reason)
                continue
            chunk.append((lineno, raw))
            if len(chunk) >= size:
                if broken:
                    yield from settle((None, chunk))
                else:
                    in_flight.append((pool.submit(check_lines, chunk, now, at), chunk))
                    while len(in_flight) > window:
                        yield from settle(in_flight.popleft())
                chunk = []
        if chunk:
            in_flight.append((None if broken else pool.submit(check_lines, chunk, now, at), chunk))
        while in_flight:
            yield from settle(in_flight.popleft())


def _settle(checked: tuple[Any, Any], reject: Callable[[int, bytes, str], None]
            ) -> Iterator[tuple[Any, ...]]:
    nodes, rejects = checked
    for lineno, raw, reason in rejects:
        reject(lineno, raw, reason)
    yield from nodes
