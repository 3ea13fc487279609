"""The controller's own death loses nothing: a point is done only when its row is in the node
table that the ledger belongs to.

Whole ``pytest collect_tests --gpu=local`` runs (interpreter, real tmux, real SQLite) are
interrupted from outside as a user would (Ctrl-C and a hang-up to the process group, SIGTERM or
SIGKILL to the process), run twice at once, or pointed at another node table; then the node
table, the ledger and the box are checked.  ``own-matmul`` (38 points, about 20 s on this
machine) is the job that is running when the signal comes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest

from harness.ledger import Ledger
from harness.remote.tmux import session_names
from tests.runs import (
    Run,
    box_processes,
    box_rows,
    db_points,
    measurements,
    session_alive,
    summary_jobs,
    unwrapped,
)

pytestmark = pytest.mark.slow

MATMUL = ("-k", "own and matmul", "--budget-s=300")


@pytest.fixture
def tmux_socket():
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def assert_nothing_lost(run: Run, ledger: Path) -> None:
    """Every row any run wrote on the box is in the node table; no point is in it twice; every
    point the ledger calls done has its row there."""
    wrote = {(r["point_key"], r["run_id"], r["measured_at"]) for r in box_rows(run.box)}
    assert wrote, "no rows were written"
    assert wrote <= measurements(run.db)
    points = db_points(run.db)
    assert len(points) == len({(k, regime) for k, regime, _ in points})
    in_db = {(k, regime) for k, regime, status in points if status in ("ok", "bench_fail")}
    book = Ledger.load(ledger)
    done = {(k, "interpret") for k in book if not book.needs_run(k, "interpret")}
    assert done <= in_db


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False),
                                            (signal.SIGHUP, True)], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_signal_mid_job_stops_it_merges_its_rows_and_ends_interrupted(
        tmp_path: Path, tmux_socket: str, sig: int, group: bool) -> None:
    run = Run(tmp_path, tmux_socket, *MATMUL)
    run.wait_for_box(r"\[batch 1\] own matmul")
    run.signal(sig, group=group)
    rc, out = run.finish(timeout=120)
    name = signal.Signals(sig).name
    assert rc == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert summary_jobs(out)[("own", "matmul")]["state"].startswith(
        f"interrupted ({name}; stopped and harvested: "), out[-3000:]
    assert "status: INTERRUPTED (job own-matmul stopped and harvested; " in out
    assert "Traceback" not in out
    (rows_file,) = (run.box / "rows").glob("bench-*/own-matmul.jsonl")
    n = len(rows_file.read_text().splitlines())
    assert 0 < n < 38  # stopped mid-job
    assert f"stopped and harvested: {n} rows merged" in out
    assert_nothing_lost(run, tmp_path / "state" / "ledger.json")
    # the job is ended, the box free again
    assert not session_alive(tmux_socket, run.box) and box_processes(run.box) == []
    assert not (run.box / "lock.json").exists()


def test_the_report_of_an_interrupted_run_lists_the_jobs_it_never_started(
        tmp_path: Path, tmux_socket: str) -> None:
    """Ctrl-C in the first of two jobs: the report and the summary hold both, the second as
    ``not_run``, and the totals add up."""
    report = tmp_path / "report.json"
    run = Run(tmp_path, tmux_socket, "-k", "own and (matmul or rms_norm)", "--budget-s=300",
              f"--report-json={report}")
    first = run.wait_for_box(r"; job (own-\w+): \d+ of \d+ points to measure")[1]
    run.wait_for_box(rf"\[batch 1\] {first.replace('-', ' ')}")
    run.signal(signal.SIGINT)
    rc, out = run.finish(timeout=120)
    assert rc == pytest.ExitCode.INTERRUPTED, out[-3000:]
    rep = json.loads(report.read_text())
    jobs = [(f"{j['slice']}-{j['kind']}", j["outcome"]) for j in rep["jobs"]]
    second = ({"own-matmul", "own-rms_norm"} - {first}).pop()
    assert jobs == [(first, "interrupted"), (second, "not_run")], jobs
    totals = rep["totals"]["jobs"]
    assert totals["total"] == 2 and totals["interrupted"] == totals["not_run"] == 1
    assert totals["total"] == sum(v for k, v in totals.items() if k != "total")
    assert summary_jobs(out)[("own", second.split("-")[1])]["cell"] == "not run", out[-3000:]


def test_a_second_ctrl_c_leaves_at_once_and_the_next_run_merges_what_was_left(
        tmp_path: Path, tmux_socket: str) -> None:
    first = Run(tmp_path, tmux_socket, *MATMUL)
    first.wait_for_box(r"\[batch 1\] own matmul")
    first.signal(signal.SIGINT)
    first.wait_for(r"SIGINT: stopping the session")
    first.signal(signal.SIGINT)
    rc, out = first.finish(timeout=60)
    assert rc == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "left at once (SIGINT twice)" in out and "the next run with this node table merges" in out
    assert "status: INTERRUPTED (left at once" in out
    # a session left measuring is always said, with how to end it
    name = session_names(str(first.box))[1]
    said = f"`tmux -L {tmux_socket} kill-session -t {name}`" in out
    assert said or not session_alive(tmux_socket, first.box), out[-3000:]

    second = Run(tmp_path, tmux_socket, "-k", "own and softmax", "--budget-s=60")
    rc, out = second.finish()
    assert rc == 0, out[-3000:]
    assert "merged " in out and "rows that earlier runs left unmerged" in out, out[-3000:]
    assert_nothing_lost(second, tmp_path / "state" / "ledger.json")


def test_kill_9_of_the_controller_the_next_run_waits_for_the_orphan_and_merges_it(
        tmp_path: Path, tmux_socket: str) -> None:
    first = Run(tmp_path, tmux_socket, *MATMUL)
    first.wait_for_box(r"\[batch 1\] own matmul")
    first.signal(signal.SIGKILL, group=False)
    first.finish(timeout=30)
    assert session_alive(tmux_socket, first.box)  # the orphan sweep measures on

    second = Run(tmp_path, tmux_socket, *MATMUL)
    rc, out = second.finish()
    assert rc == 0, out[-3000:]
    assert "took over the lock of a run that is gone" in out, out[-3000:]
    assert "(its controller is gone) is still measuring; waiting" in unwrapped(out)
    assert "rows that earlier runs left unmerged" in out
    # the orphan's rows, then (where it was still measuring when the wait ended, on a busy
    # machine) the second run's of what it had left: every point once
    orphan, *rest = sorted((tmp_path / "box" / "rows").glob("bench-*/own-matmul.jsonl"))
    rows = {f.parent.name: [json.loads(line) for line in f.read_text().splitlines()]
            for f in (orphan, *rest)}
    keys = [r["point_key"] for file_rows in rows.values() for r in file_rows]
    # on a failure: how many rows each file holds, by status, and how the second run ended
    tally = {name: sorted(Counter(r.get("status") for r in file_rows).items())
             for name, file_rows in rows.items()}
    assert len(keys) == len(set(keys)) == 38, (tally, unwrapped(out)[-4000:])
    assert orphan.read_text().count("\n") > 0 and len(rest) <= 1
    if not rest:  # it finished its job while the second run waited
        assert "all 38 matmul points of the own slice" in out
    assert_nothing_lost(second, tmp_path / "state" / "ledger.json")


def test_a_second_controller_on_the_same_box_is_refused_at_once(tmp_path: Path,
                                                                  tmux_socket: str) -> None:
    first = Run(tmp_path, tmux_socket, *MATMUL, name="first")
    first.wait_for_box(r"\[batch 1\] own matmul")
    second = Run(tmp_path, tmux_socket, *MATMUL, db=tmp_path / "other.db", name="second")
    rc2, out2 = second.finish(timeout=60)
    assert rc2 == 1, out2[-3000:]
    assert "box local is in use by another collect-node-data run (pid " in out2
    assert "one controller per box" in out2
    rc, out = first.finish()
    assert rc == 0, out[-3000:]
    assert summary_jobs(out)[("own", "matmul")]["state"] == "done", out[-3000:]
    assert_nothing_lost(first, tmp_path / "state" / "ledger.json")


def test_a_run_with_another_node_table_never_inherits_done_points(tmp_path: Path,
                                                                  tmux_socket: str) -> None:
    # a budget the job cannot spend (it ends when its points do): both runs measure every
    # point however busy the machine is
    args = ("-k", "own and softmax", "--budget-s=600")
    a = Run(tmp_path, tmux_socket, *args, db=tmp_path / "a.db")
    rc, out = a.finish()
    assert rc == 0, out[-3000:]
    b = Run(tmp_path, tmux_socket, *args, db=tmp_path / "b.db")
    rc, out = b.finish()
    assert rc == 0, out[-3000:]
    assert "in the node table already" not in out
    assert summary_jobs(out)[("own", "softmax")]["state"] == "done", out[-3000:]
    assert len(db_points(tmp_path / "b.db")) == len(db_points(tmp_path / "a.db")) > 0
    # the ledger now belongs to b.db, and a.db's run stays a.db's
    bound = json.loads((tmp_path / "state" / "ledger.json").read_text())["node_table"]
    assert bound["path"] == str(tmp_path / "b.db")
    assert "rows that earlier runs left unmerged" not in out
