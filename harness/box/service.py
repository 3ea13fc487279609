"""The box service: one process per session that runs a card's whole session on the box's clock.

Started after setup in the box folder's tmux session ``emmy-node-sweep-<id>`` as
``python -m harness.box serve --session BOX/service/<session_id>/session.json``.  The request
(:class:`~harness.contract.SessionSpec`) names every job pytest selected, in order, with the
budget, the slices' shares, the paces and the options.  The service

1. claims the request (``claim.json``, made exclusively: a request is run by one process, once;
   a second service, or one started after a service of it died, refuses it);
2. starts its tools once (probe, compile pool, a bench worker per lane) and builds every job's
   pool once;
3. plans the budget (:mod:`harness.planner`) and runs the jobs back to back: a job's
   allotment is water-filled when the job before it ends, on this box's clock, and once every
   job has run, what is left tops up the jobs that still have points, until the budget or the
   points run out.  The next job's first batches compile while a job ends, so the GPU never
   waits for a job boundary nor for the controller.

It answers through files: ``status.json`` (:class:`~harness.contract.SessionStatus`, rewritten
whole at every change), each run's rows and summary (:class:`~harness.contract.Layout`).  The
controller watches them, fetches each job's rows as it ends and merges them while the box
measures on; it may ask for ``stop`` (end the job in flight at its next point; run nothing
more) or ``drain`` (run nothing after the job in flight).  The service ends with its session.
Stdlib + torch + triton only.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from harness import pools, shipped
from harness.box.job import Scheduler
from harness.box.runner import JobConfig, Tools, lookahead, run_job
from harness.contract import (
    ENDED,
    JOB_OVERHEAD_S,
    MIN_JOB_S,
    SESSION_ENDED,
    SLICES,
    Entry,
    JobRef,
    Layout,
    SessionSpec,
    SessionStatus,
    parse_baselines,
)
from harness.ledger import Ledger
from harness.planner import BudgetPlan, Ran, run_session, session_plan

STATUS_EVERY_S = 2.0  # the running job's time in the status is at most this old


class Refused(RuntimeError):
    """The request cannot be served: it was claimed before, or it cannot be read."""


class Ended(BaseException):
    """The service was told to end by a signal (tmux ended its session, a ``kill``)."""

    @property
    def signum(self) -> int:
        return int(self.args[0]) if self.args else 2


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def ledger_of_rows(run_dir: Path) -> Ledger:
    """Every point the run's rows files under ``run_dir`` hold, marked as its rows say (a line
    that is not a whole row is left out: the merge sets it aside)."""
    book = Ledger()
    for path in sorted(run_dir.glob("*.jsonl")):
        try:
            fh = path.open("rb")
        except OSError:
            continue
        with fh:
            for line in fh:
                try:
                    row = json.loads(line)
                    book.mark(row["point_key"], row["spec"], row["regime"], row["status"],
                              row.get("error") if isinstance(row.get("error"), str) else None)
                except (ValueError, TypeError, KeyError, RecursionError):
                    continue
    return book


def job_eta_s(entry: Entry) -> float:
    """A running job's seconds to go: until its allotment or, at its pace so far, its points
    run out, whichever comes first."""
    allot_left = max(0.0, entry.allotment_s - entry.elapsed_s)
    if entry.benched > 0 and entry.elapsed_s > 0:
        return min(allot_left, entry.points_left * entry.elapsed_s / entry.benched)
    return allot_left


def claim(path: Path) -> None:
    """Take the request for this process, once and for all: the claim is made exclusively, and
    a claimed request is never run again, whether its claimer lives or died (its job's rows
    are harvested by the controller, which sends what is left as a new session)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            held = json.loads(path.read_text())
        except (OSError, ValueError):
            held = {}
        raise Refused(f"session {path.parent.name} was claimed already (by pid {held.get('pid')} "
                      f"on {held.get('host')}); a session is run once") from None
    with os.fdopen(fd, "w") as fh:
        # pgid: the tmux pane's process group, which holds the service and every process it
        # started; the controller ends the service by these ids, never by a pattern.
        json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "host": socket.gethostname(),
                   "at": time.time()}, fh)


