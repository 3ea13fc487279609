"""The harvest: gather every job's report, merge all rows once, print the summary.

Lives in the process that sees every test report: the plain pytest process, or the xdist
controller when several cards run at once (``--gpu l40s,h100 -n 2``).  Jobs pass what the
harvest needs through their report's ``user_properties`` (the rows file, the counts), so a
worker that dies loses only its own in-flight job: every finished job's rows are already
known here.  Leftover leases of rented servers are released here too.

With ``--report-json PATH`` the same facts (the jobs' reports, the merge's receipt, the exit
status) are also written as one JSON file at the session's end (see :meth:`Harvest.report`).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

PROP = "emmy_job"  # the user_properties key carrying a job's report (a JSON-able dict)
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
    # until its call (or a skip or failure) is reported
    outcome: str = "unfinished"
    reason: str | None = None
    worker: str | None = None

    def to_json(self, nodeid: str) -> dict[str, Any]:
        return {"nodeid": nodeid, "gpu": self.gpu, "card": self.card or None,
                "regime": self.regime, "slice": self.slice, "kind": self.kind,
                "outcome": self.outcome, "reason": self.reason, "state": self.state,
                "allotment_s": self.allotment_s, "elapsed_s": self.seconds,
                "benched": self.benched, "ok": self.ok, "failed": self.failed,
                "statuses": dict(self.statuses), "points_done": self.points_done,
                "points_total": self.points_total, "rows_file": self.rows_file,
                "run_id": self.run_id, "worker": self.worker}


@dataclass(eq=False)  # registered as a pytest plugin: must stay hashable
class Harvest:
    db_path: Path
    no_merge: bool
    budget_s: float
    leases_dir: Path | None = None
    keep_server: bool = False
    report_json: Path | None = None  # --report-json: written at the session's end
    options: dict[str, Any] = field(default_factory=dict)  # the run's options, for the report
    jobs: dict[str, JobReport] = field(default_factory=dict)
    receipt_lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    merge_info: dict[str, Any] = field(default_factory=dict)
    other_failures: list[dict[str, Any]] = field(default_factory=list)
    report_lines: list[str] = field(default_factory=list)
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    # -- hooks ---------------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        data = props.get(PROP)
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
        for k, v in (data or {}).items():
            if hasattr(job, k) and v is not None:
                setattr(job, k, v)
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

    # -- end of session ------------------------------------------------------------------------
    def rows_files(self) -> list[Path]:
        files = {Path(j.rows_file) for j in self.jobs.values() if j.rows_file}
        return sorted(f for f in files if f.is_file())

    def finish(self) -> None:
        self._release_leftover_leases()
        files = self.rows_files()
        m = self.merge_info = {
            "state": "nothing to merge", "db": str(self.db_path), "rows_files": [str(f) for f in files],
            "rows_skipped": 0, "merged": 0, "new": 0, "replaced": 0, "kept": 0, "duplicate": 0,
            "per_card": {}, "per_card_regime": {}, "backup": None, "error": None,
            "merge_command": None, "warnings": []}
        if not files:
            if any(j.benched for j in self.jobs.values()):
                self.receipt_lines.append("merge: no rows came back")
                m["state"] = "no rows came back"
            return
        by_hand = f"  python -m harness merge {' '.join(str(f) for f in files)} --db {self.db_path}"
        if self.no_merge:
            self.receipt_lines += ["merge skipped (--no-merge); to merge by hand:", by_hand]
            m.update(state="skipped (--no-merge)", merge_command=by_hand.strip())
            return
        from harness.store import NodeStore, RowError, format_receipt, read_rows_file, row_to_node

        rows: list[dict[str, Any]] = []
        for f in files:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got, bad = read_rows_file(f)
            m["warnings"].extend(str(w.message) for w in caught)
            m["rows_skipped"] += bad
            # A whole line that is no row (a damaged value) must not keep every other job's
            # rows out of the one merge: it is skipped here, counted and shown; the file keeps it.
            refused: list[str] = []
            for row in got:
                try:
                    row_to_node(row)
                except RowError as exc:
                    refused.append(str(exc))
                    continue
                rows.append(row)
            if refused:
                m["warnings"].append(f"{f}: skipped {len(refused)} row(s) that cannot be merged "
                                     f"(first: {refused[0]}); merging the other "
                                     f"{len(got) - len(refused)}")
                m["rows_skipped"] += len(refused)
        self.problems.extend(m["warnings"])
        try:
            with NodeStore(self.db_path) as store:
                receipt = store.merge(rows)
                m.update(state="merged", merged=receipt.rows_read, new=receipt.inserted,
                         replaced=receipt.replaced, kept=receipt.kept, duplicate=receipt.duplicates,
                         per_card=dict(receipt.per_card),
                         per_card_regime={g: dict(r) for g, r in receipt.per_card_regime.items()})
                self.receipt_lines.extend(format_receipt(receipt).splitlines())
                self.receipt_lines.append(f"db: {self.db_path}")
                if receipt.inserted or receipt.replaced:
                    backup = store.backup()
                    m["backup"] = str(backup)
                    self.receipt_lines.append(f"backup: {backup}")
        except Exception as exc:  # noqa: BLE001 - the rows files stay; say how to retry
            self.receipt_lines += [f"MERGE FAILED: {exc}", "the rows are kept; merge them by hand with:",
                                   by_hand]
            m.update(state="failed", error=str(exc), merge_command=by_hand.strip())

    def _release_leftover_leases(self) -> None:
        """A worker that died could not release its server: do it here (unless kept)."""
        if self.leases_dir is None or not self.leases_dir.is_dir():
            return
        from harness.remote.providers import Lease

        for path in sorted(self.leases_dir.glob("*.json")):
            lease = Lease.load(path)
            if self.keep_server:
                self.problems.append(f"server kept (--keep-server): {lease.target}; release it "
                                     f"with: {lease.release_command}")
                continue
            try:
                lease.release()
                self.receipt_lines.append(f"released leftover server {lease.target}")
            except Exception as exc:  # noqa: BLE001 - say exactly how to release by hand
                self.problems.append(f"could not release {lease.target}: {exc}; release it with: "
                                     f"{lease.release_command}")

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
                                                  ("passed", "failed", "skipped", "unfinished")}},
                  "benched": sum(j.benched for j in self.jobs.values()),
                  "ok": sum(j.ok for j in self.jobs.values()),
                  "failed": sum(j.failed for j in self.jobs.values()),
                  "statuses": dict(sorted(statuses.items())),
                  "elapsed_s": round(sum(j.seconds for j in self.jobs.values()), 1),
                  "allotment_s": round(sum(j.allotment_s or 0 for j in self.jobs.values()), 1)}
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
                "warnings": list(self.problems), "other_failures": list(self.other_failures)}

    def write_report(self, exitstatus: int) -> None:
        """Write ``--report-json`` (tmp file, fsync, rename: the old report or the new one,
        never half).  A failure to write is a warning in the summary, not an error of the run."""
        if self.report_json is None:
            return
        if int(exitstatus) == pytest.ExitCode.USAGE_ERROR:
            return  # the run never started (e.g. --db refused): stderr says why
        try:
            write_json_atomic(self.report_json, self.report(exitstatus))
        except (OSError, TypeError, ValueError) as exc:
            self.report_lines.append(f"warning: could not write --report-json {self.report_json}: "
                                     f"{exc}")
        else:
            self.report_lines.append(f"report: {self.report_json}")

    def summary_lines(self) -> list[str]:
        if not self.jobs:
            return list(self.report_lines)
        lines = ["", "=== collect-node-data summary ==="]
        for box in dict.fromkeys(j.box for j in self.jobs.values() if j.box):
            lines.append(f"box {box}")
        spent = sum(j.seconds for j in self.jobs.values())
        lines.append(f"sweep: {spent:.0f}s of jobs for a budget of {self.budget_s:.0f}s per card")
        lines.append(f"{'card':24} {'slice':5} {'kind':12} {'benched':>7} {'ok':>5} {'failed':>6} "
                     f"{'seconds':>8}  state")
        for j in self.jobs.values():
            card = j.card or j.gpu
            lines.append(f"{card[:24]:24} {j.slice:5} {j.kind:12} {j.benched:>7} {j.ok:>5} "
                         f"{j.failed:>6} {j.seconds:>8.1f}  {j.state}")
        lines.extend(self.receipt_lines)
        lines.extend(f"warning: {p}" for p in self.problems)
        lines.extend(self.report_lines)
        return lines


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


def job_property(**data: Any) -> tuple[str, Any]:
    json.dumps(data)  # must cross the xdist wire
    return (PROP, data)
