"""The whole collection over SSH: a real sshd on 127.0.0.1 is the box (interpret regime)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.sshd"]
pytestmark = pytest.mark.slow


@pytest.fixture
def tmux_socket():
    name = f"emmy-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def collect_remote(server, tmp_path: Path, socket: str, *args: str,
                   known_hosts: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=auto", "-p", "no:cacheprovider",
           f"--remote={server.remote}", f"--ssh-key={server.client_key}",
           f"--known-hosts={known_hosts or server.known_hosts}", f"--box-python={sys.executable}",
           f"--db={tmp_path / 'db' / 'autotune.db'}", f"--box-dir={tmp_path / 'box'}",
           f"--tmux-socket={socket}", "--poll-s=0.5", "--filter=fp32", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_collect_over_ssh(sshd, tmp_path: Path, tmux_socket: str) -> None:
    r = collect_remote(sshd, tmp_path, tmux_socket, "--budget-s=30", "-k", "softmax")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"box {sshd.remote}" in out or "Triton CPU interpreter (interpret)" in out
    db = sqlite3.connect(tmp_path / "db" / "autotune.db")
    n, kinds = db.execute("select count(*), group_concat(distinct kind) from node").fetchone()
    assert n > 0 and kinds == "softmax"
    # the box's Python was used as it is (nothing installed), and only our folder was made
    box = tmp_path / "box"
    assert (box / "python.path").read_text().strip() == sys.executable
    assert not (box / "venv").exists()
    assert (box / "setup.status").read_text().strip() == "SETUP_OK"
    assert oct((box).stat().st_mode & 0o777) == "0o700"
    assert (box / ".collect-node-data").is_file() and not (box / "lock.json").exists()
    # from another terminal, over SSH: the session the box ran
    st = subprocess.run([sys.executable, "-m", "harness", "status", f"--remote={sshd.remote}",
                         f"--ssh-key={sshd.client_key}", f"--known-hosts={sshd.known_hosts}",
                         f"--box-dir={box}", f"--tmux-socket={tmux_socket}", "--json"],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert st.returncode == 0, st.stdout + st.stderr
    seen = json.loads(st.stdout)
    assert seen["box"] == sshd.remote and seen["alive"] is False and seen["lock"] is None
    assert seen["session"]["state"] == "done"
    assert {e["kind"] for e in seen["session"]["entries"]} == {"softmax"}


def test_unknown_host_key_is_refused_with_the_fix(sshd, tmp_path: Path, tmux_socket: str) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = collect_remote(sshd, tmp_path, tmux_socket, "--budget-s=5", "-k", "own and softmax",
                       known_hosts=empty)
    assert r.returncode != 0
    assert "--accept-new-host-key" in r.stdout
    assert not (tmp_path / "box").exists()
