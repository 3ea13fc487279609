"""A sweep job ended by a signal keeps the ledger marks of every row it wrote.

The job saves its ledger every ``LEDGER_SAVE_S`` rather than after every batch (a long run's
ledger is large), so the marks since the last save live only in memory until the job ends: a
hang-up (``tmux kill-session``) or a terminate must still save them.  Real processes, the
Triton interpreter, real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_job_ended_by_a_signal_saves_the_marks_of_its_rows(tmp_path: Path, sig: int) -> None:
    rows, ledger = tmp_path / "rows.jsonl", tmp_path / "ledger.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.box", "run", "--slice", "own",
                             "--kind", "softmax", "--budget-s", "600", "--batch", "1",
                             "--rows", str(rows), "--ledger", str(ledger)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if rows.exists() and rows.read_text().count("\n") >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the job ended before the signal: {proc.communicate()[0]}"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, out
    written = [json.loads(line)["point_key"] for line in rows.read_text().splitlines()]
    marked = json.loads(ledger.read_text())["points"]
    assert len(written) >= 2
    assert set(written) <= set(marked), "rows written without their ledger marks"
    # each was saved as measured; the job's 12 points were not all done
    assert all(marked[k]["interpret"]["attempts"] == 1 for k in written)
    assert len(written) < 12
