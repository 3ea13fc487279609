"""The resume ledger: which points are done and which may be retried, per regime, in one JSON file.

File format (``VERSION`` 1)::

    {"version": 1,
     "points": {point_key: {"spec": "K=V,…",
                            "deployable": {"status": "ok", "attempts": 1},
                            "interpret": {"status": "timeout", "attempts": 2, "error": "…"}}}}

Regimes are independent: a point done in ``interpret`` still needs a ``deployable`` run.
Every mark counts an attempt; a terminal status (``ok``, ``bench_fail``) sticks and later
marks are ignored; anything else is retried while attempts < ``MAX_ATTEMPTS``.

A ledger belongs to one node table: the controller makes it from the table's rows
(:meth:`Ledger.from_records`), so a point is done only when its row is in that table, and
pushes it to the box for one run; the box marks it as it measures (its marks are the run's
working state; they come home only as rows, through the merge).  ``node_table`` in the file
names the table (its id and path).  Writes are atomic (tmp + fsync + rename).  A file that cannot be read
is not fatal: :meth:`Ledger.load` warns, keeps a copy of it, and starts fresh.  Stdlib only.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from harness.contract import MAX_ATTEMPTS, REGIMES, STATUSES, TERMINAL_STATUSES

__all__ = [
    "MAX_ATTEMPTS",
    "REGIMES",
    "RETRYABLE",
    "TERMINAL",
    "VERSION",
    "Ledger",
    "LedgerWarning",
]

TERMINAL = frozenset(TERMINAL_STATUSES)
RETRYABLE = frozenset(STATUSES) - TERMINAL
VERSION = 1


class LedgerWarning(UserWarning):
    """The ledger file was unusable and resume state starts fresh (a copy of it was kept)."""


def _entry_problem(key: object, entry: object) -> str | None:
    """Why one ``points`` entry is malformed, or None if it is fine."""
    if not isinstance(key, str) or not key:
        return f"point key {key!r} is not a non-empty string"
    if not isinstance(entry, dict):
        return f"point {key!r} is a {type(entry).__name__}, not an object"
    if not isinstance(entry.get("spec"), str):
        return f"point {key!r} has no string 'spec'"
    for field, record in entry.items():
        if field == "spec":
            continue
        if field not in REGIMES:
            return f"point {key!r} has unknown field {field!r} (regimes: {', '.join(REGIMES)})"
        if not isinstance(record, dict):
            return f"point {key!r} regime {field!r} is not an object"
        status, attempts = record.get("status"), record.get("attempts")
        if not isinstance(status, str) or not status:
            return f"point {key!r} regime {field!r} has no string 'status'"
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            return f"point {key!r} regime {field!r} has bad 'attempts' {attempts!r}"
        if "error" in record and not isinstance(record["error"], str):
            return f"point {key!r} regime {field!r} has a non-string 'error'"
        if set(record) - {"status", "attempts", "error"}:
            return f"point {key!r} regime {field!r} has unknown fields {sorted(set(record) - {'status', 'attempts', 'error'})}"
    return None


def _file_problem(data: object) -> str | None:
    """Why decoded ledger JSON is unusable, or None if it is fine."""
    if not isinstance(data, dict):
        return f"top level is a {type(data).__name__}, not an object"
    if data.get("version") != VERSION:
        return f"version is {data.get('version')!r}, expected {VERSION}"
    points = data.get("points")
    if not isinstance(points, dict):
        return "'points' is missing or not an object"
    for key, entry in points.items():
        problem = _entry_problem(key, entry)
        if problem:
            return problem
    return None


def _check_regime(regime: str) -> None:
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid regimes: {', '.join(REGIMES)}")


class Ledger:
    """In-memory resume state for points, with JSON load/save; see the module docstring."""

    def __init__(self) -> None:
        self._points: dict[str, dict[str, Any]] = {}
        self.bound_to: dict[str, str] | None = None  # the node table it belongs to (id, path)

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, str, str, str, int | None, str | None]],
                     bound_to: dict[str, str] | None = None) -> Ledger:
        """The ledger of a node table: one entry per measured leaf (point_key, spec, regime,
        status, visits, error), its attempts the measurements the table absorbed.  A point is
        done here only because its row is in that table."""
        ledger = cls()
        ledger.bound_to = bound_to
        points = ledger._points
        for key, spec, regime, status, visits, error in records:
            if regime not in REGIMES or not isinstance(status, str) or not status:
                continue
            entry = points.setdefault(key, {"spec": spec})
            if entry["spec"] != spec:
                continue  # a legacy row with a colliding key: the first one stands
            record: dict[str, Any] = {"status": status, "attempts": max(1, int(visits or 1))}
            if error is not None and status not in TERMINAL:
                record["error"] = str(error)
            entry[regime] = record
        return ledger

    # -- file I/O -----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: object) -> Ledger:
        """Build a ledger from decoded file JSON; ValueError saying what is wrong if it is bad."""
        problem = _file_problem(data)
        if problem:
            raise ValueError(problem)
        ledger = cls()
        assert isinstance(data, dict)
        ledger._points = copy.deepcopy(data["points"])
        bound = data.get("node_table")
        if isinstance(bound, dict):
            ledger.bound_to = {str(k): str(v) for k, v in bound.items()}
        return ledger

    def to_dict(self) -> dict[str, Any]:
        """The file content as plain JSON-able data (a copy)."""
        out: dict[str, Any] = {"version": VERSION, "points": copy.deepcopy(self._points)}
        if self.bound_to:
            out["node_table"] = dict(self.bound_to)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Ledger:
        """Read the ledger at ``path``; a missing file gives an empty ledger.

        An unreadable file (bad JSON, wrong shape or version, bad entries) is not fatal: it is
        copied to ``<path>.corrupt-<timestamp>``, a :class:`LedgerWarning` says so, and an
        empty ledger is returned.
        """
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls()
        except OSError as exc:
            return cls._fresh(path, f"cannot be read ({exc})")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return cls._fresh(path, f"is not valid JSON ({exc})")
        problem = _file_problem(data)
        if problem:
            return cls._fresh(path, f"is not a version-{VERSION} ledger ({problem})")
        return cls.from_dict(data)

    @classmethod
    def _fresh(cls, path: Path, why: str) -> Ledger:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        keep = path.with_name(f"{path.name}.corrupt-{stamp}")
        n = 1
        while keep.exists():
            keep = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            shutil.copyfile(path, keep)
            kept = f"the bad file was kept as {keep}"
        except OSError as exc:
            kept = f"a copy could not be kept ({exc})"
        warnings.warn(
            f"ledger {path} {why}; starting with fresh resume state, so points already done "
            f"may be measured again. {kept[0].upper()}{kept[1:]}. "
            f"Deleting {path} resets resume state and silences this warning.",
            LedgerWarning,
            stacklevel=3,
        )
        return cls()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ledger atomically: ``.<name>.<pid>.tmp``, flush + fsync, then rename over
        ``path``.  The temporary file is the writer's own: the workers of one run (one a card)
        save the same ``--ledger`` at once, and one's rename must never take the other's half
        written file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        text = json.dumps(self.to_dict(), indent=1, sort_keys=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    # -- marks and queries ----------------------------------------------------------------

    def mark(self, key: str, spec: str, regime: str, status: str, error: str | None = None) -> None:
        """Record one attempt of point ``key`` in ``regime`` that ended with ``status``.

        Attempts count every mark.  Once a point is terminal in a regime, later marks there are
        ignored.  ``error`` is the attempt's error text (the previous one is dropped).
        """
        _check_regime(regime)
        if not isinstance(status, str) or not status:
            raise ValueError(f"status must be a non-empty string, got {status!r}")
        entry = self._points.get(key)
        if entry is None:
            entry = self._points[key] = {"spec": spec}
        elif entry["spec"] != spec:
            raise ValueError(f"point {key!r} is recorded for spec {entry['spec']!r}, not {spec!r}")
        record = entry.get(regime)
        if record is not None and record["status"] in TERMINAL:
            return
        attempts = record["attempts"] if record is not None else 0
        new: dict[str, Any] = {"status": status, "attempts": attempts + 1}
        if error is not None:
            new["error"] = error
        entry[regime] = new

    def _record(self, key: str, regime: str) -> dict[str, Any] | None:
        _check_regime(regime)
        entry = self._points.get(key)
        return None if entry is None else entry.get(regime)

    def status(self, key: str, regime: str) -> str | None:
        """The last status of ``key`` in ``regime``, or None if it was never marked there."""
        record = self._record(key, regime)
        return None if record is None else record["status"]

    def attempts(self, key: str, regime: str) -> int:
        """How many times ``key`` was marked in ``regime`` (0 if never)."""
        record = self._record(key, regime)
        return 0 if record is None else record["attempts"]

    def error(self, key: str, regime: str) -> str | None:
        """The error text of the last attempt of ``key`` in ``regime``, if any."""
        record = self._record(key, regime)
        return None if record is None else record.get("error")

    def spec(self, key: str) -> str | None:
        """The spec recorded for ``key``, or None if the point is unknown."""
        entry = self._points.get(key)
        return None if entry is None else entry["spec"]

    def needs_run(self, key: str, regime: str, max_attempts: int = MAX_ATTEMPTS) -> bool:
        """True if ``key`` was never marked in ``regime``, or is non-terminal with attempts left."""
        record = self._record(key, regime)
        if record is None:
            return True
        return record["status"] not in TERMINAL and record["attempts"] < max_attempts

    def update(self, other: Ledger) -> None:
        """Fold ``other`` (e.g. the box's ledger come home) into this one.

        Per point and regime: a terminal status beats a non-terminal one; otherwise the record
        with more attempts wins; on a tie this ledger's record is kept.
        """
        for key, theirs in other._points.items():
            mine = self._points.get(key)
            if mine is None:
                self._points[key] = copy.deepcopy(theirs)
                continue
            if mine["spec"] != theirs["spec"]:
                raise ValueError(
                    f"point {key!r} has spec {mine['spec']!r} here but {theirs['spec']!r} "
                    "in the ledger being merged"
                )
            for regime in REGIMES:
                if regime in theirs and _beats(theirs[regime], mine.get(regime)):
                    mine[regime] = dict(theirs[regime])

    def counts(self, regime: str) -> dict[str, int]:
        """How many points have each status in ``regime`` (points never marked there not counted)."""
        _check_regime(regime)
        return dict(Counter(e[regime]["status"] for e in self._points.values() if regime in e))

    def __len__(self) -> int:
        return len(self._points)

    def __contains__(self, key: object) -> bool:
        return key in self._points

    def __iter__(self) -> Iterator[str]:
        return iter(self._points)


def _beats(theirs: dict[str, Any], mine: dict[str, Any] | None) -> bool:
    if mine is None:
        return True
    their_terminal, my_terminal = theirs["status"] in TERMINAL, mine["status"] in TERMINAL
    if their_terminal != my_terminal:
        return their_terminal
    return theirs["attempts"] > mine["attempts"]
