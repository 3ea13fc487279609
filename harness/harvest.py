"""The harvest: gather every job's report, merge what is not merged yet, print the summary.

Lives in the process that sees every test report: the plain pytest process, or the xdist
controller when several cards run at once (``--gpu l40s,h100 -n 2``).  Each job merges its own
rows as soon as they are home and passes its receipt through its report's ``user_properties``;
at the session's end the harvest merges any rows file a job reported without merging it (its
merge failed, or a worker died before it could), backs the node table up once, rewrites the
ledger from the node table, and prints the summary with a ``status:`` line.  Leases of rented
servers left over are handled here too: this session's own are released; another session's
only once its controller is provably gone, after the rows on that server are merged.

With ``--report-json PATH`` the same facts (the jobs' reports, the merge's receipt, the exit
status) are also written as one JSON file at the session's end (see :meth:`Harvest.report`).
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

PROP = "emmy_job"  # the user_properties key carrying a job's report (a JSON object's text)
TOP_UPS_PROP = "emmy_top_ups"  # the card's top-ups, each naming its job (a JSON array's text)
REPORT_FORMAT = "collect-node-data report"
REPORT_VERSION = 1


@dataclass
class JobReport:
    gpu: str
    slice: str
    kind: str
    card: str = ""
    state: str = "not run"
    benched: int = 0
    ok: int = 0
    failed: int = 0
    seconds: float = 0.0
    rows_file: str | None = None
    box: str = ""
    # also carried by the job's report, for --report-json
    regime: str | None = None
    run_id: str | None = None
    allotment_s: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    points_done: int | None = None
    points_total: int | None = None
    # pytest's verdict on the job's test: passed | failed | skipped (and why); "unfinished"
    # until its call (or a skip or failure) is reported; "not_run": selected, never started
    # (the run was interrupted, or ended, before it)
    outcome: str = "unfinished"
    reason: str | None = None
    worker: str | None = None
    merge: dict[str, Any] = field(default_factory=dict)  # the job's own merge (see Collection)
    top_ups: list[dict[str, Any]] = field(default_factory=list)  # run after the plan's last job
    leftovers: dict[str, Any] = field(default_factory=dict)  # what earlier runs left, merged
    db: str | None = None

    def to_json(self, nodeid: str) -> dict[str, Any]:
        return {"nodeid": nodeid, "gpu": self.gpu, "card": self.card or None,
                "regime": self.regime, "slice": self.slice, "kind": self.kind,
                "outcome": self.outcome, "reason": self.reason, "state": self.state,
                "allotment_s": self.allotment_s, "elapsed_s": self.seconds,
                "benched": self.benched, "ok": self.ok, "failed": self.failed,
                "statuses": dict(self.statuses), "points_done": self.points_done,
                "points_total": self.points_total, "rows_file": self.rows_file,
                "run_id": self.run_id, "worker": self.worker, "merge": dict(self.merge) or None,
                "top_ups": list(self.top_ups)}


@dataclass(eq=False)  # registered as a pytest plugin: must stay hashable
class Harvest:
    db_path: Path
    no_merge: bool
    budget_s: float
    leases_dir: Path | None = None
    keep_server: bool = False
    report_json: Path | None = None  # --report-json: written at the session's end
    options: dict[str, Any] = field(default_factory=dict)  # the run's options, for the report
    ledger_path: Path | None = None
    rows_dir: Path | None = None
    session: str = ""
    interrupts: Any = None  # harness.interrupts.Interrupts of this process
    known_hosts: Path | None = None  # --known-hosts, for a gone run's rented server
    jobs: dict[str, JobReport] = field(default_factory=dict)
    receipt_lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    merge_info: dict[str, Any] = field(default_factory=dict)
    other_failures: list[dict[str, Any]] = field(default_factory=list)
    report_lines: list[str] = field(default_factory=list)
    left_running: list[str] = field(default_factory=list)  # what leaving at once left on boxes
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    status: str = ""  # the summary's last line: status: COMPLETE (…) / FAILED (…) / INTERRUPTED (…)
    exit_status: int | None = None  # what the session's exit status should become, if worse
    refused: dict[str, str] = field(default_factory=dict)  # --gpu token → why its box was refused

    def select(self, jobs: list[tuple[str, str, str, str]]) -> None:
        """Every job pytest selected (nodeid, gpu, slice, kind), in run order: each is in the
        report and the summary, also one that never starts."""
        for nodeid, gpu, slice_, kind in jobs:
            self.jobs.setdefault(nodeid, JobReport(gpu=gpu, slice=slice_, kind=kind,
                                                   outcome="not_run"))

    def refuse(self, gpu: str, why: str) -> None:
        """The box of ``gpu`` has another card: none of its jobs runs (a usage error)."""
        self.refused[gpu] = why
        for job in self.jobs.values():
            if job.gpu == gpu and job.outcome == "not_run":
                job.reason = why

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist: the cards a worker refused (see :meth:`refuse`)."""
        from harness.plugin import REFUSED_OUTPUT

        for gpu, why in (getattr(node, "workeroutput", None) or {}).get(REFUSED_OUTPUT,
                                                                       {}).items():
            self.refuse(str(gpu), str(why))

    def note_job(self, nodeid: str, data: dict[str, Any], outcome: str, reason: str | None) -> None:
        """A job's report handed over directly (the job was interrupted, so pytest reports
        nothing for it)."""
        job = self.jobs.setdefault(nodeid, JobReport(gpu=data["gpu"], slice=data["slice"],
                                                     kind=data["kind"]))
        self._apply(job, data)
        job.outcome, job.reason = outcome, reason

    @staticmethod
    def _apply(job: JobReport, data: dict[str, Any]) -> None:
        for k, v in data.items():
            if hasattr(job, k) and v is not None:
                setattr(job, k, v)

    # -- hooks ---------------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        data = _json(props.get(PROP))
        self._book_top_ups(_json(props.get(TOP_UPS_PROP)) or [])
        job = self.jobs.get(report.nodeid)
        if data is None and job is None:
            # no job report: a crashed xdist worker's item, or a test that is no sweep job
            if report.failed:
                self.other_failures.append({"nodeid": report.nodeid, "when": report.when,
                                            "reason": _first_line(report)})
            return
        if job is None:
            job = self.jobs[report.nodeid] = JobReport(gpu=data["gpu"], slice=data["slice"],
                                                       kind=data["kind"])
        if job.outcome == "not_run":  # it started
            job.outcome = "unfinished"
        self._apply(job, data or {})
        worker = getattr(getattr(report, "node", None), "gateway", None)  # xdist's gw0, gw1, …
        if worker is not None:
            job.worker = str(worker.id)
        if report.skipped and report.when in ("setup", "call"):
            job.state = "skipped: " + _reason(report)
            job.outcome, job.reason = "skipped", _reason(report)
        elif report.failed and report.when == "setup":
            job.state = "error: " + _first_line(report)
            job.outcome, job.reason = "failed", "error in setup: " + _first_line(report)
        elif report.failed and report.when == "call" and not job.state.startswith(("died", "failed")):
            job.state = "failed: " + _first_line(report)
        if report.failed and report.when != "setup" and job.outcome != "failed":
            where = "error in teardown: " if report.when == "teardown" else ""
            job.outcome, job.reason = "failed", where + _first_line(report)
        elif report.passed and report.when == "call":
            job.outcome, job.reason = "passed", None

    def _book_top_ups(self, top_ups: list[dict[str, Any]]) -> None:
        """Each top-up on the job it topped up (once, however many reports carry it)."""
        for t in top_ups:
            job = next((j for j in self.jobs.values() if (j.gpu, j.slice, j.kind)
                        == (t.get("gpu"), t.get("slice"), t.get("kind"))), None)
            if job is None:
                continue
            entry = {k: v for k, v in t.items() if k != "gpu"}
            job.top_ups = [u for u in job.top_ups if u.get("id") != entry.get("id")] + [entry]

    # -- end of session ------------------------------------------------------------------------
    def rows_files(self) -> list[Path]:
        files = {Path(j.rows_file) for j in self.jobs.values() if j.rows_file}
        return sorted(f for f in files if f.is_file())

    def finish(self) -> None:
        """Merge what no job merged, back up once, rewrite the ledger, settle leases."""
        m = self.merge_info = {
            "state": "nothing to merge", "db": str(self.db_path), "rows_files": [str(f) for f in self.rows_files()],
            "merged": 0, "new": 0, "replaced": 0, "kept": 0, "duplicate": 0,
            "rejected": 0, "rejected_files": [], "per_card": {}, "per_card_regime": {},
            "backup": None, "error": None, "merge_command": None, "warnings": [], "leftovers": []}
        leaving = bool(self.interrupts is not None and self.interrupts.leaving)
        for j in self.jobs.values():  # the jobs' own merges and what earlier runs left
            for part in (j.merge, j.leftovers, *(t.get("merge") or {} for t in j.top_ups)):
                if part.get("merged") is not None:
                    self._count(part)
            if j.leftovers.get("line"):
                m["leftovers"].append(j.leftovers["line"])
            if j.leftovers.get("error"):
                self.problems.append(f"rows left by earlier runs could not be merged: "
                                     f"{j.leftovers['error']}")
        if leaving:
            self._left_at_once()
            return
        self._settle_leases()
        unmerged = [Path(j.rows_file) for j in self.jobs.values()
                    if j.rows_file and j.merge.get("state") != "merged" and Path(j.rows_file).is_file()]
        unmerged = sorted(set(unmerged))
        by_hand = (f"  python -m harness merge {' '.join(str(f) for f in unmerged)} --db {self.db_path}"
                   if unmerged else "")
        if self.no_merge:
            if unmerged:
                self.receipt_lines += ["merge skipped (--no-merge); to merge by hand:", by_hand]
                m.update(state="skipped (--no-merge)", merge_command=by_hand.strip())
            return
        # The merge, the backup and the ledger are never cut: a first signal waits for them
        # (then ends the run as interrupted, see the plugin's session finish); a second one
        # leaves at once, and what it cut short is said.
        shield = self.interrupts.shielded() if self.interrupts else _nothing()
        with shield:
            if unmerged:
                self._merge_now(unmerged, by_hand)
            elif m["merged"]:
                m["state"] = "merged"
            elif any(j.benched for j in self.jobs.values()):
                self.receipt_lines.append("merge: no rows came back")
                m["state"] = "no rows came back"
            if m["merged"] or m["leftovers"]:
                self._close_out()

    def interrupted_at_end(self, signame: str) -> None:
        """A first signal came during the merge, backup and ledger at the session's end: they
        finished first; the run ends as interrupted."""
        self.receipt_lines.append(f"{signame} during the merge and backup at the session's end: "
                                  "they finished first")
        self.merge_info["interrupted"] = signame
        self.exit_status = pytest.ExitCode.INTERRUPTED

    def _count(self, part: dict[str, Any]) -> None:
        m = self.merge_info
        for k in ("merged", "new", "replaced", "kept", "duplicate", "rejected"):
            m[k] += int(part.get(k) or 0)
        if part.get("rejected_file") and part["rejected_file"] not in m["rejected_files"]:
            m["rejected_files"].append(part["rejected_file"])
        if part.get("first_rejected") and not m.get("first_rejected"):
            m["first_rejected"] = part["first_rejected"]
        m["changed"] = bool(m.get("changed") or part.get("changed"))

    def _merge_now(self, files: list[Path], by_hand: str) -> None:
        """Merge rows files that no job merged (its merge failed, or its worker died)."""
        from harness.intake import source_of
        from harness.rows import RejectedRows
        from harness.store import NodeStore, RowsFile, receipt_dict

        m = self.merge_info
        rejected_dir = (self.rows_dir or self.db_path.parent) / "rejected"
        try:
            with NodeStore(self.db_path) as store:
                receipt = store.merge_files(
                    [RowsFile(f, source_of(f)) for f in files],
                    RejectedRows(rejected_dir / f"session-end-{os.getpid()}.jsonl"))
            self._count(receipt_dict(receipt))
            m["state"] = "merged"
        except Exception as exc:  # noqa: BLE001 - the rows files stay; say how to retry
            self.receipt_lines += [f"MERGE FAILED: {exc}", "the rows are kept; merge them by hand "
                                   "with (or run again: the next run merges them first):", by_hand]
            m.update(state="failed", error=str(exc), merge_command=by_hand.strip())

    def _close_out(self) -> None:
        """After the merges: the receipt, the cards' counts, one backup, the ledger."""
        from harness.ledger import Ledger
        from harness.store import MergeReceipt, NodeStore, format_receipt

        m = self.merge_info
        try:
            with NodeStore(self.db_path) as store:
                counts: dict[str, dict[str, int]] = {}
                for gpu, regime, n in store._conn.execute(
                        "SELECT gpu, regime, COUNT(*) FROM node GROUP BY gpu, regime"):
                    counts.setdefault(gpu, {})[regime] = n
                m["per_card_regime"] = counts
                m["per_card"] = {g: sum(r.values()) for g, r in counts.items()}
                total = MergeReceipt(rows_read=m["merged"], inserted=m["new"], replaced=m["replaced"],
                                     kept=m["kept"], duplicates=m["duplicate"], per_card=m["per_card"],
                                     per_card_regime=counts)
                self.receipt_lines.extend(m["leftovers"])
                receipt = format_receipt(total).splitlines()
                if len(receipt) == 3:  # one card: its count on the line that announces it
                    receipt[1:] = [f"{receipt[1]} {receipt[2].strip()}"]
                self.receipt_lines.extend(receipt)
                from harness.summary import best_per_shape

                self.receipt_lines.extend(best_per_shape(
                    store._conn, sorted({j.run_id for j in self.jobs.values() if j.run_id})))
                self.receipt_lines.append(f"db: {self.db_path}")
                if m.get("changed") or m["new"] or m["replaced"]:
                    backup = store.backup()
                    m["backup"] = str(backup)
                    self.receipt_lines.append(f"backup: {backup}")
                if self.ledger_path is not None:
                    bound = {"id": store.db_id, "path": str(self.db_path)}
                    Ledger.from_records(store.ledger_records(), bound).save(self.ledger_path)
        except Exception as exc:  # noqa: BLE001 - the merges have committed; say what failed
            self.problems.append(f"after the merge: {exc}")
        if m["rejected"]:
            files = ", ".join(m["rejected_files"])
            line = (f"rejected {m['rejected']} row(s) that cannot be merged; they are set aside "
                    f"with their reasons in {files} (first: {m.get('first_rejected')})")
            self.problems.append(line)
            m["warnings"].append(line)
            self.exit_status = pytest.ExitCode.TESTS_FAILED

    def _left_at_once(self) -> None:
        m = self.merge_info
        sig = self.interrupts.signame if self.interrupts else "a signal"
        if m.get("state") == "merged":  # the second signal came after the merge committed
            self.receipt_lines.append(
                f"left at once ({sig} twice) at the session's end: the rows are merged"
                + ("" if m.get("backup") else "; no backup was made this run (the next run "
                   "makes one)"))
        else:
            where = self.rows_dir or "the rows folder"
            self.receipt_lines += [
                f"left at once ({sig} twice): nothing more was fetched or merged",
                "the rows measured so far are on the box (and in "
                f"{where}); the next run with this node table merges them first"]
        self.receipt_lines.extend(self.left_running)
        m["state"] = "left at once"

    def _settle_leases(self) -> None:
        """This session's leases still on disk are released; another session's only once its
        controller is provably gone (its rows are merged first); the rest are listed."""
        if self.leases_dir is None or not self.leases_dir.is_dir():
            return
        from harness.owner import Owner
        from harness.remote.providers import Lease

        for path in sorted(self.leases_dir.glob("*.json")):
            try:
                lease = Lease.load(path)
            except (OSError, ValueError, TypeError) as exc:
                self.problems.append(f"lease {path} cannot be read ({exc}); release that server by hand")
                continue
            owner = Owner.from_data(lease.owner)
            mine = owner is not None and owner.session == self.session
            if self.keep_server and mine:
                self.problems.append(f"server kept (--keep-server): {lease.target}; release it "
                                     f"with: {lease.release_command}")
                continue
            gone = owner.gone() if owner is not None else None
            if not mine and not gone:
                who = owner.describe() if owner else "a run of an older version"
                self.report_lines.append(f"note: server {lease.target} was rented by another run "
                                         f"({who}), which may still use it; left alone. Release "
                                         f"it once it is done with: {lease.release_command}")
                continue
            if lease.provider == "slurm":
                self._cancel_job(lease, mine)
                continue
            if not mine and lease.db_id and lease.db_id == self._db_id():
                try:
                    line = self._harvest_lease(lease)
                except Exception as exc:  # noqa: BLE001 - keep it: it may hold rows
                    self.problems.append(f"server {lease.target} of a run that is gone may hold "
                                         f"rows not merged yet, and fetching them failed ({exc}); it "
                                         f"is kept. Release it with: {lease.release_command}")
                    continue
                if line:
                    self.receipt_lines.append(line)
            try:
                lease.release()
                self.receipt_lines.append(f"released {'leftover ' if mine else 'abandoned '}"
                                          f"server {lease.target}")
            except Exception as exc:  # noqa: BLE001 - say exactly how to release by hand
                self.problems.append(f"could not release {lease.target}: {exc}; release it with: "
                                     f"{lease.release_command}")

    def _cancel_job(self, lease: Any, mine: bool) -> None:
        """A Slurm job whose session is over (this one's, or one whose controller is gone):
        cancelled by its id, on the login node it was submitted from.  Its rows stay in its
        box folder on the shared filesystem; the next run of that card merges them."""
        from harness.remote.slurm import Slurm

        where = lease.extra.get("box_dir", "its box folder")
        on = "" if lease.target == "local" else f" on {lease.target}"
        try:
            transport = self._login(lease)
            try:
                Slurm(transport).cancel(lease.handle)
            finally:
                transport.close()
        except Exception as exc:  # noqa: BLE001 - say exactly how to cancel by hand
            self.problems.append(f"could not cancel Slurm job {lease.handle}{on}: {exc}; cancel "
                                 f"it with: scancel {lease.handle}")
            return
        Path(lease.path).unlink(missing_ok=True)
        self.receipt_lines.append(
            f"cancelled {'leftover ' if mine else 'abandoned '}Slurm job {lease.handle}{on}"
            + ("" if mine else f"; its rows stay in {where}, and the next run of its card "
               "merges them"))

    def _login(self, lease: Any) -> Any:
        """A transport to the login node a Slurm lease was submitted from."""
        if lease.target == "local":
            from harness.remote.transport import LocalTransport

            return LocalTransport()
        from harness.remote.ssh import SSHTransport, parse_remote

        transport = SSHTransport(parse_remote(lease.target),
                                 key_filename=Path(lease.ssh_key).expanduser() if lease.ssh_key
                                 else None, known_hosts=self.known_hosts)
        transport.connect()
        return transport

    def _db_id(self) -> str | None:
        from harness.store import read_db_id

        return read_db_id(self.db_path)

    def _harvest_lease(self, lease: Any) -> str:
        """Fetch and merge what a gone run left on the server it rented."""
        from harness.boxctl import DEFAULT_BASE, BoxDriver
        from harness.intake import take_in_leftovers
        from harness.owner import Owner
        from harness.remote.boxdir import BoxLock
        from harness.remote.ssh import SSHTransport, parse_remote
        from harness.remote.tmux import Tmux
        from harness.rows import RejectedRows
        from harness.store import NodeStore

        transport = SSHTransport(parse_remote(lease.target),
                                 key_filename=Path(lease.ssh_key).expanduser() if lease.ssh_key else None,
                                 known_hosts=self.known_hosts)
        try:
            transport.connect()
            driver = BoxDriver(transport=transport, tmux=Tmux(transport, lease.extra.get("tmux_socket")),
                               base=lease.extra.get("box_dir") or DEFAULT_BASE, poll_s=5.0)
            driver.lock = BoxLock(transport, driver.base, Owner.here(self.session))
            driver.lock.acquire()
            try:
                driver.settle_orphan(lambda line: None, wait_s=600)
                db_id = self._db_id() or ""

                def merge(files: list[Any]) -> Any:
                    with NodeStore(self.db_path) as store:
                        return store.merge_files(files, RejectedRows(
                            (self.rows_dir or self.db_path.parent) / "rejected" / f"lease-{os.getpid()}.jsonl"))

                got = take_in_leftovers(driver, db_path=self.db_path, db_id=db_id,
                                        rows_dir=self.rows_dir or self.db_path.parent / "rows",
                                        current_run="", merge=merge, say=lambda line: None)
            finally:
                driver.lock.release()
        finally:
            transport.close()
        if got.get("error"):
            raise RuntimeError(got["error"])
        if got.get("merged") is not None:
            self._count(got)
        return got.get("line", "")

    # -- --report-json ---------------------------------------------------------------------------
    def report(self, exitstatus: int) -> dict[str, Any]:
        """Everything this session knows, as the JSON of ``--report-json``: the options, the
        jobs (from their reports' ``emmy_job`` property, as the summary and JUnit show them),
        totals, the merge and the exit status."""
        finished = datetime.now(timezone.utc)
        jobs = [j.to_json(nodeid) for nodeid, j in self.jobs.items()]
        statuses: dict[str, int] = {}
        for j in self.jobs.values():
            for k, v in j.statuses.items():
                statuses[k] = statuses.get(k, 0) + int(v)
        outcomes = [j.outcome for j in self.jobs.values()]
        totals = {"jobs": {"total": len(jobs), **{o: outcomes.count(o) for o in
                                                  ("passed", "failed", "skipped", "interrupted",
                                                   "unfinished", "not_run")}},
                  "benched": sum(j.benched + _top(j, "benched") for j in self.jobs.values()),
                  "ok": sum(j.ok + _top(j, "ok") for j in self.jobs.values()),
                  "failed": sum(j.failed + _top(j, "failed") for j in self.jobs.values()),
                  "statuses": dict(sorted(statuses.items())),
                  "top_ups": sum(len(j.top_ups) for j in self.jobs.values()),
                  "elapsed_s": round(sum(j.seconds + _top(j, "seconds")
                                         for j in self.jobs.values()), 1),
                  "allotment_s": round(sum((j.allotment_s or 0) + _top(j, "allotment_s")
                                           for j in self.jobs.values()), 1)}
        try:
            name = pytest.ExitCode(int(exitstatus)).name
        except ValueError:
            name = None
        return {"format": REPORT_FORMAT, "version": REPORT_VERSION,
                "started_at": _iso(self.started_at), "finished_at": _iso(finished),
                "duration_s": round((finished - self.started_at).total_seconds(), 1),
                "exit_status": int(exitstatus), "exit_status_name": name,
                "options": self.options,
                "boxes": list(dict.fromkeys(j.box for j in self.jobs.values() if j.box)),
                "jobs": jobs, "totals": totals,
                "merge": self.merge_info or {"state": "not run", "db": str(self.db_path)},
                "warnings": list(self.problems), "other_failures": list(self.other_failures),
                "refused": dict(self.refused)}

    def write_report(self, exitstatus: int) -> None:
        """Write ``--report-json`` (tmp file, fsync, rename: the old report or the new one,
        never half).  A failure to write is a warning in the summary, not an error of the run."""
        if self.report_json is None:
            return
        if int(exitstatus) == pytest.ExitCode.USAGE_ERROR and not self.refused:
            return  # the run never started (e.g. --db refused): stderr says why
        try:
            write_json_atomic(self.report_json, self.report(exitstatus))
        except (OSError, TypeError, ValueError) as exc:
            self.report_lines.append(f"warning: could not write --report-json {self.report_json}: "
                                     f"{exc}")
        else:
            self.report_lines.append(f"report: {self.report_json}")

    def summary_lines(self, exitstatus: int = 0) -> list[str]:
        if not self.jobs:
            return list(self.report_lines)
        lines = ["=== collect-node-data summary ==="]
        for why in self.refused.values():
            lines.extend(textwrap.wrap(f"ERROR: {why}", 119, subsequent_indent="  ",
                                       break_on_hyphens=False))
        jobs = [j for j in self.jobs.values() if j.gpu not in self.refused]
        boxes = list(dict.fromkeys(j.box for j in jobs if j.box))
        if len(boxes) != 1:
            lines.extend(f"box {box}" for box in boxes)
        if jobs:
            from harness.summary import jobs_table

            spent = sum(j.seconds + sum(t["seconds"] for t in j.top_ups) for j in jobs)
            sweep = f"{spent:.0f}s of jobs for a budget of {self.budget_s:.0f}s"
            lines.extend(textwrap.wrap(f"box {boxes[0]}; {sweep}" if len(boxes) == 1 else
                                       f"sweep: {sweep} per card", 119, subsequent_indent="  "))
            lines.extend(jobs_table(jobs))
        lines.extend(self.receipt_lines)
        lines.extend(f"warning: {p}" for p in self.problems)
        lines.extend(self.report_lines)
        lines.append(self.status_line(exitstatus))
        return lines

    def status_line(self, exitstatus: int) -> str:
        """``status: COMPLETE (…)``, ``status: FAILED (…)`` or ``status: INTERRUPTED (…)``: one
        line a script can read, as the original printed."""
        m = self.merge_info
        merge = m.get("state", "not run")
        if self.refused and int(exitstatus) != pytest.ExitCode.INTERRUPTED:
            return (f"status: FAILED (usage error: {', '.join(f'--gpu={g}' for g in self.refused)}"
                    f" refused, the box has another card; {m.get('merged', 0)} rows merged)")
        if int(exitstatus) == pytest.ExitCode.INTERRUPTED:
            stopped = [j for j in self.jobs.values() if j.outcome == "interrupted"]
            what = f"job {stopped[0].slice}-{stopped[0].kind} stopped and harvested" if stopped \
                else "no job was running"
            if merge == "left at once":
                what = "left at once; the next run merges what is left"
            elif m.get("interrupted"):
                what = f"{m['interrupted']} at the session's end, after the merge and backup"
            return f"status: INTERRUPTED ({what}; {m.get('merged', 0)} rows merged)"
        failed = [f"{j.slice}-{j.kind}" for j in self.jobs.values() if j.outcome == "failed"]
        why = []
        if failed:
            why.append(f"{len(failed)} job(s) failed: {', '.join(failed[:4])}"
                       + (", …" if len(failed) > 4 else ""))
        if merge == "failed":
            why.append("merge failed")
        if m.get("rejected"):
            why.append(f"{m['rejected']} row(s) rejected")
        if self.other_failures:
            why.append(f"{len(self.other_failures)} other test(s) failed")
        if why or int(exitstatus) not in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
            return f"status: FAILED ({'; '.join(why) or f'exit status {int(exitstatus)}'})"
        stop = "sweep stopped at --timeout-s" if any("--timeout-s" in j.state for j in self.jobs.values()) \
            else "sweep done"
        tail = {"merged": "merge done", "skipped (--no-merge)": "merge skipped: --no-merge",
                "nothing to merge": "nothing to merge"}.get(merge, merge)
        return f"status: COMPLETE ({stop} + {tail})"


def _top(job: JobReport, name: str) -> Any:
    return sum(t.get(name) or 0 for t in job.top_ups)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr)


def _first_line(report: pytest.TestReport) -> str:
    text = getattr(report, "longreprtext", "") or str(report.longrepr)
    for line in text.splitlines():
        if line.startswith("E "):
            return line[2:].strip()[:160]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "").strip()[:160]


def job_property(**data: Any) -> tuple[str, str]:
    """A job's report as one JUnit property: its value is JSON (it also crosses the xdist
    wire)."""
    return (PROP, json.dumps(data, sort_keys=True))


def top_ups_property(top_ups: list[dict[str, Any]]) -> tuple[str, str]:
    return (TOP_UPS_PROP, json.dumps(top_ups, sort_keys=True))


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


@contextmanager
def _nothing() -> Iterator[None]:
    yield
