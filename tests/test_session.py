"""The box runs the whole session: one request, claimed once; a service that dies leaves the
jobs it had not begun to the controller, which sends them as a new session.

Real tmux, real SQLite, the interpreter as the box's GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from harness.contract import JobRef, Layout, SessionSpec, SessionStatus
from harness.remote.tmux import session_names
from tests.runs import (
    Run,
    box_processes,
    box_rows,
    db_points,
    measurements,
    session_alive,
    signal_service,
    summary_jobs,
    unwrapped,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tmux_socket():
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def test_a_request_is_served_once_even_after_its_claimer_died(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path / "box"), "bench-1", "bench-1")
    spec = SessionSpec(run_id="bench-1", session_id="bench-1", budget_s=5.0, shares={"own": 1},
                       jobs=(JobRef("own", "softmax"),), s_per_point={}, compile_s={})
    req = Path(lay.service("session.json"))
    req.parent.mkdir(parents=True)
    req.write_text(spec.to_json())
    # a service claimed it and died before it wrote anything else
    Path(lay.service("claim.json")).write_text(json.dumps({"pid": 999999999, "host": "box"}))
    r = subprocess.run([sys.executable, "-m", "harness.box", "serve", "--session", str(req)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "EMMY_FORCE_INTERPRET": "1"})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "session bench-1 was claimed already (by pid 999999999 on box); a session is run once" \
        in r.stdout
    assert not Path(lay.service("status.json")).exists()
    assert not (tmp_path / "box" / "rows").exists()


@pytest.mark.slow
def test_a_killed_service_its_job_resumes_in_a_new_session_nothing_measured_twice(
        tmp_path: Path, tmux_socket: str) -> None:
    """SIGKILL of the service mid-job: what the job wrote comes home and merges, and a new
    session takes on what is left of it (its points with rows on the box left out) and the
    job the first had not begun."""
    run = Run(tmp_path, tmux_socket, "-k", "own and (softmax or rms_norm)", "--budget-s=300",
              "--batch=2")
    run.wait_for_box(r"\[batch 1\] own softmax")
    signal_service(run.box, signal.SIGKILL)
    rc, out = run.finish()
    assert "Traceback" not in out
    assert re.search(r"the box service died \(its tmux session is gone\); starting a new session "
                     r"for what is left of own-softmax and the 1 job\(s\) it had not begun",
                     unwrapped(out)), out[-3000:]
    jobs = summary_jobs(out)
    # how far the resumed job got depends on the machine's load; that it resumed does not
    assert re.match(r"done \((pool exhausted|budget spent)\); resumed in a new session after its "
                    r"run died: the box service died", jobs[("own", "softmax")]["state"]), out[-3000:]
    assert jobs[("own", "rms_norm")]["state"] == "done", out[-3000:]
    assert rc == 0 and "status: COMPLETE" in out, out[-3000:]
    # two sessions of one run; the second took on the rest of the died job, then the other
    statuses = [SessionStatus.from_json(f.read_text())
                for f in sorted((run.box / "service").glob("bench-*/status.json"))]
    assert len(statuses) == 2
    first, second = sorted(statuses, key=lambda s: s.session_id)
    assert second.session_id == first.session_id + ".2" and second.state == "done"
    # (then, on a busy machine, top-ups of a job its allotment ended before its points did)
    ids = [e.id for e in second.entries]
    assert ids[:2] == ["own-softmax", "own-rms_norm"], ids
    assert all(re.fullmatch(r"own-(softmax|rms_norm)\.top\d+", i) for i in ids[2:]), ids
    from harness import cards, pools

    own = len(pools.build(cards.INTERPRETER, kinds=["softmax"]).points("own", "softmax"))
    softmax = [r for r in box_rows(run.box) if r["kind"] == "softmax"]
    assert len(softmax) == own and 0 < second.entry("own-softmax").benched < own
    # nothing measured twice, everything measured is merged
    written = box_rows(run.box)
    assert written and max(Counter(r["point_key"] for r in written).values()) == 1
    assert {(r["point_key"], r["run_id"], r["measured_at"]) for r in written} <= \
        measurements(run.db)
    assert len(db_points(run.db)) == len(written)
    assert not session_alive(tmux_socket, run.box) and box_processes(run.box) == []


@pytest.mark.slow
def test_a_service_ended_by_a_hang_up_says_so_and_its_job_resumes(tmp_path: Path,
                                                                 tmux_socket: str) -> None:
    """SIGHUP (its tmux session killed by hand): the service writes its account, the job in
    flight died, the controller says why, and sends what is left as a new session."""
    run = Run(tmp_path, tmux_socket, "-k", "own and (softmax or rms_norm)", "--budget-s=300",
              "--batch=2")
    run.wait_for_box(r"\[batch 1\] own softmax")
    signal_service(run.box, signal.SIGHUP)
    rc, out = run.finish()
    assert rc == 0, out[-3000:]
    jobs = summary_jobs(out)
    # how far the resumed job got depends on the machine's load; that it resumed does not
    assert re.fullmatch(r"done \((pool exhausted|budget spent)\); resumed in a new session after "
                        r"its run died: the service was ended by SIGHUP.*",
                        jobs[("own", "softmax")]["state"]), out[-3000:]
    assert jobs[("own", "rms_norm")]["state"] == "done", out[-3000:]
    (first,) = [SessionStatus.from_json(f.read_text())
                for f in (run.box / "service").glob("bench-*/status.json")
                if not f.parent.name.endswith(".2")]
    assert first.state == "stopped" and first.error == "the service was ended by SIGHUP"
    written = box_rows(run.box)
    assert written and max(Counter(r["point_key"] for r in written).values()) == 1


def test_the_rows_a_run_wrote_mark_its_points_measured_for_a_new_service(tmp_path: Path) -> None:
    """What a service adds to the run's ledger before it plans: each whole row of the run's
    rows files, as its status says; a line that is no row is left out."""
    from harness.box.service import ledger_of_rows

    def row(key: str, status: str) -> str:
        return json.dumps({"point_key": key, "spec": f"S{key}", "regime": "interpret",
                           "status": status, **({"error": "boom"} if status != "ok" else {})})

    (tmp_path / "own-softmax.jsonl").write_text(
        row("a", "ok") + "\n" + "not json\n" + row("b", "bench_fail") + "\n" + row("c", "ok")[:20])
    (tmp_path / "own-rms_norm.jsonl").write_text(row("d", "ok") + "\n")
    (tmp_path / "ledger.json").write_text("{}")  # not a rows file
    book = ledger_of_rows(tmp_path)
    assert sorted(book) == ["a", "b", "d"]
    assert not book.needs_run("a", "interpret") and not book.needs_run("d", "interpret")
    assert book.attempts("b", "interpret") == 1 and book.error("b", "interpret") == "boom"


def test_a_status_naming_a_run_the_controller_never_asked_for_is_left_out() -> None:
    """An entry names the rows file the controller fetches home: only runs of the jobs this run
    sent are taken from a status (a damaged or forged one names others)."""
    from harness.collection import BoxState
    from harness.contract import Entry

    spec = SessionSpec(run_id="bench-1", session_id="bench-1", budget_s=5.0, shares={"own": 1},
                       jobs=(JobRef("own", "softmax"),), s_per_point={}, compile_s={})
    box = BoxState(gpu="local", driver=None, probe={}, card=None, spec=spec,  # type: ignore[arg-type]
                   setup_s=0.0)
    entries = [Entry("own", "softmax", state="done"), Entry("own", "softmax", round=1),
               Entry("own", "../../outside", state="done"), Entry("tail", "softmax"),
               Entry("own", "softmax", round=-1), Entry("own", ["softmax"], state="done")]  # type: ignore[arg-type]
    box.see(SessionStatus(session_id="bench-1", run_id="bench-1", entries=entries))
    assert sorted(box.entries) == ["own-softmax", "own-softmax.top1"]


@pytest.mark.slow
def test_status_shows_the_boxs_session_from_another_terminal(tmp_path: Path,
                                                              tmux_socket: str) -> None:
    """``python -m harness status`` while the run measures, and after it: the lock's holder,
    the session's state and jobs, its tmux session, the log's last lines; it touches nothing."""
    run = Run(tmp_path, tmux_socket, "-k", "own and (matmul or rms_norm)", "--budget-s=300",
              "--batch=2")
    run.wait_for_box(r"\[batch 1\] own")

    def status(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "harness", "status", "--box-dir",
                               str(run.box), "--tmux-socket", tmux_socket, *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)

    during = status()
    assert during.returncode == 0, during.stderr
    out = during.stdout
    name = session_names(str(run.box))[1]
    assert re.search(r"^lock: held by pid \d+ on ", out, re.M), out
    assert re.search(rf"^session bench-\S+ \(run bench-\S+\): running; tmux session {name}: "
                     r"alive$", out, re.M), out
    # the box's own estimates: the job's and the session's time to go, its points so far
    assert re.search(r"^  job 1 of 2 +own-\w+ +running +\d+s of \d+s allotted \(about \d+s to go\), "
                     r"\d+ measured, \d+ of \d+ points left", out, re.M), out
    assert re.search(r"^card Triton CPU interpreter \(interpret\), .*s left, about \d+s to go$",
                     out, re.M), out
    assert re.search(r"^last lines of sweep.log:\n(  .*\n)*  \[batch 1\] own", out, re.M), out
    rc, end = run.finish()
    assert rc == 0, end[-3000:]
    after = status("--json")
    st = json.loads(after.stdout)
    assert st["alive"] is False and st["lock"] is None
    assert st["session"]["state"] == "done"
    # the two jobs (and, on a busy machine, top-ups where budget was left), each done
    states = [e["state"] for e in st["session"]["entries"]]
    assert len(states) >= 2 and set(states) == {"done"}, states
    assert any("session" in line and "done" in line for line in st["log"])
    assert status().stdout.count("\n") > 4  # the finished session's log stays on the box
