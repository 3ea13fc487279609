"""Who runs a collection, and whether that controller is gone.

An :class:`Owner` is written wherever a run leaves something another run may find: the box's
lock, a run's folder of rows, a rented server's lease.  A later run decides from it whether
the thing is still in use: on the same machine a controller is *gone* when its process no
longer exists (or the pid now belongs to another process, told apart by its start time); on
another machine this cannot be proven, and the caller falls back on a heartbeat's age.
Stdlib only.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def machine_id() -> str:
    """This machine's identity: systemd's machine id (a container has its own), else the
    host name."""
    return _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or socket.gethostname()


def process_start(pid: int) -> str:
    """A token of when process ``pid`` started (boot id and start ticks), "" if unknown: a
    pid reused by another process has another token."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return ""
    try:
        ticks = stat.rsplit(")", 1)[1].split()[19]
    except IndexError:
        return ""
    return f"{_read('/proc/sys/kernel/random/boot_id')[:8]}:{ticks}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs.  A zombie (killed, not yet reaped by its parent: an
    orphan whose new parent does not reap) runs no more: its locks are free."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    stat = _read(f"/proc/{pid}/stat")
    try:
        return not stat or stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except IndexError:
        return True


@dataclass(frozen=True)
class Owner:
    """The controller process of one collection session."""

    host: str
    machine: str
    pid: int
    pid_start: str
    started_at: str
    session: str

    @classmethod
    def here(cls, session: str) -> Owner:
        pid = os.getpid()
        return cls(host=socket.gethostname(), machine=machine_id(), pid=pid,
                   pid_start=process_start(pid),
                   started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), session=session)

    def to_json(self) -> str:
        """One line of JSON (the box's lock compares it as text)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_data(cls, data: Any) -> Owner | None:
        """An owner from decoded JSON; None when it is not one."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(host=str(data["host"]), machine=str(data["machine"]), pid=int(data["pid"]),
                       pid_start=str(data.get("pid_start") or ""),
                       started_at=str(data.get("started_at") or ""),
                       session=str(data.get("session") or ""))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def here_too(self) -> bool:
        """Whether this owner ran on this machine (so its process can be checked)."""
        return self.machine == machine_id()

    def gone(self) -> bool | None:
        """True if provably gone (this machine, its process no longer exists or is another
        one), False if it runs, None if it ran on another machine (cannot be told here)."""
        if not self.here_too:
            return None
        if not pid_alive(self.pid):
            return True
        now = process_start(self.pid)
        return bool(self.pid_start and now and now != self.pid_start)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started_at}"
