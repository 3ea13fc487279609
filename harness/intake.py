"""Rows that have not reached the node table yet: find them, bring them home, merge them.

Every run has a folder of rows, on the box (``BOX_DIR/rows/<run_id>/``) and at home
(``--rows-dir/<run_id>/``), with an ``owner.json`` that names the node table the run belongs
to (its id) and the controller that made it.  A rows file has reached its node table when the
table's ``merged_file`` records it at its present size.  So whatever stopped a controller
(Ctrl-C, ``kill -9``, a full disk, a failed merge), the next run with the same node table finds
the rows files that are not there yet (:func:`list_box_runs`, :func:`pending_on_box`,
:func:`pending_at_home`), fetches them and merges them before it measures anything.  Runs of
another node table, or made with ``--no-merge``, are left alone.  Runs made before runs had an
``owner.json`` are adopted by the first node table that finds them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.contract import SAFE_NAME
from harness.owner import Owner
from harness.remote.transport import Transport
from harness.store import MergeReceipt, NodeStore, RowsFile, receipt_dict

if TYPE_CHECKING:
    from harness.boxctl import BoxDriver

OWNER_FILE = "owner.json"

# $1: the rows folder.  One line per run, its owner record, and each rows file with its size.
# Only names of the tool's own alphabet are listed (a name with a newline cannot forge a line).
_LIST = r'''
cd "$1" 2>/dev/null || exit 0
for d in */; do
  d=${d%/}
  [ -d "$d" ] || continue
  case $d in ''|.*|*[!A-Za-z0-9._-]*) continue;; esac
  echo "RUN $d"
  if [ -f "$d/owner.json" ]; then printf 'OWNER '; tr -d '\n' < "$d/owner.json"; echo; fi
  for f in "$d"/*.jsonl; do
    n=${f#*/}
    case $n in .*|*[!A-Za-z0-9._-]*) continue;; esac
    [ -f "$f" ] && echo "FILE $(stat -c %s "$f") $n"
  done
done
'''


@dataclass
class RunFolder:
    """One run's folder of rows as a listing shows it."""

    run_id: str
    owner: dict[str, Any] | None = None
    files: dict[str, int] = field(default_factory=dict)  # name → bytes


def owner_record(owner: Owner, *, run_id: str, db_id: str | None, db_path: str, merge: bool,
                 gpu: str) -> dict[str, Any]:
    """What a run's ``owner.json`` says: the controller, and the node table it belongs to
    (``db_id`` None: the run merges into none, e.g. ``--no-merge``)."""
    return {"run_id": run_id, "db_id": db_id if merge else None, "db": db_path, "merge": merge,
            "gpu": gpu, "controller": json.loads(owner.to_json())}


def source(run_id: str, name: str) -> str:
    """How ``merged_file`` names a run's rows file."""
    return f"{run_id}/{name}"


def source_of(path: Path) -> str | None:
    """How ``merged_file`` names a rows file found in a run's folder (None elsewhere: merged,
    not recorded)."""
    return source(path.parent.name, path.name) if path.parent.name.startswith("bench-") else None


def list_box_runs(transport: Transport, rows_root: str) -> dict[str, RunFolder]:
    """Every run folder under ``rows_root`` on the box, in one short call."""
    r = transport.run(["sh", "-c", _LIST, "sh", rows_root], check=False, timeout=300)
    runs: dict[str, RunFolder] = {}
    current: RunFolder | None = None
    for line in r.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "RUN":
            if not SAFE_NAME.fullmatch(rest):
                current = None
                continue
            current = runs.setdefault(rest, RunFolder(rest))
        elif word == "OWNER" and current is not None:
            try:
                data = json.loads(rest)
            except ValueError:
                data = None
            current.owner = data if isinstance(data, dict) else {"unreadable": rest[:200]}
        elif word == "FILE" and current is not None:
            size, _, name = rest.partition(" ")
            if size.isdigit() and name.endswith(".jsonl") and SAFE_NAME.fullmatch(name):
                current.files[name] = int(size)
    return runs


def belongs(owner: dict[str, Any] | None, db_id: str) -> bool | None:
    """Whether a run belongs to node table ``db_id``: True, False, or None when the run has
    no owner record (a run made before they existed: adopted by whoever finds it)."""
    if owner is None:
        return None
    return bool(owner.get("merge", True)) and owner.get("db_id") == db_id


