"""The controller's handle on one box: push the code, set up, probe, plan, run jobs, harvest.

Everything long-running runs inside the box's named tmux sessions; the controller only makes
short calls (start a session, one poll, fetch a file), so a dropped connection costs a poll,
never the work.  The box folder (``base``, default ``~/.local/share/emmy/node-collect``) is the
tool's own (marked ``.collect-node-data``) and one controller at a time holds its lock
(:mod:`harness.remote.boxdir`).  Layout: ``repo/ setup.log setup.status probe.json pool.json
sweep.log sweep.status current-job.json lock.json`` and one folder per run,
``rows/<run_id>/`` (``owner.json``, the run's ``ledger.json``, ``<slice>-<kind>.jsonl``,
``worker.log``) and ``summary/<run_id>/<slice>-<kind>.json``.
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
from harness.box import BOX_PINS
from harness.interrupts import Interrupted
from harness.remote.boxdir import BoxLock
from harness.remote.tmux import SETUP_SESSION, SWEEP_SESSION, JobState, Tmux
from harness.remote.transport import Transport

DEFAULT_BASE = "~/.local/share/emmy/node-collect"
CODE_ROOT = Path(harness.__file__).resolve().parent.parent
_EXCLUDE = ("__pycache__", "*.pyc", ".pytest_cache")
RECONNECT_S = 900.0  # how long a start, stop or fetch waits for a box that stopped answering
# How long a job asked to stop may take to finish its point before its service is ended.
STOP_WAIT_S = 60.0

T = TypeVar("T")


class BoxError(RuntimeError):
    """The box cannot be used: says why and what to do."""


@dataclass
class JobOutcome:
    """What one sweep job did, as the controller saw it."""

    state: str  # done | stopped (timeout) | died | failed | interrupted
    summary: dict[str, Any] = field(default_factory=dict)
    rows_path: Path | None = None
    log_tail: str = ""
    elapsed_s: float = 0.0
    remote_rows: str = ""  # where the rows file is on the box
    interrupted: Interrupted | None = None
    fetch_error: str | None = None  # the rows could not be brought home (they stay on the box)


@dataclass
class BoxDriver:
    transport: Transport
    tmux: Tmux
    base: str = DEFAULT_BASE
    python: str = "python3"
    install: bool = False  # --box-install: make BOX_DIR/venv with the pinned torch and Triton
    env: dict[str, str] = field(default_factory=dict)
    poll_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    reconnect_s: float = RECONNECT_S
    lock: BoxLock | None = None  # taken by the collection before anything else
    chosen_python: str | None = None  # the Python setup found with torch and Triton
    service_idle_s: float = 600.0  # the service ends when its controller is silent this long
    service_run: str | None = None  # the run whose service is up
    job_seq: int = 0

    def __post_init__(self) -> None:
        if self.base.startswith("~"):
            self.base = self.transport.home() + self.base[1:]

    def path(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts)

    # -- setup --------------------------------------------------------------------------------
    def settle_orphan(self, say: Callable[[str], None], wait_s: float = 3600.0) -> None:
        """With the lock held, a live sweep session was left by a controller that is gone: wait
        for its job to end (its allotment bounds it), then stop what is left, so its rows can be
        harvested.  A sweep session of unknown origin is refused."""
        if not self.tmux.alive(SWEEP_SESSION):
            return
        try:
            job = self.read_json(self.path("current-job.json"))
        except (BoxError, ValueError):
            job = None
        sock = f" -L {self.tmux.socket}" if self.tmux.socket else ""
        if not isinstance(job, dict) or not isinstance(job.get("limit_s"), (int, float)):
            raise BoxError(
                f"a sweep is already running on {self.transport.name} (tmux session "
                f"{SWEEP_SESSION!r}) that no run of this box folder started; watch it with "
                f"`tmux{sock} attach -t {SWEEP_SESSION}` or end it with "
                f"`tmux{sock} kill-session -t {SWEEP_SESSION}`, then run again")
        left = float(job.get("started", 0)) + float(job["limit_s"]) - time.time()
        left = max(0.0, min(left, wait_s))
        done = str(job.get("done") or "")

        def finished() -> bool:
            if done and self.transport.run(["test", "-e", done], check=False).rc == 0:
                return True
            return not self.tmux.alive(SWEEP_SESSION)

        if not finished():
            say(f"box {self.transport.name}: job {job.get('slice')}-{job.get('kind')} of run "
                f"{job.get('run_id')} (its controller is gone) is still measuring; waiting up to "
                f"{left:.0f}s for it to end, then its rows are merged")
            deadline = self.clock() + left
            while not finished() and self.clock() < deadline:
                self.sleep(min(self.poll_s, 10.0, max(0.05, deadline - self.clock())))
        if self.tmux.alive(SWEEP_SESSION):  # the orphan's service (idle now) or its stuck job
            self.stop()

    def quick_card(self) -> tuple[str, str]:
        """The box's GPU as the driver names it, in one short call and before any setup:
        ("gpu", name), ("named", name) for a CPU box labelled as a card (the test seam),
        ("cpu", "") when the box has no NVIDIA GPU, or ("unknown", "") when only the probe can
        tell (a device node but no nvidia-smi)."""
        script = r"""
