"""One collection session: boxes, the budget plan, the jobs, and each job's merge.

Created by the plugin after collection (only when sweep jobs were selected); the fixtures in
``collect_tests/conftest.py`` open boxes through it and each ``test_sweep`` item runs one job
through it.  The invariant it keeps: **a point is done only when its row is in the node table**.
So the ledger is made from the node table (never from what a box says it measured), each job's
rows are merged as soon as they are home, and whatever an earlier run left unmerged (on the box
or at home) is merged before a box measures anything.  One controller holds a box at a time.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from harness import cards
from harness.boxctl import DEFAULT_BASE, BoxDriver, BoxError, JobOutcome
from harness.contract import (
    MIN_JOB_S,
    SLACK_PER_JOB_S,
    Entry,
    SessionSpec,
    SessionStatus,
    new_run_id,
)
from harness.intake import owner_record, source, take_in_leftovers, write_owner
from harness.interrupts import Interrupted, Interrupts
from harness.ledger import Ledger
from harness.options import RunOptions
from harness.owner import Owner
from harness.planner import Job
from harness.progress import JobView, Progress, job_view
from harness.remote.boxdir import BoxDirError, BoxLock
from harness.remote.tmux import Tmux
from harness.remote.transport import LocalTransport
from harness.rows import RejectedRows
from harness.sessions import make_spec
from harness.slurmbox import QUEUE_ALLOWANCE_S, SlurmDriver, slurm_base
from harness.store import (
    MergeReceipt,
    NodeStore,
    RowsFile,
    read_db_id,
    read_ledger_records,
    receipt_dict,
)

JobKey = tuple[str, Job]  # (--gpu token, job)
SLURM_POLL_S = 30.0  # --poll-s with --provider slurm: one squeue a poll, kind to slurmctld


class BoxUnusable(BoxError):
    """A box that already failed to open: its other jobs are skipped, the reason said once."""


class CardMismatch(BoxError):
    """The box has another card than ``--gpu`` names: a usage error of the run (exit status 4),
    said once; none of that card's jobs runs."""


def _card_fix(want: cards.Card, have: cards.Card | None) -> str:
    """What to do about a box with another card."""
    other = (f"--gpu={have.alias} (the card it has) or " if have is not None
             and have.name in {c.name for c in cards.CATALOG} else "")
    return f"run with {other}--gpu=auto, or use a box with {want.name}"


class CollectWarning(UserWarning):
    """A recoverable problem of the collection that the user should see."""


@dataclass
class JobResult:
    key: JobKey
    allotment_s: float = 0.0
    outcome: JobOutcome | None = None
    skipped: str | None = None
    merge: MergeReceipt | None = None
    merge_error: str | None = None
    top_ups: list[dict[str, Any]] = field(default_factory=list)  # runs after the plan's last job
    parts: list[JobResult] = field(default_factory=list)  # earlier runs whose service died

    def stat(self, name: str) -> Any:
        own = (self.outcome.summary.get(name, 0) if self.outcome else 0) or 0
        if name in ("benched", "ok", "failed"):
            own += sum(p.stat(name) for p in self.parts)
        return own


@dataclass
class BoxState:
    """A prepared box and the session it runs.  ``entries`` is the controller's view of every
    run the box reported (of this session, and of an earlier one of this run whose service
    died), by entry id; ``fetched`` those whose rows came home."""

    gpu: str
    driver: BoxDriver
    probe: dict[str, Any]
    card: cards.Card
    spec: SessionSpec
    setup_s: float
    leftovers: dict[str, Any] = field(default_factory=dict)  # what earlier runs left, merged
    reported: bool = False  # the leftovers went into a job's report
    started: float = field(default_factory=time.monotonic)
    entries: dict[str, Entry] = field(default_factory=dict)
    fetched: set[str] = field(default_factory=set)
    session_over: bool = False  # its last session ended and everything it ran is home
    stopped_by: str | None = None  # why the controller stopped the session (--timeout-s, …)
    failed: str | None = None  # the box turned out unusable after it opened (a batch job)
    sessions: int = 1
    resumed: set[Job] = field(default_factory=set)  # jobs a new session took on after a death
    spent_before_s: float = 0.0  # box seconds charged by this run's earlier sessions
    status: SessionStatus | None = None
    budget_s: float = 0.0  # --budget-s: the card's, over all its sessions

    def see(self, status: SessionStatus) -> None:
        """A status of the running session: its entries join the view, each only if it is a
        run of a job this run asked for (an entry names the rows file fetched home: a status
        that names anything else is not the service's)."""
        self.status = status
        if status.regime:  # the service's own word (a batch job's box was not probed before)
            self.probe["regime"] = status.regime
        asked = set(self.spec.jobs)
        for e in status.entries:
            if not (isinstance(e.slice, str) and isinstance(e.kind, str)) or e.job not in asked \
                    or type(e.round) is not int or e.round < 0:
                continue
            old = self.entries.get(e.id)
            if old is None or not old.final or e.final:
                self.entries[e.id] = e

    @property
    def spent_s(self) -> float:
        return self.spent_before_s + (self.status.spent_s if self.status else 0.0)

    def left_s(self) -> float:
        return max(0.0, self.budget_s - self.spent_s)


