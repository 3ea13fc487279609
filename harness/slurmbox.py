"""A box that is a Slurm batch job: the controller's handle on one card's job.

With ``--provider slurm`` the controller runs on the cluster's login node (or reaches it with
``--remote``) and never logs in to a compute node.  Per card it writes a box folder on the
shared filesystem (``BOX_DIR/<card alias>``), the session request into it, and submits one
batch job (``sbatch``) that does on the node Slurm allocates what setup and the box service do
on any box: find the Python with torch and Triton, probe the card (refusing a node with
another card than ``--gpu``), then run the whole session (``python -m harness.box serve``).
The job's id is the lease: it is on disk the moment ``sbatch`` answers, and only that job is
ever cancelled.

The controller follows the job with ``squeue`` and the session's files, exactly as it follows a
tmux session: one short call per poll.  A job waiting in the queue costs no budget (the box
service's clock starts on the node) but counts against ``--timeout-s``; the summary says how
long it waited and why (the reason ``squeue`` gives).  A job that Slurm ends (its time limit,
preemption, a ``scancel`` from outside, a node failure) is harvested like a box whose service
died, and not submitted again: the next run resumes from the node table.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.boxctl import CURRENT_SESSION, STOP_WAIT_S, BoxDriver, BoxError
from harness.cards import Card
from harness.contract import (
    BUDGET_GRACE_S,
    ENDED,
    SAFE_NAME,
    SESSION_ENDED,
    Layout,
    SessionSpec,
    SessionStatus,
    SlurmOptions,
)
from harness.remote.slurm import (
    JobInfo,
    Slurm,
    SlurmError,
    parse_squeue,
    sbatch_options,
    time_limit_minutes,
)

DEFAULT_SLURM_BASE = "~/.local/share/emmy/node-collect-slurm"
"""``--box-dir`` with ``--provider slurm``: a folder on the cluster's shared filesystem that
holds one box folder per card."""
QUEUE_ALLOWANCE_S = 3600.0
"""With ``--provider slurm`` and no ``--timeout-s``: how long a job may wait in the queue on
top of its time limit before the controller gives up on it."""
CANCEL_WAIT_S = 120.0  # how long a cancelled job may take to leave the running states


def slurm_base(box_dir: str | None, gpu: str) -> str:
    """The box folder of card ``gpu``'s jobs under ``--box-dir``."""
    return f"{(box_dir or DEFAULT_SLURM_BASE).rstrip('/')}/{gpu}"


# lines of the job's log that say what Slurm does with it: events a person must see
SLURM_LINES = ("Slurm job", "[slurm]")


