"""tmux sessions through the local transport: start, poll, status, kill, quoting."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from harness.remote.tmux import Tmux
from harness.remote.transport import LocalTransport, RemoteCommandError


@pytest.fixture
def tmux():
    t = Tmux(LocalTransport(), socket=f"emmy-test-{uuid.uuid4().hex[:8]}")
    yield t
    t.transport.run(["tmux", "-L", t.socket, "kill-server"], check=False)


def _wait_status(tmux: Tmux, name: str, log: Path, status: Path, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = tmux.poll(name, log=str(log), status=str(status))
        if st.status is not None:
            return st
        time.sleep(0.1)
    raise AssertionError("session did not finish")


def test_job_exit_status_and_log(tmux: Tmux, tmp_path: Path) -> None:
    log, status = tmp_path / "job.log", tmp_path / "job.status"
    tmux.start("job", ["sh", "-c", "echo hello; echo last line; exit 3"], cwd=str(tmp_path),
               log=str(log), status=str(status))
    st = _wait_status(tmux, "job", log, status)
    assert st.status == "3"
    assert st.last_line == "last line"
    assert log.read_text() == "hello\nlast line\n"


def test_poll_alive_then_kill(tmux: Tmux, tmp_path: Path) -> None:
    log, status = tmp_path / "l", tmp_path / "s"
    tmux.start("long", ["sleep", "30"], cwd=str(tmp_path), log=str(log), status=str(status))
    st = tmux.poll("long", log=str(log), status=str(status))
    assert st.alive is True and st.status is None
    tmux.kill("long")
    st = tmux.poll("long", log=str(log), status=str(status))
    assert st.alive is False and st.status is None


def test_stale_status_from_an_earlier_job_is_removed_first(tmux: Tmux, tmp_path: Path) -> None:
    log, status = tmp_path / "l", tmp_path / "s"
    status.write_text("0\n")
    tmux.start("job", ["sleep", "30"], cwd=str(tmp_path), log=str(log), status=str(status))
    time.sleep(0.5)
    st = tmux.poll("job", log=str(log), status=str(status))
    assert st.alive is True and st.status is None


@pytest.mark.parametrize("hostile", ["a b", "it's", '"q"', "x; touch pwned", "$(touch pwned)",
                                     "`touch pwned`", "new\nline", "--flag"])
def test_hostile_values_are_passed_verbatim(tmux: Tmux, tmp_path: Path, hostile: str) -> None:
    d = tmp_path / "dir with space; $(x)"
    d.mkdir()
    log, status = d / "o.log", d / "s"
    tmux.start("q", ["printf", "%s", hostile], cwd=str(d), log=str(log), status=str(status),
               env={"EMMY_X": hostile})
    st = _wait_status(tmux, "q", log, status)
    assert st.status == "0"
    assert log.read_text() == hostile
    assert not list(tmp_path.rglob("pwned")) and not (Path.cwd() / "pwned").exists()


def test_local_transport_failure_names_command_and_code() -> None:
    with pytest.raises(RemoteCommandError, match=r"exit 7\): sh -c echo boom; exit 7\n.*boom"):
        LocalTransport().run(["sh", "-c", "echo boom; exit 7"])
