"""Measured rows on their way into the node table: read a rows file as a stream, check each row.

A rows file holds one JSON object per line, as the box writes them.  Every line is either a
row that can become a node (:func:`row_to_node`) or it is *rejected* with the reason: a line
that is not JSON, nested too deep, too long, a value of the wrong type or out of range, keys
that contradict each other.  A rejected line never reaches the SQLite transaction, so one bad
row can never keep the others out of the node table.  Reading streams: one line at a time,
whatever the file's size.  Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

from harness.contract import FAIL_VALUE_US, REGIMES, REQUIRED_ROW_KEYS, SLICES, STATUSES
from harness.points import SpecError, make_spec, parse_spec, point_key

FEAT_VER = 1
"""Featurizer version stamped on rows that do not carry their own ``feat_ver``."""

MAX_LINE_BYTES = 1 << 20
"""A line longer than this (1 MiB; a real row is about 2 KB) is rejected unread."""

FUTURE_SLACK = timedelta(days=1)
"""How far past this machine's clock a ``measured_at`` may lie (clocks of boxes drift)."""

OLDEST = datetime(2020, 1, 1, tzinfo=timezone.utc)
MAX_TEXT = 4096  # ids, specs, feature strings
MAX_ERROR_TEXT = 65536
MAX_FIELDS = 512  # keys of features / shape / provenance
INT64 = 2**63 - 1


class RowError(ValueError):
    """A row that cannot become a node: says which field is wrong and what is valid."""


@dataclass(frozen=True)
class Line:
    """One line of a rows file: its number, its bytes, and the row or why it is rejected."""

    lineno: int
    raw: bytes
    row: dict[str, Any] | None
    reason: str | None


# One encoder each, made once: json.dumps with options builds a new encoder on every call.
_KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_COLUMN_JSON = json.JSONEncoder(sort_keys=True, allow_nan=False)

try:  # several times faster at both ends; the stdlib does the same where it is missing
    import orjson as _orjson
except ImportError:  # pragma: no cover - declared as a dependency
    _orjson = None  # type: ignore[assignment]


def _loads(raw: bytes) -> Any:
    """Parse one line.  The fast parser takes the good lines; a line it refuses is parsed
    again by the stdlib, which accepts the same JSON (and NaN) and names what is wrong.  Both
    read an integer past 64 bits as a float, as a number that large can only be one."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except ValueError:
            pass
    return json.loads(raw, parse_int=_int_or_float)


def _int_or_float(text: str) -> int | float:
    value = int(text) if len(text) < 4300 else None
    if value is not None and -INT64 <= value <= INT64:
        return value
    return float(text)


def _dumps(value: Any) -> str:
    """A column's JSON: keys sorted, floats finite (a non-finite one raises ValueError)."""
    if _orjson is None:
        return _COLUMN_JSON.encode(value)
    return _orjson.dumps(value, option=_orjson.OPT_SORT_KEYS).decode()


def digest(*parts: Any) -> str:
    """Stable 24-hex-digit key of JSON-able parts (the node table's key function)."""
    return hashlib.sha1(_KEY_JSON.encode(list(parts)).encode()).hexdigest()[:24]


@lru_cache(maxsize=256)
def _context_key(cc: tuple[int, int], regime: str) -> str:
    return digest("Context", f"{cc[0]}.{cc[1]}", regime)


@lru_cache(maxsize=4096)
def _op_sig(kind: str, facts: tuple[tuple[str, Any], ...]) -> str:
    return digest("op", kind, [list(f) for f in facts])


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def when(stamp: Any) -> datetime | None:
    """A measured_at string as an aware UTC time; None if absent or unreadable."""
    if not isinstance(stamp, str) or not stamp or len(stamp) > 64:
        return None
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00") if stamp.endswith("Z") else stamp)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


# ---------------------------------------------------------------- reading