class Collection:
    def __init__(self, opts: RunOptions, order: list[JobKey], *,
                 interrupts: Interrupts | None = None, session: str = "",
                 harvest: Any = None, progress: Progress | None = None) -> None:
        self.opts = opts
        self.order = order
        self.shares: Mapping[str, float] = opts.shares
        self.state_dir = opts.state_dir
        self.ledger_path = opts.ledger_path
        self.rows_dir = opts.rows_dir
        self.db_path: Path = opts.db_path
        self.run_id = new_run_id()
        self.results: dict[JobKey, JobResult] = {k: JobResult(k) for k in order}
        self.boxes: dict[str, BoxState] = {}
        self.drivers: dict[str, BoxDriver] = {}
        self.leases: dict[str, Any] = {}
        self.leases_dir = opts.leases_dir
        self.box_errors: dict[str, str] = {}
        self.first_errors: dict[str, BaseException] = {}
        self.refused: dict[str, str] = {}  # cards whose box has another card: why
        self.interrupts = interrupts or Interrupts()
        self.owner = Owner.here(session)
        self.harvest = harvest
        self.progress = progress or Progress(_Quiet())  # the run's lines (harness.progress)
        self.merging = opts.merging
        self.rejected_path = self.rows_dir / "rejected" / f"{self.run_id}.jsonl"
        self._check_writable()
        self.db_id = self._open_db()

    # -- preflight ---------------------------------------------------------------------------
    def _check_writable(self) -> None:
        """Fail before any box is touched (or server rented) when the DB could not take this
        run's rows (a folder, not writable, not a node DB, a newer schema) or the state folders
        cannot be written."""
        from harness.store import StoreError, check_db, make_private_dirs

        if self.ledger_path.expanduser().resolve() == self.db_path.expanduser().resolve():
            raise pytest.UsageError(f"--ledger={self.ledger_path} is the node DB (--db): the "
                                    "ledger would overwrite it; give them different files")
        if self.ledger_path.is_dir():
            raise pytest.UsageError(f"--ledger={self.ledger_path} is a directory; give a file path")
        if self.merging:
            try:
                check_db(self.db_path)
            except StoreError as exc:
                raise pytest.UsageError(f"--db: {exc}; nothing was started") from None
        for what, path in (("--db", self.db_path.parent), ("--ledger", self.ledger_path.parent),
                           ("--rows-dir", self.rows_dir)):
            try:  # the folders made here are private (0700): they hold the measurements
                make_private_dirs(path)
            except OSError as exc:
                raise pytest.UsageError(f"{what}: cannot create {path}: {exc.strerror}") from None
            if not os.access(path, os.W_OK):
                raise pytest.UsageError(f"{what}: {path} is not writable; choose another path")

    def _open_db(self) -> str | None:
        """Make (or open) the node table now, so a run that could not merge never measures;
        its id names this session's runs.  With --no-merge the DB is only read, if it exists."""
        from harness.store import StoreError

        if not self.merging:
            return read_db_id(self.db_path)
        try:
            with NodeStore(self.db_path) as store:
                return store.db_id
        except (StoreError, sqlite3.Error, OSError) as exc:
            raise pytest.UsageError(f"--db: {exc}; nothing was started") from None

    # -- boxes -------------------------------------------------------------------------------
    def open_box(self, gpu: str, progress: Callable[[str], None]) -> BoxState:
        """Prepare the box for ``gpu`` (this machine for local): lock, harvest what earlier
        runs left, push, set up, probe, plan."""
        if gpu in self.boxes:
            return self.boxes[gpu]
        if gpu in self.first_errors:  # opened before its first job: that job says why
            raise self.first_errors.pop(gpu)
        if gpu in self.box_errors:
            raise BoxUnusable(f"box for --gpu={gpu} is unusable: see the first job's failure")
        try:
            return self._open_box(gpu, progress)
        except Interrupted as exc:
            if exc.second:
                raise
            self.box_errors[gpu] = f"interrupted ({exc.signame}) while the box was prepared"
            pytest.exit(f"{exc.signame}: the session stopped while box {gpu} was prepared; "
                        "nothing was measured", returncode=pytest.ExitCode.INTERRUPTED)
        except Exception as exc:
            self.box_errors[gpu] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise

    def open_before_jobs(self, gpu: str, progress: Progress) -> bool:
        """Open the card's box before its first job's test starts; say whether its jobs run.
        A box with another card is a usage error: it is closed (a rented server given back
        at once), the card is refused, and none of its jobs runs or reports.  Another failure
        is kept for the first job, which fails with it."""
        if gpu in self.refused:
            return False
        if gpu in self.boxes or gpu in self.box_errors:
            return True
        try:
            self.open_box(gpu, progress)
        except CardMismatch as exc:
            self.refused[gpu] = str(exc)
            self.box_errors.pop(gpu, None)
            try:
                self.close_box(gpu, progress)
            except Exception as close_exc:  # noqa: BLE001 - said, the refusal stands
                progress(f"box for --gpu={gpu}: closing it failed: {close_exc}")
            if self.harvest is not None:
                self.harvest.refuse(gpu, str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - the first job's test fails with it
            self.first_errors[gpu] = exc
        return True

    def _open_box(self, gpu: str, progress: Callable[[str], None]) -> BoxState:
        t0 = time.monotonic()
        driver = self._driver(gpu, progress)
        transport = driver.transport
        driver.lock = BoxLock(transport, driver.base, self.owner)
        try:
            driver.lock.acquire()
        except BoxDirError as exc:
            raise BoxError(str(exc)) from None
        for note in driver.lock.notes:
            progress(note)
            warnings.warn(CollectWarning(note), stacklevel=1)
        queued = isinstance(driver, SlurmDriver)
        if not queued:
            self._check_card_early(gpu, driver)
        driver.settle_orphan(progress)
        leftovers = self._take_in_leftovers(driver, progress)
        progress.note(f"box {transport.name}: pushing the harness to {driver.base}")
        driver.push_code()
        if queued:  # the batch job sets up, probes and refuses a node with another card
            card = cards.by_alias(gpu)
            probe: dict[str, Any] = {"regime": card.regime, "card": card.name}
        else:
            progress(f"box {transport.name}: setup in tmux session {driver.setup_session}")
            probe = driver.setup()
            card = self._check_card(gpu, probe)
            progress.note(f"box {transport.name}: card {card.name} ({probe['regime']})")
        record = owner_record(self.owner, run_id=self.run_id, db_id=self.db_id,
                              db_path=str(self.db_path), merge=self.merging, gpu=gpu)
        try:
            write_owner(self.rows_dir / self.run_id / "owner.json", record)
            self._save_ledger()
        except OSError as exc:
            raise BoxError(f"cannot write {exc.filename or 'the state files'}: "
                           f"{exc.strerror or exc} (--rows-dir, --ledger); free space or choose "
                           "another folder; nothing was measured") from None
        driver.start_run(self.run_id, record, self.ledger_path)
        jobs = [j for g, j in self.order if g == gpu]
        spec = self._spec(card, probe["regime"], jobs, self.opts.budget_s, self.run_id)
        where = "a Slurm batch job" if queued else f"tmux session {driver.sweep_session}"
        progress(f"box {transport.name}: {card.name} ({probe['regime']}); {len(jobs)} jobs in "
                 f"{spec.budget_s:.0f}s, {where}")
        submitted = time.monotonic()
        driver.start_session(spec, progress)
        state = BoxState(gpu=gpu, driver=driver, probe=probe, card=card, spec=spec,
                         setup_s=time.monotonic() - t0, leftovers=leftovers,
                         budget_s=self.opts.budget_s)
        if queued:  # --timeout-s counts the queue's wait and the job's setup
            state.started = submitted
        self.boxes[gpu] = state
        return state

    def _spec(self, card: cards.Card, regime: str, jobs: list[Job], budget_s: float,
              session_id: str) -> SessionSpec:
        """The session request: these jobs, this budget, the node table's paces of the card."""
        return make_spec(run_id=self.run_id, session_id=session_id, budget_s=budget_s,
                         shares=self.shares, jobs=jobs, card=card.name, regime=regime,
                         db=self.db_path if self.merging else None, sweep=self.opts.sweep,
                         tools=self.opts.tools)

    def _save_ledger(self) -> None:
        """Save the node table's ledger at ``--ledger`` (pushed to the box for this run): a
        point is done there only because its row is in the table (nothing a box reports counts
        before it is merged)."""
        bound = {"id": self.db_id or "", "path": str(self.db_path)}
        if self.merging:
            with NodeStore(self.db_path) as store:
                ledger = Ledger.from_records(store.ledger_records(), bound)
        else:
            ledger = Ledger.from_records(read_ledger_records(self.db_path), bound)
        with self.interrupts.shielded():
            ledger.save(self.ledger_path)

    def _take_in_leftovers(self, driver: BoxDriver, progress: Callable[[str], None]
                           ) -> dict[str, Any]:
        """Merge what earlier runs of this node table left unmerged, on the box and at home,
        before anything is measured; say how much."""
        if not self.merging or self.db_id is None:
            return {}
        try:
            return take_in_leftovers(driver, db_path=self.db_path, db_id=self.db_id,
                                     rows_dir=self.rows_dir, current_run=self.run_id,
                                     merge=self._merge, say=progress)
        except OSError as exc:  # the home disk: they stay where they are for the next run
            msg = (f"rows left by earlier runs could not be brought home: {exc.strerror or exc} "
                   f"({exc.filename or self.rows_dir}); they stay on the box for the next run")
            progress(msg)
            warnings.warn(CollectWarning(msg), stacklevel=1)
            return {"error": msg}

    def _merge(self, files: list[RowsFile],
               keep: Callable[[MergeReceipt], None] | None = None) -> MergeReceipt:
        """Merge rows files into the node table now; a first Ctrl-C waits until it is done
        (``keep`` is handed the receipt before that Ctrl-C is raised)."""
        with self.interrupts.shielded(), NodeStore(self.db_path) as store:
            receipt = store.merge_files(files, RejectedRows(self.rejected_path))
            if keep is not None:
                keep(receipt)
            return receipt

    def _rent(self, gpu: str, progress: Callable[[str], None]) -> Any:
        """Rent a server for ``gpu`` through ``--provider``; its lease is on disk at once."""
        from harness.remote.providers import make_provider
        from harness.remote.ssh import parse_remote

        o = self.opts
        provider = make_provider(o.provider, o.up_cmd, o.down_cmd, o.sky_cloud)
        card = cards.by_alias(gpu)
        progress(f"renting a {card.name} through {provider.name}")

        def record(lease: Any) -> None:
            lease.owner = {**self.owner.__dict__}
            lease.db_id = self.db_id if self.merging else None
            lease.save(self.leases_dir)

        lease = provider.acquire(card, record)
        self.leases[gpu] = lease
        progress(f"rented {lease.target} (release: {lease.release_command})")
        return parse_remote(lease.target), lease

    def release(self, gpu: str, progress: Callable[[str], None]) -> None:
        """Give a rented server back (never one given by --remote); --keep-server keeps it, and
        so does leaving at once (a second Ctrl-C): it may hold rows not merged yet."""
        lease = self.leases.pop(gpu, None)
        if lease is None:
            return
        if lease.provider == "slurm":
            self._release_job(gpu, lease, progress)
            return
        if self.opts.keep_server or self.interrupts.leaving:
            why = ("--keep-server" if self.opts.keep_server else
                   "left at once; it may hold rows not merged yet, which a run with this "
                   f"node table merges from --remote={lease.target}")
            msg = f"server kept ({why}): {lease.target}; release it with: {lease.release_command}"
            progress(msg)
            warnings.warn(CollectWarning(msg), stacklevel=1)
            if lease.path and self.opts.keep_server:
                Path(lease.path).unlink(missing_ok=True)
            return
        progress(f"releasing {lease.target}")
        lease.release()

    def _release_job(self, gpu: str, lease: Any, progress: Callable[[str], None]) -> None:
        """This session's Slurm job ends with it: cancelled by its id if it still runs
        (``scancel``), its lease then removed; leaving at once (a second Ctrl-C) leaves it
        to run its session out, and says how to cancel it."""
        driver = self.drivers.get(gpu)
        on = "" if lease.target == "local" else f" on {lease.target}"
        if self.interrupts.leaving or driver is None:
            msg = (f"Slurm job {lease.handle} kept (left at once): it may still be measuring; "
                   f"cancel it with: scancel {lease.handle}{on} (the next run with this node "
                   "table merges its rows)")
            progress(msg)
            warnings.warn(CollectWarning(msg), stacklevel=1)
            return
        driver.stop()
        if lease.path:
            Path(lease.path).unlink(missing_ok=True)

    def _driver(self, gpu: str, progress: Callable[[str], None]) -> BoxDriver:
        """A driver for the box: this machine, the ``--remote`` server, a rented one, or a
        Slurm job submitted from the login node (this machine or ``--remote``)."""
        target = self.opts.remote_target
        rented: Any = None
        if self.opts.provider == "slurm":
            return self._slurm_driver(gpu, target)
        if self.opts.provider:
            target, rented = self._rent(gpu, progress)
        if target is None:
            transport: Any = LocalTransport()
            python, poll_s = self.opts.box_python or sys.executable, 1.0
        else:
            from harness.remote.ssh import SSHTransport

            key = self.opts.ssh_key or (rented.ssh_key if rented else None)
            known = self.opts.known_hosts
            # a server this run rented is new: its first host key is saved (a changed one is
            # still refused); an existing server's key must already be known
            transport = SSHTransport(target, key_filename=Path(key).expanduser() if key else None,
                                     known_hosts=Path(known).expanduser() if known else None,
                                     accept_new_host_key=self.opts.accept_new_host_key
                                     or rented is not None)
            where = f"rented server {rented.target}" if rented else f"--remote={self.opts.remote}"
            deadline = time.monotonic() + (600 if rented else 0)
            while True:
                try:
                    transport.connect()  # a wrong host or key fails here, not as "unreachable"
                    break
                except ConnectionError as exc:
                    if time.monotonic() >= deadline:  # a fresh rental may still be booting
                        raise BoxError(f"cannot reach {where}: {exc}") from None
                    time.sleep(10)
            python, poll_s = self.opts.box_python or "python3", 60.0
        extra = rented.extra if rented else {}
        socket = self.opts.tmux_socket or extra.get("tmux_socket")
        driver = BoxDriver(transport=transport, tmux=Tmux(transport, socket),
                           base=self.opts.box_dir or extra.get("box_dir") or DEFAULT_BASE,
                           python=python, install=self.opts.box_install,
                           poll_s=self.opts.poll_s or poll_s)
        self.drivers[gpu] = driver
        return driver

    def _login_transport(self, target: Any) -> Any:
        """This machine, or the ``--remote`` server (its host key must be known)."""
        if target is None:
            return LocalTransport()
        from harness.remote.ssh import SSHTransport

        o = self.opts
        transport = SSHTransport(target, key_filename=Path(o.ssh_key).expanduser() if o.ssh_key
                                 else None,
                                 known_hosts=Path(o.known_hosts).expanduser() if o.known_hosts
                                 else None, accept_new_host_key=o.accept_new_host_key)
        try:
            transport.connect()
        except ConnectionError as exc:
            raise BoxError(f"cannot reach --remote={o.remote}: {exc}") from None
        return transport

    def _slurm_driver(self, gpu: str, target: Any) -> SlurmDriver:
        """The login node's driver for card ``gpu``'s batch job; its job id is leased (on
        disk) the moment sbatch answers."""
        from harness.remote.providers import Lease

        o = self.opts
        transport = self._login_transport(target)
        base = slurm_base(o.box_dir, gpu)

        def record(job_id: str) -> None:
            lease = Lease(provider="slurm", gpu=gpu, target=o.remote or "local", handle=job_id,
                          release_argv=["scancel", job_id], ssh_key=o.ssh_key,
                          extra={"box_dir": base}, owner={**self.owner.__dict__},
                          db_id=self.db_id if self.merging else None)
            lease.save(self.leases_dir)
            self.leases[gpu] = lease

        driver = SlurmDriver(transport=transport, tmux=Tmux(transport, o.tmux_socket), base=base,
                             python=o.box_python or (sys.executable if target is None
                                                     else "python3"),
                             install=o.box_install, poll_s=o.poll_s or SLURM_POLL_S,
                             options=o.slurm, card=cards.by_alias(gpu), gpu=gpu, record=record)
        self.drivers[gpu] = driver
        return driver

    def _check_card_early(self, gpu: str, driver: BoxDriver) -> None:
        """Refuse a box with another card in seconds, before anything is pushed or set up
        (the probe after setup checks again, from what CUDA reports)."""
        if gpu in (cards.LOCAL, cards.AUTO):
            return
        want = cards.by_alias(gpu)
        what, name = driver.quick_card()
        if what == "unknown":
            return
        if what == "cpu":
            have, shown = cards.INTERPRETER, "no NVIDIA GPU (nvidia-smi finds none)"
        elif what == "named":
            have, shown = None, name
        else:
            have, shown = cards.canonicalize(name), name
        if (have.name if have else name) != want.name:
            raise CardMismatch(f"--gpu={gpu} wants {want.name} but box {driver.transport.name} "
                               f"has {shown}; nothing was set up or measured: "
                               f"{_card_fix(want, have)}")

    def _check_card(self, gpu: str, probe: dict[str, Any]) -> cards.Card:
        card = cards.card_from_probe(probe)
        if gpu not in (cards.LOCAL, cards.AUTO):
            want = cards.by_alias(gpu)
            if want.name != card.name:
                raise CardMismatch(f"--gpu={gpu} wants {want.name} but the box has {card.name} "
                                   f"(device {probe.get('device_name')!r}); nothing was "
                                   f"measured: {_card_fix(want, card)}")
        return card

    def close_box(self, gpu: str, progress: Callable[[str], None]) -> None:
        """End the box's session if it still runs and bring home what it measured, give the
        box's lock back, close the connection, release a rented server: each step runs even
        when the one before it failed.  After a second Ctrl-C nothing slow runs."""
        driver = self.drivers.get(gpu)
        box = self.boxes.get(gpu)
        try:
            if driver is not None and box is not None and self.interrupts.leaving \
                    and not box.session_over and not (box.status and box.status.final):
                self._say_left_running(box, progress)
            if driver is not None:
                try:
                    if not self.interrupts.leaving:
                        with self.interrupts.shielded():
                            if box is not None:
                                self._close_session(box, progress)
                            if driver.lock is not None:
                                driver.lock.release()
                finally:
                    try:
                        if isinstance(driver, SlurmDriver):  # scancel runs on the login node
                            self.release(gpu, progress)
                    finally:
                        driver.transport.close()
        finally:
            self.release(gpu, progress)

    def _say_left_running(self, box: BoxState, progress: Callable[[str], None]) -> None:
        """Leaving at once leaves the card's session measuring on the box: say so, and how to
        watch it or end it (the next run with this node table ends it after its job in flight
        and merges its rows)."""
        d = box.driver
        if isinstance(d, SlurmDriver):
            line = (f"box {d.transport.name}: {d.describe()} may still be measuring (up to "
                    f"{box.left_s():.0f}s of budget); watch it with `squeue -j {d.job_id}` and "
                    f"`tail -f {d.path('sweep.log')}`, cancel it with `scancel {d.job_id}`, or "
                    "let the next run with this node table merge its rows")
            progress(line)
            if self.harvest is not None:
                self.harvest.left_running.append(line)
            return
        sock = f" -L {d.tmux.socket}" if d.tmux.socket else ""
        on = "" if d.transport.name == "local" else f" on {d.transport.name}"
        line = (f"box {d.transport.name}: its session may still be measuring in tmux session "
                f"{d.sweep_session} (up to {box.left_s():.0f}s of budget); watch it with "
                f"`tmux{sock} attach -t {d.sweep_session}`{on}, end it with "
                f"`tmux{sock} kill-session -t {d.sweep_session}`{on}, or let the next run with "
                "this node table end it after its job in flight and merge its rows")
        progress(line)
        if self.harvest is not None:
            self.harvest.left_running.append(line)

    # -- jobs: the box runs them; each test waits for its own, brings it home, merges it -------
    def run_job(self, key: JobKey, box: BoxState, progress: Callable[[str], None],
                nodeid: str = "") -> JobResult:
        """Wait until the box says how ``key``'s job went, fetch and merge its rows (the box
        measures the next job meanwhile) and report it; the card's last job also waits for the
        session's end and brings its top-ups home."""
        gpu, job = key
        res = self.results[key]
        say = self._sayer(progress, box, job)
        try:
            try:
                entry = self._await(box, job, say)
                res.allotment_s = entry.allotment_s
                if entry.state == "skipped":
                    res.skipped = self._skip_reason(box, entry)
                elif entry.id not in box.fetched or res.outcome is None:
                    self._harvest(box, entry, say)
                self._job_done(box, key, entry)
                if key == self.last_job(gpu):
                    self._finish(box, progress)
            except Interrupted as exc:
                if exc.second:
                    raise
                self._interrupted(key, box, exc, say, nodeid)
        except Interrupted as exc:  # the second: leave at once, still say where things are
            where = box.driver.path("rows", self.run_id, f"{job.id}.jsonl")
            res.outcome = res.outcome or JobOutcome(state="interrupted", remote_rows=where)
            res.outcome.state = "interrupted"
            res.outcome.summary["stop"] = (f"{exc.signame} twice: left at once; its rows stay "
                                           f"on the box in {where}")
            if self.harvest is not None:
                self.harvest.note_job(nodeid, self.job_report(key), outcome="interrupted",
                                      reason=f"{exc.signame} twice: left at once")
            raise
        return res

    def _job_done(self, box: BoxState, key: JobKey, entry: Entry) -> None:
        """The job is home: its line, with its result."""
        res = self.results[key]
        if res.skipped:
            state = f"skipped: {res.skipped}"
        elif res.outcome is None:
            state = _result(entry)
        else:
            stop = res.outcome.summary.get("stop")
            state = res.outcome.state + (f" ({stop})" if stop else "")
            if res.merge_error:
                state += "; its merge failed"
            elif res.merge is not None and res.merge.rejected:
                state += f"; {res.merge.rejected} row(s) rejected"
        self.progress.done(replace(self._view(box, entry), state=state, eta_s=None,
                                   session_eta_s=None))

    def last_job(self, gpu: str) -> JobKey | None:
        mine = [k for k in self.order if k[0] == gpu]
        return mine[-1] if mine else None

    def _deadline(self, box: BoxState) -> float:
        """When the controller stops the card's session (--timeout-s, from the end of setup;
        by default the budget and some slack per job: the box bounds itself)."""
        limit = self.opts.timeout_s or box.budget_s + SLACK_PER_JOB_S * (len(box.spec.jobs) + 1)
        if not self.opts.timeout_s and isinstance(box.driver, SlurmDriver):
            limit += self.opts.slurm.slurm_setup_s + QUEUE_ALLOWANCE_S
        return box.started + limit

    @staticmethod
    def _place(box: BoxState, entry: Entry) -> str:
        """Where a run stands in the card's session: ``job k/N`` or ``top-up``."""
        if entry.round:
            return "top-up"
        k = box.spec.jobs.index(entry.job) + 1 if entry.job in box.spec.jobs else 0
        return f"job {k}/{len(box.spec.jobs)}"

    def _sayer(self, progress: Callable[[str], None], box: BoxState,
               job: Job) -> Callable[[str], None]:
        place = self._place(box, Entry(job.slice, job.kind))

        def say(line: str) -> None:  # every line names the job and its place in the session
            progress(f"{box.gpu} {job.id} [{place}]: {line}")

        return say

    def _note(self, box: BoxState, entry: Entry, line: str) -> None:
        """A routine step of a run (see :meth:`harness.progress.Progress.note`)."""
        self.progress.note(f"{box.gpu} {entry.id} [{self._place(box, entry)}]: {line}")

    def _view(self, box: BoxState, entry: Entry) -> JobView:
        """The run's line, as the box's latest status has it."""
        return job_view(box.gpu, entry, self._place(box, entry), box.status)

    def _await(self, box: BoxState, job: Job, say: Callable[[str], None]) -> Entry:
        """The box's account of ``job``'s run once it is final (the job ran, was skipped, or
        never will run).  At the deadline the session is stopped; a service that died is
        started again for the jobs it had not begun."""
        told: set[str] = set()
        entry_id = job.id
        marks = (f"{job.slice} {job.kind}", entry_id)

        def mine(line: str) -> bool:  # never another job's line
            return any(m in line for m in marks)

        def on_status(status: SessionStatus) -> None:
            box.see(status)
            e = box.entries.get(entry_id)
            if e is not None and e.state != "planned" and e.state != "skipped" \
                    and "allotted" not in told:
                told.add("allotted")
                self._note(box, e, f"{e.allotment_s:.0f}s allotted")
            if e is not None and e.state in ("planned", "running"):
                self.progress.show(self._view(box, e))

        def log_line(line: str) -> None:
            self._note(box, Entry(job.slice, job.kind), line)

        while True:
            if box.failed:
                raise BoxUnusable(f"box for --gpu={box.gpu} is unusable: see the first job's "
                                  "failure")
            entry = box.entries.get(entry_id)
            if entry is not None and entry.final:
                if entry.state == "died" and self._resumable(box, entry):
                    self._died(box, say)  # the service said so as it ended: a new session
                    continue
                if box.status is not None:
                    on_status(box.status)
                return entry
            if box.session_over:
                return Entry(job.slice, job.kind, state="skipped",
                             reason=box.stopped_by or "the session ended before it ran")
            try:
                why = box.driver.wait_entry(entry_id, self._deadline(box), on_line=log_line,
                                            mine=mine, on_status=on_status, on_event=say)
            except BoxError as exc:  # a batch job that ended before its session began
                box.failed = str(exc)
                box.session_over = True
                self.box_errors[box.gpu] = str(exc).splitlines()[0]
                raise
            entry = box.entries.get(entry_id)
            if entry is not None and entry.final:
                continue
            if why == "timeout":
                self._stop(box, f"--timeout-s={self._limit(box):g} reached", say)
            elif why == "dead" or (box.status is not None and box.status.final):
                self._died(box, say)  # gone, or ended by a signal that was not ours

    def _limit(self, box: BoxState) -> float:
        return self._deadline(box) - box.started

    def _skip_reason(self, box: BoxState, entry: Entry) -> str:
        generic = ("the session was stopped before it ran", "not reached",
                   "the session ended before it ran")
        if box.stopped_by and box.stopped_by.startswith("--timeout-s") and (
                not entry.reason or entry.reason in generic):
            return f"{box.stopped_by}: the sweep was stopped"
        return entry.reason or "not run"

    def _stop(self, box: BoxState, why: str, say: Callable[[str], None]) -> None:
        """Stop the session at its next point and bring what it measured home (a harvest
        trigger, not a failure)."""
        waited = box.driver.queue_note() if box.status is None else ""
        if waited:  # a batch job still waiting (or setting up): it measured nothing
            why = f"{why} while {waited}"
        say(f"{why}: stopping the session and bringing its rows home")
        box.stopped_by = why
        open_ = {i for i, e in box.entries.items() if not e.final}
        box.driver.stop_session(now=True, say=say)
        if box.status is None and box.driver.status is None:
            box.session_over = True  # it never began: nothing to bring home
        if box.driver.status is not None:
            box.see(box.driver.status)
        # a service ended by force says its job died: it was this stop
        for i in open_:
            e = box.entries.get(i)
            if e is not None and e.state == "died":
                e.state, e.reason = "stopped", why
        self._close_entries(box, "stopped", why)

    def _close_entries(self, box: BoxState, running: str, why: str) -> None:
        for e in box.entries.values():
            if e.state == "running":
                e.state, e.reason = running, why
            elif e.state == "planned":
                e.state, e.reason = "skipped", why

    def _resumable(self, box: BoxState, entry: Entry) -> bool:
        """Whether a new session may take on what is left of ``entry``'s job: it died with
        the session's service (which said so as a signal ended it), once per job."""
        return (entry.round == 0 and entry.job not in box.resumed and entry.id not in box.fetched
                and box.status is not None and box.status.final and bool(box.status.error)
                and not self.interrupts.count)

    def _died(self, box: BoxState, say: Callable[[str], None]) -> None:
        """The service is gone without ending its session (killed, the box rebooted, out of
        memory): the job it ran has died.  Its rows come home and merge now; a new session,
        with what is left of the budget, takes on what is left of that job (once: the new
        service leaves out every point whose row the run wrote) and the jobs it had not
        begun."""
        why = (box.driver.gone_reason()
               or (box.status.error if box.status and box.status.error else None)
               or "the box service died (its tmux session is gone)")
        if not box.driver.restarts:
            self._gone(box, why, say)
            return
        planned = [e.job for e in box.entries.values() if e.state == "planned" and e.round == 0]
        # its job in flight: still "running" if it was killed, "died" if it said so as it ended
        dead = [e for e in box.entries.values() if e.state == "running"
                or (e.state == "died" and e.id not in box.fetched)]
        for e in dead:
            e.state, e.reason = "died", e.reason if e.state == "died" and e.reason else why
        resume = [e for e in dead if e.round == 0 and e.job not in box.resumed]
        box.spent_before_s += box.status.spent_s if box.status else 0.0
        box.status = None
        left = box.left_s()
        todo = [e.job for e in resume] + planned
        if not todo or left < MIN_JOB_S or self.interrupts.count:
            self._close_entries(box, "died", f"{why} before it ran")
            box.session_over = True
            return
        parts = []
        for e in resume:  # its rows home and merged; its result waits for the rest of the job
            part = JobResult((box.gpu, e.job), allotment_s=e.allotment_s)
            self._harvest(box, e, say, into=part)
            parts.append((e, part))
        box.sessions += 1
        spec = self._spec(box.card, str(box.probe["regime"]), todo, left,
                          f"{self.run_id}.{box.sessions}")
        what = " and ".join(x for x in (
            f"what is left of {', '.join(e.id for e in resume)}" if resume else "",
            f"the {len(planned)} job(s) it had not begun" if planned else "") if x)
        say(f"{why}; starting a new session for {what} ({left:.0f}s of the budget left)")
        try:
            box.driver.start_session(spec, say)
        except BoxError as exc:
            self._close_entries(box, "died", f"{why}; a new session did not start: {exc}")
            box.session_over = True
            for e, part in parts:  # the died run is the job's result after all
                res = self.results[(box.gpu, e.job)]
                res.outcome, res.merge, res.merge_error = part.outcome, part.merge, part.merge_error
            return
        for e, part in parts:
            res = self.results.setdefault((box.gpu, e.job), JobResult((box.gpu, e.job)))
            res.parts.append(part)
            if part.merge_error and not res.merge_error:  # the job fails for it, as it would
                res.merge_error = part.merge_error
            box.resumed.add(e.job)
            del box.entries[e.id]  # the new session's run of the job takes its place
            box.fetched.discard(e.id)
            note = (f"{e.id}: {why}; its {part.stat('benched')} row(s) are merged and a new "
                    "session measures what is left of it")
            warnings.warn(CollectWarning(note), stacklevel=1)

    def _gone(self, box: BoxState, why: str, say: Callable[[str], None]) -> None:
        """A box that is not started again (a batch job Slurm ended): the run in flight died,
        its rows come home and merge now, and the jobs it had not begun died with it; the next
        run resumes from the node table."""
        say(f"{why}; bringing its rows home (the next run measures what is left)")
        for e in box.entries.values():
            if e.state == "running" or (e.state == "died" and e.id not in box.fetched):
                e.state, e.reason = "died", why
        self._close_entries(box, "died", f"{why} before it ran")
        self._harvest_rest(box, say)
        box.session_over = True

    def _harvest(self, box: BoxState, entry: Entry, say: Callable[[str], None],
                 into: JobResult | None = None) -> JobResult:
        """Bring one run home, merge its rows, and book it on its job's result (a top-up in
        the job's ``top_ups``; ``into``: on that result instead)."""
        key = (box.gpu, entry.job)
        res = self.results.setdefault(key, JobResult(key))
        box.fetched.add(entry.id)
        outcome = box.driver.fetch_entry(entry, self.rows_dir, say)
        holder = into if into is not None else res if entry.round == 0 else JobResult(key)
        holder.outcome = outcome
        if entry.round == 0 and into is None:
            res.allotment_s = entry.allotment_s
        if entry.state == "stopped" and box.stopped_by and box.stopped_by.startswith("--"):
            outcome.summary["stop"] = f"{box.stopped_by}; harvested"
        try:
            if outcome.rows_path is not None and self.merging:
                self._note(box, entry, f"merging the rows of {entry.id} into {self.db_path}")
                self.progress.state((box.gpu, entry.id), "merging")
                try:
                    self._merge([RowsFile(outcome.rows_path,
                                          source(self.run_id, outcome.rows_path.name))],
                                keep=lambda receipt: setattr(holder, "merge", receipt))
                except Interrupted:
                    raise
                except Exception as exc:  # noqa: BLE001 - the rows stay pending; the job fails
                    holder.merge_error = str(exc).splitlines()[0]
        finally:  # booked also when a Ctrl-C came during its merge
            if entry.round:
                res.top_ups = [t for t in res.top_ups if t["id"] != entry.id]
                res.top_ups.append(self._top_up(entry, holder))
        return res

    @staticmethod
    def _top_up(entry: Entry, r: JobResult) -> dict[str, Any]:
        out = r.outcome
        stop = out.summary.get("stop") if out else None
        return {"id": entry.id, "round": entry.round, "slice": entry.slice, "kind": entry.kind,
                "state": entry.state + (f" ({stop})" if stop else ""),
                "allotment_s": round(entry.allotment_s, 1), "seconds": round(entry.elapsed_s, 1),
                **{k: r.stat(k) for k in ("benched", "ok", "failed")},
                "merge": ({"state": "merged", **receipt_dict(r.merge)} if r.merge else
                          {"state": "failed", "error": r.merge_error} if r.merge_error else {})}

    def _harvest_rest(self, box: BoxState, say: Callable[[str], None]) -> list[Entry]:
        """Every run the box ended whose rows are not home yet: fetch and merge them."""
        done = []
        for entry in list(box.entries.values()):
            if entry.final and entry.state != "skipped" and entry.id not in box.fetched:
                self._harvest(box, entry, say)
                done.append(entry)
        return done

    def _finish(self, box: BoxState, progress: Callable[[str], None]) -> None:
        """The card's last job is home: wait for the session's end (its top-ups) and bring
        home whatever is left."""
        def say(line: str) -> None:
            progress(f"{box.gpu} session [top-ups]: {line}")

        def note(line: str) -> None:
            self.progress.note(f"{box.gpu} session [top-ups]: {line}")

        shown: set[str] = set()

        def on_status(status: SessionStatus) -> None:  # each top-up's line
            box.see(status)
            for e in list(box.entries.values()):
                if e.round and e.state == "running":
                    shown.add(e.id)
                    self.progress.show(self._view(box, e))
                elif e.id in shown and e.final:
                    shown.discard(e.id)
                    self.progress.done(replace(self._view(box, e), state=_result(e)))

        while not box.session_over and not (box.status and box.status.final):
            why = box.driver.wait_entry(None, self._deadline(box), on_line=note,
                                        on_status=on_status, on_event=say)
            if why == "timeout":
                self._stop(box, f"--timeout-s={self._limit(box):g} reached", say)
            elif why == "dead":
                self._died(box, say)
                box.session_over = True
        self._harvest_rest(box, lambda line: progress(f"{box.gpu} {line}"))
        box.session_over = True

    def _end_session(self, box: BoxState, progress: Callable[[str], None]) -> None:
        """At the end of the card's tests (some never ran): stop the session if it still runs,
        and bring home what it measured, so that nothing stays on the box."""
        if box.status is not None and not box.status.final:
            self._stop(box, "the session's tests are over", lambda line: progress(
                f"{box.gpu}: {line}"))
        got = self._harvest_rest(box, lambda line: progress(f"{box.gpu} {line}"))
        if got:
            progress(f"{box.gpu}: brought home and merged {len(got)} run(s) that ended after "
                     "their tests: " + ", ".join(e.id for e in got))
        box.session_over = True

    def _close_session(self, box: BoxState, progress: Callable[[str], None]) -> None:
        if not box.session_over:
            self._end_session(box, progress)
        box.driver.end()

    def _interrupted(self, key: JobKey, box: BoxState, exc: Interrupted,
                     say: Callable[[str], None], nodeid: str) -> None:
        """The first Ctrl-C (SIGTERM, SIGHUP): stop the session at its next point, bring home
        and merge every run it ended, report, and end the pytest session (status 2)."""
        say(f"{exc.signame}: stopping the session and bringing its rows home (again to leave at "
            "once: its rows stay on the box and the next run merges them)")
        box.stopped_by = exc.signame
        running = {e.id for e in box.entries.values() if e.state == "running"}
        ended = box.driver.stop_session(now=True, say=say)
        if box.driver.status is not None:
            box.see(box.driver.status)
        if ended == "killed":
            self._close_entries(box, "stopped", f"{exc.signame}")
        for entry in self._harvest_rest(box, say):
            other = (box.gpu, entry.job)
            if other != key and entry.round == 0 and self.harvest is not None:
                self.harvest.note_job(_nodeid(nodeid, box.gpu, entry.job), self.job_report(other),
                                      outcome="interrupted" if entry.id in running else "passed",
                                      reason=None)
        box.session_over = True
        res = self.results[key]
        mine = box.entries.get(key[1].id)
        was_running = mine is not None and (mine.id in running or mine.state == "stopped")
        outcome = res.outcome or JobOutcome(state="interrupted")
        if was_running or res.outcome is None:
            outcome.state = "interrupted"
        outcome.interrupted = exc
        res.outcome = outcome
        self._end_interrupted(key, outcome, res.merge, nodeid)

    def _end_interrupted(self, key: JobKey, outcome: JobOutcome, merge: MergeReceipt | None,
                         nodeid: str) -> None:
        sig = outcome.interrupted.signame  # type: ignore[union-attr]
        merged = (f"{merge.rows_read} rows merged" if merge else
                  f"its rows kept in {outcome.rows_path}" if outcome.rows_path else
                  f"no rows came home; they stay on the box in {outcome.remote_rows}"
                  if outcome.remote_rows else "it had not started")
        outcome.summary["stop"] = f"{sig}; stopped and harvested: {merged}"
        if self.harvest is not None:
            self.harvest.note_job(nodeid, self.job_report(key), outcome="interrupted",
                                  reason=f"{sig}: the session was interrupted")
        pytest.exit(f"{sig}: job {key[1].id} was stopped and harvested ({merged}); the session "
                    "ends here", returncode=pytest.ExitCode.INTERRUPTED)

    def top_ups_report(self, gpu: str) -> list[dict[str, Any]]:
        """Every top-up of the card's jobs, each naming its own job (reported with the card's
        last test, booked by the harvest on the job it topped up)."""
        return [{"gpu": g, **t} for (g, _), r in self.results.items() if g == gpu
                for t in r.top_ups]

    def job_report(self, key: JobKey) -> dict[str, Any]:
        """What the harvest needs from one job (it may run in another process)."""
        gpu, job = key
        r = self.results[key]
        box = self.boxes.get(gpu)
        rep: dict[str, Any] = {"gpu": gpu, "slice": job.slice, "kind": job.kind,
                               "run_id": self.run_id, "db": str(self.db_path)}
        if box:
            rep["card"] = box.card.name
            rep["regime"] = box.probe.get("regime")
            rep["box"] = (f"{box.driver.transport.name}: {box.card.name} ({box.probe['regime']}), "
                          + (box.driver.describe() or f"setup {box.setup_s:.0f}s"))
            if not box.reported and box.leftovers:
                rep["leftovers"] = box.leftovers
                box.reported = True
        allotment = r.allotment_s + sum(p.allotment_s for p in r.parts)
        if allotment:
            rep["allotment_s"] = round(allotment, 1)
        if r.outcome:
            o = r.outcome
            stop = o.summary.get("stop")
            statuses: dict[str, int] = {}
            for one in (r, *r.parts):  # a job a new session took on: its died run and the rest
                for k, v in ((one.outcome.summary.get("statuses") or {}) if one.outcome
                             else {}).items():
                    statuses[str(k)] = statuses.get(str(k), 0) + int(v)
            resumed = "".join(f"; resumed in a new session after its run {p.outcome.state}: "
                              f"{p.outcome.summary.get('stop') or 'no reason given'}"
                              for p in r.parts if p.outcome)
            seconds = o.elapsed_s + sum(p.outcome.elapsed_s for p in r.parts if p.outcome)
            rep.update(state=o.state + (f" ({stop})" if stop else "") + resumed,
                       benched=r.stat("benched"), ok=r.stat("ok"), failed=r.stat("failed"),
                       seconds=round(seconds, 1),
                       rows_file=str(o.rows_path) if o.rows_path else None, statuses=statuses,
                       points_done=r.stat("points_done"), points_total=r.stat("points_total"))
        receipts = [x.merge for x in (*r.parts, r) if x.merge is not None]
        errors = [x.merge_error for x in (*r.parts, r) if x.merge_error is not None]
        if errors:
            rep["merge"] = {"state": "failed", "error": errors[-1]}
        elif receipts:
            rep["merge"] = {"state": "merged", **receipt_dict(sum(receipts[1:], receipts[0]))}
        elif r.outcome and r.outcome.rows_path and not self.merging:
            rep["merge"] = {"state": "skipped (--no-merge)"}
        return rep


def _result(entry: Entry) -> str:
    """A run's end as its line says it: ``done (pool exhausted)``, ``skipped: …``."""
    if entry.state == "skipped":
        return f"skipped: {entry.reason or 'not run'}"
    return entry.state + (f" ({entry.reason})" if entry.reason else "")


class _Quiet:
    """No terminal: a collection made without one prints nothing."""

    tty = False

    def line(self, text: str) -> None:
        pass

    def redraw(self, text: str) -> None:
        pass

    def end_redraw(self) -> None:
        pass

    def width(self) -> int:
        return 80


def _nodeid(like: str, gpu: str, job: Job) -> str:
    """The node id of ``job``'s test, made from another job's of the same module."""
    head = like.split("[", 1)[0] if like else "collect_tests/test_sweep.py::test_sweep"
    return f"{head}[{gpu}-{job.id}]"