class Service:
    """One session on the box.  ``clock`` is the box's monotonic clock (a test seam)."""

    def __init__(self, spec_path: Path, log: Any = sys.stdout, clock: Any = time.monotonic) -> None:
        self.spec_path = spec_path
        self.dir = spec_path.parent
        self.log = log
        self.clock = clock
        self.status: SessionStatus | None = None
        self._primed: dict[JobRef, Scheduler] = {}
        self._lock = threading.Lock()
        self._written = 0.0
        self._best: dict[str, float] = {}  # shape_id → the session's best ok time on it

    # -- the session's files ------------------------------------------------------------------
    def _write(self) -> None:
        assert self.status is not None
        with self._lock:  # the lanes of a job call in from their threads
            self.status.spent_s = round(sum(e.elapsed_s for e in self.status.entries), 2)
            self._estimate()
            write_atomic(self.dir / "status.json", self.status.to_json())
            self._written = self.clock()

    def _estimate(self) -> None:
        """The seconds to go of the running job and of the session, as the status says them:
        a job ends when its points or its allotment run out, at its pace so far; the session
        when the budget or every job's points left do (at the plan's paces, top-ups
        included)."""
        status = self.status
        assert status is not None
        if status.final:
            status.eta_s = 0.0
            for e in status.entries:
                e.eta_s = None
            return
        plan = getattr(self, "plan", None)
        if plan is None:  # not planned yet
            return
        left = max(0.0, status.budget_s - status.spent_s)
        latest: dict[JobRef, Entry] = {}
        for e in status.entries:
            if e.job not in latest or e.round >= latest[e.job].round:
                latest[e.job] = e
        work = 0.0
        for e in latest.values():
            if e.state == "running":
                e.eta_s = round(job_eta_s(e), 1)
                work += e.eta_s
            elif e.state == "planned" or (e.state == "done" and e.points_left > 0):
                rate = plan.rates.get(e.kind)
                work += (left if rate is None else
                         e.points_left * rate / plan.lanes + JOB_OVERHEAD_S)
        for e in status.entries:
            if e.state != "running":
                e.eta_s = None
        status.eta_s = round(min(left, work), 1)

    def _ended(self, *ids: str) -> None:
        """Say that runs (or the session) have ended, after the status that says how."""
        with self._lock, open(self.dir / ENDED, "a") as fh:
            fh.write("".join(f"{i}\n" for i in ids))

    def _say(self, line: str) -> None:
        print(line, file=self.log, flush=True)

    def _asked(self, name: str) -> bool:
        return (self.dir / name).exists()

    # -- the session --------------------------------------------------------------------------
    def serve(self) -> int:
        try:
            spec = SessionSpec.from_json(self.spec_path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._say(f"[service] error: cannot read the session request {self.spec_path}: {exc}")
            return 2
        try:
            claim(self.dir / "claim.json")
        except Refused as exc:
            self._say(f"[service] error: {exc}")
            return 3
        self.spec = spec
        self.layout = Layout(str(self.dir.parent.parent), spec.run_id, spec.session_id)
        self.status = SessionStatus(spec.session_id, spec.run_id, budget_s=spec.budget_s,
                                    pid=os.getpid(), started_at=round(time.time(), 3),
                                    entries=[Entry(j.slice, j.kind) for j in spec.jobs])
        self._write()
        run_dir = Path(self.layout.run_dir)
        Path(self.layout.summary_dir).mkdir(parents=True, exist_ok=True)
        t0 = self.clock()
        tools = None
        rc = 0
        try:
            tools = Tools.start(spec.tools, spec.sweep.seed, run_dir / "worker.log")
            self.tools = tools
            lanes = (f" with {len(tools.lanes)} lanes ("
                     + ", ".join(lane.describe() for lane in tools.lanes) + ")"
                     if len(tools.lanes) > 1 else "")
            self._say(f"[service] up on {tools.card.name} ({tools.regime}){lanes} in "
                      f"{self.clock() - t0:.1f}s; session {spec.session_id}: "
                      f"{len(spec.jobs)} jobs, budget {spec.budget_s:.0f}s")
            self.status.card, self.status.regime = tools.card.name, tools.regime
            self.status.lanes = len(tools.lanes)
            plan = self._plan(tools)
            self.status.state = "running"
            self._write()
            self._last_end = self.clock()
            run_session(plan, self._run, self._skip,
                        stopping=lambda: self._asked("stop") or self._asked("drain"))
            self.status.state = "stopped" if self._asked("stop") or self._asked("drain") \
                else "done"
        except (Ended, KeyboardInterrupt) as exc:
            # not the controller's stop (that comes as a file): the job in flight died, and
            # the jobs not begun are left to the controller, which sends them again
            signum = exc.signum if isinstance(exc, Ended) else signal.SIGINT
            self.status.state = "stopped"
            self.status.error = f"the service was ended by {signal.Signals(signum).name}"
            self._say(f"[service] {self.status.error}")
            rc = 128 + signum
        except Exception as exc:  # noqa: BLE001 - said in the status, for the controller
            self.status.state = "failed"
            self.status.error = f"{type(exc).__name__}: {exc}"
            self._say(f"[service] error: {self.status.error}")
            self._say(traceback.format_exc()[-3000:])
            rc = 1
        finally:
            # the account first (a waiting controller goes on at once), then the tools
            self._close(rc)
            for sched in self._primed.values():
                if tools is not None and tools.pool is not None:
                    tools.pool.forget(sched.keys)
            if tools is not None:
                tools.close()
        self._say(f"[service] session {spec.session_id} {self.status.state}: "
                  f"{self.status.spent_s:.0f}s of {spec.budget_s:.0f}s spent")
        return rc

    def _close(self, rc: int) -> None:
        """The session's last status: every run final but the jobs a signal kept from starting
        (the controller sends those again), and the session's end marked."""
        status = self.status
        assert status is not None
        closed = []
        for e in status.entries:
            if e.state == "running":
                e.state = {"failed": "failed", "done": "stopped"}.get(
                    status.state, "died" if rc > 128 else "stopped")
                e.reason = status.error or "the session ended"
            elif e.state == "planned" and rc <= 128:
                e.state, e.reason = (("failed", f"the session failed: {status.error}")
                                     if status.state == "failed" else
                                     ("skipped", "the session was stopped before it ran"))
            else:
                continue
            closed.append(e.id)
        status.current = None
        status.ended_at = round(time.time(), 3)
        self._write()
        self._ended(*closed, SESSION_ENDED)

    def _plan(self, tools: Tools) -> BudgetPlan:
        """Every job's points (one pool build for the session), and the budget's plan."""
        spec, s = self.spec, self.spec.sweep
        self.ledger = Ledger.load(Path(self.layout.ledger))
        # A point whose row this run wrote is measured, whether or not a ledger save came
        # after it (a service killed between the two): a later session never measures it again.
        self.ledger.update(ledger_of_rows(Path(self.layout.run_dir)))
        kinds = sorted({j.kind for j in spec.jobs})
        pool = pools.build(tools.card, kinds=kinds, filter=s.filter, max_dist=s.max_dist,
                           tail_cap=s.tail_cap, baselines=parse_baselines(s.baselines))
        self.points = {j: pool.points(j.slice, j.kind) for j in spec.jobs}
        regime = tools.regime
        todo = {j: [p for p in pts if self.ledger.needs_run(p.key, regime, s.max_attempts)]
                for j, pts in self.points.items()}
        heavy = {j: sum(1 for p in pts if p.spec == shipped.COMPILE_SPEC) for j, pts in todo.items()}
        plan = session_plan(spec, {j: len(v) for j, v in todo.items()}, heavy, len(tools.lanes))
        self.plan = plan
        skipped = []
        for e in self.status.entries:  # type: ignore[union-attr]
            e.points_total, e.points_left = len(self.points[e.job]), len(todo[e.job])
            if e.job not in plan.order:
                e.state, e.reason = "skipped", self._nothing_left(e.job, pool, tools)
                skipped.append(e.id)
        self._write()
        self._ended(*skipped)
        for s_ in SLICES:
            for kind in kinds:
                n = sum(len(v) for j, v in todo.items() if j.slice == s_ and j.kind == kind)
                if any(j.slice == s_ and j.kind == kind for j in spec.jobs):
                    self._say(f"[plan] {s_:5} {kind:12} {n:6} to measure")
        return plan

    def _nothing_left(self, job: JobRef, pool: pools.PoolSet, tools: Tools) -> str:
        """Why a job has nothing to run, true on a re-run too."""
        if self.spec.shares.get(job.slice, 0) <= 0:
            return f"--share-{job.slice}=0: the {job.slice} slice is skipped"
        total = len(self.points[job])
        flt = self.spec.sweep.filter
        if flt and not any(pool.points(s, job.kind) for s in SLICES):
            return f"--filter={flt!r} keeps no {job.kind} shape"
        if total:
            return (f"all {total} {job.kind} points of the {job.slice} slice on {tools.card.name} "
                    "are in the node table already")
        why = {"own": " (no anchors of this card)",
               "cross": " (no other card's anchors realize here)"}.get(job.slice, "")
        return f"no {job.kind} points in the {job.slice} slice on {tools.card.name}{why}"

    def _needs_run(self, job: JobRef) -> list[pools.Point]:
        s = self.spec.sweep
        return [p for p in self.points[job]
                if self.ledger.needs_run(p.key, self.tools.regime, s.max_attempts)]

    def _skip(self, job: JobRef, allot: float) -> None:
        assert self.status is not None
        e = self.status.entry(job.id)
        assert e is not None
        e.state, e.allotment_s = "skipped", round(allot, 1)
        e.reason = (f"no budget left for this job ({allot:.1f}s allotted; under "
                    f"{MIN_JOB_S:.0f}s it would measure nothing)")
        primed = self._primed.pop(job, None)
        if primed is not None and self.tools.pool is not None:
            self.tools.pool.forget(primed.keys)
        self._write()
        self._ended(e.id)

    def _prime_next(self, job: JobRef) -> None:
        """The job after ``job`` in the session's order: its first batches go to the compile
        pool now, while ``job`` ends."""
        assert self.status is not None
        nxt = next((e.job for e in self.status.entries if e.state == "planned"), None)
        if nxt is None or nxt in self._primed or self.tools.pool is None:
            return
        s = self.spec.sweep
        sched = Scheduler(self._needs_run(nxt), s.batch, random.Random(s.seed), self.tools.pool,
                          lookahead(self.tools.pool.workers, s.batch, len(self.tools.lanes)))
        sched.prime()
        self._primed[nxt] = sched

    def _run(self, job: JobRef, allot: float, rnd: int) -> Ran:
        """Run one job (``rnd`` 0) or top-up (1, 2, …) for ``allot`` seconds of the box."""
        status, spec, tools = self.status, self.spec, self.tools
        assert status is not None
        if rnd == 0:
            entry = status.entry(job.id)
            assert entry is not None
        else:
            entry = Entry(job.slice, job.kind, round=rnd)
            status.entries.append(entry)
        entry.state, entry.allotment_s = "running", round(allot, 1)
        entry.points_total = len(self.points[job])
        entry.points_left = len(self._needs_run(job))
        status.current = entry.id
        self._write()
        cfg = JobConfig(slice=job.slice, kind=job.kind, budget_s=allot,
                        rows_path=Path(self.layout.rows(entry.id)),
                        ledger_path=Path(self.layout.ledger),
                        summary_path=Path(self.layout.summary(entry.id)),
                        sweep=spec.sweep, tools=spec.tools, run_id=spec.run_id)
        started = self._last_end  # the time between jobs is the job's

        def on_row(row: dict[str, Any]) -> None:  # the job's live account in the status
            entry.benched += 1
            entry.points_left = max(0, entry.points_left - 1)
            entry.shape = str(row.get("shape_id"))
            us = row.get("value_us")
            if row.get("status") == "ok":
                entry.ok += 1
                if not shipped.is_baseline(str(row.get("spec"))) and isinstance(us, (int, float)) \
                        and us > 0 and us < self._best.get(entry.shape, math.inf):
                    self._best[entry.shape] = float(us)
            entry.best_us = self._best.get(entry.shape)

        def should_stop() -> bool:  # asked before every point: the status says how far it is
            now = self.clock()
            if now - self._written >= STATUS_EVERY_S:
                entry.elapsed_s = round(now - started, 2)
                self._write()
            return self._asked("stop")

        summary: dict[str, Any] = {}
        try:
            summary = run_job(cfg, log=self.log, clock=self.clock, tools=tools, started=started,
                              should_stop=should_stop, points=self.points[job],
                              ledger=self.ledger, scheduler=self._primed.pop(job, None),
                              prefetch=(lambda: self._prime_next(job)) if rnd == 0 else None,
                              on_row=on_row)
            stop = str(summary.get("stop") or "")
            entry.state = "stopped" if stop == "stopped on request" else "done"
            entry.reason = stop
        except SystemExit as exc:  # the job's own failure (a rows file it cannot write)
            entry.state, entry.reason = "failed", str(exc.code)
        except Exception as exc:  # noqa: BLE001 - one job's failure never ends the session
            entry.state, entry.reason = "failed", f"{type(exc).__name__}: {exc}"
            self._say(f"[service] job {entry.id} failed: {entry.reason}")
            self._say(traceback.format_exc()[-3000:])
        end = self.clock()
        elapsed = end - started
        self._last_end = end
        left = len(self._needs_run(job))
        entry.elapsed_s = round(elapsed, 2)
        entry.points_left = left
        if summary:  # else (the job failed) what its rows said as they came
            entry.benched = int(summary.get("benched") or 0)
            entry.ok = int(summary.get("ok") or 0)
        status.current = None
        self._write()
        self._ended(entry.id)
        if entry.state == "failed":  # (a full disk, say): no top-up tries it again
            return Ran(spent_s=elapsed, points_left=0)
        pace = None
        if entry.benched >= 20 and entry.state == "done" and not self.plan.extra_s.get(job):
            pace = max(0.0, elapsed - JOB_OVERHEAD_S) * len(tools.lanes) / entry.benched
        return Ran(spent_s=elapsed, points_left=left, pace_s=pace)
