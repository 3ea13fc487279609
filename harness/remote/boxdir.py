"""The box folder is the tool's own, and one controller at a time uses it.

Before anything else touches a box, :meth:`BoxLock.acquire` makes one short call that

- makes the folder (mode 0700) and marks it with ``.collect-node-data``; an existing folder
  is used only if it bears the marker or is empty (it is then marked, its mode left as it is);
  any other folder (``/tmp``, a home, one holding files that look like this tool's) is
  refused whatever it holds, and the tool never changes the mode of a folder it did not make;
- takes the lock ``lock.json`` atomically (under ``flock`` on ``.lock``), holding the
  controller's :class:`~harness.owner.Owner` as one line of JSON.

A lock held by another controller is refused at once, unless that controller is gone: on the
same machine, its process no longer exists; on another machine, its heartbeat (the lock's
mtime, touched by every poll) is older than ``stale_s``.  A gone controller's lock is taken
over (compare-and-swap on its exact text) with a warning.  ``release`` removes the lock only
if it is still this controller's.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field

from harness.owner import Owner
from harness.remote.transport import Transport

MARKER = ".collect-node-data"
LOCK = "lock.json"
STALE_S = 900.0  # a lock of another machine's controller untouched this long is taken over

# $1 base, $2 the owner line to write, $3 the exact lock text to take over ("" = none)
_CLAIM = r'''
B=$1 OWNER=$2 EXPECT=$3
if [ -e "$B" ] && [ ! -d "$B" ]; then echo NOTDIR; exit 0; fi
if [ ! -d "$B" ]; then
  mkdir -p -- "$(dirname -- "$B")" 2>/dev/null
  mkdir -m 700 -- "$B" 2>/dev/null
  if [ ! -d "$B" ]; then echo CANNOT; exit 0; fi
  : > "$B/.collect-node-data"
elif [ ! -f "$B/.collect-node-data" ]; then
  if [ -z "$(ls -A -- "$B" 2>/dev/null)" ]; then
    : > "$B/.collect-node-data" 2>/dev/null || { echo CANNOT; exit 0; }
  else
    echo FOREIGN; ls -A -- "$B" | head -n 5; exit 0
  fi
fi
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$B/.lock"
  flock -x -w 30 9 || { echo BUSY; exit 0; }
fi
if [ -f "$B/lock.json" ]; then
  CUR=$(cat "$B/lock.json")
  if [ -z "$EXPECT" ] || [ "$CUR" != "$EXPECT" ]; then
    echo "HELD $(( $(date +%s) - $(stat -c %Y "$B/lock.json") ))"
    printf '%s\n' "$CUR"
    exit 0
  fi
fi
printf '%s\n' "$OWNER" > "$B/lock.json.tmp" && mv -f "$B/lock.json.tmp" "$B/lock.json" && echo TAKEN
'''

_RELEASE = r'''
B=$1 OWNER=$2
if command -v flock >/dev/null 2>&1; then exec 9>>"$B/.lock"; flock -x -w 30 9; fi
if [ "$(cat "$B/lock.json" 2>/dev/null)" = "$OWNER" ]; then rm -f "$B/lock.json"; echo RELEASED; fi
'''


class BoxDirError(RuntimeError):
    """The box folder cannot be used, or another controller holds it: says which and what to do."""


@dataclass
class BoxLock:
    transport: Transport
    base: str
    owner: Owner
    stale_s: float = STALE_S
    held: bool = False
    notes: list[str] = field(default_factory=list)  # a lock taken over, said once

    @property
    def path(self) -> str:
        return posixpath.join(self.base, LOCK)

    def _claim(self, expect: str) -> list[str]:
        r = self.transport.run(["sh", "-c", _CLAIM, "sh", self.base, self.owner.to_json(), expect],
                               check=False, timeout=120)
        lines = r.stdout.splitlines()
        if not lines:
            raise BoxDirError(f"could not prepare the box folder {self.base} on "
                              f"{self.transport.name} (exit {r.rc}): {r.stderr.strip()[-300:]}")
        return lines

    def acquire(self) -> None:
        """Make or check the box folder, then take its lock (or refuse, saying who holds it)."""
        lines = self._claim("")
        word = lines[0].split()[0]
        if word == "HELD":
            age = float(lines[0].split()[1])
            text = "\n".join(lines[1:]).strip()
            try:
                holder = Owner.from_data(json.loads(text))
            except ValueError:
                holder = None
            gone = holder.gone() if holder else None
            if gone is None:  # another machine's controller (or an unreadable lock): its heartbeat
                gone = age > self.stale_s
            if gone:
                lines = self._claim(text)
                word = lines[0].split()[0]
                if word == "TAKEN":
                    who = holder.describe() if holder else "an unreadable lock"
                    self.notes.append(f"box {self.transport.name}: took over the lock of a run "
                                      f"that is gone ({who}; {self.path})")
            if word == "HELD":
                who = holder.describe() if holder else f"unreadable lock text {text[:80]!r}"
                raise BoxDirError(
                    f"box {self.transport.name} is in use by another collect-node-data run "
                    f"({who}; lock {self.path}, touched {age:.0f}s ago): one controller per box. "
                    "Wait for that run to end or stop it (Ctrl-C in its terminal); a lock whose "
                    "controller is gone is taken over by the next run")
        if word == "TAKEN":
            self.held = True
            return
        if word == "FOREIGN":
            shown = ", ".join(lines[1:])
            raise BoxDirError(
                f"--box-dir={self.base}: a folder that is not empty and not collect-node-data's "
                f"(no {MARKER} in it; it holds {shown}…). The run fills its box folder and keeps "
                "it private: give a new or empty folder, e.g. ~/.local/share/emmy/node-collect "
                f"(a box folder of an earlier collect-node-data: mark it with `touch "
                f"{posixpath.join(self.base, MARKER)}`)")
        if word == "NOTDIR":
            raise BoxDirError(f"--box-dir={self.base} exists on {self.transport.name} and is not a "
                              "folder; give a folder path")
        if word == "CANNOT":
            raise BoxDirError(f"--box-dir={self.base}: cannot create it (or write in it) on "
                              f"{self.transport.name}; give a folder you can write to")
        if word == "BUSY":
            raise BoxDirError(f"box {self.transport.name}: the lock file {self.base}/.lock stayed "
                              "busy for 30s; try again")
        raise BoxDirError(f"box folder {self.base}: unexpected answer {lines!r}")

    def release(self) -> None:
        """Give the lock up (only if it is still this controller's)."""
        if not self.held:
            return
        self.transport.run(["sh", "-c", _RELEASE, "sh", self.base, self.owner.to_json()],
                           check=False, timeout=120)
        self.held = False

    def heartbeat_line(self) -> str:
        """A shell fragment for the poll: touch the lock so other machines see it live."""
        return f"touch -c {shlex.quote(self.path)} 2>/dev/null"