if [ -n "${EMMY_BOX_CARD_NAME:-}" ]; then echo "named $EMMY_BOX_CARD_NAME"; exit 0; fi
if [ -n "${EMMY_FORCE_INTERPRET:-}" ]; then echo "cpu"; exit 0; fi
if command -v nvidia-smi >/dev/null 2>&1; then
  dev=${CUDA_VISIBLE_DEVICES:-0}; dev=${dev%%,*}
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "$dev" 2>/dev/null | head -n 1)
  if [ -n "$name" ]; then echo "gpu $name"; exit 0; fi
fi
if [ -e /dev/nvidiactl ]; then echo unknown; else echo cpu; fi
"""
        r = self.transport.run(["sh", "-c", script], check=False, timeout=60, env=self.env)
        word, _, rest = r.stdout.strip().partition(" ")
        return (word, rest.strip()) if word in ("gpu", "named", "cpu") else ("unknown", "")

    def push_code(self) -> None:
        # rows/ and summary/ are made private when made here; nothing else changes mode
        self.transport.run(["sh", "-c", 'for d in "$@"; do [ -d "$d" ] || mkdir -m 700 "$d"; done',
                            "sh", self.path("rows"), self.path("summary")])
        self.transport.put_tree(CODE_ROOT / "harness", self.path("repo", "harness"), _EXCLUDE)

    def setup_script(self) -> str:
        """The setup run in tmux: find a Python with torch and Triton (``--box-python`` as it
        is, else the venv an earlier ``--box-install`` made), or make that venv with the pinned
        versions when ``--box-install`` asks; then probe.  One word lands in ``setup.status``:
        SETUP_OK (and ``python.path`` names the Python), NEED_TORCH (``setup.log`` lists the
        Pythons that have them) or SETUP_FAIL."""
        q = shlex.quote
        venv_py = self.path("venv", "bin", "python")
        check = "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
        install = (f"{q(self.python)} -m venv {q(self.path('venv'))} && "
                   f"{q(venv_py)} -m pip install {' '.join(q(p) for p in BOX_PINS)} && "
                   f"{q(venv_py)} -c {q(check)} && PY={q(venv_py)}") if self.install else "false"
        status = q(self.path("setup.status"))
        return f"""