def pending_on_box(runs: dict[str, RunFolder], db_id: str, merged: dict[str, int],
                   current_run: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """Rows files on the box that node table ``db_id`` still lacks: (run_id, name, bytes),
    and the runs without an owner record among them (to be adopted)."""
    out: list[tuple[str, str, int]] = []
    adopted: list[str] = []
    for run_id, run in sorted(runs.items()):
        if run_id == current_run:
            continue
        mine = belongs(run.owner, db_id)
        if mine is False:
            continue
        todo = [(run_id, name, size) for name, size in sorted(run.files.items())
                if size > merged.get(source(run_id, name), -1)]
        if todo and mine is None:
            adopted.append(run_id)
        out.extend(todo)
    return out, adopted


def pending_at_home(rows_dir: Path, db_id: str, merged: dict[str, int], current_run: str,
                    skip: set[str] = frozenset()) -> list[RowsFile]:  # type: ignore[assignment]
    """Rows files in ``--rows-dir`` of runs of node table ``db_id`` that it still lacks."""
    out: list[RowsFile] = []
    if not rows_dir.is_dir():
        return out
    for run_dir in sorted(p for p in rows_dir.iterdir() if p.is_dir()):
        if run_dir.name == current_run:
            continue
        try:
            owner = json.loads((run_dir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not a run of this version: only its box copy is adopted
        if not belongs(owner if isinstance(owner, dict) else None, db_id):
            continue
        for f in sorted(run_dir.glob("*.jsonl")):
            src = source(run_dir.name, f.name)
            if src in skip:
                continue
            try:
                size = f.stat().st_size
            except OSError:
                continue
            if size > merged.get(src, -1):
                out.append(RowsFile(f, src))
    return out


def write_owner(path: Path, record: dict[str, Any]) -> None:
    """Write a run's owner record (0600, atomic; the workers of a run, one a card, write it
    at once, each through a temporary file of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)


def take_in_leftovers(driver: BoxDriver, *, db_path: Path, db_id: str, rows_dir: Path,
                      current_run: str, merge: Callable[[list[RowsFile]], MergeReceipt],
                      say: Callable[[str], None]) -> dict[str, Any]:
    """Fetch the rows files that node table ``db_id`` lacks from the box (and find those at
    home), merge them, and say how many; a dict for the report ({} when there were none).  The
    box's lock must be held and no job of an earlier run may still be running."""
    with NodeStore(db_path) as store:
        merged = store.merged_files()
    runs = list_box_runs(driver.transport, driver.path("rows"))
    todo, adopted = pending_on_box(runs, db_id, merged, current_run)
    for run_id in adopted:  # a run of an older version: this node table takes it
        record = {"run_id": run_id, "db_id": db_id, "db": str(db_path), "merge": True,
                  "adopted_by": current_run}
        write_owner(rows_dir / run_id / OWNER_FILE, record)
        driver.transport.put_file(rows_dir / run_id / OWNER_FILE,
                                  driver.path("rows", run_id, OWNER_FILE))
    files: list[RowsFile] = []
    for run_id, name, _ in todo:
        local = rows_dir / run_id / name
        if driver.fetch(driver.path("rows", run_id, name), local, say):
            files.append(RowsFile(local, source(run_id, name)))
    fetched = {f.source for f in files if f.source}
    files += pending_at_home(rows_dir, db_id, merged, current_run, skip=fetched)
    if not files:
        return {}
    runs_named = sorted({(f.source or "").split("/")[0] for f in files})
    say(f"merging {len(files)} rows file(s) that earlier runs left unmerged "
        f"({', '.join(runs_named)})")
    try:
        receipt = merge(files)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - the files stay; the next run tries again
        msg = (f"rows left by earlier runs could not be merged: {exc}; they stay in "
               f"{rows_dir} and the next run tries again")
        say(msg)
        warnings.warn(msg, stacklevel=2)
        return {"error": str(exc), "files": len(files), "runs": runs_named}
    line = (f"merged {receipt.rows_read} rows that earlier runs left unmerged "
            f"({receipt.inserted} new, {receipt.duplicates} already there"
            + (f", {receipt.rejected} rejected" if receipt.rejected else "")
            + f") from {len(files)} file(s) of run(s) {', '.join(runs_named)}")
    say(line)
    return {"line": line, "runs": runs_named, "files": len(files), **receipt_dict(receipt)}
