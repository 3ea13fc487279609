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
import shutil
import sqlite3
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import cards, pools, shipped
from harness.box.runner import new_run_id
from harness.boxctl import DEFAULT_BASE, BoxDriver, BoxError, JobOutcome, pool_args
from harness.intake import owner_record, source, take_in_leftovers, write_owner
from harness.interrupts import Interrupted, Interrupts
from harness.ledger import Ledger
from harness.options import RunOptions
from harness.owner import Owner
from harness.planner import BudgetPlan, Job
from harness.remote.boxdir import BoxDirError, BoxLock
from harness.remote.tmux import Tmux
from harness.remote.transport import LocalTransport
from harness.rows import RejectedRows
from harness.slices import SLICES
from harness.store import (
    MergeReceipt,
    NodeStore,
    RowsFile,
    read_db_id,
    read_ledger_records,
    receipt_dict,
)

JobKey = tuple[str, Job]  # (--gpu token, job)
# The box service is up before the first job, so a job's own start is its pool build and a
# request's round trip (about 1-2 s): an allotment below this would measure nothing.
MIN_JOB_S = 3.0
JOB_OVERHEAD_S = 2.0
# Seconds a point takes where this card has no history yet: an H200 sweep of 300 s measured
# 3348 points in 302 s of jobs; the interpreter on a 2-core machine about half a second.
DEFAULT_S_PER_POINT = {"deployable": 0.09, "interpret": 0.5}


class BoxUnusable(BoxError):
    """A box that already failed to open: its other jobs are skipped, the reason said once."""


class CollectWarning(UserWarning):
    """A recoverable problem of the collection that the user should see."""


def estimate_order(selected: list[JobKey]) -> list[JobKey]:
    """Run order before any box is seen: per card, slices own → cross → tail, and inside a
    slice the kinds with the smallest pools first (estimated on the named card, or on the
    interpreter / an H100 when the card is only known once the box is probed)."""
    sizes: dict[tuple[str, str], int] = {}

    def size(gpu: str, kind: str) -> int:
        if (gpu, kind) not in sizes:
            if gpu in (cards.LOCAL, cards.AUTO):
                card = cards.by_alias("h100") if shutil.which("nvidia-smi") else cards.INTERPRETER
            else:
                card = cards.by_alias(gpu)
            sizes[(gpu, kind)] = len(pools.build(card, kinds=[kind]).points())
        return sizes[(gpu, kind)]

    gpus = list(dict.fromkeys(g for g, _ in selected))
    return sorted(selected, key=lambda gj: (gpus.index(gj[0]), SLICES.index(gj[1].slice),
                                            size(gj[0], gj[1].kind), gj[1].kind))


@dataclass
class JobResult:
    key: JobKey
    allotment_s: float = 0.0
    outcome: JobOutcome | None = None
    skipped: str | None = None
    merge: MergeReceipt | None = None
    merge_error: str | None = None
    top_ups: list[dict[str, Any]] = field(default_factory=list)  # runs after the plan's last job

    def stat(self, name: str) -> Any:
        return (self.outcome.summary.get(name, 0) if self.outcome else 0) or 0


@dataclass
class BoxState:
    """A prepared box and the plan of the jobs that run on it."""

    gpu: str
    driver: BoxDriver
    probe: dict[str, Any]
    card: cards.Card
    pool: dict[str, Any]
    plan: BudgetPlan
    setup_s: float
    leftovers: dict[str, Any] = field(default_factory=dict)  # what earlier runs left, merged
    reported: bool = False  # the leftovers went into a job's report
    started: float = field(default_factory=time.monotonic)