PY=
if {q(self.python)} -c {q(check)}; then PY={q(self.python)}
elif [ -x {q(venv_py)} ] && {q(venv_py)} -c {q(check)}; then PY={q(venv_py)}; echo "using {venv_py} (made by an earlier --box-install)"
elif {install}; then :
fi
if [ -z "$PY" ]; then
  echo "{self.python} cannot import torch and triton; looking for Pythons that can:"
  seen=
  for p in {q(venv_py)} $(command -v python3 python3.13 python3.12 python3.11 python3.10 python 2>/dev/null) \
      /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python /opt/conda/envs/*/bin/python \
      "$HOME"/miniconda3/bin/python "$HOME"/miniconda3/envs/*/bin/python "$HOME"/anaconda3/bin/python \
      "$HOME"/anaconda3/envs/*/bin/python "$HOME"/miniforge3/envs/*/bin/python "$HOME"/.pyenv/versions/*/bin/python \
      "$HOME"/*/bin/python "$HOME"/.venv*/bin/python "$HOME"/.virtualenvs/*/bin/python; do
    [ -x "$p" ] || continue
    d=$(dirname "$p")
    case " $seen " in *" $d "*) continue;; esac
    seen="$seen $d"
    v=$(timeout 120 "$p" -c {q(check)} 2>/dev/null) && echo "CANDIDATE $p ($v)"
  done
  echo NEED_TORCH > {status}.tmp
elif printf '%s\n' "$PY" > {q(self.path('python.path'))} && cd {q(self.path('repo'))} && "$PY" -m harness.box probe --out {q(self.path('probe.json'))}; then
  echo SETUP_OK > {status}.tmp
else
  echo SETUP_FAIL > {status}.tmp
fi
mv {status}.tmp {status}
"""

    @property
    def box_python(self) -> str:
        return self.chosen_python or self.python

    def setup(self, timeout_s: float = 4500.0) -> dict[str, Any]:
        """Set the box up in tmux ``emmy-node-setup`` (see :meth:`setup_script`); probe."""
        self.transport.run(["rm", "-f", self.path("setup.status"), self.path("probe.json"),
                            self.path("python.path")], check=False)
        self.tmux.start(SETUP_SESSION, ["bash", "-c", self.setup_script()], cwd=self.base,
                        log=self.path("setup.log"), status=self.path("setup.rc"), env=self.env)
        try:
            self._wait(SETUP_SESSION, self.path("setup.log"), self.path("setup.rc"), timeout_s,
                       on_line=None)
        except Interrupted:
            self.tmux.kill(SETUP_SESSION)
            raise
        word = self.transport.run(["cat", self.path("setup.status")], check=False).stdout.strip()
        if word == "SETUP_OK":
            chosen = self.transport.run(["cat", self.path("python.path")], check=False).stdout.strip()
            self.chosen_python = chosen or self.python
            return self.read_json(self.path("probe.json"))
        log = self.tail(self.path("setup.log"), 60)
        if word == "NEED_TORCH":
            found = [ln.removeprefix("CANDIDATE ") for ln in log.splitlines()
                     if ln.startswith("CANDIDATE ")]
            where = ("; these Pythons on the box have them:\n  " + "\n  ".join(found)
                     + f"\npass one as --box-python=PATH (e.g. --box-python={found[0].split()[0]})"
                     if found else "; none of the usual places has a Python that does")
            raise BoxError(f"--box-python={self.python} on {self.transport.name} cannot import "
                           f"torch and triton{where}. Nothing is installed unless you ask: "
                           f"--box-install makes {self.path('venv')} with "
                           f"{' '.join(BOX_PINS)}")
        raise BoxError(f"setup failed on {self.transport.name} ({word or 'no status'}); "
                       f"tail of setup.log:\n{self.tail(self.path('setup.log'), 40)}")

    def start_run(self, run_id: str, owner_record: dict[str, Any], ledger: Path) -> None:
        """Make the run's folder on the box with its owner record and its ledger."""
        run_dir = self.path("rows", run_id)
        self.transport.run(["mkdir", "-p", "-m", "700", run_dir, self.path("summary", run_id)])
        with tempfile.TemporaryDirectory() as d:
            owner = Path(d) / "owner.json"
            owner.write_text(json.dumps(owner_record, sort_keys=True) + "\n")
            self.transport.put_file(owner, posixpath.join(run_dir, "owner.json"))
        self.transport.put_file(ledger, posixpath.join(run_dir, "ledger.json"))

    def run_ledger(self, run_id: str) -> str:
        return self.path("rows", run_id, "ledger.json")

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

    def fetch(self, remote: str, local: Path, say: Callable[[str], None] | None = None) -> bool:
        """Fetch one file home (waiting for a box that stopped answering); False if missing."""
        return self._while_unreachable(f"fetching {posixpath.basename(remote)}",
                                       lambda: self.transport.get_file(remote, local), say)

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
    def plan(self, pool_args: Sequence[str], ledger: str) -> dict[str, Any]:
        argv = [self.box_python, "-m", "harness.box", "plan", "--ledger", ledger,
                "--out", self.path("pool.json"), *pool_args]
        self.transport.run(["sh", "-c", f"cd {shlex.quote(self.path('repo'))} && {shlex.join(argv)}"],
                           timeout=900, env=self.env)
        return self.read_json(self.path("pool.json"))

    # -- the box service and its jobs ---------------------------------------------------------
    def service_path(self, run_id: str, *parts: str) -> str:
        return self.path("service", run_id, *parts)

    def start_service(self, run_id: str, args: Sequence[str],
                      say: Callable[[str], None] | None = None, timeout_s: float = 900.0) -> None:
        """Start the session's box service in tmux ``emmy-node-sweep`` and wait until it is up
        (its probe, compile pool and bench worker started)."""
        argv = [self.box_python, "-m", "harness.box", "serve", "--run-dir",
                self.path("rows", run_id), "--service-dir", self.service_path(run_id),
                "--idle-s", f"{self.service_idle_s:.0f}", *args]
        ready = self.service_path(run_id, "ready.json")
        self.transport.run(["mkdir", "-p", "-m", "700", self.path("service"),
                            self.service_path(run_id)])
        self.transport.run(["rm", "-f", ready], check=False)
        self._while_unreachable("starting the box service", lambda: self.tmux.start(
            SWEEP_SESSION, argv, cwd=self.path("repo"), log=self.path("sweep.log"),
            status=self.path("sweep.status"), env=self.env), say)
        state = self._wait(SWEEP_SESSION, self.path("sweep.log"), ready, timeout_s, on_line=None)
        if state.status is None:
            alive = state.alive
            if alive:
                self.stop()
            raise BoxError(f"the box service did not come up on {self.transport.name} within "
                           f"{timeout_s:.0f}s ({'still starting' if alive else 'it ended'}); tail "
                           f"of sweep.log:\n{self.tail(self.path('sweep.log'), 40)}")
        self.service_run = run_id

    def end_service(self, wait_s: float = 30.0) -> None:
        """Ask the service to end (the session is over); end it by force if it does not."""
        if self.service_run is None:
            return
        self.transport.run(["touch", self.service_path(self.service_run, "quit")], check=False)
        self.service_run = None
        deadline = self.clock() + wait_s
        while self.tmux.alive(SWEEP_SESSION) and self.clock() < deadline:
            self.sleep(0.5)
        if self.tmux.alive(SWEEP_SESSION):
            self.stop()

    def run_job(self, *, slice_: str, kind: str, budget_s: float, run_id: str,
                job_fields: Mapping[str, Any], timeout_s: float, rows_dir: Path,
                service_args: Sequence[str] = (),
                on_line: Callable[[str], None] | None = None) -> JobOutcome:
        """Hand one job to the box service, wait for it, bring its rows and summary home.

        At ``timeout_s`` or on a first :class:`~harness.interrupts.Interrupted` the job is asked
        to stop at its next point (and the service ended if it does not within
        ``STOP_WAIT_S``); its rows still come home: the outcome is ``stopped`` or
        ``interrupted``.  A second interrupt propagates at once; the rows then stay on the box
        for the next run.  A service that died is started again for the next job."""
        name = f"{slice_}-{kind}"
        rows = self.path("rows", run_id, f"{name}.jsonl")
        summary = self.path("summary", run_id, f"{name}.json")
        outcome = JobOutcome(state="done", remote_rows=rows)
        t0 = self.clock()
        if self.service_run != run_id or not self.tmux.alive(SWEEP_SESSION):
            if on_line:
                on_line("starting the box service")
            self.start_service(run_id, service_args, on_line)
        self.job_seq += 1
        req = self.service_path(run_id, f"job-{self.job_seq:04d}.json")
        done = req[: -len(".json")] + ".done"
        stop_file = req[: -len(".json")] + ".stop"
        fields = {**job_fields, "slice": slice_, "kind": kind, "budget_s": budget_s,
                  "rows_path": rows, "ledger_path": self.run_ledger(run_id),
                  "summary_path": summary, "run_id": run_id}
        with tempfile.TemporaryDirectory() as d:
            job = Path(d) / "job.json"
            job.write_text(json.dumps({"run_id": run_id, "slice": slice_, "kind": kind,
                                       "started": time.time(), "limit_s": timeout_s,
                                       "done": done}))
            self._while_unreachable("starting the job", lambda: self.transport.put_file(
                job, self.path("current-job.json")), on_line)
            job.write_text(json.dumps(fields))
            self._while_unreachable("starting the job", lambda: self.transport.put_file(
                job, req), on_line)
        marks = (f"{slice_} {kind}", name)

        def mine(line: str) -> bool:
            return any(m in line for m in marks)

        try:
            state = self._wait(SWEEP_SESSION, self.path("sweep.log"), done, timeout_s,
                               on_line=on_line, mine=mine)
            if state.status is None and state.alive:  # the job's time ran out: ask it to stop
                outcome.state = "stopped"
                state = self._stop_job(stop_file, done, on_line, mine)
        except Interrupted as exc:
            if exc.second:
                raise
            outcome.state, outcome.interrupted = "interrupted", exc
            if on_line:
                on_line(f"{exc.signame}: stopping the job and bringing its rows home (again to "
                        "leave at once: its rows stay on the box and the next run merges them)")
            state = self._stop_job(stop_file, done, on_line, mine)
        if state.status is None:
            if not state.alive and outcome.state == "done":
                code = self.transport.run(["cat", self.path("sweep.status")], check=False)
                outcome.state = "failed" if code.stdout.strip() not in ("", "0") else "died"
            self.service_run = None  # started again for the next job
        else:
            try:
                word = json.loads(state.status).get("status")
            except (ValueError, AttributeError):
                word = "failed"
            if word != "ok" and outcome.state == "done":
                outcome.state = "failed"
        outcome.elapsed_s = self.clock() - t0
        local_rows = rows_dir / run_id / f"{name}.jsonl"

        def harvest() -> None:
            outcome.rows_path = local_rows if self.transport.get_file(rows, local_rows) else None
            try:
                outcome.summary = self.read_json(summary)
            except BoxError:
                outcome.summary = {}
            if outcome.state not in ("done", "stopped", "interrupted"):
                outcome.log_tail = self.tail(self.path("sweep.log"), 40)

        try:
            self._while_unreachable(f"fetching the rows of {name}", harvest, on_line)
        except BoxError as exc:
            outcome.fetch_error = (f"{exc}; the rows stay on the box in {rows}: the next run with "
                                   "this node table merges them first")
        except OSError as exc:  # the home disk (--rows-dir) is full or not writable
            outcome.rows_path = None
            outcome.fetch_error = (f"its rows could not be brought home to {local_rows}: "
                                   f"{exc.strerror or exc} (--rows-dir); they stay on the box in "
                                   f"{rows}, and the next run with this node table merges them "
                                   "first")
        if not outcome.summary and outcome.rows_path:
            # the job was ended before it wrote its summary: count what its rows file holds
            outcome.summary = _count_rows(outcome.rows_path)
            if outcome.state == "stopped":
                outcome.summary["stop"] = f"its {timeout_s:.0f}s limit reached; harvested"
        elif outcome.state == "stopped" and outcome.summary.get("stop") == "stopped on request":
            outcome.summary["stop"] = f"its {timeout_s:.0f}s limit reached; harvested"
        return outcome

    def _stop_job(self, stop_file: str, done: str, on_line: Callable[[str], None] | None,
                  mine: Callable[[str], bool]) -> JobState:
        """Ask the running job to stop at its next point; end the service if it does not."""
        self._while_unreachable("stopping the job", lambda: self.transport.run(
            ["touch", stop_file], timeout=60), on_line)
        state = self._wait(SWEEP_SESSION, self.path("sweep.log"), done, STOP_WAIT_S, on_line,
                           mine)
        if state.status is None:
            self._while_unreachable("stopping the job", self.stop, on_line)
            self.service_run = None
            state = JobState(alive=False, status=None, last_line=state.last_line)
        return state

    def stop(self) -> None:
        """End the sweep session and the job's processes (harvest, never abandon): the job
        ends through its clean-up (rows synced, summary written) or, after two tries, is
        killed; this returns once none of them is left."""
        # only this box folder's job (its argv names our rows folder); its bench worker exits
        # when the job's end of the pipe closes
        pattern = "[h]arness[.]box (run|serve) .*" + re.escape(self.path("rows"))
        for attempt in range(8):
            self.tmux.kill(SWEEP_SESSION)
            if attempt:
                sig = "-9" if attempt >= 3 else "-15"
                self.transport.run(["pkill", sig, "-f", "--", pattern], check=False, timeout=60)
            left = self.transport.run(["pgrep", "-f", "--", pattern], check=False, timeout=60)
            if left.rc != 0 and not self.tmux.alive(SWEEP_SESSION):
                return
            self.sleep(1.0 if attempt < 3 else 3.0)

    def _heartbeat(self) -> str:
        """What every poll touches: the box's lock (other controllers see it held) and the
        service's ``alive`` (the service sees its controller)."""
        parts = [self.lock.heartbeat_line()] if self.lock else []
        if self.service_run:
            parts.append(f"touch {shlex.quote(self.service_path(self.service_run, 'alive'))} "
                         "2>/dev/null")
        return "; ".join(parts)

    def _wait(self, session: str, log: str, status: str, timeout_s: float,
              on_line: Callable[[str], None] | None,
              mine: Callable[[str], bool] = lambda line: True) -> JobState:
        """Poll until the session writes its status, dies twice in a row, or time runs out.

        Each poll hands the log's newest line to ``on_line`` (the box's ``[batch N]`` progress);
        a poll the box does not answer is not a dead session: say so once, keep waiting."""
        deadline = self.clock() + timeout_s
        dead_polls = 0
        last_seen = ""
        down_since: float | None = None
        while True:
            state = self.tmux.poll(session, log=log, status=status, extra=self._heartbeat())
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
            if on_line and state.last_line and state.last_line != last_seen \
                    and mine(state.last_line):  # never another job's line
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
    if opts.get("filter"):  # one word: a value that starts with "-" stays a value
        out.append(f"--filter={opts['filter']}")
    if opts.get("baselines") is not None:
        out.append(f"--baselines={opts['baselines']}")
    return out