@dataclass
class SlurmDriver(BoxDriver):
    """:class:`BoxDriver` whose session runs as one Slurm batch job (see the module's text).

    Lifecycle: :meth:`start_session` submits the job (setup, probe and service in one) and
    returns at once; :meth:`poll_session` answers from ``squeue`` and the box folder;
    :meth:`stop_session` asks the service to stop (or cancels a job still waiting or setting
    up); :meth:`stop` cancels the job by its id."""

    options: SlurmOptions = field(default_factory=SlurmOptions)
    card: Card | None = None  # the card the job must find on its node
    gpu: str = ""  # its alias, as --gpu named it
    record: Callable[[str], None] = lambda job_id: None  # writes the lease
    job_id: str | None = None
    job: JobInfo | None = None  # Slurm's newest answer about it
    submitted_at: float | None = None  # the controller's clock
    left_queue_at: float | None = None  # first seen out of PENDING
    waited_for: list[str] = field(default_factory=list)  # squeue's reasons while it waited
    restarts = False  # a job Slurm ended is harvested, never submitted again
    slurm: Slurm = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.slurm = Slurm(self.transport)

    @property
    def job_name(self) -> str:
        """The job's name in ``squeue``: the box folder's sweep session name."""
        return self.sweep_session

    # -- the job --------------------------------------------------------------------------------
    def job_script(self, layout: Layout) -> str:
        """The batch script: setup and probe (refusing a node whose card is not the one asked
        for), then the box service for the session; every value quoted."""
        assert self.card is not None
        q = shlex.quote
        setup = self.setup_script(expect_card=self.card.name)
        return f"""#!/bin/bash
# collect-node-data: the session {layout.session_id} of run {layout.run_id} on {self.card.name}
cd {q(self.base)} || exit 2
echo "[slurm] job $SLURM_JOB_ID on $(hostname): setting up" > {q(self.path('sweep.log'))}
(
{setup}
) > {q(self.path('setup.log'))} 2>&1
word=$(cat {q(self.path('setup.status'))} 2>/dev/null)
if [ "$word" != SETUP_OK ]; then
  echo "[slurm] setup ended with ${{word:-no status}}; see setup.log" >> {q(self.path('sweep.log'))}
  exit 3
fi
PY=$(cat {q(self.path('python.path'))})
cd {q(self.path('repo'))} || exit 2
"$PY" -m harness.box serve --session {q(layout.service('session.json'))} >> {q(self.path('sweep.log'))} 2>&1
"""

    def time_limit_min(self, spec: SessionSpec) -> int:
        return time_limit_minutes(spec.budget_s, self.options.slurm_setup_s,
                                  (BUDGET_GRACE_S + 10.0) * (len(spec.jobs) + 1))

    def start_session(self, spec: SessionSpec, say: Callable[[str], None] | None = None,
                      timeout_s: float = 900.0) -> Layout:
        """Write the request and the batch script into the box folder and submit the job; the
        lease is recorded the moment ``sbatch`` answers.  Returns without waiting for the
        job to start (a queue may hold it for hours: the controller's wait sees it)."""
        if self.job_id is not None:
            raise BoxError(f"Slurm job {self.job_id} ran this card's session already; a job "
                           "Slurm ended is not submitted again (the next run resumes from the "
                           "node table)")
        layout = Layout(self.base, spec.run_id, spec.session_id)
        self._make_folders(self.path("service"), layout.service_dir)
        script = layout.service("job.sh")
        self.transport.run(["rm", "-f", *(self.path(n) for n in (
            "setup.status", "probe.json", "python.path", "setup.log", "sweep.log"))],
            check=False, timeout=60)
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d) / "f"
            tmp.write_text(spec.to_json() + "\n")
            self.transport.put_file(tmp, layout.service("session.json"))
            tmp.write_text(self.job_script(layout))
            self.transport.put_file(tmp, script)
            self._current(tmp, spec, None)
        options = sbatch_options(self.options, self.gpu, job_name=self.job_name,
                                 output=self.path(f"slurm-{'%j'}.out"), chdir=self.base,
                                 minutes=self.time_limit_min(spec))
        try:
            self.job_id = self.slurm.submit(options, script)
        except SlurmError as exc:
            raise BoxError(str(exc)) from None
        self.submitted_at = self.clock()
        self.record(self.job_id)
        self.session = layout
        with tempfile.TemporaryDirectory() as d:
            self._current(Path(d) / "f", spec, self.job_id)
        if say:
            say(f"submitted Slurm job {self.job_id} ({self.job_name}, time limit "
                f"{self.time_limit_min(spec)} min): {shlex.join(['sbatch', *options, script])}")
        return layout

    def _current(self, tmp: Path, spec: SessionSpec, job_id: str | None) -> None:
        tmp.write_text(json.dumps({"run_id": spec.run_id, "session_id": spec.session_id,
                                   "started": time.time(), "slurm_job": job_id}) + "\n")
        self.transport.put_file(tmp, self.path(CURRENT_SESSION))

    # -- watching -------------------------------------------------------------------------------
    def poll_session(self, wait_s: float = 0.0, entry_id: str | None = None
                     ) -> tuple[SessionStatus | None, bool | None, str]:
        """One call on the login node: wait (up to ``wait_s``) until the run ``entry_id`` or
        the session has ended or the job's setup gave up, then ``squeue`` for the job, the
        session's status and the newest line of the job's log.  Alive: the job may still run
        the session; None: Slurm or the login node did not answer."""
        assert self.session is not None and self.job_id is not None
        q = shlex.quote
        ended = q(self.session.service(ENDED))
        words = " ".join(f"-e {q(w)}" for w in ([entry_id] if entry_id else []) + [SESSION_ENDED])
        setup_word = q(self.path("setup.status"))
        until = (f"grep -qxF {words} {ended} 2>/dev/null || {{ [ -s {setup_word} ] && "
                 f"! grep -qx SETUP_OK {setup_word}; }}")
        wait = ""
        if wait_s > 0:
            wait = (f"i=0; while [ $i -lt {max(1, int(wait_s * 4))} ] && ! {{ {until}; }}; do "
                    "sleep 0.25; i=$((i+1)); done; ")
        extra = self._heartbeat()
        script = (f"{extra + '; ' if extra else ''}{wait}"
                  f"out=$(squeue -h -j {q(self.job_id)} -t all -o '%T|%r|%N' 2>&1); rc=$?; "
                  "printf 'SQ=%s|' $rc; printf '%s' \"$out\" | head -n 1 | tr -d '\\n'; echo; "
                  f"printf 'STATUS='; tr '\\n' ' ' 2>/dev/null < {q(self.session.service('status.json'))}; echo; "
                  f"printf 'LAST='; tail -n 1 {q(self.path('sweep.log'))} 2>/dev/null | tr -d '\\n'; echo")
        try:
            r = self.transport.run(["sh", "-c", script], check=False, timeout=60 + wait_s)
        except ConnectionError:
            return None, None, ""
        fields: dict[str, str] = {}
        for line in r.stdout.splitlines():
            word, eq, rest = line.partition("=")
            if eq and word in ("SQ", "STATUS", "LAST") and word not in fields:
                fields[word] = rest
        if "SQ" not in fields:
            return None, None, ""
        status = None
        if fields.get("STATUS", "").strip():
            try:
                status = SessionStatus.from_json(fields["STATUS"])
            except (ValueError, TypeError, KeyError):
                status = None
        if status is not None:
            self.status = status
        info = self._read_squeue(fields["SQ"])
        if info is None:
            return status, None, fields.get("LAST", "")
        self._see_job(info)
        line = fields.get("LAST", "")
        if info.pending or (self.status is None and not line):
            line = f"Slurm job {self.job_id} {info.describe()}"
        return status, info.alive, line

    def _read_squeue(self, text: str) -> JobInfo | None:
        rc, _, out = text.partition("|")
        assert self.job_id is not None
        if rc.strip() == "0" and out.strip():
            return parse_squeue(self.job_id, out)
        if "Invalid job id" in out or rc.strip() == "0":  # forgotten: what accounting says
            return self.slurm.info(self.job_id) or JobInfo(self.job_id, "")
        return None  # slurmctld did not answer: not an ended job

    def _see_job(self, info: JobInfo) -> None:
        self.job = info
        if info.pending:
            if info.reason and info.reason not in self.waited_for:
                self.waited_for.append(info.reason)
        elif self.left_queue_at is None:
            self.left_queue_at = self.clock()

    def wait_entry(self, entry_id: str | None, deadline: float,
                   on_line: Callable[[str], None] | None = None,
                   on_status: Callable[[SessionStatus], None] | None = None,
                   mine: Callable[[str], bool] = lambda line: True,
                   on_event: Callable[[str], None] | None = None) -> str:
        """:meth:`BoxDriver.wait_entry`, also saying what Slurm does with the job (waiting,
        setting up: events, to ``on_event``).  A job that ended before its service took the
        session is a box that cannot be used: :class:`BoxError`, saying why (another card, no
        torch, Slurm's reason)."""

        def route(line: str) -> None:
            if line.startswith(SLURM_LINES) and on_event is not None:
                on_event(line)
            elif on_line is not None:
                on_line(line)

        why = super().wait_entry(entry_id, deadline, route, on_status,
                                 mine=lambda line: line.startswith(SLURM_LINES) or mine(line),
                                 on_event=on_event)
        if why == "dead" and self.status is None:
            raise BoxError(self.why_no_session())
        return why

    # -- what went wrong ------------------------------------------------------------------------
    def queue_note(self) -> str:
        """How long the job waited in the queue, and why (``squeue``'s reasons)."""
        if self.job_id is None or self.submitted_at is None:
            return ""
        end = self.left_queue_at if self.left_queue_at is not None else self.clock()
        why = f" ({', '.join(self.waited_for)})" if self.waited_for else ""
        still = " and still waits" if self.left_queue_at is None else ""
        return f"Slurm job {self.job_id} waited {end - self.submitted_at:.0f}s in the queue{why}{still}"

    def gone_reason(self) -> str | None:
        """Why the job is gone, as Slurm says it (its state and reason, and the line its
        output file has about it)."""
        if self.job_id is None:
            return None
        info = self.slurm.info(self.job_id) or self.job
        # a job whose processes are still being ended (COMPLETING) has not yet the state it
        # ends in (CANCELLED, TIMEOUT, …): wait for that, as long as a cancel may take
        deadline = self.clock() + CANCEL_WAIT_S
        while info is not None and info.state == "COMPLETING" and self.clock() < deadline:
            self.sleep(0.5)
            info = self.slurm.info(self.job_id) or info
        said = [ln[ln.index("***"):].strip() for ln in
                self.tail(self.path(f"slurm-{self.job_id}.out"), 20).splitlines() if "***" in ln]
        what = info.describe() if info else "is no longer known to Slurm"
        return f"Slurm job {self.job_id} {what}" + (f": {said[-1]}" if said else "")

    def why_no_session(self) -> str:
        """The job ended before its box service took the session: why, and what to do."""
        assert self.card is not None
        word = self.transport.run(["cat", self.path("setup.status")], check=False,
                                  timeout=60).stdout.strip()
        gone = self.gone_reason() or ""
        if word == "WRONG_CARD":
            try:
                probe = self.read_json(self.path("probe.json"))
            except (BoxError, ValueError):
                probe = {}
            have = probe.get("card") or probe.get("device_name") or "another card"
            host = probe.get("host") or (self.job.node if self.job else "") or "its node"
            return (f"--gpu={self.gpu} wants {self.card.name} but Slurm job {self.job_id} ran on "
                    f"{host}, which has {have}; the job refused the node and measured nothing. "
                    "Ask Slurm for the card with --slurm-gres (e.g. gpu:{gpu}:1), "
                    "--slurm-constraint or --slurm-partition")
        if word == "NEED_TORCH":
            found = [ln.removeprefix("CANDIDATE ") for ln in
                     self.tail(self.path("setup.log"), 60).splitlines()
                     if ln.startswith("CANDIDATE ")]
            where = (f"; these Pythons on the node have them: {'; '.join(found)}" if found
                     else "")
            return (f"--box-python={self.python} cannot import torch and triton on the node of "
                    f"Slurm job {self.job_id}{where}. Give --box-python a Python on the shared "
                    "filesystem that has them (a venv or conda env), or --box-install")
        return (f"{gone}, before its session started (setup {word or 'did not finish'}); "
                f"nothing was measured. Tail of setup.log:\n{self.tail(self.path('setup.log'), 20)}"
                f"\ntail of slurm-{self.job_id}.out:\n"
                f"{self.tail(self.path(f'slurm-{self.job_id}.out'), 20)}")

    # -- ending it ------------------------------------------------------------------------------
    def stop_session(self, now: bool = True, wait_s: float = STOP_WAIT_S,
                     say: Callable[[str], None] | None = None) -> str:
        """Ask the session to end (see :meth:`BoxDriver.stop_session`); a job whose service
        has not taken the session yet (waiting in the queue, setting up) is cancelled at
        once: it measured nothing."""
        if self.job_id is None or self.session is None:
            return "final"
        if self.status is None:
            self.poll_session()
        if self.status is None:
            self._cancel(say)
            return "killed"
        return super().stop_session(now=now, wait_s=wait_s, say=say)

    def stop(self) -> None:
        """Cancel the job by its id (Slurm signals every process of it: the service ends
        through its clean-up) and wait until it has left the running states."""
        self._cancel(None)

    def _cancel(self, say: Callable[[str], None] | None) -> None:
        if self.job_id is None:
            return
        info = self.slurm.info(self.job_id)
        if info is not None and info.state and not info.alive:
            return
        if say:
            say(f"cancelling Slurm job {self.job_id} (scancel {self.job_id})")
        try:
            self.slurm.cancel(self.job_id)
        except SlurmError as exc:
            raise BoxError(f"{exc}; cancel it by hand: scancel {self.job_id}") from None
        deadline = self.clock() + CANCEL_WAIT_S
        while self.clock() < deadline:
            info = self.slurm.info(self.job_id)
            if info is not None:
                self.job = info
                if not info.alive:
                    return
            self.sleep(0.5)

    def end(self, wait_s: float = 30.0) -> None:
        """The session is over: let the job end by itself (its script ends with the service),
        or cancel it."""
        if self.job_id is None:
            return
        deadline = self.clock() + wait_s
        while self.clock() < deadline:
            info = self.slurm.info(self.job_id)
            if info is not None and not info.alive:
                self.job = info
                return
            self.sleep(0.5)
        self._cancel(None)

    def settle_orphan(self, say: Callable[[str], None], wait_s: float = 3600.0) -> None:
        """With the lock held: a job of an earlier run whose controller is gone still in the
        queue or running.  A job still waiting is cancelled (it measured nothing); a running
        one is let end its job in flight (``drain``), then cancelled if it has not."""
        try:
            cur = self.read_json(self.path(CURRENT_SESSION))
        except (BoxError, ValueError):
            return
        if not isinstance(cur, dict) or not isinstance(cur.get("slurm_job"), str):
            return
        if not all(isinstance(cur.get(k), str) and SAFE_NAME.fullmatch(cur[k])
                   for k in ("run_id", "session_id")):
            return
        job_id = cur["slurm_job"]
        info = self.slurm.info(job_id)
        if info is None or not info.alive:
            return
        self.session = Layout(self.base, cur["run_id"], cur["session_id"])
        self.job_id = job_id
        try:
            status, _, _ = self.poll_session()
            if status is not None and not status.final:
                running = status.entry(status.current) if status.current else None
                left = min(wait_s, (running.allotment_s if running else 0.0)
                           + BUDGET_GRACE_S + 30.0)
                say(f"box {self.transport.name}: Slurm job {job_id} of run {cur['run_id']} (its "
                    f"controller is gone) is still measuring; waiting up to {left:.0f}s for its "
                    "job in flight to end, then its rows are merged")
                self.stop_session(now=False, wait_s=left, say=say)
            else:
                say(f"box {self.transport.name}: cancelling Slurm job {job_id} of run "
                    f"{cur['run_id']} (its controller is gone; it had not started measuring)")
            self._cancel(say)
        finally:
            self.session, self.status, self.job_id, self.job = None, None, None, None

    def describe(self) -> str:
        """The job as the summary names it: its node and its wait in the queue, and why."""
        if self.job_id is None or self.submitted_at is None:
            return ""
        node = f" on {self.job.node}" if self.job and self.job.node else ""
        end = self.left_queue_at if self.left_queue_at is not None else self.clock()
        why = f" ({', '.join(self.waited_for)})" if self.waited_for else ""
        return (f"Slurm job {self.job_id}{node}, {end - self.submitted_at:.0f}s in the queue"
                f"{why}")

