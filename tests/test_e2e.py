"""End to end: ``pytest collect_tests --gpu=local`` in the interpret regime, real tmux, real DB."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture
def tmux_socket():
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def _collect(tmp_path: Path, socket: str, *args: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env.update(extra)
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=local", "-p", "no:cacheprovider",
           f"--db={tmp_path / 'db' / 'autotune.db'}", f"--box-dir={tmp_path / 'box'}",
           f"--tmux-socket={socket}", "--poll-s=0.5", "--filter=fp32", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_collect_local_interpret_end_to_end(tmp_path: Path, tmux_socket: str) -> None:
    r = _collect(tmp_path, tmux_socket, "--budget-s=400", "--max-dist=1", "--tail-cap=3", "-k", "matmul or softmax")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "=== collect-node-data summary ===" in out
    assert "merged " in out and "backup: " in out, out[-3000:]

    db = sqlite3.connect(tmp_path / "db" / "autotune.db")
    rows = db.execute("select gpu, regime, kind, slice, status, value_us, n_samples, features, "
                      "shape_spec, point_key from node").fetchall()
    assert rows, "no rows merged"
    assert {r[0] for r in rows} == {"Triton CPU interpreter"}
    assert {r[1] for r in rows} == {"interpret"}
    assert {r[2] for r in rows} == {"matmul", "softmax"}
    assert {r[3] for r in rows} == {"own", "cross", "tail"}
    ok = [r for r in rows if r[4] == "ok"]
    assert len(ok) >= 0.9 * len(rows)
    assert all(r[5] > 0 and r[6] == 3 for r in ok)
    assert all('"H_sm_count"' in r[7] and '"S_kind"' in r[7] for r in rows)
    assert len({r[9] for r in rows}) == len(rows)
    assert list((tmp_path / "db" / "backups").glob("autotune-*.db"))
    # the sessions are gone once the run ends
    left = subprocess.run(["tmux", "-L", tmux_socket, "list-sessions", "-F", "#S"],
                          capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout

    # progress names the job (k of N) and the session's time left, and a job's lines are its own
    assert re.search(r"local own-\w+ \[job 1 of \d+, \d+s of the session left\]: \d+s allotted", out)
    for m in re.finditer(r"local (\w+)-(\w+) \[job \d+ of \d+, [^\]]*\]: \[batch \d+\] (\w+) (\w+)", out):
        assert (m[1], m[2]) == (m[3], m[4]), m[0]
    assert "status: COMPLETE (sweep done + merge done)" in out

    # resume: what the node table holds is not measured again
    n_before = len(rows)
    r2 = _collect(tmp_path, tmux_socket, "--budget-s=20", "--max-dist=1", "--tail-cap=3", "-k", "own and softmax")
    assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    assert re.search(r"all \d+ softmax points of the own slice on Triton CPU interpreter are in "
                     r"the node table already", r2.stdout), r2.stdout[-2000:]
    n_after = db.execute("select count(*) from node").fetchone()[0]
    assert n_after == n_before


def test_a_box_python_without_torch_is_refused_naming_the_pythons_that_have_it(
        tmp_path: Path, tmux_socket: str) -> None:
    """Nothing is downloaded: the refusal lists the box's Pythons that import torch and triton
    (here a venv-like folder in the box user's home) and the --box-python to pass."""
    home = tmp_path / "home"
    bare = home / "bare" / "bin" / "python"
    found = home / "torchenv" / "bin" / "python"
    for path, body in ((bare, 'exec "$0.real" "$@"\n'), (found, f'exec {sys.executable} "$@"\n')):
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    bare.with_name("python.real").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    env_home = {"HOME": str(home)}
    r = _collect(tmp_path, tmux_socket, f"--box-python={bare}", "--budget-s=20", "-k", "own and softmax",
                 env=env_home)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert f"--box-python={bare} on local cannot import torch and triton; these Pythons on the box " \
           "have them:" in out, out[-3000:]
    assert f"\n  {found} (torch " in out  # listed (after any on the PATH)
    assert "pass one as --box-python=PATH (e.g. --box-python=" in out
    assert "--box-install" in out
    assert not (tmp_path / "box" / "venv").exists()


def test_a_box_with_another_card_is_refused_in_seconds_before_any_setup(tmp_path: Path,
                                                                      tmux_socket: str) -> None:
    t0 = time.monotonic()
    r = _collect(tmp_path, tmux_socket, "--gpu=h200", "--budget-s=20", "-k", "own")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert time.monotonic() - t0 < 60  # seconds here; the bound holds on a loaded machine
    assert "--gpu=h200 wants NVIDIA H200 141GB but box local has no NVIDIA GPU" in out
    assert out.count("wants NVIDIA H200 141GB") <= 3  # said once: the failure, its table line, -ra
    assert "is unusable: see the first job's failure" in out
    assert not (tmp_path / "box" / "setup.log").exists() and not (tmp_path / "box" / "repo").exists()
    assert "status: FAILED (1 job(s) failed" in out
