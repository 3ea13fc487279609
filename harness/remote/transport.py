"""The transport seam: run an argv on the box and move files, the same way for every box.

Every command is an argv list.  Where a shell is unavoidable (tmux, one-call polls) the line
is built with :func:`shlex.quote` around every value, never by pasting user text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str


class RemoteCommandError(RuntimeError):
    """A command on the box failed: says which, its exit code and the tail of its output."""

    def __init__(self, where: str, result: CommandResult) -> None:
        self.result = result
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        super().__init__(f"command on {where} failed (exit {result.rc}): "
                         f"{' '.join(result.argv)}\n{tail}")


class SSHError(RuntimeError):
    """An SSH problem the user must fix (host key, authentication, key file): not a blip.

    Defined here, not beside the paramiko code, so callers can catch it without paramiko."""


class BoxUnreachable(ConnectionError):
    """The box did not answer (a dropped connection is not a dead sweep)."""


class Transport(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, timeout: float = 600, check: bool = True,
            env: Mapping[str, str] | None = None) -> CommandResult: ...

    def put_file(self, local: Path, remote: str) -> None: ...

    def get_file(self, remote: str, local: Path) -> bool: ...

    def put_tree(self, local_dir: Path, remote_dir: str, exclude: Sequence[str] = ()) -> None: ...

    def home(self) -> str: ...

    def close(self) -> None: ...


class LocalTransport:
    """This machine is the box (``--gpu=local``)."""

    name = "local"

    def run(self, argv: Sequence[str], *, timeout: float = 600, check: bool = True,
            env: Mapping[str, str] | None = None) -> CommandResult:
        full_env = {**os.environ, **(env or {})}
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                               env=full_env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            res = CommandResult(tuple(argv), 124, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)")
            if check:
                raise RemoteCommandError(self.name, res) from exc
            return res
        res = CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr)
        if check and p.returncode != 0:
            raise RemoteCommandError(self.name, res)
        return res

    def put_file(self, local: Path, remote: str) -> None:
        dest = Path(remote)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(local, tmp)
        os.replace(tmp, dest)

    def get_file(self, remote: str, local: Path) -> bool:
        src = Path(remote)
        if not src.is_file():
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".part")
        try:
            shutil.copyfile(src, tmp)
        except BaseException:  # a full disk: no half copy left behind
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, local)
        return True

    def put_tree(self, local_dir: Path, remote_dir: str, exclude: Sequence[str] = ()) -> None:
        dest = Path(remote_dir)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(local_dir, dest, ignore=shutil.ignore_patterns(*exclude))

    def home(self) -> str:
        return str(Path.home())

    def close(self) -> None:
        pass


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode(errors="replace")