def raw_lines(fh: BinaryIO, max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes, str | None]]:
    """(line number, bytes, None) for every non-blank line of an open rows file; a line longer
    than ``max_bytes`` comes as its first 256 bytes with the reason it is rejected.  Memory
    stays bounded by ``max_bytes`` whatever the file holds."""
    lineno = 0
    while True:
        raw = fh.readline(max_bytes + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            head = raw[:256]
            while raw and not raw.endswith(b"\n"):  # drain the rest of the long line
                raw = fh.readline(max_bytes + 1)
            yield lineno, head, f"line longer than {max_bytes} bytes (a row is a few KB)"
            continue
        if raw.strip():
            yield lineno, raw, None


def read_lines(fh: BinaryIO, max_bytes: int = MAX_LINE_BYTES) -> Iterator[Line]:
    """Every non-blank line of an open rows file, parsed or with the reason it is rejected."""
    for lineno, raw, reason in raw_lines(fh, max_bytes):
        yield Line(lineno, raw, None, reason) if reason else _parse_line(lineno, raw)


def _parse_line(lineno: int, raw: bytes) -> Line:
    try:
        row = _loads(raw)
    except RecursionError:
        return Line(lineno, raw, None, "JSON nested too deeply")
    except UnicodeDecodeError:
        return Line(lineno, raw, None, "not UTF-8 text")
    except ValueError as exc:
        why = "cut off (no newline at its end: a write stopped midway?)" if not raw.endswith(b"\n") \
            else f"not valid JSON ({exc})"
        return Line(lineno, raw, None, why[:300])
    if not isinstance(row, dict):
        return Line(lineno, raw, None, f"a JSON {type(row).__name__}, not an object")
    return Line(lineno, raw, row, None)


def check_lines(lines: list[tuple[int, bytes]], now: str, at: datetime
                ) -> tuple[list[tuple[Any, ...]], list[tuple[int, bytes, str]]]:
    """Parse and check a chunk of lines: the node values of the good ones (in order) and
    (line number, bytes, reason) of the rest.  Whatever a line holds, never raises: this runs
    in the merge's helper processes too."""
    nodes: list[tuple[Any, ...]] = []
    rejects: list[tuple[int, bytes, str]] = []
    for lineno, raw in lines:
        line = _parse_line(lineno, raw)
        if line.row is None:
            rejects.append((lineno, raw, str(line.reason)))
            continue
        try:
            nodes.append(node_values(line.row, now, at))
        except RowError as e:
            rejects.append((lineno, raw, str(e)))
        except Exception as e:  # noqa: BLE001 - whatever a row holds, never a crash
            rejects.append((lineno, raw, f"cannot be read as a row ({type(e).__name__}: {e})"[:500]))
    return nodes, rejects


def read_rows_file(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """All rows of a small rows file and how many lines were not JSON objects (tests, tools)."""
    rows, bad = [], 0
    with open(path, "rb") as fh:
        for line in read_lines(fh):
            if line.row is None:
                bad += 1
            else:
                rows.append(line.row)
    return rows, bad


# ---------------------------------------------------------------- checking


def _text(where: str, name: str, value: Any, limit: int = MAX_TEXT, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise RowError(f"{where} has {name} of type {type(value).__name__} ({_short(value)}); "
                       "expected a string")
    if len(value) > limit:
        raise RowError(f"{where} has a {name} of {len(value)} characters; at most {limit}")
    if not value and not empty:
        raise RowError(f"{where} has an empty {name}")
    _utf8(where, name, value)
    return value


def _utf8(where: str, name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RowError(f"{where} has a {name} that is not valid Unicode (a lone surrogate)") from None


def _number(where: str, name: str, value: Any, *, low: float = 0.0, high: float = 1e15,
            low_open: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RowError(f"{where} has {name} {_short(value)} of type {type(value).__name__}; "
                       "expected a number")
    try:
        f = float(value)
    except OverflowError:
        raise RowError(f"{where} has {name} {_short(value)}: too large; at most {high:g}") from None
    if not math.isfinite(f) or f > high or f < low or (low_open and f == low):
        bound = f"{'>' if low_open else '>='} {low:g} and <= {high:g}"
        raise RowError(f"{where} has {name} {_short(value)}; expected a finite number {bound}")
    return f


def _integer(where: str, name: str, value: Any, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError(f"{where} has {name} {_short(value)} of type {type(value).__name__}; "
                       "expected an integer")
    if not low <= value <= high:
        raise RowError(f"{where} has {name} {_short(value)}; expected {low} to {high}")
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat(where: str, name: str, value: Any, *, lists: bool = False) -> dict[str, Any]:
    """An object of scalars (and, with ``lists``, short lists of scalars).  Checked in one
    C-level pass over the value types; the rest is checked when the object is encoded: its
    floats (``allow_nan=False``), its keys (strings, sortable) and its size
    (:func:`_encode`).  Its strings are not checked for lone surrogates: the object is stored
    as ASCII JSON, which escapes them.  Anything unusual takes the item-by-item path that
    names it."""
    if value is None:
        return {}
    if type(value) is not dict:
        raise RowError(f"{where} has {name} of type {type(value).__name__} ({_short(value)}); "
                       "expected an object of names to values")
    if len(value) > MAX_FIELDS:
        raise RowError(f"{where} has {len(value)} {name} entries; at most {MAX_FIELDS}")
    types = set(map(type, value.values()))
    if types <= _SCALARS and _numbers_fit(value.values(), types):
        return value
    if lists and types <= _SCALARS | {list}:
        nested = [v for v in value.values() if type(v) is list]
        inner = [x for v in nested for x in v]
        inner_types = set(map(type, inner))
        if max(map(len, nested)) <= 64 and inner_types <= _SCALARS \
                and _numbers_fit(inner, inner_types) and _numbers_fit(value.values(), types):
            return value
    _flat_slowly(where, name, value, lists)
    return value


def _numbers_fit(values: Any, types: set[type]) -> bool:
    """Integers within 64 bits, floats finite."""
    if int in types:
        ints = [v for v in values if type(v) is int]
        if not (-INT64 <= min(ints) and max(ints) <= INT64):
            return False
    return float not in types or all(map(math.isfinite, [v for v in values if type(v) is float]))


def _flat_slowly(where: str, name: str, value: dict[Any, Any], lists: bool) -> None:
    for k, v in value.items():
        if type(k) is not str or len(k) > 256:
            raise RowError(f"{where} has {name} key {_short(k)}; expected a name of at most 256 "
                           "characters")
        if lists and type(v) is list:
            if len(v) > 64:
                raise RowError(f"{where} has {name}[{k!r}] of {len(v)} items; at most 64")
            for item in v:
                _scalar(where, f"{name}[{k!r}]", item)
        else:
            _scalar(where, f"{name}[{k!r}]", v)


MAX_OBJECT_JSON = 1 << 16  # a features, shape or provenance object, encoded


def _encode(where: str, name: str, value: Any) -> str:
    try:
        text = _dumps(value)
    except (ValueError, TypeError):  # a float that is not finite, keys that are not names
        _flat_slowly(where, name, value, True)
        raise RowError(f"{where} has {name} that cannot be written as JSON") from None
    if len(text) > MAX_OBJECT_JSON:
        _flat_slowly(where, name, value, True)
        raise RowError(f"{where} has {name} of {len(text)} characters as JSON; at most "
                       f"{MAX_OBJECT_JSON}")
    return text


def _scalar(where: str, name: str, v: Any) -> None:
    if v is None or isinstance(v, bool):
        return
    if isinstance(v, str):
        if len(v) > MAX_TEXT:
            raise RowError(f"{where} has a {name} of {len(v)} characters; at most {MAX_TEXT}")
    elif isinstance(v, int):
        if not -INT64 <= v <= INT64:
            raise RowError(f"{where} has {name} {_short(v)}: out of the 64-bit integer range")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise RowError(f"{where} has {name} {v!r}; expected a finite number")
    else:
        raise RowError(f"{where} has {name} of type {type(v).__name__} ({_short(v)}); expected "
                       "a string, number, true/false or null")


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a huge int's repr is refused
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:40] + f"…({len(text)} characters)"


def row_to_node(row: Mapping[str, Any], *, now: str | None = None,
                at: datetime | None = None) -> dict[str, Any]:
    """Check one measured row (the box's JSON line) and turn it into a node-table row.

    Raises :class:`RowError` naming what is wrong.  Pure apart from ``now`` (the node's
    ``updated_at``) and ``at`` (this machine's time, against which a ``measured_at`` more than
    :data:`FUTURE_SLACK` ahead is refused)."""
    return dict(zip(NODE_FIELDS, node_values(row, now or iso(utcnow()), at or utcnow()),
                    strict=True))


NODE_FIELDS = (
    "node_key", "parent_key", "context_key", "op_sig", "gpu", "features", "value_us", "depth",
    "n_updates", "updated_at", "visits", "is_leaf", "variance", "n_samples", "status", "run_id",
    "measured_at", "feat_ver", "shape_spec", "regime", "kind", "shape_id", "spec", "slice",
    "point_key", "ref_us", "error", "compile_s", "bench_s", "provenance",
)
"""The node-table columns :func:`node_values` fills, in the table's order."""


def node_values(row: Any, now: str, at: datetime) -> tuple[Any, ...]:
    """:func:`row_to_node` as a tuple in :data:`NODE_FIELDS` order (the merge's fast path)."""
    try:
        return _node_values(row, now, at)
    except RowError as e:
        pk = row.get("point_key") if isinstance(row, Mapping) else None
        msg = str(e)
        if isinstance(pk, str) and len(pk) <= 300 and msg.startswith("row "):
            raise RowError(f"row {pk!r} " + msg[4:]) from None
        raise


_TEXT_FIELDS = (("gpu", 256), ("kind", 64), ("shape_id", MAX_TEXT), ("point_key", MAX_TEXT))


def _node_values(row: Any, now: str, at: datetime) -> tuple[Any, ...]:
    where = "row"
    if not isinstance(row, Mapping):
        raise RowError(f"a row must be a JSON object, not {type(row).__name__}")
    get = row.get
    missing = [k for k in REQUIRED_ROW_KEYS if get(k) is None]
    if missing:
        raise RowError(f"{where} is missing required keys: {', '.join(missing)} "
                       f"(every row needs {', '.join(REQUIRED_ROW_KEYS)})")
    regime, status = row["regime"], row["status"]
    if regime not in REGIMES:
        raise RowError(f"{where} has regime {_short(regime)}; valid regimes: {', '.join(REGIMES)}")
    if status not in STATUSES:
        raise RowError(f"{where} has status {_short(status)}; valid statuses: {', '.join(STATUSES)}")
    for name, limit in _TEXT_FIELDS:
        value = row[name]
        if type(value) is not str or not 0 < len(value) <= limit:
            _text(where, name, value, limit)
    gpu, kind, shape_id, pk = row["gpu"], row["kind"], row["shape_id"], row["point_key"]
    spec = row["spec"]
    if type(spec) is not str or len(spec) > MAX_TEXT:
        _text(where, "spec", spec, empty=True)
    try:
        _utf8_all(gpu, kind, shape_id, spec)
    except UnicodeEncodeError:
        raise RowError(f"{where} has an id (gpu, kind, shape_id or spec) that is not valid "
                       "Unicode (a lone surrogate)") from None
    try:
        names = list(parse_spec(spec))
        expected_key = point_key(gpu, shape_id, spec)
    except (SpecError, ValueError) as exc:
        raise RowError(f"{where}: {exc}") from None
    if names != sorted(names):
        raise RowError(f"{where} has spec {_short(spec)}, not in canonical form (knobs sorted "
                       f"by name: {_short(make_spec(parse_spec(spec)))})")
    if pk != expected_key:
        raise RowError(f"{where} has a point_key that does not match its gpu, shape_id and spec "
                       f"(expected {expected_key!r})")
    cc = row["cc"]
    if type(cc) not in (list, tuple) or len(cc) != 2 or type(cc[0]) is not int \
            or type(cc[1]) is not int or not (0 <= cc[0] < 100 and 0 <= cc[1] < 100):
        raise RowError(f"{where} has cc {_short(cc)}; expected [major, minor], e.g. [9, 0]")
    measured_at = row["measured_at"]
    measured = when(measured_at)
    if measured is None:
        raise RowError(f"{where} has measured_at {_short(measured_at)}; expected an "
                       "ISO-8601 time such as 2026-12-02T11:22:33.123456Z")
    if measured < OLDEST:
        raise RowError(f"{where} has measured_at {measured_at!r}, before {OLDEST:%Y}")
    if measured > at + FUTURE_SLACK:
        raise RowError(f"{where} has measured_at {measured_at!r}, more than a day after "
                       f"this machine's clock ({iso(at)}): a box clock that far ahead would "
                       "make this row beat every later measurement")
    if status == "ok":
        value = _number(where, "value_us", get("value_us"), high=FAIL_VALUE_US / 10, low_open=True)
        if value is None:
            raise RowError(f"{where} has status 'ok' but value_us None; expected a finite number")
        value_us = value
    else:
        value_us = FAIL_VALUE_US
    variance = _number(where, "variance", get("variance"), high=1e30)
    ref_us = _number(where, "ref_us", get("ref_us"))
    compile_s = _number(where, "compile_s", get("compile_s"))
    bench_s = _number(where, "bench_s", get("bench_s"))
    n_samples = _integer(where, "n_samples", get("n_samples"), 0, 10**9)
    feat_ver = _integer(where, "feat_ver", get("feat_ver"), 0, 10**6)
    run_id = get("run_id") or ""
    if type(run_id) is not str or len(run_id) > 256:
        _text(where, "run_id", run_id, 256, empty=True)
    slice_ = get("slice")
    if slice_ is not None and slice_ not in SLICES:
        raise RowError(f"{where} has slice {_short(slice_)}; valid slices: {', '.join(SLICES)}")
    error = get("error")
    if error is not None:
        _text(where, "error", error, MAX_ERROR_TEXT, empty=True)
    try:
        _utf8_all(run_id, slice_ or "")
    except UnicodeEncodeError:
        raise RowError(f"{where} has a run_id or slice that is not valid Unicode") from None
    features = _flat(where, "features", get("features"))
    shape = get("shape")
    if shape is not None:
        _flat(where, "shape", shape)
    provenance = get("provenance")
    if provenance is not None:
        _flat(where, "provenance", provenance, lists=True)
    facts = tuple(sorted([item for item in features.items() if item[0][:2] == "S_"]))
    if not facts:  # a failed row may come without features; its shape tells shapes apart
        facts = tuple(sorted((f"S_{k}", v) for k, v in (shape or {}).items()))
    if not facts:
        raise RowError(f"{where} has no S_* shape facts in features and no shape; its op_sig "
                       "could not tell shapes apart")
    context_key = _context_key((cc[0], cc[1]), regime)
    op_sig = _op_sig(kind, facts)
    return (
        digest(context_key, gpu, op_sig, spec), None, context_key, op_sig, gpu,
        _encode(where, "features", features), value_us, 0, 1, now, 1, 1, variance, n_samples, status,
        run_id, measured_at, feat_ver or FEAT_VER,
        None if shape is None else _encode(where, "shape", {"kind": kind, **shape}),
        regime, kind, shape_id, spec, slice_, pk, ref_us, error, compile_s, bench_s,
        None if provenance is None else _encode(where, "provenance", provenance),
    )


def _utf8_all(*texts: str) -> None:
    "".join(texts).encode("utf-8")


# ---------------------------------------------------------------- rejected rows


class RejectedRows:
    """Where rejected lines are set aside, each with its reason: a JSON-lines file made on the
    first rejection (0600).  Written to ``<path>.part`` and renamed by :meth:`commit` once the
    merge that read them has committed, so a merge rolled back leaves no record of rejections
    it will make again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.reasons: dict[str, int] = {}
        self.first: str | None = None
        self._fh: Any = None

    @property
    def part(self) -> Path:
        return self.path.with_name(self.path.name + ".part")

    def add(self, source: str, lineno: int, raw: bytes, reason: str) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._fh = os.fdopen(fd, "a", encoding="utf-8")
        self.count += 1
        kind = reason.split(";")[0].split(" has ")[-1].split(" (")[0][:80]
        self.reasons[kind] = self.reasons.get(kind, 0) + 1
        if self.first is None:
            self.first = f"{source}:{lineno}: {reason}"
        self._fh.write(json.dumps({"source": source, "line": lineno, "reason": reason,
                                   "text": raw.decode("utf-8", errors="replace").rstrip("\n"),
                                   "rejected_at": iso(utcnow())}) + "\n")

    def commit(self) -> Path | None:
        if self._fh is None:
            return None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        if self.path.exists():  # another merge of this second: append after it
            with open(self.path, "ab") as out, open(self.part, "rb") as src:
                out.write(src.read())
            self.part.unlink()
        else:
            os.replace(self.part, self.path)
        return self.path

    def discard(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self.part.unlink(missing_ok=True)
        self.count, self.reasons, self.first = 0, {}, None
