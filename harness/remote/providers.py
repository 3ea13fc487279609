"""Servers the run rents: acquire a 1-GPU server for a card, release it at the end.

A :class:`Lease` is written to disk the moment a server exists and removed once it is
released, so a run that dies (a killed worker, Ctrl-C) still leaves the exact release command
behind.  A lease names the controller that rented it: a session releases its own leases, and
another session's only once that controller is provably gone (see ``harness.harvest``).

Providers run command-line tools by argv (never through a shell): ``command`` wraps any
cloud CLI the user names; ``skypilot`` drives SkyPilot's ``sky`` CLI.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.cards import Card

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


class ProviderError(RuntimeError):
    """Renting or releasing failed: says which command, its exit code and output tail."""


def run_argv(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ProviderError(f"{argv[0]!r} not found on PATH (command: {shlex.join(argv)})") from None
    except subprocess.TimeoutExpired:
        raise ProviderError(f"timed out after {timeout:.0f}s: {shlex.join(argv)}") from None


def _checked(runner: Runner, argv: Sequence[str], timeout: float, what: str) -> str:
    p = runner(argv, timeout)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise ProviderError(f"{what} failed (exit {p.returncode}): {shlex.join(argv)}\n{tail}")
    return p.stdout


@dataclass
class Lease:
    """A rented server and how to give it back."""

    provider: str
    gpu: str  # card alias
    target: str  # what --remote would take: user@host:port or an ssh config alias
    handle: str
    release_argv: list[str]
    ssh_key: str | None = None
    path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    owner: dict[str, Any] | None = None  # the controller that rented it (harness.owner.Owner)
    db_id: str | None = None  # the node table its rows belong to

    @property
    def release_command(self) -> str:
        return shlex.join(self.release_argv)

    def save(self, leases_dir: Path) -> Path:
        leases_dir.mkdir(parents=True, exist_ok=True)
        path = leases_dir / f"{self.provider}-{self.gpu}-{secrets.token_hex(4)}.json"
        self.path = str(path)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: Path) -> Lease:
        data = json.loads(path.read_text())
        data["path"] = str(path)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def release(self, runner: Runner = run_argv, timeout: float = 1800) -> None:
        _checked(runner, self.release_argv, timeout, f"releasing {self.target}")
        if self.path:
            Path(self.path).unlink(missing_ok=True)


class Provider(Protocol):
    name: str

    def acquire(self, card: Card, record: Callable[[Lease], None]) -> Lease:
        """Rent a server; ``record(lease)`` is called as soon as a release command exists."""
        ...


_TARGET_RE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.:\[\]_-]+$|^[A-Za-z0-9._-]+@[A-Za-z0-9._-]+:\d+$")


def parse_up_output(stdout: str) -> tuple[str, str | None, str | None, dict[str, str]]:
    """(target, handle, ssh_key, extra) from what an up command printed: a JSON object
    (``ssh_target`` or ``ssh_host``/``ssh_port``/``ssh_user``; ``handle``/``id``/``instance_id``;
    optional ``ssh_key``, ``box_dir`` — the folder to use on the server, e.g. a scratch disk —
    and ``tmux_socket``) or a ``user@host:port`` line.  The last such thing printed wins."""
    candidates: list[Any] = []
    try:
        candidates.append(json.loads(stdout))
    except ValueError:
        pass
    for line in reversed([ln.strip() for ln in stdout.splitlines() if ln.strip()]):
        if line.startswith("{"):
            try:
                candidates.append(json.loads(line))
            except ValueError:
                continue
        elif _TARGET_RE.match(line):
            candidates.append(line)
    for c in candidates:
        if isinstance(c, str):
            return c, None, None, {}
        if isinstance(c, dict):
            target = c.get("ssh_target")
            if not target and c.get("ssh_host"):
                target = c["ssh_host"]
                if c.get("ssh_user"):
                    target = f"{c['ssh_user']}@{target}"
                if c.get("ssh_port"):
                    target = f"{target}:{int(c['ssh_port'])}"
            if target:
                handle = next((str(c[k]) for k in ("handle", "id", "instance_id", "name")
                               if c.get(k) is not None), None)
                if handle is None and c.get("delete_info") is not None:
                    handle = json.dumps(c["delete_info"], sort_keys=True)
                extra = {k: str(c[k]) for k in ("box_dir", "tmux_socket") if c.get(k)}
                return str(target), handle, c.get("ssh_key"), extra
    raise ProviderError("the up command printed no server: expected a JSON object with "
                        "ssh_target (or ssh_host/ssh_port/ssh_user) or a user@host:port line; "
                        f"it printed:\n{stdout[-1500:]}")


def substitute(template: str, values: dict[str, str], option: str) -> list[str]:
    """Split a command template like a shell would, then put values into each word: a value
    is always exactly one argv word's part, never parsed by a shell."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ProviderError(f"{option}={template!r}: {exc}") from None
    if not words:
        raise ProviderError(f"{option} is empty")
    out = []
    for w in words:
        for k, v in values.items():
            w = w.replace("{" + k + "}", v)
        out.append(w)
    unknown = re.findall(r"\{(\w+)\}", " ".join(words))
    bad = sorted(set(unknown) - set(values))
    if bad:
        raise ProviderError(f"{option}: unknown placeholder(s) {', '.join('{' + b + '}' for b in bad)}; "
                            f"valid: {', '.join('{' + k + '}' for k in values)}")
    return out


