"""The box folder is the tool's own and one controller holds it: real files, a real ``flock``,
real processes (a controller that is gone is a process that has exited)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.owner import Owner, process_start
from harness.remote.boxdir import MARKER, BoxDirError, BoxLock
from harness.remote.transport import LocalTransport


def owner(session: str = "s1", pid: int | None = None) -> Owner:
    me = Owner.here(session)
    if pid is None:
        return me
    return Owner(host=me.host, machine=me.machine, pid=pid, pid_start=process_start(pid) or "x",
                 started_at=me.started_at, session=session)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_new_folder_is_made_private_marked_and_locked(tmp_path: Path) -> None:
    base = tmp_path / "deep" / "box"
    lock = BoxLock(LocalTransport(), str(base), owner())
    lock.acquire()
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert (base / MARKER).is_file()
    assert json.loads((base / "lock.json").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (base / "lock.json").exists()


@pytest.mark.parametrize("name", ["tmp-like", "home-like"])
def test_a_foreign_folder_is_refused_and_left_as_it_was(tmp_path: Path, name: str) -> None:
    base = tmp_path / name
    base.mkdir(mode=0o755)
    (base / "notes.txt").write_text("mine\n")
    before = sorted(p.name for p in base.iterdir()), stat.S_IMODE(base.stat().st_mode)
    with pytest.raises(BoxDirError, match=rf"--box-dir={base}: a folder that is not empty and not "
                                          rf"collect-node-data's \(no {MARKER} in it; it holds notes.txt"):
        BoxLock(LocalTransport(), str(base), owner()).acquire()
    assert (sorted(p.name for p in base.iterdir()), stat.S_IMODE(base.stat().st_mode)) == before


def test_an_empty_folder_is_used_and_its_mode_left_alone(tmp_path: Path) -> None:
    base = tmp_path / "empty"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    BoxLock(LocalTransport(), str(base), owner()).acquire()
    assert stat.S_IMODE(base.stat().st_mode) == 0o755
    assert (base / MARKER).is_file()


@pytest.mark.parametrize("holds", ["setup.status", "repo/harness/box/__main__.py"])
def test_an_unmarked_folder_is_refused_whatever_it_holds(tmp_path: Path, holds: str) -> None:
    """Files that look like this tool's do not make a folder its own: only the marker does (a
    box folder of an earlier version is marked by hand, as the error says)."""
    base = tmp_path / "other"
    (base / holds).parent.mkdir(parents=True, exist_ok=True)
    (base / holds).write_text("someone else's\n")
    with pytest.raises(BoxDirError, match=rf"not collect-node-data's \(no {MARKER} in it; it holds "
                                          rf".*mark it with `touch {base}/{MARKER}`"):
        BoxLock(LocalTransport(), str(base), owner()).acquire()
    assert not (base / MARKER).exists() and (base / holds).read_text() == "someone else's\n"
    (base / MARKER).touch()
    BoxLock(LocalTransport(), str(base), owner()).acquire()  # marked: it is the tool's


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(BoxDirError, match="exists on local and is not a folder"):
        BoxLock(LocalTransport(), str(tmp_path / "f"), owner()).acquire()


def test_a_live_controller_keeps_the_box_a_second_is_refused_at_once(tmp_path: Path) -> None:
    first = BoxLock(LocalTransport(), str(tmp_path / "box"), owner("a"))
    first.acquire()
    second = BoxLock(LocalTransport(), str(tmp_path / "box"), owner("b"))
    with pytest.raises(BoxDirError, match=rf"box local is in use by another collect-node-data run "
                                          rf"\(pid {os.getpid()} on .*one controller per box"):
        second.acquire()
    second.release()  # never held: a no-op that leaves the first's lock
    assert json.loads((tmp_path / "box" / "lock.json").read_text())["session"] == "a"


def test_a_gone_controllers_lock_is_taken_over_with_a_note(tmp_path: Path) -> None:
    gone = BoxLock(LocalTransport(), str(tmp_path / "box"), owner("old", pid=dead_pid()))
    gone.acquire()
    mine = BoxLock(LocalTransport(), str(tmp_path / "box"), owner("new"))
    mine.acquire()
    assert mine.held and len(mine.notes) == 1 and "took over the lock of a run that is gone" in mine.notes[0]
    assert json.loads((tmp_path / "box" / "lock.json").read_text())["session"] == "new"
    gone.release()  # the old owner's release never removes the new owner's lock
    assert (tmp_path / "box" / "lock.json").exists()


def test_another_machines_lock_is_taken_over_only_when_its_heartbeat_is_stale(tmp_path: Path) -> None:
    far = Owner(host="elsewhere", machine="another-machine", pid=1, pid_start="", started_at="t",
                session="far")
    BoxLock(LocalTransport(), str(tmp_path / "box"), far).acquire()
    with pytest.raises(BoxDirError, match="in use by another collect-node-data run"):
        BoxLock(LocalTransport(), str(tmp_path / "box"), owner()).acquire()
    old = os.stat(tmp_path / "box" / "lock.json").st_mtime - 3600
    os.utime(tmp_path / "box" / "lock.json", (old, old))
    taker = BoxLock(LocalTransport(), str(tmp_path / "box"), owner(), stale_s=900)
    taker.acquire()
    assert taker.held


def test_of_many_controllers_racing_for_a_gone_ones_lock_exactly_one_wins(tmp_path: Path) -> None:
    BoxLock(LocalTransport(), str(tmp_path / "box"), owner("old", pid=dead_pid())).acquire()
    won, refused = [], []

    def race(i: int) -> None:
        lock = BoxLock(LocalTransport(), str(tmp_path / "box"), owner(f"racer-{i}"))
        try:
            lock.acquire()
            won.append(i)
        except BoxDirError:
            refused.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 5
    assert json.loads((tmp_path / "box" / "lock.json").read_text())["session"] == f"racer-{won[0]}"


def test_owner_of_a_live_process_a_gone_one_and_another_machine() -> None:
    assert owner().gone() is False
    assert owner(pid=dead_pid()).gone() is True
    assert Owner("h", "other-machine", 1, "", "", "s").gone() is None
    reused = Owner.here("s")
    reused = Owner(reused.host, reused.machine, reused.pid, "boot:123", reused.started_at, "s")
    assert reused.gone() is True  # same pid, another start: another process


def test_a_killed_controller_not_yet_reaped_holds_no_lock(tmp_path: Path) -> None:
    """kill -9 of a controller whose parent does not reap it leaves a zombie: its pid still
    answers, with its start time, but it runs no more."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start(proc.pid)
        zombie = Owner(**{**owner().__dict__, "pid": proc.pid, "pid_start": start})
        held = BoxLock(LocalTransport(), str(tmp_path / "box"), zombie)
        held.acquire()
        proc.kill()
        deadline = time.monotonic() + 10
        while (Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
               and time.monotonic() < deadline):
            time.sleep(0.05)  # not waited for: a zombie until reaped
        assert process_start(proc.pid) == start
        mine = BoxLock(LocalTransport(), str(tmp_path / "box"), owner())
        mine.acquire()
        assert mine.held and "took over the lock of a run that is gone" in mine.notes[0]
    finally:
        proc.kill()
        proc.wait()
