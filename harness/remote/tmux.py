"""Named tmux sessions on the box: long work survives a dropped connection.

A job is ``bash -c '<cmd> > LOG 2>&1; echo $? > STATUS'`` in a detached session, so a
person can ``tmux attach -t emmy-node-sweep`` to watch it, and the exit code lands in a
file that the controller reads in one short call per poll.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.remote.transport import Transport

SETUP_SESSION = "emmy-node-setup"
SWEEP_SESSION = "emmy-node-sweep"


@dataclass(frozen=True)
class JobState:
    """One poll's answer.  ``alive`` None means the box did not answer the poll."""

    alive: bool | None
    status: str | None  # the exit code written by the session, once it ended
    last_line: str


class Tmux:
    def __init__(self, transport: Transport, socket: str | None = None) -> None:
        self.transport = transport
        self.socket = socket

    def _base(self) -> list[str]:
        return ["tmux", "-L", self.socket] if self.socket else ["tmux"]

    def job_line(self, argv: Sequence[str], *, cwd: str, log: str, status: str,
                 env: Mapping[str, str] | None = None) -> str:
        """The shell line a session runs; every value is quoted.  The command writes to the
        log (so a dropped pane never breaks its output), and the pane follows the log, so
        ``tmux attach`` shows it live; the command's own exit code lands in the status file."""
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        q_log, q_status = shlex.quote(log), shlex.quote(status)
        return (f"cd {shlex.quote(cwd)} && {exports}rm -f {q_status}; : > {q_log}; "
                f"{shlex.join(list(argv))} > {q_log} 2>&1 & job=$!; "
                f"tail -n +1 -f --pid=$job {q_log} 2>/dev/null; wait $job; "
                f"echo $? > {q_status}.tmp && mv {q_status}.tmp {q_status}")

    def start(self, name: str, argv: Sequence[str], *, cwd: str, log: str, status: str,
              env: Mapping[str, str] | None = None) -> None:
        """Start a detached session (a stale one of that name is ended first)."""
        self.kill(name)
        # An earlier job's status and log must be gone before the session exists: a poll may
        # come before the session's own shell has run, and must not read the last job's lines.
        self.transport.run(["rm", "-f", status, log], check=False, timeout=60)
        line = self.job_line(argv, cwd=cwd, log=log, status=status, env=env)
        self.transport.run([*self._base(), "new-session", "-d", "-s", name, "bash", "-c", line],
                           timeout=60)

    def alive(self, name: str) -> bool:
        r = self.transport.run([*self._base(), "has-session", "-t", f"={name}"], check=False,
                               timeout=60)
        return r.rc == 0

    def kill(self, name: str) -> None:
        self.transport.run([*self._base(), "kill-session", "-t", f"={name}"], check=False, timeout=60)

    def poll(self, name: str, *, log: str, status: str, extra: str = "") -> JobState:
        """One short call: is the session alive, its exit status if any, the log's last line
        (``extra``, a shell fragment of our own, runs first: the box lock's heartbeat)."""
        base = shlex.join(self._base())
        script = (f"{extra + '; ' if extra else ''}if {base} has-session -t {shlex.quote('=' + name)} 2>/dev/null; "
                  f"then echo SESS=ALIVE; else echo SESS=DEAD; fi; "
                  f"echo STATUS=$(cat {shlex.quote(status)} 2>/dev/null); "
                  f"echo LAST=$(tail -n 1 {shlex.quote(log)} 2>/dev/null)")
        try:
            r = self.transport.run(["sh", "-c", script], check=False, timeout=60)
        except ConnectionError:
            return JobState(None, None, "")
        fields = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        if "SESS" not in fields:
            return JobState(None, None, "")
        return JobState(fields["SESS"] == "ALIVE", fields.get("STATUS") or None,
                        fields.get("LAST", ""))