@dataclass
class CommandProvider:
    """``--provider command --up-cmd '…' --down-cmd '…'``: any CLI that makes a server."""

    up_cmd: str
    down_cmd: str
    runner: Runner = run_argv
    up_timeout_s: float = 3600.0
    name: str = "command"

    def acquire(self, card: Card, record: Callable[[Lease], None]) -> Lease:
        values = {"gpu": card.alias, "gpu_name": card.name}
        out = _checked(self.runner, substitute(self.up_cmd, values, "--up-cmd"), self.up_timeout_s,
                       f"renting a {card.name}")
        target, handle, key, extra = parse_up_output(out)
        down = substitute(self.down_cmd, {**values, "handle": handle or target, "target": target},
                          "--down-cmd")
        lease = Lease(provider=self.name, gpu=card.alias, target=target, handle=handle or target,
                      release_argv=down, ssh_key=key, extra=extra)
        record(lease)
        return lease


# SkyPilot's accelerator names for our cards
SKY_ACCELERATORS = {"l40s": "L40S", "l40": "L40", "l4": "L4", "a10g": "A10G", "a10": "A10",
                    "rtx6000-ada": "RTX6000-Ada", "rtxa6000": "A6000", "h100": "H100",
                    "h200": "H200", "gh200": "GH200", "a100-40": "A100", "a100-80": "A100-80GB",
                    "rtx4090": "RTX4090", "rtx5090": "RTX5090", "b200": "B200"}


@dataclass
class SkyPilotProvider:
    """``--provider skypilot``: one GPU of the card's type through SkyPilot's ``sky`` CLI.

    SkyPilot adds each cluster to ``~/.ssh/config``, so the cluster name is the SSH target.
    """

    runner: Runner = run_argv
    cloud: str | None = None
    name: str = "skypilot"

    def acquire(self, card: Card, record: Callable[[Lease], None]) -> Lease:
        acc = SKY_ACCELERATORS.get(card.alias)
        if acc is None:
            raise ProviderError(f"SkyPilot has no accelerator for {card.name}; cards it can rent: "
                                f"{', '.join(SKY_ACCELERATORS)}")
        cluster = f"emmy-{card.alias}-{secrets.token_hex(3)}"
        argv = ["sky", "launch", "-y", "-c", cluster, "--gpus", f"{acc}:1"]
        if self.cloud:
            argv += ["--cloud", self.cloud]
        lease = Lease(provider=self.name, gpu=card.alias, target=cluster, handle=cluster,
                      release_argv=["sky", "down", "-y", cluster])
        record(lease)  # before the launch: an interrupted launch still leaves its release command
        try:
            _checked(self.runner, argv, 3600, f"renting a {card.name} through SkyPilot")
        except ProviderError:
            # a half-made cluster still costs money: take it down before failing
            self.runner(lease.release_argv, 1800)
            raise
        return lease


def make_provider(name: str, up_cmd: str | None, down_cmd: str | None,
                  cloud: str | None = None) -> Provider:
    if name == "command":
        if not up_cmd or not down_cmd:
            raise ProviderError("--provider command needs --up-cmd and --down-cmd")
        return CommandProvider(up_cmd, down_cmd)
    if name == "skypilot":
        return SkyPilotProvider(cloud=cloud)
    raise ProviderError(f"--provider={name!r}: valid providers are 'command' and 'skypilot'")
