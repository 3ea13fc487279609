"""The node table: the cross-hardware SQLite store that measured rows are merged into."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlite_utils

SCHEMA_VERSION = 1
"""The newest node-table layout this code knows; bump it with a migration step."""

FAIL_VALUE_US = 1e9
"""value_us of a row whose status is not ok: sorts after every real measurement."""

FEAT_VER = 1
"""Featurizer version stamped on rows that do not carry their own ``feat_ver``."""

BUSY_TIMEOUT_MS = 30_000
BACKUP_GLOB = "autotune-*.db"

REQUIRED_ROW_KEYS = (
    "point_key",
    "gpu",
    "regime",
    "kind",
    "shape_id",
    "spec",
    "status",
    "measured_at",
    "cc",
)
REGIMES = ("deployable", "interpret")
STATUSES = ("ok", "bench_fail", "timeout", "error", "crash")

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


class StoreError(Exception):
    """The node table cannot be opened or written as asked."""


class RowError(StoreError, ValueError):
    """A measured row cannot become a node (missing keys or impossible values)."""


class RowsFileWarning(UserWarning):
    """A rows file had lines that could not be read; the whole lines were still used."""


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

    @property
    def changed(self) -> bool:
        """Whether the merge wrote anything (duplicates write nothing)."""
        return bool(self.inserted or self.replaced or self.kept)


# ---------------------------------------------------------------- pure: keys and rows


def digest(*parts: Any) -> str:
    """Stable 24-hex-digit key of JSON-able parts (the node table's key function)."""
    blob = json.dumps(list(parts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:24]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _when(stamp: Any) -> datetime | None:
    """A measured_at string as an aware UTC time; None (older than anything) if absent or unreadable."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _shape_facts(row: Mapping[str, Any], features: Mapping[str, Any]) -> list[tuple[str, Any]]:
    facts = sorted((k, v) for k, v in features.items() if k.startswith("S_"))
    if facts:
        return facts
    # A failed row may come without features; its shape still tells shapes apart.
    shape = row.get("shape") or {}
    return sorted((f"S_{k}", v) for k, v in shape.items())


def row_to_node(row: Mapping[str, Any], *, now: str | None = None) -> dict[str, Any]:
    """Turn one measured row (the box's JSON line) into a node-table row; pure apart from ``now``."""
    missing = [k for k in REQUIRED_ROW_KEYS if row.get(k) is None]
    where = f"row {row.get('point_key')!r}" if row.get("point_key") else "row"
    if missing:
        raise RowError(
            f"{where} is missing required keys: {', '.join(missing)} "
            f"(every row needs {', '.join(REQUIRED_ROW_KEYS)})"
        )
    regime, status = row["regime"], row["status"]
    if regime not in REGIMES:
        raise RowError(f"{where} has regime {regime!r}; valid regimes: {', '.join(REGIMES)}")
    if status not in STATUSES:
        raise RowError(f"{where} has status {status!r}; valid statuses: {', '.join(STATUSES)}")
    cc = row["cc"]
    if not isinstance(cc, (list, tuple)) or len(cc) != 2:
        raise RowError(f"{where} has cc {cc!r}; expected [major, minor], e.g. [9, 0]")
    if _when(row["measured_at"]) is None:
        raise RowError(
            f"{where} has measured_at {row['measured_at']!r}; expected an ISO-8601 time "
            "such as 2026-12-02T11:22:33.123456Z"
        )
    value = row.get("value_us")
    if status == "ok":
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise RowError(
                f"{where} has status 'ok' but value_us {value!r}; expected a finite number"
            )
        value_us = float(value)
    else:
        value_us = FAIL_VALUE_US
    features = dict(row.get("features") or {})
    facts = _shape_facts(row, features)
    if not facts:
        raise RowError(
            f"{where} has no S_* shape facts in features and no shape; its op_sig could not "
            "tell shapes apart"
        )
    kind, gpu, spec = row["kind"], row["gpu"], row["spec"]
    context_key = digest("Context", f"{cc[0]}.{cc[1]}", regime)
    op_sig = digest("op", kind, facts)
    shape = row.get("shape")
    node = {
        "node_key": digest(context_key, gpu, op_sig, spec),
        "parent_key": None,
        "context_key": context_key,
        "op_sig": op_sig,
        "gpu": gpu,
        "features": json.dumps(features, sort_keys=True),
        "value_us": value_us,
        "depth": 0,
        "n_updates": 1,
        "updated_at": now or _iso(_utcnow()),
        "visits": 1,
        "is_leaf": 1,
        "variance": row.get("variance"),
        "n_samples": row.get("n_samples"),
        "status": status,
        "run_id": row.get("run_id") or "",
        "measured_at": row["measured_at"],
        "feat_ver": row.get("feat_ver") or FEAT_VER,
        "shape_spec": None
        if shape is None
        else json.dumps({"kind": kind, **shape}, sort_keys=True),
        "regime": regime,
        "kind": kind,
        "shape_id": row["shape_id"],
        "spec": spec,
        "slice": row.get("slice"),
        "point_key": row["point_key"],
        "ref_us": row.get("ref_us"),
        "error": row.get("error"),
        "compile_s": row.get("compile_s"),
        "bench_s": row.get("bench_s"),
        "provenance": _json(row.get("provenance")),
    }
    assert tuple(node) == COLUMN_NAMES
    return node


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
        old_t, new_t = _when(old.get("measured_at")), _when(new.get("measured_at"))
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


def read_rows_file(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """Read a box rows file (JSON lines); corrupt or truncated lines are skipped, counted, warned about."""
    path = Path(path)
    rows: list[dict[str, Any]] = []
    n_bad, first_bad = 0, 0
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            row = None
        if not isinstance(row, dict):
            n_bad += 1
            first_bad = first_bad or lineno
            continue
        rows.append(row)
    if n_bad:
        warnings.warn(
            RowsFileWarning(
                f"{path}: skipped {n_bad} corrupt or truncated line(s), first at line {first_bad}; "
                f"merging the {len(rows)} whole row(s)"
            ),
            stacklevel=2,
        )
    return rows, n_bad


def _newer_schema(path: Path, version: int) -> str:
    return (
        f"node DB {path} has schema version {version}, but this collect-node-data supports "
        f"schema version {SCHEMA_VERSION} at most; upgrade collect-node-data to open it"
    )


def _unreadable_version(path: Path, value: Any) -> str:
    return (
        f"node DB {path} has an unreadable schema_version {value!r} in its meta table; "
        "restore it from a backup (backups/autotune-*.db beside it)"
    )


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
        self, path: str | os.PathLike[str], *, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        self.path = Path(path).expanduser()
        self._clock = clock
        if self.path.is_dir():
            raise StoreError(f"node DB path {self.path} is a directory; give a file path")
        make_private_dirs(self.path.parent)
        _create_private_file(self.path)
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open node DB {self.path}: {e}") from e
        try:
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
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
            self._conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            if version != SCHEMA_VERSION:
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )

    # ---- writing

    def merge(self, rows: Iterable[Mapping[str, Any]]) -> MergeReceipt:
        """Upsert measured rows in one transaction: all of them or, on any error, none."""
        now = _iso(self._clock())
        tally = {"insert": 0, "replace": 0, "keep": 0, "duplicate": 0}
        n = 0
        with self._transaction() as conn:
            for n, row in enumerate(rows, start=1):
                try:
                    new = row_to_node(row, now=now)
                except RowError as e:
                    raise RowError(f"row {n} of this merge: {e}; nothing was merged") from e
                tally[self._upsert(conn, new)] += 1
            per_card_regime: dict[str, dict[str, int]] = {}
            for gpu, regime, count in conn.execute(
                "SELECT gpu, regime, COUNT(*) FROM node GROUP BY gpu, regime"
            ):
                per_card_regime.setdefault(gpu, {})[regime] = count
        return MergeReceipt(
            rows_read=n,
            inserted=tally["insert"],
            replaced=tally["replace"],
            kept=tally["keep"],
            duplicates=tally["duplicate"],
            per_card={gpu: sum(r.values()) for gpu, r in per_card_regime.items()},
            per_card_regime=per_card_regime,
        )

    def _upsert(self, conn: sqlite3.Connection, new: dict[str, Any]) -> str:
        key = new["node_key"]
        cur = conn.execute("SELECT * FROM node WHERE node_key = ?", (key,))
        found = cur.fetchone()
        old = (
            None
            if found is None
            else dict(zip([d[0] for d in cur.description], found, strict=True))
        )
        measurement = (key, new["run_id"], new["measured_at"])
        if (
            old is not None
            and conn.execute(
                "SELECT 1 FROM node_measurement WHERE node_key = ? AND run_id = ? AND measured_at = ?",
                measurement,
            ).fetchone()
        ):
            return "duplicate"
        decision = upsert_decision(old, new)
        if decision == "duplicate":
            return decision
        if decision == "insert":
            conn.execute(
                f"INSERT INTO node ({', '.join(COLUMN_NAMES)}) "
                f"VALUES ({', '.join('?' * len(COLUMN_NAMES))})",
                [new[c] for c in COLUMN_NAMES],
            )
        else:
            sets = [
                "visits = COALESCE(visits, 0) + :visits",
                "n_updates = COALESCE(n_updates, 1) + 1",
                "updated_at = :updated_at",
                *(f"{c} = COALESCE({c}, :{c})" for c in _IDENTITY),
            ]
            if decision == "replace":
                sets += [f"{c} = :{c}" for c in _REPLACED]
                sets.append("shape_spec = COALESCE(:shape_spec, shape_spec)")
            else:
                sets.append("shape_spec = COALESCE(shape_spec, :shape_spec)")
            conn.execute(f"UPDATE node SET {', '.join(sets)} WHERE node_key = :node_key", new)
        conn.execute("INSERT OR IGNORE INTO node_measurement VALUES (?, ?, ?)", measurement)
        return decision

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
        """Snapshot the DB with ``VACUUM INTO`` (WAL-safe) and keep only the newest ``keep`` backups."""
        if keep < 1:
            raise StoreError(f"keep must be at least 1 (the backup just made), got {keep}")
        directory = Path(dest_dir) if dest_dir is not None else self.path.parent / "backups"
        make_private_dirs(directory)
        stem = f"autotune-{self._clock().astimezone(timezone.utc):%Y%m%d-%H%M%S}"
        # Number past every backup of this second, so a name freed by rotation is never reused
        # (a reused name would sort as older than its neighbours).
        taken = [_backup_age(p)[1] for p in directory.glob(f"{stem}*.db")]
        n = max(taken, default=0) + 1
        # Creating the empty 0600 file first reserves the name and fixes its mode before any data.
        while not _create_private_file(
            dest := directory / (f"{stem}-{n}.db" if n > 1 else f"{stem}.db")
        ):
            n += 1
        try:
            self._conn.execute("VACUUM INTO ?", (str(dest),))
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        os.chmod(dest, 0o600)
        for old in sorted(directory.glob(BACKUP_GLOB), key=_backup_age, reverse=True)[keep:]:
            old.unlink(missing_ok=True)
        return dest


_PY_TYPES: dict[str, type] = {"TEXT": str, "REAL": float, "INTEGER": int}
_BACKUP_NAME = re.compile(r"autotune-(\d{8}-\d{6})(?:-(\d+))?\.db$")


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


def _backup_age(path: Path) -> tuple[str, int, float]:
    """Sort key, oldest first: the stamp and -N suffix in the name, then the file time."""
    stat_time = path.stat().st_mtime
    m = _BACKUP_NAME.search(path.name)
    if m is None:
        return (
            datetime.fromtimestamp(stat_time, timezone.utc).strftime("%Y%m%d-%H%M%S"),
            0,
            stat_time,
        )
    return (m.group(1), int(m.group(2) or 1), stat_time)
