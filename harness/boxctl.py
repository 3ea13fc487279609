"""The controller's handle on one box: push the code, set up, probe, start the session, watch it.

Everything long-running runs inside the box's named tmux sessions; the controller only makes
short calls (start a session, one poll, fetch a file), so a dropped connection costs a poll,
never the work.  After setup the controller sends the box one request for the whole session
(:class:`~harness.contract.SessionSpec`); the box service runs every job on its own clock and
says how each went in ``status.json``; the controller watches that, fetches each job's rows as
it ends and merges them while the box measures on.  The box folder (``base``, default
``~/.local/share/emmy/node-collect``) is the tool's own (marked ``.collect-node-data``) and one
controller at a time holds its lock (:mod:`harness.remote.boxdir`).  Layout: ``repo/ setup.log
setup.status probe.json sweep.log sweep.status current-session.json lock.json``, and the
session's files as :class:`~harness.contract.Layout` places them.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import harness
from harness.contract import (
    BOX_PINS,
    BUDGET_GRACE_S,
    ENDED,
    SAFE_NAME,
    SESSION_ENDED,
    WRONG_CARD_RC,
    Entry,
    Layout,
    SessionSpec,
    SessionStatus,
    count_statuses,
)
from harness.interrupts import Interrupted
from harness.remote.boxdir import BoxLock
from harness.remote.tmux import JobState, Tmux, session_names
from harness.remote.transport import Transport

DEFAULT_BASE = "~/.local/share/emmy/node-collect"
CODE_ROOT = Path(harness.__file__).resolve().parent.parent
_EXCLUDE = ("__pycache__", "*.pyc", ".pytest_cache")
RECONNECT_S = 900.0  # how long a start, stop or fetch waits for a box that stopped answering
# How long a session asked to stop may take to end its point before its service is ended.
STOP_WAIT_S = BUDGET_GRACE_S + 40.0
CURRENT_SESSION = "current-session.json"  # the session the box folder's service runs

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
    session: Layout | None = None  # the session this driver started (or settles)
    status: SessionStatus | None = None  # its newest status seen
    setup_session: str = field(init=False, default="")  # tmux session names of this box folder
    sweep_session: str = field(init=False, default="")

    restarts = True  # a session whose service died may be started again (see the collection)

    def __post_init__(self) -> None:
        if self.base.startswith("~"):
            self.base = self.transport.home() + self.base[1:]
        self.setup_session, self.sweep_session = session_names(self.base)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts)

    # -- setup --------------------------------------------------------------------------------
    def settle_orphan(self, say: Callable[[str], None], wait_s: float = 3600.0) -> None:
        """With the lock held, a live sweep session was left by a controller that is gone: let
        the job in flight end (its allotment bounds it) and run nothing after it (the next run
        plans what is left anew), so its rows can be harvested.  A sweep session of unknown
        origin is refused."""
        if not self.tmux.alive(self.sweep_session):
            return
        try:
            cur = self.read_json(self.path(CURRENT_SESSION))
        except (BoxError, ValueError):
            cur = None
        sock = f" -L {self.tmux.socket}" if self.tmux.socket else ""
        if not isinstance(cur, dict) or not all(
                isinstance(cur.get(k), str) and SAFE_NAME.fullmatch(cur[k])
                for k in ("run_id", "session_id")):
            raise BoxError(
                f"a sweep is already running on {self.transport.name} (tmux session "
                f"{self.sweep_session!r}) that no run of this box folder started; watch it with "
                f"`tmux{sock} attach -t {self.sweep_session}` or end it with "
                f"`tmux{sock} kill-session -t {self.sweep_session}`, then run again")
        self.session = Layout(self.base, cur["run_id"], cur["session_id"])
        try:
            status, _, _ = self.poll_session()
            running = status.entry(status.current) if status and status.current else None
            if status is not None and not status.final:
                left = min(wait_s, (running.allotment_s if running else 0.0)
                           + BUDGET_GRACE_S + 30.0)
                what = f"job {running.id}" if running else "its session"
                say(f"box {self.transport.name}: {what} of run {cur['run_id']} (its controller is "
                    f"gone) is still measuring; waiting up to {left:.0f}s for it to end, then "
                    "its rows are merged")
                self.stop_session(now=False, wait_s=left, say=say)
            if self.tmux.alive(self.sweep_session):  # an idle or stuck service
                self.stop()
        finally:
            self.session, self.status = None, None

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

    def setup_script(self, expect_card: str | None = None) -> str:
        """The setup run in tmux: find a Python with torch and Triton (``--box-python`` as it
        is, else the venv an earlier ``--box-install`` made), or make that venv with the pinned
        versions when ``--box-install`` asks; then probe.  One word lands in ``setup.status``:
        SETUP_OK (and ``python.path`` names the Python), NEED_TORCH (``setup.log`` lists the
        Pythons that have them), WRONG_CARD (the probe found another card than ``expect_card``,
        a canonical card name: a batch job checks its node itself) or SETUP_FAIL."""
        q = shlex.quote
        expect = f" --expect-card {q(expect_card)}" if expect_card else ""
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
elif printf '%s\n' "$PY" > {q(self.path('python.path'))} && cd {q(self.path('repo'))}; then
  "$PY" -m harness.box probe --out {q(self.path('probe.json'))}{expect}
  case $? in 0) echo SETUP_OK;; {WRONG_CARD_RC}) echo WRONG_CARD;; *) echo SETUP_FAIL;; esac > {status}.tmp
else
  echo SETUP_FAIL > {status}.tmp
fi
mv {status}.tmp {status}
"""

    @property
    def box_python(self) -> str:
        return self.chosen_python or self.python

    def setup(self, timeout_s: float = 4500.0) -> dict[str, Any]:
        """Set the box up in tmux (:attr:`setup_session`) (see :meth:`setup_script`); probe."""
        self.transport.run(["rm", "-f", self.path("setup.status"), self.path("probe.json"),
                            self.path("python.path")], check=False)
        self.tmux.start(self.setup_session, ["bash", "-c", self.setup_script()], cwd=self.base,
                        log=self.path("setup.log"), status=self.path("setup.rc"), env=self.env)
        try:
            self._wait(self.setup_session, self.path("setup.log"), self.path("setup.rc"), timeout_s,
                       on_line=None)
        except Interrupted:
            self.tmux.kill(self.setup_session)
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
        self._make_folders(run_dir, self.path("summary", run_id))
        with tempfile.TemporaryDirectory() as d:
            owner = Path(d) / "owner.json"
            owner.write_text(json.dumps(owner_record, sort_keys=True) + "\n")
            self.transport.put_file(owner, posixpath.join(run_dir, "owner.json"))
        self.transport.put_file(ledger, posixpath.join(run_dir, "ledger.json"))

    def run_ledger(self, run_id: str) -> str:
        return self.path("rows", run_id, "ledger.json")

    # -- files --------------------------------------------------------------------------------
    def _make_folders(self, *paths: str) -> None:
        """Make the box folder's own folders (0700); something in the way is a clear error."""
        r = self.transport.run(["mkdir", "-p", "-m", "700", "--", *paths], check=False, timeout=60)
        if r.rc != 0:
            why = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
            raise BoxError(f"cannot make {', '.join(paths)} on {self.transport.name} ({why}): "
                           f"something in the box folder {self.base} is in the way; remove it "
                           "or give another --box-dir")

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

    # -- the session --------------------------------------------------------------------------
    def start_session(self, spec: SessionSpec, say: Callable[[str], None] | None = None,
                      timeout_s: float = 900.0) -> Layout:
        """Send the session request and start the box service in tmux (:attr:`sweep_session`);
        return once the service has claimed the request (its plan and jobs then go on without
        the controller)."""
        layout = Layout(self.base, spec.run_id, spec.session_id)
        self._make_folders(self.path("service"), layout.service_dir)
        with tempfile.TemporaryDirectory() as d:
            req = Path(d) / "session.json"
            req.write_text(spec.to_json() + "\n")
            self.transport.put_file(req, layout.service("session.json"))
            req.write_text(json.dumps({"run_id": spec.run_id, "session_id": spec.session_id,
                                       "started": time.time()}) + "\n")
            self.transport.put_file(req, self.path(CURRENT_SESSION))
        argv = [self.box_python, "-m", "harness.box", "serve", "--session",
                layout.service("session.json")]
        self._while_unreachable("starting the box service", lambda: self.tmux.start(
            self.sweep_session, argv, cwd=self.path("repo"), log=self.path("sweep.log"),
            status=self.path("sweep.status"), env=self.env), say)
        self.session = layout
        state = self._wait(self.sweep_session, self.path("sweep.log"), layout.service("status.json"),
                           timeout_s, on_line=None)
        if state.status is None:
            alive = state.alive
            if alive:
                self.stop()
            raise BoxError(f"the box service did not take the session on {self.transport.name} "
                           f"within {timeout_s:.0f}s ({'still starting' if alive else 'it ended'}); "
                           f"tail of sweep.log:\n{self.tail(self.path('sweep.log'), 40)}")
        return layout

    def poll_session(self, wait_s: float = 0.0, entry_id: str | None = None
                     ) -> tuple[SessionStatus | None, bool | None, str]:
        """One call: the session's status (None before the service wrote one), whether its
        tmux session is alive (None: the box did not answer) and the log's newest line.  With
        ``wait_s`` the call waits on the box until the run ``entry_id`` (None: the session)
        has ended, for up to that long."""
        assert self.session is not None
        ended = shlex.quote(self.session.service(ENDED))
        words = " ".join(f"-e {shlex.quote(w)}" for w in ([entry_id] if entry_id else [])
                         + [SESSION_ENDED])
        state = self.tmux.poll(self.sweep_session, log=self.path("sweep.log"),
                               status=self.session.service("status.json"),
                               extra=self._heartbeat(), wait_s=wait_s,
                               until=f"grep -qxF {words} {ended} 2>/dev/null")
        status = None
        if state.status:
            try:
                status = SessionStatus.from_json(state.status)
            except (ValueError, TypeError, KeyError):
                status = None  # caught mid-write by an older reader: the next poll reads it
        if status is not None:
            self.status = status
        return status, state.alive, state.last_line

    def wait_entry(self, entry_id: str | None, deadline: float,
                   on_line: Callable[[str], None] | None = None,
                   on_status: Callable[[SessionStatus], None] | None = None,
                   mine: Callable[[str], bool] = lambda line: True,
                   on_event: Callable[[str], None] | None = None) -> str:
        """Poll until the session's entry ``entry_id`` is final (None: the whole session),
        and say why the wait ended: ``final``, ``dead`` (the service is gone without ending
        the session: two polls in a row) or ``timeout`` (``deadline`` on this clock).  Each
        poll hands the log's newest line to ``on_line`` when ``mine`` says it is the waiter's,
        and the status to ``on_status``.  A poll the box does not answer is not a dead
        session: say so once (to ``on_event``, else ``on_line``), keep waiting."""
        tell = on_event or on_line
        dead_polls = 0
        last_seen = ""
        down_since: float | None = None
        while True:
            t0 = self.clock()
            status, alive, line = self.poll_session(
                max(0.0, min(self.poll_s, deadline - t0)), entry_id)
            if alive is None:
                if down_since is None:
                    down_since = self.clock()
                    if tell:
                        tell(f"box {self.transport.name} unreachable; the session goes on in "
                             "tmux, still waiting")
            elif down_since is not None:
                if tell:
                    tell(f"box {self.transport.name} answers again after "
                         f"{self.clock() - down_since:.0f}s")
                down_since = None
            if status is not None and on_status:
                on_status(status)
            if on_line and line and line != last_seen and mine(line):
                last_seen = line
                on_line(line)
            if status is not None:
                entry = status.entry(entry_id) if entry_id else None
                if status.final or (entry is not None and entry.final):
                    return "final"
            if alive is None:
                dead_polls = 0
            elif not alive:
                dead_polls += 1
                if dead_polls >= 2:
                    return "dead"
            else:
                dead_polls = 0
            if self.clock() >= deadline:
                return "timeout"
            # the call waited on the box already, unless the box did not answer or is gone
            rest = self.poll_s - (self.clock() - t0)
            if rest > 0.05 and (alive is None or dead_polls):
                self.sleep(min(rest, max(0.05, deadline - self.clock())))

    def stop_session(self, now: bool = True, wait_s: float = STOP_WAIT_S,
                     say: Callable[[str], None] | None = None) -> str:
        """Ask the session to end: ``now`` at the job's next point, else after the job in
        flight (``drain``); end the service by force if it has not within ``wait_s``.
        Returns how the wait ended (see :meth:`wait_entry`; ``killed``: by force)."""
        assert self.session is not None
        flag = self.session.service("stop" if now else "drain")
        self._while_unreachable("stopping the session", lambda: self.transport.run(
            ["touch", flag], timeout=60), say)
        why = self.wait_entry(None, self.clock() + wait_s, None)
        if why == "final":
            return why
        self._while_unreachable("stopping the session", self.stop, say)
        self.poll_session()
        return "killed"

    def end(self, wait_s: float = 15.0) -> None:
        """The session is over: let its tmux session close (the service has ended, its pane
        follows), or end it."""
        deadline = self.clock() + wait_s
        while self.tmux.alive(self.sweep_session) and self.clock() < deadline:
            self.sleep(0.2)
        if self.tmux.alive(self.sweep_session):
            self.stop()

    def fetch_entry(self, entry: Entry, rows_dir: Path,
                    say: Callable[[str], None] | None = None) -> JobOutcome:
        """Bring one run's rows and summary home (they stay on the box too).  A box that does
        not answer is waited for; one that never does leaves the rows there for the next
        run (``fetch_error``)."""
        assert self.session is not None
        rows = self.session.rows(entry.id)
        outcome = JobOutcome(state=entry.state, remote_rows=rows, elapsed_s=entry.elapsed_s)
        local_rows = rows_dir / self.session.run_id / f"{entry.id}.jsonl"

        def harvest() -> None:
            outcome.rows_path = local_rows if self.transport.get_file(rows, local_rows) else None
            try:
                outcome.summary = self.read_json(self.session.summary(entry.id))  # type: ignore[union-attr]
            except (BoxError, ValueError):
                outcome.summary = {}
            if entry.state not in ("done", "stopped", "skipped"):
                outcome.log_tail = self.tail(self.path("sweep.log"), 40)

        try:
            self._while_unreachable(f"fetching the rows of {entry.id}", harvest, say)
        except BoxError as exc:
            outcome.fetch_error = (f"{exc}; the rows stay on the box in {rows}: the next run with "
                                   "this node table merges them first")
        except OSError as exc:  # the home disk (--rows-dir) is full or not writable
            outcome.rows_path = None
            outcome.fetch_error = (f"its rows could not be brought home to {local_rows}: "
                                   f"{exc.strerror or exc} (--rows-dir); they stay on the box in "
                                   f"{rows}, and the next run with this node table merges them "
                                   "first")
        wrote_summary = bool(outcome.summary)
        counted = {"benched": 0}
        if outcome.rows_path:
            with outcome.rows_path.open("rb") as fh:
                counted = count_statuses(fh)
        if not outcome.summary and outcome.rows_path:
            # the job was ended before it wrote its summary: count what its rows file holds
            outcome.summary = dict(counted)
        if entry.reason:
            outcome.summary.setdefault("stop", entry.reason)
        if outcome.fetch_error is None and entry.state in ("done", "stopped"):
            self._account(entry, outcome, wrote_summary, counted["benched"])
        return outcome

    @staticmethod
    def _account(entry: Entry, outcome: JobOutcome, wrote_summary: bool, rows: int) -> None:
        """A run the box calls ended is trusted only with its rows accounted: a ``done`` run
        has its summary, and the rows file holds every point the status counts as benched.
        Otherwise the run failed, and what is on the box is said (and kept there)."""
        problem = None
        if entry.state == "done" and not wrote_summary:
            problem = "the box says it ended, but it wrote no summary"
        elif rows < entry.benched:
            problem = (f"the box counts {entry.benched} point(s) benched, but "
                       + (f"its rows file holds {rows}" if outcome.rows_path else
                          "no rows file came back"))
        if problem:
            outcome.state = "failed"
            outcome.summary["stop"] = (f"{problem}; what it wrote stays on the box in "
                                       f"{outcome.remote_rows}")

    def stop(self) -> None:
        """End the sweep session and the service's processes (harvest, never abandon): the
        service ends through its clean-up (rows synced, status written) or, after two tries,
        is killed; this returns once none of it is left.  Only this box folder's session is
        touched: its tmux session has the folder's own name, and the service is signalled by
        the process group its claim recorded, once its pid is seen still to run this
        session's request (a pid reused by another process is left alone)."""
        for attempt in range(8):
            self.tmux.kill(self.sweep_session)
            ids = self._service_ids()
            if ids is not None and attempt:
                self._signal_service(ids, "KILL" if attempt >= 3 else "TERM")
            running = ids is not None and self._signal_service(ids, "0")
            if not running and not self.tmux.alive(self.sweep_session):
                return
            self.sleep(1.0 if attempt < 3 else 3.0)

    def _service_ids(self) -> tuple[int, int] | None:
        """The pid and process group the service of this driver's session recorded in its
        claim (None: no session, or not claimed yet)."""
        if self.session is None:
            return None
        try:
            held = self.read_json(self.session.service("claim.json"))
        except (BoxError, ValueError):
            return None
        pid, pgid = (held.get("pid"), held.get("pgid")) if isinstance(held, dict) else (None, None)
        if not (isinstance(pid, int) and pid > 1):
            return None
        return pid, (pgid if isinstance(pgid, int) and pgid > 1 else pid)

    def _signal_service(self, ids: tuple[int, int], sig: str) -> bool:
        """Send ``sig`` (``0``: only ask) to the service's process group if its pid still runs
        this session's request; say whether it did."""
        assert self.session is not None
        pid, pgid = ids
        words = f"serve --session {self.session.service('session.json')}"
        target = f"-{pgid}" if sig != "0" else str(pid)
        script = (f"tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null | grep -qF -- {shlex.quote(words)}"
                  f" && kill -{sig} -- {target} 2>/dev/null")
        return self.transport.run(["bash", "-c", script], check=False, timeout=60).rc == 0

    def queue_note(self) -> str:
        """How long the box waited before it began (a batch queue's wait); "" for a box that
        does not queue."""
        return ""

    def gone_reason(self) -> str | None:
        """Why the box's session is gone, where something else than the box says it (a batch
        scheduler); None: nothing to add."""
        return None

    def describe(self) -> str:
        """What the summary says of the box beside its card, where setup's time is not all
        (a batch job: its id, node and wait in the queue); ""."""
        return ""

    def _heartbeat(self) -> str:
        """What every poll touches: the box's lock (other controllers see it held)."""
        return self.lock.heartbeat_line() if self.lock else ""

    def _wait(self, session: str, log: str, status: str, timeout_s: float,
              on_line: Callable[[str], None] | None) -> JobState:
        """Poll until the session writes ``status``, dies twice in a row, or time runs out
        (setup, and a service taking its request)."""
        deadline = self.clock() + timeout_s
        dead_polls = 0
        while True:
            state = self.tmux.poll(session, log=log, status=status, extra=self._heartbeat())
            if on_line and state.last_line:
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
            self.sleep(min(self.poll_s, 2.0, max(0.05, deadline - self.clock())))