class Collection:
    def __init__(self, opts: RunOptions, order: list[JobKey], *,
                 interrupts: Interrupts | None = None, session: str = "",
                 harvest: Any = None) -> None:
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
        self.interrupts = interrupts or Interrupts()
        self.owner = Owner.here(session)
        self.harvest = harvest
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
        self._check_card_early(gpu, driver)
        driver.settle_orphan(progress)
        leftovers = self._take_in_leftovers(driver, progress)
        progress(f"box {transport.name}: pushing the harness to {driver.base}")
        driver.push_code()
        progress(f"box {transport.name}: setup in tmux session emmy-node-setup")
        probe = driver.setup()
        card = self._check_card(gpu, probe)
        progress(f"box {transport.name}: card {card.name} ({probe['regime']}); planning pools")
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
        pool = driver.plan(pool_args(self.opts.pool_fields()), driver.run_ledger(self.run_id))
        mine = [k for k in self.order if k[0] == gpu]
        counts = {j: sum(pool["remaining"][j.slice].get(j.kind, {}).values()) for _, j in mine}
        rates = self._rates(card.name, probe["regime"], {j.kind for _, j in mine})
        heavy = pool.get("compile_baselines", {})
        compile_s = self._compile_baseline_s(card.name, probe["regime"], {j.kind for _, j in mine})
        extra = {j: n * compile_s[j.kind] for _, j in mine
                 if (n := sum(heavy.get(j.slice, {}).get(j.kind, {}).values()))}
        plan = BudgetPlan(self.opts.budget_s, self.shares, counts, order=[j for _, j in mine],
                          s_per_point=rates, job_overhead_s=JOB_OVERHEAD_S, extra_s=extra,
                          min_job_s=MIN_JOB_S)
        if plan.order:  # (a run with nothing to measure needs no service)
            progress(f"box {transport.name}: starting the box service (tmux session "
                     "emmy-node-sweep)")
            driver.start_service(self.run_id, self.opts.service_args(), progress)
        state = BoxState(gpu=gpu, driver=driver, probe=probe, card=card, pool=pool, plan=plan,
                         setup_s=time.monotonic() - t0, leftovers=leftovers)
        self.boxes[gpu] = state
        return state

    def _rates(self, card: str, regime: str, kinds: set[str]) -> dict[str, float]:
        """Seconds a point of each kind takes on this card: the node table's history (the
        median pace of earlier jobs), else a default for the regime."""
        rates = {k: DEFAULT_S_PER_POINT.get(regime, 0.1) for k in kinds}
        if self.merging:
            with NodeStore(self.db_path) as store:
                rates.update({k: v for k, v in store.paces(card, regime).items() if k in kinds})
        return rates

    def _compile_baseline_s(self, card: str, regime: str, kinds: set[str]) -> dict[str, float]:
        """kind → seconds torch.compile's baseline of a shape takes on this card: the node
        table's history of that kind (Inductor's autotuning of a fused GEMM costs several times
        a reduction's), else of any kind on this card, else a default."""
        if not self.merging:
            return dict.fromkeys(kinds, shipped.COMPILE_BASELINE_S)
        with NodeStore(self.db_path) as store:
            card_s = store.point_cost(card, regime, shipped.COMPILE_SPEC)
            fallback = shipped.COMPILE_BASELINE_S if card_s is None else card_s
            seen = {k: store.point_cost(card, regime, shipped.COMPILE_SPEC, k) for k in kinds}
        return {k: fallback if s is None else s for k, s in seen.items()}

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

    def _merge(self, files: list[RowsFile]) -> MergeReceipt:
        """Merge rows files into the node table now; a first Ctrl-C waits until it is done."""
        with self.interrupts.shielded(), NodeStore(self.db_path) as store:
            return store.merge_files(files, RejectedRows(self.rejected_path))

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

    def _driver(self, gpu: str, progress: Callable[[str], None]) -> BoxDriver:
        """A driver for the box: this machine, the ``--remote`` server, or a rented one."""
        target = self.opts.remote_target
        rented: Any = None
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
            raise BoxError(f"--gpu={gpu} wants {want.name} but box {driver.transport.name} has "
                           f"{shown}; nothing was set up or measured. Use --gpu=auto to accept "
                           "the box's card, or a box with that card")

    def _check_card(self, gpu: str, probe: dict[str, Any]) -> cards.Card:
        from harness.box.probe import card_from_probe

        card = card_from_probe(probe)
        if gpu not in (cards.LOCAL, cards.AUTO):
            want = cards.by_alias(gpu)
            if want.name != card.name:
                raise BoxError(f"--gpu={gpu} wants {want.name} but the box has {card.name} "
                               f"(device {probe.get('device_name')!r}); nothing was measured. "
                               f"Use --gpu=auto to accept the box's card.")
        return card

    def close_box(self, gpu: str, progress: Callable[[str], None]) -> None:
        """Give the box's lock back, close the connection, release a rented server: each step
        runs even when the one before it failed.  After a second Ctrl-C nothing slow runs."""
        driver = self.drivers.get(gpu)
        try:
            if driver is not None:
                try:
                    if not self.interrupts.leaving:
                        with self.interrupts.shielded():
                            driver.end_service()
                            if driver.lock is not None:
                                driver.lock.release()
                finally:
                    driver.transport.close()
        finally:
            self.release(gpu, progress)

    # -- jobs --------------------------------------------------------------------------------
    def run_job(self, key: JobKey, box: BoxState, progress: Callable[[str], None],
                nodeid: str = "") -> JobResult:
        gpu, job = key
        res = self.results[key]
        if self.shares.get(job.slice, 0) == 0:
            res.skipped = f"--share-{job.slice}=0: the {job.slice} slice is skipped"
            return res
        if job not in box.plan.order:
            res.skipped = self._nothing_left(job, box)
            return res
        allot = box.plan.allotment(job)
        res.allotment_s = allot
        if allot < MIN_JOB_S:
            box.plan.skip(job)
            res.skipped = (f"no budget left for this job ({allot:.1f}s allotted; under "
                           f"{MIN_JOB_S:.0f}s it would measure nothing)")
            if box.plan.next_job is None:
                res.top_ups = self._top_ups(box, progress, nodeid)
            return res
        o = self.opts
        bound = min(o.point_timeout_s, 20.0) + 60  # the job cuts a point at the budget's end
        timeout = allot + bound
        by_option = False
        if o.timeout_s:
            left = o.timeout_s - (time.monotonic() - box.started)
            if left <= 0:  # a job stopped at --timeout-s was harvested; the rest do not start
                box.plan.skip(job)
                res.skipped = f"--timeout-s={o.timeout_s:g} reached: the sweep was stopped"
                return res
            by_option = left < timeout
            timeout = min(timeout, left)
        k, n = box.plan.order.index(job) + 1, len(box.plan.order)
        say = self._say(progress, gpu, job, f"job {k} of {n}", box.plan.remaining_s)
        say(f"{allot:.0f}s allotted")
        outcome, res.merge, res.merge_error = self._run_and_merge(
            key, box, allot, timeout, say, nodeid, res)
        box.plan.record(job, outcome.elapsed_s)
        benched = int(outcome.summary.get("benched") or 0)
        # this run's own pace, for later jobs (not from a job that measured compile baselines)
        if benched >= 20 and outcome.state == "done" and not box.plan.extra_s.get(job):
            box.plan.learn(job.kind, max(0.0, outcome.elapsed_s - JOB_OVERHEAD_S) / benched)
        if outcome.state == "stopped" and by_option:
            outcome.summary["stop"] = f"--timeout-s={o.timeout_s:g} reached; harvested"
        res.outcome = outcome
        if outcome.interrupted is not None:
            self._end_interrupted(key, outcome, res.merge, nodeid)
        if box.plan.next_job is None:
            res.top_ups = self._top_ups(box, progress, nodeid)
        return res

    @staticmethod
    def _say(progress: Callable[[str], None], gpu: str, job: Job, where: str,
             session_left: float) -> Callable[[str], None]:
        started = time.monotonic()

        def say(line: str) -> None:  # every line names the job and the session's time left
            left = max(0.0, session_left - (time.monotonic() - started))
            progress(f"{gpu} {job.id} [{where}, {left:.0f}s of the session left]: {line}")

        return say

    def _run_and_merge(self, key: JobKey, box: BoxState, allot: float, timeout: float,
                       say: Callable[[str], None], nodeid: str, res: JobResult
                       ) -> tuple[JobOutcome, MergeReceipt | None, str | None]:
        """Run one job (or top-up) on the box and merge its rows as soon as they are home."""
        gpu, job = key
        try:
            outcome = box.driver.run_job(slice_=job.slice, kind=job.kind, budget_s=allot,
                                         run_id=self.run_id, job_fields=self.opts.job_fields(),
                                         timeout_s=timeout, rows_dir=self.rows_dir,
                                         service_args=self.opts.service_args(), on_line=say)
        except Interrupted as exc:  # the second signal: leave at once, still say where things are
            where = box.driver.path("rows", self.run_id, f"{job.id}.jsonl")
            res.outcome = res.outcome or JobOutcome(state="interrupted", remote_rows=where, summary={
                "stop": f"{exc.signame} twice: left at once; its rows stay on the box in {where}"})
            if self.harvest is not None:
                self.harvest.note_job(nodeid, self.job_report(key), outcome="interrupted",
                                      reason=f"{exc.signame} twice: left at once")
            raise
        merge, merge_error = None, None
        if outcome.rows_path is not None and self.merging:
            say(f"merging its rows into {self.db_path}")
            try:
                merge = self._merge([RowsFile(outcome.rows_path,
                                              source(self.run_id, outcome.rows_path.name))])
            except Interrupted:
                raise
            except Exception as exc:  # noqa: BLE001 - the rows stay pending; the job fails
                merge_error = str(exc).splitlines()[0]
        return outcome, merge, merge_error

    def _end_interrupted(self, key: JobKey, outcome: JobOutcome, merge: MergeReceipt | None,
                         nodeid: str) -> None:
        sig = outcome.interrupted.signame  # type: ignore[union-attr]
        merged = (f"{merge.rows_read} rows merged" if merge else
                  f"its rows kept in {outcome.rows_path}" if outcome.rows_path else
                  f"no rows came home; they stay on the box in {outcome.remote_rows}")
        outcome.summary["stop"] = f"{sig}; stopped and harvested: {merged}"
        if self.harvest is not None:
            self.harvest.note_job(nodeid, self.job_report(key), outcome="interrupted",
                                  reason=f"{sig}: the session was interrupted")
        pytest.exit(f"{sig}: job {key[1].id} was stopped and harvested ({merged}); the session "
                    "ends here", returncode=pytest.ExitCode.INTERRUPTED)

    def _points_left(self, box: BoxState) -> dict[Job, int]:
        """What each job of the card's plan left unmeasured for want of time."""
        left: dict[Job, int] = {}
        for (gpu, job), r in self.results.items():
            if gpu != box.gpu or job not in box.plan.order:
                continue
            out = r.outcome
            if out is None:
                left[job] = box.plan.pool[job] if r.skipped and "no budget left" in r.skipped else 0
            elif out.state == "done" and out.summary.get("stop") == "budget spent":
                left[job] = max(0, int(out.summary.get("points_total") or 0)
                                - int(out.summary.get("points_done") or 0))
        return left

    def _top_ups(self, box: BoxState, progress: Callable[[str], None],
                 nodeid: str) -> list[dict[str, Any]]:
        """Every planned job has run: what is left of the budget goes to the jobs that still
        have points (earlier jobs could not know what later ones would leave unused)."""
        o = self.opts
        done: list[dict[str, Any]] = []
        extra = box.plan.top_ups(self._points_left(box))
        for job in [j for j in box.plan.order if j in extra]:
            allot = extra[job]
            if allot < MIN_JOB_S:
                continue
            timeout = allot + min(o.point_timeout_s, 20.0) + 60
            if o.timeout_s:
                left = o.timeout_s - (time.monotonic() - box.started)
                if left <= MIN_JOB_S:
                    break
                timeout = min(timeout, left)
            say = self._say(progress, box.gpu, job, "top-up", box.plan.remaining_s)
            say(f"{allot:.0f}s allotted: the time the jobs left unused, for its points left")
            key = (box.gpu, job)
            holder = JobResult(key)
            outcome, merge, merge_error = self._run_and_merge(key, box, allot, timeout, say,
                                                              nodeid, holder)
            box.plan.record_top_up(job, outcome.elapsed_s)
            entry = {"slice": job.slice, "kind": job.kind, "state": outcome.state
                     + (f" ({outcome.summary['stop']})" if outcome.summary.get("stop") else ""),
                     "allotment_s": round(allot, 1), "seconds": round(outcome.elapsed_s, 1),
                     **{k: int(outcome.summary.get(k) or 0) for k in ("benched", "ok", "failed")},
                     "merge": ({"state": "merged", **receipt_dict(merge)} if merge else
                               {"state": "failed", "error": merge_error} if merge_error else {})}
            done.append(entry)
            if outcome.interrupted is not None:
                self.results[key].top_ups = done  # type: ignore[attr-defined]
                self._end_interrupted(key, outcome, merge, nodeid)
        return done

    def _nothing_left(self, job: Job, box: BoxState) -> str:
        """Why a job has no points, true on a re-run too."""
        total = sum(box.pool["total"].get(job.slice, {}).get(job.kind, {}).values())
        flt = self.opts.filter
        if flt and not any(box.pool["total"].get(s, {}).get(job.kind) for s in SLICES):
            return f"--filter={flt!r} keeps no {job.kind} shape"
        if total:
            return (f"all {total} {job.kind} points of the {job.slice} slice on {box.card.name} "
                    "are in the node table already")
        why = {"own": " (no anchors of this card)",
               "cross": " (no other card's anchors realize here)"}.get(job.slice, "")
        return f"no {job.kind} points in the {job.slice} slice on {box.card.name}{why}"

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
                          f"setup {box.setup_s:.0f}s")
            if not box.reported and box.leftovers:
                rep["leftovers"] = box.leftovers
                box.reported = True
        if r.allotment_s:
            rep["allotment_s"] = round(r.allotment_s, 1)
        if r.outcome:
            o = r.outcome
            stop = o.summary.get("stop")
            rep.update(state=o.state + (f" ({stop})" if stop else ""), benched=r.stat("benched"),
                       ok=r.stat("ok"), failed=r.stat("failed"), seconds=round(o.elapsed_s, 1),
                       rows_file=str(o.rows_path) if o.rows_path else None,
                       statuses={str(k): int(v) for k, v in (o.summary.get("statuses") or {}).items()},
                       points_done=r.stat("points_done"), points_total=r.stat("points_total"))
        if r.merge is not None:
            rep["merge"] = {"state": "merged", **receipt_dict(r.merge)}
        elif r.merge_error is not None:
            rep["merge"] = {"state": "failed", "error": r.merge_error}
        elif r.outcome and r.outcome.rows_path and not self.merging:
            rep["merge"] = {"state": "skipped (--no-merge)"}
        if r.top_ups:
            rep["top_ups"] = r.top_ups
        return rep
