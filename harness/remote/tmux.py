"""Named tmux sessions on the box: long work survives a dropped connection.

A job is ``bash -c '<cmd> > LOG 2>&1; echo $? > STATUS'`` in a detached session, so a
person can ``tmux attach -t emmy-node-sweep-<id>`` to watch it, and the exit code lands in a
file that the controller reads in one short call per poll.  A box folder's sessions carry its
own id (:func:`session_names`): two runs with different box folders never see, or end, each
other's sessions on one tmux server.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.remote.transport import Transport

SETUP_SESSION = "emmy-node-setup"
SWEEP_SESSION = "emmy-node-sweep"


def session_names(base: str) -> tuple[str, str]:
    """The setup and sweep session names of the box folder ``base`` (its path on the box):
    the prefixes above and the first 8 hex digits of the path's SHA-1."""
    tag = hashlib.sha1(base.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{SETUP_SESSION}-{tag}", f"{SWEEP_SESSION}-{tag}"


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

    def poll(self, name: str, *, log: str, status: str, extra: str = "", wait_s: float = 0.0,
             until: str | None = None) -> JobState:
        """One call: is the session alive, the status file's text if there is one (its lines
        joined by spaces: an exit code, or a session's one-line JSON status), the log's last
        line (``extra``, a shell fragment of our own, runs first: the box lock's heartbeat).
        Both files are printed as they are, never through the shell's word splitting or
        globbing.  With ``wait_s`` the call waits on the box, for up to that long, until the
        shell condition ``until`` (of our own) holds or the session ends: the controller
        learns of an event at once, in one call per ``wait_s``."""
        base = shlex.join(self._base())
        alive = f"{base} has-session -t {shlex.quote('=' + name)} 2>/dev/null"
        wait = ""
        if wait_s > 0 and until:
            wait = (f"i=0; while [ $i -lt {max(1, int(wait_s * 4))} ] && ! {{ {until}; }} && "
                    f"{alive}; do sleep 0.25; i=$((i+1)); done; ")
        script = (f"{extra + '; ' if extra else ''}{wait}if {alive}; "
                  f"then echo SESS=ALIVE; else echo SESS=DEAD; fi; "
                  f"printf 'STATUS='; tr '\\n' ' ' 2>/dev/null < {shlex.quote(status)}; echo; "
                  f"printf 'LAST='; tail -n 1 {shlex.quote(log)} 2>/dev/null | tr -d '\\n'; echo")
        try:
            r = self.transport.run(["sh", "-c", script], check=False, timeout=60 + wait_s)
        except ConnectionError:
            return JobState(None, None, "")
        fields: dict[str, str] = {}
        for line in r.stdout.splitlines():
            word, eq, rest = line.partition("=")
            if eq and word in ("SESS", "STATUS", "LAST") and word not in fields:
                fields[word] = rest
        if "SESS" not in fields:
            return JobState(None, None, "")
        return JobState(fields["SESS"] == "ALIVE", fields.get("STATUS", "").strip() or None,
                        fields.get("LAST", ""))
