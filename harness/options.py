"""A collection run's options: one frozen value, checked once when pytest starts.

``harness.plugin`` checks every option (a bad value is a usage error before anything is
touched) and makes a :class:`RunOptions`; the collection, the harvest and the report read it
and nothing else (never ``config.option``), so every part of a run sees the same values and
the same resolved paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.contract import SlurmOptions, SweepOptions, ToolsSpec


def default_state_dir() -> Path:
    return Path(os.environ.get("EMMY_STATE_DIR", "~/.cache/emmy/node-collect")).expanduser()


@dataclass(frozen=True)
class RunOptions:
    # what to measure
    gpu: str
    gpus: tuple[str, ...]
    budget_s: float
    shares: MappingProxyType[str, float]
    sweep: SweepOptions  # what reaches the box, declared once in harness.contract
    tools: ToolsSpec
    keyword: str | None
    # where it goes (resolved)
    db_path: Path
    ledger_path: Path
    rows_dir: Path
    state_dir: Path
    report_json: Path | None
    no_merge: bool
    # the box
    remote: str | None
    ssh_key: str | None
    known_hosts: Path | None
    accept_new_host_key: bool
    provider: str | None
    up_cmd: str | None
    down_cmd: str | None
    sky_cloud: str | None
    keep_server: bool
    box_python: str | None
    box_install: bool
    box_dir: str | None
    tmux_socket: str | None
    # how the controller watches
    poll_s: float | None
    timeout_s: float | None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)  # --provider slurm's request
    numprocesses: Any = None
    remote_target: Any = field(default=None, compare=False)  # --remote, parsed

    @classmethod
    def from_config(cls, o: Any, *, gpus: list[str], shares: dict[str, float],
                    db: Path | None, report_json: Path | None, remote: Any,
                    sweep: SweepOptions, tools: ToolsSpec,
                    slurm: SlurmOptions | None = None) -> RunOptions:
        """From pytest's parsed options, once they are checked."""
        from harness.store import default_db_path

        state = default_state_dir()
        return cls(
            gpu=o.gpu, gpus=tuple(gpus), budget_s=o.budget_s,
            shares=MappingProxyType(dict(shares)), sweep=sweep, tools=tools,
            keyword=getattr(o, "keyword", None) or None,
            db_path=db or default_db_path(),
            ledger_path=Path(o.ledger).expanduser() if o.ledger else state / "ledger.json",
            rows_dir=Path(o.rows_dir).expanduser() if o.rows_dir else state / "rows",
            state_dir=state, report_json=report_json, no_merge=o.no_merge,
            remote=o.remote, ssh_key=o.ssh_key,
            known_hosts=Path(o.known_hosts).expanduser() if o.known_hosts else None,
            accept_new_host_key=o.accept_new_host_key, provider=o.provider, up_cmd=o.up_cmd,
            down_cmd=o.down_cmd, sky_cloud=o.sky_cloud, keep_server=o.keep_server,
            box_python=o.box_python, box_install=o.box_install, box_dir=o.box_dir,
            tmux_socket=o.tmux_socket, poll_s=o.poll_s, timeout_s=o.timeout_s,
            slurm=slurm or SlurmOptions(), numprocesses=getattr(o, "numprocesses", None), remote_target=remote)

    @property
    def leases_dir(self) -> Path:
        return self.state_dir / "leases"

    @property
    def merging(self) -> bool:
        return not self.no_merge

    def report(self) -> dict[str, Any]:
        """The options ``--report-json`` records (never a command template: an ``--up-cmd``
        may hold a token)."""
        return {"gpu": self.gpu, "gpus": list(self.gpus), "budget_s": self.budget_s,
                "db": str(self.db_path), "ledger": str(self.ledger_path),
                "rows_dir": str(self.rows_dir), "shares": dict(self.shares),
                **self.sweep.to_json(), **self.tools.to_json(),
                "keyword": self.keyword, "timeout_s": self.timeout_s, "poll_s": self.poll_s,
                "no_merge": self.no_merge, "remote": self.remote,
                "provider": self.provider, "numprocesses": self.numprocesses,
                **(self.slurm.to_json() if self.provider == "slurm" else {})}
