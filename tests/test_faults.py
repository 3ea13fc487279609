"""Faults of a remote collection: a real sshd on 127.0.0.1 is the box (interpret regime).

Each test runs ``pytest collect_tests --remote=…`` in a subprocess and breaks something while
it runs: the connection, the sweep's tmux session, the time limit; or feeds it hostile values
or a closed port.  The box is this machine, so the test watches the box's tmux socket and
files directly.  Every wait is bounded; the box's Python is this one (it has torch and
Triton), used as it is.  The longest tests come first, so that two xdist workers share the time evenly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.boxctl import BoxDriver, BoxError
from harness.ledger import Ledger
from harness.remote.tmux import Tmux, session_names
from tests.runs import summary_jobs, unwrapped

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.sshd"]
pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 240  # a whole collection run (setup ~20 s, then the jobs)


@pytest.fixture
def tmux_socket():
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


class Collect:
    """One ``pytest collect_tests --remote=…`` run in a subprocess, watched from outside."""

    def __init__(self, server, tmp_path: Path, socket_name: str, *args: str,
                 box_dir: Path | None = None, key: Path | None = None,
                 filter_: str = "fp32", remote: str | None = None,
                 known_hosts: Path | None = None) -> None:
        self.tmp_path = tmp_path
        self.box = box_dir or tmp_path / "box"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
        env["EMMY_STATE_DIR"] = str(tmp_path / "state")
        env["PYTHONUNBUFFERED"] = "1"  # progress lines land in the output file as they come
        cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=auto", "-p", "no:cacheprovider",
               f"--remote={remote or server.remote}", f"--box-python={sys.executable}",
               f"--known-hosts={known_hosts or server.known_hosts}",
               f"--db={tmp_path / 'db' / 'autotune.db'}", f"--box-dir={self.box}",
               f"--tmux-socket={socket_name}", "--poll-s=0.5", f"--filter={filter_}", *args]
        if key is not None or server is not None:
            cmd.append(f"--ssh-key={key or server.client_key}")
        n = len(list(tmp_path.glob("out-*.txt")))
        self.out_path = tmp_path / f"out-{n}.txt"
        self.t0 = time.monotonic()
        with self.out_path.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the collection did not end within {timeout:.0f}s; output:\n"
                        f"{self.output[-4000:]}")
        return rc, self.output

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test started
            self.proc.wait(10)

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float = 120) -> None:
        """Wait until ``pred()`` holds while the run is still going."""
        deadline = time.monotonic() + timeout
        while not pred():
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before {what}; output:\n"
                            f"{self.output[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"no {what} within {timeout:.0f}s; output:\n{self.output[-4000:]}")
            time.sleep(0.05)

    def sweep_log_has(self, text: str) -> Callable[[], bool]:
        log = self.box / "sweep.log"
        return lambda: log.is_file() and text in log.read_text(errors="replace")


@pytest.fixture
def runs():
    """Every run a test starts is ended with it, even when the test fails midway."""
    started: list[Collect] = []

    def start(*args, **kwargs) -> Collect:
        c = Collect(*args, **kwargs)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def sweep_alive(socket_name: str, box: Path) -> bool:
    """Whether the sweep session of the box folder ``box`` is alive."""
    name = session_names(str(box))[1]
    r = subprocess.run(["tmux", "-L", socket_name, "has-session", "-t", f"={name}"],
                       capture_output=True)
    return r.returncode == 0


def box_rows(box: Path, job: str, but: frozenset[Path] = frozenset()) -> list[dict]:
    """Every row the box wrote for ``job`` (``slice-kind``), over all runs but the files in
    ``but``."""
    rows = []
    for f in rows_files(box, job) - but:
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def rows_files(box: Path, job: str) -> frozenset[Path]:
    """The job's rows files of every run: its own and its top-ups' (``JOB.topN.jsonl``, where
    budget was left once every job had run)."""
    return frozenset((box / "rows").glob(f"*/{job}.jsonl")) \
        | frozenset((box / "rows").glob(f"*/{job}.top*.jsonl"))


def box_job_left(box: Path) -> bool:
    """Is a job process of this box folder still running?"""
    r = subprocess.run(["pgrep", "-f", f"harness[.]box (run|serve) .*{re.escape(str(box))}"],
                       capture_output=True)
    return r.returncode == 0


def db_rows(tmp_path: Path) -> dict[str, str]:
    """point_key → measured_at of every node row."""
    db = tmp_path / "db" / "autotune.db"
    if not db.exists():
        return {}
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("select point_key, measured_at from node"))


def job_line(out: str, slice_: str, kind: str) -> dict:
    """The summary's account of one job: its cell, benched, failed, state."""
    jobs = summary_jobs(out)
    assert (slice_, kind) in jobs, f"no summary cell for {slice_} {kind}:\n{out[-3000:]}"
    return jobs[(slice_, kind)]


# -- b: the sweep's tmux session is killed mid-batch ------------------------------------------

