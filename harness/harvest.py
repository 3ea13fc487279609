"""The harvest: gather every job's report, merge all rows once, print the summary.

Lives in the process that sees every test report: the plain pytest process, or the xdist
controller when several cards run at once (``--gpu l40s,h100 -n 2``).  Jobs pass what the
harvest needs through their report's ``user_properties`` (the rows file, the counts), so a
worker that dies loses only its own in-flight job: every finished job's rows are already
known here.  Leftover leases of rented servers are released here too.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PROP = "emmy_job"  # the user_properties key carrying a job's report (a JSON-able dict)


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


@dataclass(eq=False)  # registered as a pytest plugin: must stay hashable
class Harvest:
    db_path: Path
    no_merge: bool
    budget_s: float
    leases_dir: Path | None = None
    keep_server: bool = False
    jobs: dict[str, JobReport] = field(default_factory=dict)
    receipt_lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    # -- hooks ---------------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        data = props.get(PROP)
        if data is None:
            return
        job = self.jobs.get(report.nodeid)
        if job is None:
            job = self.jobs[report.nodeid] = JobReport(gpu=data["gpu"], slice=data["slice"],
                                                       kind=data["kind"])
        for k, v in data.items():
            if hasattr(job, k) and v is not None:
                setattr(job, k, v)
        if report.skipped and report.when in ("setup", "call"):
            job.state = "skipped: " + _reason(report)
        elif report.failed and report.when == "setup":
            job.state = "error: " + _first_line(report)
        elif report.failed and report.when == "call" and not job.state.startswith(("died", "failed")):
            job.state = "failed: " + _first_line(report)

    # -- end of session ------------------------------------------------------------------------
    def rows_files(self) -> list[Path]:
        files = {Path(j.rows_file) for j in self.jobs.values() if j.rows_file}
        return sorted(f for f in files if f.is_file())

    def finish(self) -> None:
        self._release_leftover_leases()
        files = self.rows_files()
        if not files:
            if any(j.benched for j in self.jobs.values()):
                self.receipt_lines.append("merge: no rows came back")
            return
        by_hand = f"  python -m harness merge {' '.join(str(f) for f in files)} --db {self.db_path}"
        if self.no_merge:
            self.receipt_lines += ["merge skipped (--no-merge); to merge by hand:", by_hand]
            return
        from harness.store import NodeStore, RowError, format_receipt, read_rows_file, row_to_node

        rows: list[dict[str, Any]] = []
        for f in files:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got, _bad = read_rows_file(f)
            self.problems.extend(str(w.message) for w in caught)
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
                self.problems.append(f"{f}: skipped {len(refused)} row(s) that cannot be merged "
                                     f"(first: {refused[0]}); merging the other "
                                     f"{len(got) - len(refused)}")
        try:
            with NodeStore(self.db_path) as store:
                receipt = store.merge(rows)
                self.receipt_lines.extend(format_receipt(receipt).splitlines())
                self.receipt_lines.append(f"db: {self.db_path}")
                if receipt.inserted or receipt.replaced:
                    self.receipt_lines.append(f"backup: {store.backup()}")
        except Exception as exc:  # noqa: BLE001 - the rows files stay; say how to retry
            self.receipt_lines += [f"MERGE FAILED: {exc}", "the rows are kept; merge them by hand with:",
                                   by_hand]

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

    def summary_lines(self) -> list[str]:
        if not self.jobs:
            return []
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
        return lines


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
