"""``--report-json PATH``: the run as one JSON file, written at the session's end.

A real interpret-regime collection on this machine (real tmux, real DB) is checked against the
DB, the terminal summary and the JUnit XML; failures (a failed job, a failed merge, a folder
gone by the end) and xdist go through the harvest's seam (plain tests that record a job report,
as ``test_reliability.py`` does), which needs no box.  The bad values of the option are usage
errors in ``test_options.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from harness.points import point_key
from tests.runs import summary_jobs

ROOT = Path(__file__).resolve().parent.parent
GPU = "NVIDIA H200 141GB"
RECEIPT = re.compile(r"merged (\d+) node rows \((\d+) new, (\d+) replaced, (\d+) kept, (\d+) duplicate\)")
# one job line of the summary: card, slice, kind, benched, ok, failed, seconds, state

pytest_plugins = ["pytester"]


@pytest.fixture
def tmux_socket():
    name = f"emmy-rj-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


def _collect(tmp_path: Path, socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("EMMY_TUNE_DB", None)
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "--gpu=local", "-p", "no:cacheprovider",
           f"--db={tmp_path / 'db' / 'autotune.db'}", f"--box-dir={tmp_path / 'box'}",
           f"--tmux-socket={socket}", "--poll-s=0.5", "--filter=fp32", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_report_json_of_a_real_local_run(tmp_path: Path, tmux_socket: str) -> None:
    report_path = tmp_path / "out" / "report.json"
    report_path.parent.mkdir()
    report_path.write_text("a stale report of an earlier run\n")  # replaced whole
    junit = tmp_path / "junit.xml"
    before = datetime.now().astimezone()
    r = _collect(tmp_path, tmux_socket, "--budget-s=30", "--max-dist=1", "--tail-cap=3",
                 "--share-cross=0", "-k", "softmax and (own or cross)",
                 f"--junitxml={junit}", f"--report-json={report_path}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    rep = json.loads(report_path.read_text())
    assert sorted(p.name for p in report_path.parent.iterdir()) == ["report.json"]  # no tmp left
    assert f"report: {report_path}" in r.stdout.splitlines()

    # the run
    assert rep["format"] == "collect-node-data report" and rep["version"] == 1
    assert (rep["exit_status"], rep["exit_status_name"]) == (0, "OK")
    started = datetime.fromisoformat(rep["started_at"].replace("Z", "+00:00"))
    finished = datetime.fromisoformat(rep["finished_at"].replace("Z", "+00:00"))
    assert before <= started <= finished <= datetime.now().astimezone()
    assert rep["duration_s"] == pytest.approx((finished - started).total_seconds(), abs=0.1)
    o = rep["options"]
    assert (o["gpu"], o["gpus"], o["budget_s"]) == ("local", ["local"], 30.0)
    assert o["db"] == str(tmp_path / "db" / "autotune.db")
    assert (o["filter"], o["keyword"], o["tail_cap"], o["max_dist"]) == ("fp32", "softmax and (own or cross)", 3, 1)
    assert o["shares"]["cross"] == 0
    assert len(rep["boxes"]) == 1 and rep["boxes"][0].startswith("local: Triton CPU interpreter (interpret)")

    # the jobs: what pytest said, and what the summary prints
    jobs = {j["slice"]: j for j in rep["jobs"]}
    assert list(jobs) == ["own", "cross"]
    own, cross = jobs["own"], jobs["cross"]
    assert own["nodeid"] == "collect_tests/test_sweep.py::test_sweep[local-own-softmax]"
    assert (own["outcome"], own["reason"]) == ("passed", None)
    # its few points end the job on an idle machine; on a busy one its allotment may end first
    assert own["state"] in ("done (pool exhausted)", "done (budget spent)"), own
    assert (own["card"], own["regime"], own["kind"]) == ("Triton CPU interpreter", "interpret", "softmax")
    assert own["benched"] > 0 and own["benched"] == own["ok"] + own["failed"] == sum(own["statuses"].values())
    assert 0 < own["points_done"] <= own["points_total"]
    assert own["state"] != "done (pool exhausted)" or own["points_done"] == own["points_total"]
    assert 0 < own["elapsed_s"] and own["allotment_s"] >= 3  # what its 3 points can use
    assert (cross["outcome"], cross["reason"]) == ("skipped", "--share-cross=0: the cross slice is skipped")
    assert (cross["benched"], cross["rows_file"], cross["allotment_s"]) == (0, None, None)
    summary = summary_jobs(r.stdout)  # the summary's table says the same
    assert sorted(summary) == sorted((j["slice"], j["kind"]) for j in rep["jobs"])
    for j in rep["jobs"]:
        cell = summary[(j["slice"], j["kind"])]
        # the cell adds the job's top-ups (each with its own counts in the report) to its run
        tops = j["top_ups"]
        benched = j["benched"] + sum(t["benched"] for t in tops)
        seconds = j["elapsed_s"] + sum(t["seconds"] for t in tops) if j["benched"] else 0
        assert (cell["benched"], cell["failed"]) == (benched, j["failed"] + sum(
            t["failed"] for t in tops)), cell
        plain = j["state"] in ("done (pool exhausted)", "done (budget spent)")
        assert cell["state"] == ("done" if plain else j["state"]), cell
        if j["benched"]:
            assert cell["cell"].startswith(f"{benched} in {seconds:.1f}s"), cell
            assert ("topped up" in cell["cell"]) == bool(tops), cell

    # the same numbers as the JUnit properties of each test case
    for case in ET.parse(junit).getroot().iter("testcase"):
        job = next(j for j in rep["jobs"] if j["nodeid"].endswith("::" + case.get("name")))
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if job["outcome"] == "passed":
            for name, key in (("benched", "benched"), ("ok", "ok"), ("failed", "failed"),
                              ("seconds", "elapsed_s"), ("allotment_s", "allotment_s"),
                              ("points_done", "points_done"), ("points_total", "points_total")):
                assert float(props[name]) == job[key], name
        else:
            assert "seconds" not in props

    # the rows file and the DB hold what the report counts
    rows = [json.loads(line) for line in Path(own["rows_file"]).read_text().splitlines()]
    assert len(rows) == own["benched"] and {x["run_id"] for x in rows} == {own["run_id"]}
    db = sqlite3.connect(tmp_path / "db" / "autotune.db")
    by_status = dict(db.execute("select status, count(*) from node where run_id = ? and slice = 'own' "
                                "and kind = 'softmax' group by status", (own["run_id"],)).fetchall())
    assert by_status == own["statuses"]
    n_db = db.execute("select count(*) from node").fetchone()[0]
    t = rep["totals"]
    assert t["jobs"] == {"total": 2, "passed": 1, "failed": 0, "skipped": 1, "interrupted": 0,
                                 "unfinished": 0, "not_run": 0}
    assert (t["benched"], t["ok"], t["failed"], t["statuses"]) == (
        own["benched"], own["ok"], own["failed"], own["statuses"])
    assert t["elapsed_s"] == own["elapsed_s"] and t["allotment_s"] == own["allotment_s"]

    # the merge, as the receipt printed it
    m = rep["merge"]
    assert m["state"] == "merged" and m["error"] is None and m["warnings"] == [] == rep["warnings"]
    assert m["db"] == o["db"] and m["rows_files"] == [own["rows_file"]] and m["rejected"] == 0
    assert (m["merged"], m["new"], m["replaced"], m["kept"], m["duplicate"]) == (n_db, n_db, 0, 0, 0)
    assert n_db == t["benched"]
    receipt = next(RECEIPT.search(line) for line in r.stdout.splitlines() if RECEIPT.search(line))
    assert [int(g) for g in receipt.groups()] == [m["merged"], m["new"], m["replaced"], m["kept"],
                                                  m["duplicate"]]
    assert m["per_card"] == {"Triton CPU interpreter": n_db}
    assert m["per_card_regime"] == {"Triton CPU interpreter": {"interpret": n_db}}
    assert f"backup: {m['backup']}" in r.stdout.splitlines() and Path(m["backup"]).is_file()
    assert rep["other_failures"] == []


# ---------------------------------------------------------------- through the harvest's seam

JOBS = '''
import pytest
from harness.harvest import job_property

def test_done(record_property):
    record_property(*job_property(gpu="h200", slice="own", kind="matmul", card="{gpu}",
                                  state="done (pool exhausted)", benched=2, ok=1, failed=1,
                                  statuses={{"ok": 1, "bench_fail": 1}}, seconds=12.5,
                                  allotment_s=30.0, points_done=2, points_total=2,
                                  rows_file={rows!r}, run_id="bench-a"))

def test_died(record_property):
    record_property(*job_property(gpu="h200", slice="tail", kind="matmul", card="{gpu}",
                                  state="died", benched=0, seconds=3.0, allotment_s=20.0,
                                  run_id="bench-a"))
    pytest.fail("the sweep job died; tail of sweep.log: killed", pytrace=False)

def test_skipped(record_property):
    record_property(*job_property(gpu="h200", slice="cross", kind="matmul", card="{gpu}"))
    pytest.skip("no matmul points left to measure in the cross slice")

def test_not_a_job():
    assert 1 == 2, "something else broke"
'''


def _row(i: int, status: str = "ok") -> dict[str, Any]:
    spec = f"BLOCK_K=64,BLOCK_M=128,BLOCK_N={64 * (i + 1)},num_stages=3,num_warps=4"
    shape_id = "matmul_M64_N4096_K4096_bf16"
    return {"point_key": point_key(GPU, shape_id, spec), "gpu": GPU, "regime": "deployable",
            "kind": "matmul", "shape_id": shape_id, "shape": {"M": 64, "N": 4096, "K": 4096, "dtype": "bf16"},
            "spec": spec, "slice": "own", "status": status, "value_us": 10.0 + i, "variance": 0.01,
            "n_samples": 20, "features": {"S_M": 64, "S_N": 4096, "S_K": 4096}, "cc": [9, 0],
            "run_id": "bench-a", "measured_at": "2026-12-02T11:22:33.000000Z"}


@pytest.fixture
def seam(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("EMMY_STATE_DIR", str(pytester.path / "state"))
    monkeypatch.delenv("EMMY_TUNE_DB", raising=False)
    rows = pytester.path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in (_row(0), _row(1, "bench_fail"))))
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    pytester.makepyfile(test_jobs=JOBS.format(gpu=GPU, rows=str(rows)))
    return pytester


def test_failed_job_and_failed_merge_are_in_the_report(seam: pytest.Pytester) -> None:
    tmp = seam.path
    db = tmp / "not-a-db.sqlite"
    db.write_text("these bytes are no SQLite database\n")
    report = tmp / "report.json"
    result = seam.runpytest("-p", "no:cacheprovider", f"--db={db}", f"--report-json={report}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rep = json.loads(report.read_text())
    assert (rep["exit_status"], rep["exit_status_name"]) == (1, "TESTS_FAILED")
    jobs = {j["nodeid"].split("::")[1]: j for j in rep["jobs"]}
    assert list(jobs) == ["test_done", "test_died", "test_skipped"]
    done, died, skipped = jobs["test_done"], jobs["test_died"], jobs["test_skipped"]
    assert (done["outcome"], done["statuses"], done["allotment_s"], done["elapsed_s"]) == (
        "passed", {"ok": 1, "bench_fail": 1}, 30.0, 12.5)
    assert (died["outcome"], died["state"]) == ("failed", "died")
    assert died["reason"] == "the sweep job died; tail of sweep.log: killed"
    assert (skipped["outcome"], skipped["reason"]) == (
        "skipped", "no matmul points left to measure in the cross slice")
    assert rep["totals"]["jobs"] == {"total": 3, "passed": 1, "failed": 1, "skipped": 1, "interrupted": 0,
                                 "unfinished": 0, "not_run": 0}
    assert (rep["totals"]["benched"], rep["totals"]["statuses"]) == (2, {"bench_fail": 1, "ok": 1})
    assert rep["other_failures"] == [{"nodeid": "test_jobs.py::test_not_a_job", "when": "call",
                                      "reason": "AssertionError: something else broke"}]
    # the merge failed: the report says why and how to merge by hand, like the summary
    m = rep["merge"]
    assert m["state"] == "failed" and m["new"] == 0 and m["backup"] is None
    assert m["rows_files"] == [str(tmp / "rows.jsonl")]
    assert m["merge_command"] == f"python -m harness merge {tmp / 'rows.jsonl'} --db {db}"
    result.stdout.fnmatch_lines([f"MERGE FAILED: {m['error']}", f"  {m['merge_command']}",
                                 f"report: {report}"], consecutive=False)
    assert db.read_text() == "these bytes are no SQLite database\n"


def test_merged_rows_and_warnings_are_in_the_report(seam: pytest.Pytester) -> None:
    tmp = seam.path
    with (tmp / "rows.jsonl").open("a") as f:
        f.write('{"gpu": "half a ro')  # a crash mid-line: skipped and warned about
    report = tmp / "report.json"
    result = seam.runpytest("-p", "no:cacheprovider", f"--db={tmp / 'db' / 'a.db'}",
                            f"--report-json={report}", "-k", "not not_a_job")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # test_died
    m = json.loads(report.read_text())["merge"]
    assert (m["state"], m["merged"], m["new"], m["rejected"]) == ("merged", 2, 2, 1)
    assert m["per_card"] == {GPU: 2} and Path(m["backup"]).is_file()
    assert len(m["warnings"]) == 1 and "rejected 1 row(s) that cannot be merged" in m["warnings"][0]
    assert "rows.jsonl:3: cut off" in m["warnings"][0]
    result.stdout.fnmatch_lines([f"warning: {m['warnings'][0]}", f"report: {report}"], consecutive=False)


def test_a_report_that_cannot_be_written_at_the_end_is_a_warning(seam: pytest.Pytester) -> None:
    """The folder was there when the run started and is gone at its end: the run's exit status
    does not change, the summary says the report was not written."""
    tmp = seam.path
    gone = tmp / "gone"
    gone.mkdir()
    seam.makepyfile(test_rm=f"import shutil\n\ndef test_rm():\n    shutil.rmtree({str(gone)!r})\n")
    result = seam.runpytest("-p", "no:cacheprovider", f"--db={tmp / 'db' / 'a.db'}",
                            f"--report-json={gone / 'r.json'}", "-k", "done or rm")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"warning: could not write --report-json {gone / 'r.json'}: *"])
    assert not gone.exists()


def test_under_xdist_only_the_controller_writes_the_report(seam: pytest.Pytester) -> None:
    """Each worker's jobs reach the controller's report; no worker writes it (a spy in the
    workers marks any call)."""
    tmp = seam.path
    seam.makeconftest(
        'pytest_plugins = ["harness.plugin"]\n'
        "from pathlib import Path\n"
        "import harness.harvest as harvest\n\n"
        "def pytest_configure(config):\n"
        "    if hasattr(config, 'workerinput'):\n"
        "        def spy(path, data):\n"
        f"            Path({str(tmp)!r}, 'worker-wrote-' + config.workerinput['workerid']).touch()\n"
        "        harvest.write_json_atomic = spy\n")
    report = tmp / "report.json"
    result = seam.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", f"--db={tmp / 'db' / 'a.db'}",
                                       f"--report-json={report}", "-k", "not not_a_job")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not list(tmp.glob("worker-wrote-*"))
    rep = json.loads(report.read_text())
    assert rep["options"]["numprocesses"] == 2
    assert sorted(j["nodeid"].split("::")[1] for j in rep["jobs"]) == ["test_died", "test_done", "test_skipped"]
    assert {j["worker"] for j in rep["jobs"]} <= {"gw0", "gw1"}
    assert rep["totals"]["jobs"]["failed"] == 1 and rep["merge"]["new"] == 2


def test_a_run_refused_before_it_starts_writes_no_report(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A usage error found after the options (here the DB check) means nothing ran: stderr
    says why, and no report is written (nor an old one replaced)."""
    tmp = pytester.path
    monkeypatch.setenv("EMMY_STATE_DIR", str(tmp / "state"))
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    shutil.copytree(ROOT / "collect_tests", tmp / "collect_tests")
    (tmp / "a-folder").mkdir()
    report = tmp / "report.json"
    report.write_text("the earlier run's report\n")
    result = pytester.runpytest("collect_tests", "-p", "no:cacheprovider", "-k", "own and softmax",
                                f"--db={tmp / 'a-folder'}", f"--report-json={report}",
                                f"--box-dir={tmp / 'box'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.re_match_lines([r".*--db: .*a-folder.*"])
    assert report.read_text() == "the earlier run's report\n"
    assert not (tmp / "box").exists()


TOP_UPS = '''
from harness.harvest import job_property, top_ups_property

TOP = {{"gpu": "h200", "id": "own-softmax.top1", "round": 1, "slice": "own", "kind": "softmax",
        "state": "done (pool exhausted)", "allotment_s": 9.0, "seconds": 4.0, "benched": 3,
        "ok": 3, "failed": 0, "merge": {{}}}}

def test_a(record_property):
    record_property(*job_property(gpu="h200", slice="own", kind="softmax", card="{gpu}",
                                  state="done (budget spent)", benched=5, ok=5, seconds=10.0))

def test_b(record_property):
    record_property(*job_property(gpu="h200", slice="own", kind="matmul", card="{gpu}",
                                  state="done (pool exhausted)", benched=2, ok=2, seconds=3.0))
    record_property(*top_ups_property([TOP]))
'''


def test_a_top_up_is_booked_once_on_the_job_it_topped_up_and_properties_are_json(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The card's last test carries the top-ups; each lands on its own job (once, though
    several of the test's reports carry it), the totals add up, and JUnit's values parse."""
    import xml.etree.ElementTree as ET

    monkeypatch.setenv("EMMY_STATE_DIR", str(pytester.path / "state"))
    monkeypatch.delenv("EMMY_TUNE_DB", raising=False)
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    pytester.makepyfile(test_jobs=TOP_UPS.format(gpu=GPU))
    report, junit = pytester.path / "report.json", pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--db={pytester.path / 'db.sqlite'}",
                                f"--report-json={report}", f"--junitxml={junit}")
    assert result.ret == 0
    rep = json.loads(report.read_text())
    jobs = {j["kind"]: j for j in rep["jobs"]}
    assert [t["id"] for t in jobs["softmax"]["top_ups"]] == ["own-softmax.top1"]
    assert jobs["matmul"]["top_ups"] == []
    assert rep["totals"]["top_ups"] == 1 and rep["totals"]["benched"] == 5 + 2 + 3
    # the summary counts the top-up in its job's cell: 5 + 3 points in 10 + 4 seconds
    assert summary_jobs(result.stdout.str())[("own", "softmax")]["cell"] == \
        "8 in 14.0s, topped up"
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        names = [n for n, _ in props]
        assert names.count("emmy_job") == 1, names
        for _, value in props:
            json.loads(value)  # every value is JSON