def test_killed_sweep_session_merges_its_rows_and_a_new_session_measures_the_rest(
        sshd, tmp_path, tmux_socket, runs) -> None:
    batch = 2
    run = runs(sshd, tmp_path, tmux_socket, "--budget-s=60", f"--batch={batch}",
               "-k", "own and matmul")
    run.wait_for("first batch", run.sweep_log_has("[batch 1]"))
    subprocess.run(["tmux", "-L", tmux_socket, "kill-session", "-t",
                    session_names(str(run.box))[1]], check=True)
    rc, out = run.wait()

    assert rc == 0, out[-4000:]
    assert re.search(r"the service was ended by SIGHUP; starting a new session for what is left "
                     r"of own-matmul", unwrapped(out)), out[-4000:]
    job = job_line(out, "own", "matmul")
    assert "; resumed in a new session after its run died: the service was ended by SIGHUP" \
        in job["state"], job
    rows = box_rows(run.box, "own-matmul")
    assert len(rows) > batch and job["benched"] == len(rows)
    assert max(Counter(r["point_key"] for r in rows).values()) == 1  # nothing measured twice
    assert not box_job_left(run.box)
    # every row written on the box, by both sessions, is merged
    assert db_rows(tmp_path) == {r["point_key"]: r["measured_at"] for r in rows}
    # the ledger is the node table's: every point whose row was merged is done
    ledger = Ledger.load(tmp_path / "state" / "ledger.json")
    assert all(not ledger.needs_run(r["point_key"], "interpret") for r in rows)


# -- d: a box that cannot be reached at the start ---------------------------------------------

def test_unreachable_box_at_start_fails_fast_naming_remote(tmp_path, tmux_socket, runs) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # nothing listens there now: connections are refused
    remote = f"nobody@127.0.0.1:{port}"
    known = tmp_path / "known_hosts"
    known.write_text("")
    run = runs(None, tmp_path, tmux_socket, "--budget-s=60", "-k", "own and (softmax or reduce)",
               remote=remote, known_hosts=known)
    rc, out = run.wait(timeout=90)
    assert rc == 1, out[-4000:]
    assert time.monotonic() - run.t0 < 60
    assert f"cannot reach --remote={remote}" in out, out[-3000:]
    assert "connection refused" in out
    assert "1 failed, 1 skipped" in out and "Traceback" not in out and "During handling" not in out
    # the refusal is said once: the box's other job is skipped pointing at it
    assert out.count(f"cannot reach --remote={remote}") <= 3, out[-3000:]  # failure, table, short
    assert "box for --gpu=auto is unusable: see the first job's failure" in out
    assert not (tmp_path / "box").exists()


# -- a: the connection drops while a job runs -----------------------------------------------

def test_dropped_connection_the_job_goes_on_and_nothing_is_lost(sshd_private, tmp_path, tmux_socket,
                                                               runs) -> None:
    run = runs(sshd_private, tmp_path, tmux_socket, "--budget-s=25", "--batch=1",
               "-k", "own and matmul", "-v")  # -v: the job's line at every change
    # the job has started (its first point takes seconds more: a worker start and a compile)
    run.wait_for("the job's start", run.sweep_log_has("[sweep]"))
    assert sweep_alive(tmux_socket, run.box)
    # A restart drops every connection; this one keeps the port closed for several polls.
    sshd_private.stop()
    time.sleep(3)
    sshd_private.start()

    rc, out = run.wait()
    assert rc == 0, out[-4000:]
    assert "unreachable; the session goes on" in unwrapped(out), out[-4000:]
    assert "answers again" in out, out[-4000:]
    # the box's progress reached the terminal: the job, its points, pace and times to go
    assert re.search(r"own-matmul \[job 1/1\]: \d+/\d+ pts, .*, ETA job \d\d:\d\d, session "
                     r"\d\d:\d\d", out), out[-3000:]
    # the job outlived the drop: it went on measuring after the box answered again, and ended
    # on its own (its budget or its pool), not by the controller's hand
    assert job_line(out, "own", "matmul")["state"] == "done", out[-5000:]
    assert re.search(r"answers again.*\n(.*\n)*.*own-matmul \[job 1/1\]: \d+/\d+ pts, .*in "
                     r"\d\d:\d\d, done \((budget spent|pool exhausted)\)", out), out[-5000:]
    # one service session from start to end: never restarted; the job's process (and a
    # top-up's, where budget was left once it ended) each ran to its end, batches numbered
    # without a gap
    log = (run.box / "sweep.log").read_text()
    assert log.count("[service] up") == 1, log
    processes = log.split("[sweep]")[1:]
    assert processes and all("sweep done:" in p for p in processes), log
    assert (run.box / "sweep.status").read_text().strip() == "0"
    for p in processes:
        batches = [int(n) for n in re.findall(r"^\[batch (\d+)\]", p, re.M)]
        assert batches == list(range(1, len(batches) + 1)), log
    assert re.search(r"^\[batch 1\]", log, re.M), log
    # every point the box benched is in the DB, with the box's own measurement
    rows = box_rows(run.box, "own-matmul")
    assert rows
    assert db_rows(tmp_path) == {r["point_key"]: r["measured_at"] for r in rows}
    assert not sweep_alive(tmux_socket, run.box)


