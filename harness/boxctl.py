"""The controller's handle on one box: push the code, set up, probe, plan, run jobs, harvest.

Everything long-running runs inside the box's named tmux sessions; the controller only makes
short calls (start a session, one poll, fetch a file), so a dropped connection costs a poll,
never the work.  Remote layout under ``base`` (default ``~/.local/share/emmy/node-collect``):
``repo/ setup.log setup.status probe.json pool.json ledger.json sweep.log sweep.status
rows/<run_id>/<slice>-<kind>.jsonl summary/<run_id>/<slice>-<kind>.json``.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import harness
from harness.remote.tmux import SETUP_SESSION, SWEEP_SESSION, JobState, Tmux
from harness.remote.transport import Transport

DEFAULT_BASE = "~/.local/share/emmy/node-collect"
CODE_ROOT = Path(harness.__file__).resolve().parent.parent
_EXCLUDE = ("__pycache__", "*.pyc", ".pytest_cache")
RECONNECT_S = 900.0  # how long a start, stop or fetch waits for a box that stopped answering

T = TypeVar("T")


class BoxError(RuntimeError):
    """The box cannot be used: says why and what to do."""


@dataclass
class JobOutcome:
    """What one sweep job did, as the controller saw it."""

    state: str  # done | stopped (timeout) | died | failed
    summary: dict[str, Any] = field(default_factory=dict)
    rows_path: Path | None = None
    log_tail: str = ""
    elapsed_s: float = 0.0


@dataclass
class BoxDriver:
    transport: Transport
    tmux: Tmux
    base: str = DEFAULT_BASE
    python: str = "python3"
    use_venv: bool = False  # remote boxes get a venv; this machine uses the running python
    env: dict[str, str] = field(default_factory=dict)
    poll_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    reconnect_s: float = RECONNECT_S

    def __post_init__(self) -> None:
        if self.base.startswith("~"):
            self.base = self.transport.home() + self.base[1:]

    def path(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts)

    # -- setup --------------------------------------------------------------------------------
    def refuse_if_busy(self) -> None:
        if self.tmux.alive(SWEEP_SESSION):
            sock = f" -L {self.tmux.socket}" if self.tmux.socket else ""
            raise BoxError(
                f"a sweep is already running on {self.transport.name} (tmux session "
                f"{SWEEP_SESSION!r}); watch it with `tmux{sock} attach -t {SWEEP_SESSION}` or end "
                f"it with `tmux{sock} kill-session -t {SWEEP_SESSION}`, then run again")

    def push_code(self) -> None:
        self.transport.run(["mkdir", "-p", self.path("rows"), self.path("summary")])
        # private: the rows are measurements that cost GPU-hours, the folder holds our code
        self.transport.run(["chmod", "700", self.base, self.path("rows"), self.path("summary")])
        self.transport.put_tree(CODE_ROOT / "harness", self.path("repo", "harness"), _EXCLUDE)

    def setup_script(self) -> str:
        """The setup run in tmux: a venv that sees the box's own torch and Triton (installed
        only where missing), an import check, then the probe.  One word lands in
        ``setup.status``: SETUP_OK or SETUP_FAIL."""
        q = shlex.quote
        probe = f"cd {q(self.path('repo'))} && {q(self.box_python)} -m harness.box probe --out {q(self.path('probe.json'))}"
        if not self.use_venv:
            body = f"{q(self.python)} -c 'import torch, triton' && {probe}"
        else:
            venv = self.path("venv")
            body = (f"( [ -x {q(venv)}/bin/python ] || {q(self.python)} -m venv --system-site-packages {q(venv)} ) && "
                    f"( {q(venv)}/bin/python -c 'import torch' || {q(venv)}/bin/python -m pip install torch ) && "
                    f"( {q(venv)}/bin/python -c 'import triton' || {q(venv)}/bin/python -m pip install triton ) && "
                    f"{q(venv)}/bin/python -c 'import torch, triton; print(torch.__version__, triton.__version__)' && "
                    f"{probe}")
        status = q(self.path("setup.status"))
        return (f"if {body}; then echo SETUP_OK > {status}.tmp; else echo SETUP_FAIL > {status}.tmp; fi; "
                f"mv {status}.tmp {status}")

    @property
    def box_python(self) -> str:
        return self.path("venv", "bin", "python") if self.use_venv else self.python

    def setup(self, timeout_s: float = 4500.0) -> dict[str, Any]:
        """Set the box up in tmux ``emmy-node-setup``; retry once from a clean venv; probe."""
        for attempt in (1, 2):
            if attempt == 2:
                if not self.use_venv:
                    break
                self.transport.run(["rm", "-rf", self.path("venv")], check=False)
            self.transport.run(["rm", "-f", self.path("setup.status"), self.path("probe.json")],
                               check=False)
            self.tmux.start(SETUP_SESSION, ["bash", "-c", self.setup_script()], cwd=self.base,
                            log=self.path("setup.log"), status=self.path("setup.rc"), env=self.env)
            state = self._wait(SETUP_SESSION, self.path("setup.log"), self.path("setup.rc"),
                               timeout_s, on_line=None)
            word = self.transport.run(["cat", self.path("setup.status")], check=False).stdout.strip()
            if state.status == "0" and word == "SETUP_OK":
                return self.read_json(self.path("probe.json"))
        raise BoxError(f"setup failed on {self.transport.name} ({word or 'no status'}); "
                       f"tail of setup.log:\n{self.tail(self.path('setup.log'), 40)}")

    # -- files --------------------------------------------------------------------------------
    def read_json(self, remote: str) -> Any:
        with tempfile.TemporaryDirectory() as d:
            local = Path(d) / "f.json"
            if not self.transport.get_file(remote, local):
                raise BoxError(f"{remote} missing on {self.transport.name}")
            return json.loads(local.read_text())

    def tail(self, remote: str, n: int) -> str:
        r = self.transport.run(["tail", "-n", str(n), remote], check=False, timeout=60)
        return r.stdout

    def push_ledger(self, local: Path) -> None:
        if local.is_file():
            self.transport.put_file(local, self.path("ledger.json"))

    def fetch_ledger(self, local: Path) -> bool:
        return self._while_unreachable(
            "fetching the ledger", lambda: self.transport.get_file(self.path("ledger.json"), local))

    def _while_unreachable(self, what: str, call: Callable[[], T],
                           say: Callable[[str], None] | None = None) -> T:
        """Make the short calls in ``call``; while the box does not answer, say so once and try
        again every poll, for up to ``reconnect_s``: a dropped connection costs a wait, never the
        harvest.  (Every call in ``call`` must be safe to repeat.)"""
        deadline = self.clock() + self.reconnect_s
        told = False
        while True:
            try:
                return call()
            except ConnectionError as exc:
                if self.clock() >= deadline:
                    raise BoxError(f"box {self.transport.name} did not answer for "
                                   f"{self.reconnect_s:.0f}s while {what}: {exc}") from exc
                if not told:
                    msg = (f"box {self.transport.name} unreachable while {what}; trying again "
                           f"every {self.poll_s:g}s for up to {self.reconnect_s:.0f}s")
                    if say:
                        say(msg)
                    else:
                        warnings.warn(msg, stacklevel=3)
                    told = True
                self.sleep(min(self.poll_s, max(0.05, deadline - self.clock())))

    # -- plan and jobs ------------------------------------------------------------------------
    def plan(self, pool_args: Sequence[str]) -> dict[str, Any]:
        argv = [self.box_python, "-m", "harness.box", "plan", "--ledger", self.path("ledger.json"),
                "--out", self.path("pool.json"), *pool_args]
        self.transport.run(["sh", "-c", f"cd {shlex.quote(self.path('repo'))} && {shlex.join(argv)}"],
                           timeout=900, env=self.env)
        return self.read_json(self.path("pool.json"))

    def run_job(self, *, slice_: str, kind: str, budget_s: float, run_id: str,
                job_args: Sequence[str], timeout_s: float, rows_dir: Path,
                on_line: Callable[[str], None] | None = None) -> JobOutcome:
        name = f"{slice_}-{kind}"
        rows = self.path("rows", run_id, f"{name}.jsonl")
        summary = self.path("summary", run_id, f"{name}.json")
        self.transport.run(["mkdir", "-p", "-m", "700", self.path("rows", run_id),
                            self.path("summary", run_id)])
        argv = [self.box_python, "-m", "harness.box", "run", "--slice", slice_, "--kind", kind,
                "--budget-s", f"{budget_s:.1f}", "--rows", rows, "--ledger", self.path("ledger.json"),
                "--summary", summary, "--run-id", run_id, *job_args]
        t0 = self.clock()
        # (a start repeated after a broken connection ends the first one: the ledger keeps
        # every finished batch)
        self._while_unreachable("starting the job", lambda: self.tmux.start(
            SWEEP_SESSION, argv, cwd=self.path("repo"), log=self.path("sweep.log"),
            status=self.path("sweep.status"), env=self.env), on_line)
        state = self._wait(SWEEP_SESSION, self.path("sweep.log"), self.path("sweep.status"),
                           timeout_s, on_line=on_line)
        outcome = JobOutcome(state="done", elapsed_s=self.clock() - t0)
        if state.status is None:
            outcome.state = "stopped" if state.alive else "died"
            self._while_unreachable("stopping the job", self.stop, on_line)
        elif state.status != "0":
            outcome.state = "failed"
        local_rows = rows_dir / run_id / f"{name}.jsonl"

        def harvest() -> None:
            outcome.rows_path = local_rows if self.transport.get_file(rows, local_rows) else None
            try:
                outcome.summary = self.read_json(summary)
            except BoxError:
                outcome.summary = {}
            if outcome.state != "done":
                outcome.log_tail = self.tail(self.path("sweep.log"), 40)

        try:
            self._while_unreachable(f"fetching the rows of {name}", harvest, on_line)
        except BoxError as exc:
            raise BoxError(f"{exc}; the rows stay on the box in {rows}: fetch them later and "
                           f"merge them with `python -m harness merge FILE`") from None
        if not outcome.summary and outcome.rows_path:
            # the job was ended before it wrote its summary: count what its rows file holds
            outcome.summary = _count_rows(outcome.rows_path)
            if outcome.state == "stopped":
                outcome.summary["stop"] = f"its {timeout_s:.0f}s limit reached; harvested"
        return outcome

    def stop(self) -> None:
        """End the sweep session and any bench process it left (harvest, never abandon)."""
        for attempt in range(6):
            self.tmux.kill(SWEEP_SESSION)
            sig = "-9" if attempt >= 2 else "-15"
            # only this box folder's job (its argv names our rows folder); its bench worker
            # exits when the job's end of the pipe closes
            pattern = "[h]arness[.]box run .*" + re.escape(self.path("rows"))
            self.transport.run(["pkill", sig, "-f", "--", pattern], check=False, timeout=60)
            if not self.tmux.alive(SWEEP_SESSION):
                return
            self.sleep(5)

    def _wait(self, session: str, log: str, status: str, timeout_s: float,
              on_line: Callable[[str], None] | None) -> JobState:
        """Poll until the session writes its status, dies twice in a row, or time runs out.

        Each poll hands the log's newest line to ``on_line`` (the box's ``[batch N]`` progress);
        a poll the box does not answer is not a dead session: say so once, keep waiting."""
        deadline = self.clock() + timeout_s
        dead_polls = 0
        last_seen = ""
        down_since: float | None = None
        while True:
            state = self.tmux.poll(session, log=log, status=status)
            if state.alive is None:
                if down_since is None:
                    down_since = self.clock()
                    if on_line:
                        on_line(f"box {self.transport.name} unreachable; the job goes on in tmux, "
                                f"still waiting")
            elif down_since is not None:
                if on_line:
                    on_line(f"box {self.transport.name} answers again after "
                            f"{self.clock() - down_since:.0f}s")
                down_since = None
            if on_line and state.last_line and state.last_line != last_seen:
                last_seen = state.last_line
                on_line(state.last_line)
            if state.status is not None:
                return state
            if state.alive is None:
                dead_polls = 0
            elif not state.alive:
                dead_polls += 1
                if dead_polls >= 2:
                    return state
            else:
                dead_polls = 0
            if self.clock() >= deadline:
                return JobState(alive=True, status=None, last_line=state.last_line)
            self.sleep(min(self.poll_s, max(0.05, deadline - self.clock())))


def _count_rows(path: Path) -> dict[str, Any]:
    """benched / ok / failed of a rows file (its unreadable lines are left to the merge)."""
    statuses: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        try:
            statuses[str(json.loads(line).get("status"))] += 1
        except (ValueError, AttributeError):
            continue
    n = sum(statuses.values())
    return {"benched": n, "ok": statuses["ok"], "failed": n - statuses["ok"],
            "statuses": dict(statuses)}


def pool_args(opts: Mapping[str, Any]) -> list[str]:
    out = ["--max-dist", str(opts["max_dist"]), "--tail-cap", str(opts["tail_cap"])]
    if opts.get("filter"):
        out += ["--filter", str(opts["filter"])]
    return out
