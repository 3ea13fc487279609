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

    # not on a terminal: plain lines, each under 120 characters, no lists of statuses, few
    lines = r.stdout.splitlines()
    assert all(len(line) < 120 for line in lines), [x for x in lines if len(x) >= 120]
    assert "statuses" not in out and "[batch" not in out
    assert len(lines) <= 60, r.stdout
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


def test_a_box_with_another_card_is_refused_before_any_setup(tmp_path: Path,
                                                             tmux_socket: str) -> None:
    r = _collect(tmp_path, tmux_socket, "--gpu=h200", "--budget-s=20", "-k", "own")
    out = r.stdout + r.stderr
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    # refused at the first look at the box: its folder holds only the run's claim on it (no
    # code, no environment, no job), no tmux server was started, no row was written
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == [".collect-node-data", ".lock"]
    assert subprocess.run(["tmux", "-L", tmux_socket, "ls"], capture_output=True).returncode != 0
    assert sqlite3.connect(tmp_path / "db" / "autotune.db").execute(
        "select count(*) from node").fetchone() == (0,)
    # one message: the card asked for, the card found, and what to do
    assert out.count("wants NVIDIA H200 141GB") == 1, out
    assert re.search(r"ERROR: --gpu=h200 wants NVIDIA H200 141GB but box local has no NVIDIA GPU "
                     r"\(nvidia-smi finds none\); nothing was set up or measured: run with "
                     r"--gpu=interpret \(the card it has\) or --gpu=auto, or use a box with "
                     r"NVIDIA H200 141GB", " ".join(out.split())), out
    # a usage error, not jobs: no failure, no skip, no job table
    assert "SKIPPED" not in out and "FAILED" not in out.replace("status: FAILED", "")
    assert "failed" not in r.stdout.splitlines()[-1] and "skipped" not in out
    assert "status: FAILED (usage error: --gpu=h200 refused, the box has another card" in out
    assert not (tmp_path / "box" / "setup.log").exists() and not (tmp_path / "box" / "repo").exists()
    assert not (tmp_path / "box" / "lock.json").exists()  # the box is free again


def _on_a_terminal(cmd: list[str], env: dict[str, str], columns: int = 100,
                   timeout: float = 600) -> tuple[int, str]:
    """Run ``cmd`` on a pseudo-terminal ``columns`` wide; its exit status and all it wrote."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal's size, then the run
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        os.chdir(ROOT)
        os.execvpe(cmd[0], cmd, {**{k: v for k, v in env.items() if k != "COLUMNS"},
                                 "TERM": "xterm"})
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child ended: the terminal is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows once ``raw`` is written: a carriage return goes back to the
    line's start, and what follows overwrites it."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw).replace("\r\n", "\n")
    lines = []
    for line in text.split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown.rstrip())
    return lines


def test_on_a_terminal_each_job_has_one_line_that_redraws_itself(tmp_path: Path,
                                                                 tmux_socket: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=local", "-p", "no:cacheprovider",
           f"--db={tmp_path / 'db' / 'autotune.db'}", f"--box-dir={tmp_path / 'box'}",
           f"--tmux-socket={tmux_socket}", "--poll-s=0.3", "--filter=fp32", "--max-dist=1",
           "--budget-s=120", "-k", "own and (softmax or rms_norm)"]
    rc, raw = _on_a_terminal(cmd, env, columns=130)
    screen = _screen(raw)
    assert rc == 0, "\n".join(screen[-40:])
    jobs = [line for line in screen if re.match(r"local own-\w+ \[job \d/2\]: ", line)]
    # one line per job, each left with its result: points of the job's, the pace, the best time
    assert [line.split(" [")[0] for line in jobs] == ["local own-softmax", "local own-rms_norm"] \
        or [line.split(" [")[0] for line in jobs] == ["local own-rms_norm", "local own-softmax"], \
        "\n".join(screen)
    for line in jobs:
        assert re.match(r"local own-\w+ \[job \d/2\]: [1-9]\d*/\d+ pts(, | \|[^|]+\| +)[\d.]+(pt/s|s/pt), "
                        r"in \d\d:\d\d, done \((pool exhausted|budget spent)\); best [\d.]+m?s",
                        line), line
        assert 100 < len(line) < 130  # the terminal's width, not a default 80
    # redrawn in place as the box measured: the same job's line drawn several times
    first = jobs[0].split(":")[0]
    assert raw.count(first + ":") >= 3, raw
    assert re.search(re.escape(first) + r": \d+/\d+ pts \|[^|]*\| +\S+, ETA job \d\d:\d\d, "
                     r"session \d\d:\d\d", raw), raw
    # pytest's own letters and file name for the jobs are left out: the job lines say it
    assert "collect_tests/test_sweep.py" not in raw
    assert "status: COMPLETE (sweep done + merge done)" in screen