# -- e: --timeout-s below the budget stops and harvests -----------------------------------------

def test_timeout_stops_the_sweep_and_harvests_it(sshd, tmp_path, tmux_socket, runs) -> None:
    # --max-dist=4: an own pool (46 points here, a third of a second each) that outlasts 5 s
    run = runs(sshd, tmp_path, tmux_socket, "--budget-s=300", "--timeout-s=5", "--batch=1",
               "--max-dist=4", "-k", "matmul")
    rc, out = run.wait()
    assert rc == 0, out[-4000:]
    job = job_line(out, "own", "matmul")
    assert job["state"] == "stopped (--timeout-s=5 reached; harvested)", out[-3000:]
    # every point measured before the stop is merged (one point per batch)
    rows = box_rows(run.box, "own-matmul")
    batches = (run.box / "sweep.log").read_text().count("[batch ")
    assert len(rows) >= batches
    assert job["benched"] == len(rows)
    assert job["failed"] == sum(1 for r in rows if r["status"] != "ok")
    assert db_rows(tmp_path) == {r["point_key"]: r["measured_at"] for r in rows}
    ledger = Ledger.load(tmp_path / "state" / "ledger.json")
    assert sum(1 for r in rows if not ledger.needs_run(r["point_key"], "interpret")) >= batches
    # the jobs after it do not start
    assert job_line(out, "cross", "matmul")["state"] == (
        "skipped: --timeout-s=5 reached: the sweep was stopped")
    assert job_line(out, "tail", "matmul")["state"] in (  # at --max-dist=4 the tail is empty
        "skipped: --timeout-s=5 reached: the sweep was stopped",
        "skipped: no matmul points in the tail slice on Triton CPU interpreter")
    # nothing is left running on the box
    assert not sweep_alive(tmux_socket, run.box)
    assert not box_job_left(run.box)


# -- c: hostile values do only what they say --------------------------------------------------

HOSTILE = "a b 'q' \"dq\"; touch pwned-{0}; $(touch pwned-{0}) `touch pwned-{0}` && x"


def _pwned(*where: Path, but: Path) -> list[Path]:
    return [p for root in where for p in root.rglob("*pwned*") if p.is_file() and p != but]


def test_hostile_filter_box_dir_and_key_name_are_only_values(sshd, tmp_path, tmux_socket,
                                                             runs) -> None:
    box = tmp_path / HOSTILE.format("boxdir")
    key = tmp_path / HOSTILE.format("key")
    key.write_bytes(sshd.client_key.read_bytes())
    key.chmod(0o600)
    bad_filter = HOSTILE.format("filter")
    run = runs(sshd, tmp_path, tmux_socket, "--budget-s=15", "-k", "softmax", box_dir=box,
               key=key, filter_=bad_filter)
    rc, out = run.wait()
    assert rc == 0, out[-4000:]
    # the box used exactly that folder, and its planner got exactly that filter
    assert (box / "setup.status").read_text().strip() == "SETUP_OK"
    (request,) = (box / "service").glob("bench-*/session.json")
    assert json.loads(request.read_text())["sweep"]["filter"] == bad_filter
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(
        ["db", "state", box.name])
    # like any filter that matches nothing: every job skipped, saying why
    assert "3 skipped" in out, out[-3000:]
    for slice_ in ("own", "cross", "tail"):
        assert (f"skipped: --filter={bad_filter!r} keeps no softmax shape"
                in job_line(out, slice_, "softmax")["state"])
    assert db_rows(tmp_path) == {}
    assert _pwned(tmp_path, ROOT, Path.home(), but=key) == []


# -- the harvest's short calls wait out a dropped connection --------------------------------------

def test_fetches_wait_for_a_box_that_comes_back(sshd_private, tmp_path) -> None:
    box = tmp_path / "box"
    box.mkdir()
    (box / "ledger.json").write_text('{"version": 1, "points": {}}\n')
    t = sshd_private.transport()
    driver = BoxDriver(transport=t, tmux=Tmux(t), base=str(box), poll_s=0.2, reconnect_s=60)
    try:
        t.connect()
        sshd_private.stop()  # drops the connection; the port stays closed for 2 s
        back = threading.Timer(2.0, sshd_private.start)
        back.start()
        t0 = time.monotonic()
        with pytest.warns(UserWarning, match="unreachable while fetching ledger.json"):
            assert driver.fetch(str(box / "ledger.json"), tmp_path / "home.json")
        back.join()
        assert time.monotonic() - t0 >= 1.5
        assert (tmp_path / "home.json").read_text() == (box / "ledger.json").read_text()

        # a box that does not come back: a clear error after reconnect_s, not an endless wait
        sshd_private.stop()
        driver.reconnect_s = 1.0
        with pytest.warns(UserWarning), pytest.raises(
                BoxError, match=r"did not answer for 1s while fetching ledger.json: cannot reach"):
            driver.fetch(str(box / "ledger.json"), tmp_path / "again.json")
    finally:
        t.close()
