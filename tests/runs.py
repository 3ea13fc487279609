"""A collection run (``pytest collect_tests --gpu=local``) in its own process group, watched and
interrupted from outside the way a user's terminal would: Ctrl-C is SIGINT to the foreground
process group, a closed terminal SIGHUP to it, ``kill`` SIGTERM or SIGKILL to the process.

Each run of one test shares the test's box folder, node DB, state folder and tmux socket, so a
second run sees what the first one left.  Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.remote.tmux import session_names

ROOT = Path(__file__).resolve().parent.parent


class Run:
    def __init__(self, tmp: Path, socket: str, *args: str, db: Path | None = None,
                 box: Path | None = None, name: str | None = None,
                 state: Path | None = None) -> None:
        self.tmp = tmp
        self.db = db or tmp / "db" / "autotune.db"
        self.box = box or tmp / "box"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("EMMY_TUNE_DB", None)
        env["EMMY_STATE_DIR"] = str(state or tmp / "state")
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=local", "-p", "no:cacheprovider",
               f"--db={self.db}", f"--box-dir={self.box}", f"--tmux-socket={socket}",
               "--poll-s=0.3", *args]
        n = len(list(tmp.glob("run-*.txt")))
        self.out_path = tmp / f"run-{n}{'-' + name if name else ''}.txt"
        self.t0 = time.monotonic()
        try:  # the box's log may hold earlier runs' lines (and an orphan job may still add some)
            self.box_log_start = (self.box / "sweep.log").stat().st_size
        except FileNotFoundError:
            self.box_log_start = 0
        with self.out_path.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 180.0) -> re.Match[str]:
        """Wait for ``pattern`` in the run's output."""
        return self._wait(pattern, lambda: re.search(pattern, self.output), "", timeout)

    def wait_for_box(self, pattern: str, timeout: float = 180.0) -> re.Match[str]:
        """Wait for ``pattern`` in the box's own log: every line is there, where the
        controller prints only the newest line each poll sees.  Only what was written after
        this run started is read: the lines of earlier runs in the same box folder (or of a
        job an earlier run left measuring) do not answer.  A log that was started over
        (smaller than it was) is read whole."""
        log = self.box / "sweep.log"

        def find() -> re.Match[str] | None:
            try:
                with log.open("rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    f.seek(self.box_log_start if size >= self.box_log_start else 0)
                    return re.search(pattern, f.read().decode(errors="replace"))
            except FileNotFoundError:
                return None

        return self._wait(pattern, find, " in the box's log", timeout)

    def _wait(self, pattern: str, find: Any, where: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = find()
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (rc {self.proc.returncode}) before "
                                     f"{pattern!r}{where}:\n{self.output[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r}{where} within {timeout:.0f}s:\n"
                                     f"{self.output[-3000:]}")
            time.sleep(0.05)

    def signal(self, sig: int, group: bool = True) -> None:
        """``group``: to the whole process group, as a terminal sends Ctrl-C or a hang-up."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 300.0) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            raise AssertionError(f"the run did not end within {timeout:.0f}s:\n{self.output[-3000:]}") from None
        return rc, self.output


def box_rows(box: Path) -> list[dict[str, Any]]:
    """Every whole row of every rows file of every run on the box."""
    out = []
    for f in sorted((box / "rows").glob("bench-*/*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def measurements(db: Path) -> set[tuple[str, str, str]]:
    """(point_key, run_id, measured_at) of every measurement the node table absorbed: each
    node's current one and those it superseded."""
    conn = sqlite3.connect(db)
    try:
        current = set(conn.execute("SELECT point_key, run_id, measured_at FROM node"))
        key_of = dict(conn.execute("SELECT node_key, point_key FROM node"))
        older = {(key_of[k], r, m) for k, r, m in
                 conn.execute("SELECT node_key, run_id, measured_at FROM node_measurement")}
        return current | older
    finally:
        conn.close()


def db_points(db: Path) -> list[tuple[str, str, str]]:
    """(point_key, regime, status) of every node row."""
    conn = sqlite3.connect(db)
    try:
        return list(conn.execute("SELECT point_key, regime, status FROM node"))
    finally:
        conn.close()


def box_processes(box: Path) -> list[str]:
    """The sweep processes of this box folder still running."""
    r = subprocess.run(["pgrep", "-af", f"harness[.]box (run|serve) .*{re.escape(str(box))}"],
                       capture_output=True, text=True)
    return r.stdout.splitlines()


def signal_service(box: Path, sig: int) -> list[int]:
    """Send ``sig`` to the box service of this box folder, the Python process alone: the
    tmux pane's shell carries the same words on its command line, and a signal to it would
    close the pane and hang up the service instead."""
    r = subprocess.run(["pgrep", "-f", f"harness[.]box serve --session {re.escape(str(box))}"],
                       capture_output=True, text=True)
    hit = []
    for pid in map(int, r.stdout.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"harness.box"]:
            os.kill(pid, sig)
            hit.append(pid)
    assert hit, f"no box service of {box} runs: {r.stdout!r}"
    return hit


def session_alive(socket: str, box: Path) -> bool:
    """Whether the sweep session of the box folder ``box`` is alive on the tmux ``socket``."""
    name = session_names(str(box))[1]
    return subprocess.run(["tmux", "-L", socket, "has-session", "-t", f"={name}"],
                          capture_output=True).returncode == 0


def summary_jobs(out: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The summary's jobs table (``harness.summary.jobs_table``), by (slice, kind): the cell's
    text, the points benched and failed it says, and the job's state: its note where it has
    one, else ``done`` (its points or its allotment ran out)."""
    from harness import kinds

    lines = out.splitlines()
    cells: dict[tuple[str, str], str] = {}
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("kind ") and re.fullmatch(r"[- ]+", lines[i + 1])):
            continue
        starts = [m.start() for m in re.finditer(r"-+", lines[i + 1])]
        heads = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        for row in lines[i + 2:]:
            words = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
            if words[0] not in kinds.names():
                break
            for head, word in zip(heads[1:], words[1:], strict=True):
                if word:
                    cells[(head, words[0])] = word
    notes: dict[str, str] = {}
    last = None
    for line in lines:
        m = re.match(r"^\[(\d+)\] (.*)$", line)
        if m:
            last = m[1]
            notes[last] = m[2]
        elif last is not None and line.startswith("    "):
            notes[last] += " " + line.strip()
        else:
            last = None
    jobs: dict[tuple[str, str], dict[str, Any]] = {}
    for (slice_, kind), cell in cells.items():
        mark = re.search(r"\[(\d+)\]$", cell)
        note = notes.get(mark[1], "") if mark else ""
        state = note.split(": ", 1)[1] if note.startswith(f"{slice_} {kind}: ") else "done"
        benched = re.match(r"(\d+) in ", cell)
        failed = re.search(r", (\d+) failed", cell)
        jobs[(slice_, kind)] = {"cell": cell, "state": state,
                                "benched": int(benched[1]) if benched else 0,
                                "failed": int(failed[1]) if failed else 0}
    return jobs


def unwrapped(out: str) -> str:
    """A run's output with its own long lines joined again (a plain line of the run's is
    broken under 120 characters, its rest indented under ``  [collect]   ``)."""
    return re.sub(r"\n  \[collect\]   ", " ", out)
