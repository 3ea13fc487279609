"""Chaos: the controller is interrupted at random moments, several times in a row over one node
table, then a run goes to the end; nothing measured may be lost and no point may be there twice.

Each round starts ``pytest collect_tests --gpu=local`` (interpreter, real tmux, real SQLite)
and, at a moment drawn from a seeded RNG, sends SIGINT (to the process group, as Ctrl-C does),
SIGTERM or SIGKILL (to the process): during setup, mid-job, or just as a job's rows are being
merged.  The seed is printed; ``CHAOS_SEED=N`` replays a sequence.  Then:

Two box faults follow, mid-job: the box service is killed (SIGKILL) while a second run, with a
box folder and node table of its own, measures on the same tmux server (it must end COMPLETE,
unharmed); then the tmux server itself is killed.  Each time the job's rows come home and a new
session measures what is left of it.  Then:

- every row any run wrote on the box is in the node table (as a node's current measurement or
  one it absorbed), so nothing measured was lost;
- no (point, regime) is in the node table twice;
- every point the ledger calls done has its row in the node table;
- no sweep session, job process or box lock is left behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from harness.ledger import Ledger
from tests.runs import (
    Run,
    box_processes,
    box_rows,
    db_points,
    measurements,
    session_alive,
    signal_service,
    summary_jobs,
)

pytestmark = pytest.mark.slow

SELECTION = ("-k", "(own or cross) and (matmul or softmax or reduce)", "--budget-s=400")
# the box faults: kinds the rounds above leave alone, so each fault strikes a job with points
SERVICE_FAULT = ("-k", "own and rms_norm", "--budget-s=120", "--batch=2")
TMUX_FAULT = ("-k", "cross and rms_norm", "--budget-s=120", "--batch=2")
MOMENTS = ("setup", "mid-job", "merge")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


@pytest.fixture
def tmux_socket():
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def test_random_interruptions_lose_nothing_and_duplicate_nothing(tmp_path: Path, tmux_socket: str,
                                                                 capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    rng = random.Random(seed)
    with capsys.disabled():
        print(f"\n[chaos] seed {seed} (CHAOS_SEED={seed} replays it)")
    plan = [(rng.choice(MOMENTS), rng.choice(SIGNALS)) for _ in range(4)]
    # every moment and every signal at least once, in a seeded order
    plan[:3] = rng.sample([(m, s) for m, s in zip(MOMENTS, rng.sample(SIGNALS, 3), strict=True)], 3)
    for i, (moment, sig) in enumerate(plan):
        # -v: every step is printed (the box's batches, each merge), so the moment is seen
        run = Run(tmp_path, tmux_socket, *SELECTION, "-v", name=f"{i}-{moment}-{sig.name}")
        if moment == "setup":
            run.wait_for(r"setup in tmux session", timeout=120)
            time.sleep(rng.uniform(0.0, 1.5))
        elif moment == "mid-job":
            run.wait_for(r"\[batch \d+\]", timeout=180)
            time.sleep(rng.uniform(0.0, 3.0))
        else:
            run.wait_for(r": merging the rows of [\w.-]+ into", timeout=240)
        if run.proc.poll() is None:
            run.signal(sig, group=sig != signal.SIGKILL)
        rc, out = run.finish(timeout=180)
        with capsys.disabled():
            print(f"[chaos] round {i}: {sig.name} at {moment} -> exit {rc}")
        assert "Traceback" not in out or sig == signal.SIGKILL, out[-3000:]
        if sig != signal.SIGKILL and rc != 0:
            assert rc == pytest.ExitCode.INTERRUPTED, out[-3000:]

    # the box service dies mid-job while another run shares the tmux server
    (tmp_path / "other").mkdir()
    other = Run(tmp_path / "other", tmux_socket, "-k", "own and matmul", "--budget-s=60",
                name="bystander", state=tmp_path / "other" / "state")
    run = Run(tmp_path, tmux_socket, *SERVICE_FAULT, name="service-killed")
    run.wait_for_box(r"\[batch 1\] own rms_norm", timeout=240)
    signal_service(run.box, signal.SIGKILL)
    assert other.proc.poll() is None  # the other run was measuring when it happened
    rc, out = run.finish(timeout=400)
    with capsys.disabled():
        print(f"[chaos] box service killed -> exit {rc}")
    assert "Traceback" not in out and rc == 0, out[-3000:]
    assert "resumed in a new session after its run died: the box service died" in \
        summary_jobs(out)[("own", "rms_norm")]["state"], out[-3000:]
    rc, out = other.finish(timeout=400)
    assert rc == 0 and "status: COMPLETE" in out, out[-3000:]
    assert box_rows(other.box) and len(db_points(other.db)) == len(box_rows(other.box))

    # the tmux server is killed mid-job (the box rebooted, say)
    run = Run(tmp_path, tmux_socket, *TMUX_FAULT, name="tmux-server-killed")
    run.wait_for_box(r"\[batch 1\] cross rms_norm", timeout=240)
    subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], check=True)
    rc, out = run.finish(timeout=400)
    with capsys.disabled():
        print(f"[chaos] tmux server killed -> exit {rc}")
    assert "Traceback" not in out and rc == 0, out[-3000:]
    assert "resumed in a new session after its run died" in \
        summary_jobs(out)[("cross", "rms_norm")]["state"], out[-3000:]

    final = Run(tmp_path, tmux_socket, *SELECTION, name="final")
    rc, out = final.finish(timeout=400)
    assert rc == 0, out[-4000:]
    assert "status: COMPLETE" in out

    wrote = {(r["point_key"], r["run_id"], r["measured_at"]) for r in box_rows(final.box)}
    assert wrote, "no rows were written"
    lost = wrote - measurements(final.db)
    assert not lost, f"seed {seed}: {len(lost)} rows written on the box are not in the node table"
    points = db_points(final.db)
    assert len(points) == len({(k, regime) for k, regime, _ in points}), f"seed {seed}: a point twice"
    in_db = {(k, regime) for k, regime, status in points if status in ("ok", "bench_fail")}
    book = Ledger.load(tmp_path / "state" / "ledger.json")
    done = {(k, "interpret") for k in book if not book.needs_run(k, "interpret")}
    assert done and done <= in_db, f"seed {seed}: the ledger calls points done that are not there"
    assert not session_alive(tmux_socket, final.box) and box_processes(final.box) == []
    assert not (final.box / "lock.json").exists()
