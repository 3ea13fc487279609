"""``--provider slurm`` against a real Slurm (``tests/slurm.py``: munged, slurmctld, slurmd).

Whole ``pytest collect_tests --provider=slurm`` runs, the controller on this machine as the
login node, the interpreter standing in for the GPU: a session through a batch job, two cards
as two jobs, Ctrl-C mid-job, a ``scancel`` from outside, a job pending past ``--timeout-s``, a
node with the wrong card; each followed by the run that resumes from the node table.  What is
checked is what happened: the node table against the rows files the jobs wrote, and the
cluster's queue (no job of ours left, another user's job untouched).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.contract import SlurmOptions
from harness.remote.slurm import (
    JobInfo,
    SlurmError,
    parse_squeue,
    sbatch_options,
    time_limit_minutes,
)
from tests.runs import box_rows, db_points

if TYPE_CHECKING:
    from tests.slurm import SlurmCluster
    from tests.sshd import SSHServer

pytest_plugins = ["pytester", "tests.slurm"]

ROOT = Path(__file__).resolve().parent.parent
MATMUL = ("--gpu=interpret", "--budget-s=300", "-k", "own and matmul")  # 38 points, ~20 s
JOB_LINE = re.compile(r"submitted Slurm job (\d+)")


# -- pure parts ------------------------------------------------------------------------------
def test_slurm_sbatch_options_fill_the_card_and_keep_extra_words_whole() -> None:
    opts = SlurmOptions(slurm_partition="gpu-{gpu}", slurm_account="proj", slurm_gres="gpu:{gpu}:1",
                        slurm_constraint="{gpu}&ib", slurm_extra="--qos=high --comment='a b'")
    argv = sbatch_options(opts, "h100", job_name="j", output="/o/%j", chdir="/o", minutes=17)
    assert argv == ["--job-name=j", "--output=/o/%j", "--chdir=/o", "--nodes=1", "--ntasks=1",
                    "--time=17", "--partition=gpu-h100", "--account=proj", "--gres=gpu:h100:1",
                    "--constraint=h100&ib", "--qos=high", "--comment=a b"]
    assert "--gres=none" not in sbatch_options(SlurmOptions(slurm_gres="none"), "h100",
                                               job_name="j", output="o", chdir="o", minutes=1)
    with pytest.raises(SlurmError, match=r"--slurm-gres='gpu:\{card\}:1': unknown placeholder"):
        sbatch_options(SlurmOptions(slurm_gres="gpu:{card}:1"), "h100", job_name="j",
                       output="o", chdir="o", minutes=1)
    assert time_limit_minutes(300, 900, 90) == 22


def test_slurm_job_states_read_as_words() -> None:
    assert JobInfo("7", "PENDING", "Resources").describe() == "is pending (Resources)"
    assert parse_squeue("7", "CANCELLED|None|").describe() == \
        "was cancelled (scancel, by you or an administrator)"
    assert parse_squeue("7", "PENDING|None|").describe() == "is pending"
    assert parse_squeue("7", "PENDING|Resources|").describe() == "is pending (Resources)"
    assert parse_squeue("7", "RUNNING|None|node3").describe() == "is running on node3"
    assert JobInfo("7", "TIMEOUT", "TimeLimit").describe() == "reached its time limit (TimeLimit)"
    assert JobInfo("7", "COMPLETING").alive and not JobInfo("7", "COMPLETED").alive


def test_slurm_a_job_still_completing_is_described_by_the_state_it_ends_in(
        tmp_path: Path) -> None:
    """Just after a scancel the job is COMPLETING (its processes being ended): why it is gone
    is the state it then ends in, with the line Slurm wrote into its output file."""
    from harness.remote.tmux import Tmux
    from harness.remote.transport import LocalTransport
    from harness.slurmbox import SlurmDriver

    answers = iter([JobInfo("8", "COMPLETING"), JobInfo("8", "COMPLETING"),
                    JobInfo("8", "CANCELLED")])
    asked: list[str] = []

    class Answers:  # our seam: what squeue says, one answer a call
        def info(self, job_id: str) -> JobInfo:
            asked.append(job_id)
            return next(answers)

    now = [0.0]
    t = LocalTransport()
    d = SlurmDriver(transport=t, tmux=Tmux(t, socket="unused"), base=str(tmp_path),
                    sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    d.slurm = Answers()  # type: ignore[assignment]
    d.job_id = "8"
    (tmp_path / "slurm-8.out").write_text(
        "[sweep] …\nslurmstepd: error: *** JOB 8 ON vm CANCELLED AT 2026-12-06T03:45:31 ***\n")
    assert d.gone_reason() == ("Slurm job 8 was cancelled (scancel, by you or an administrator)"
                               ": *** JOB 8 ON vm CANCELLED AT 2026-12-06T03:45:31 ***")
    assert asked == ["8", "8", "8"]


def test_slurm_options_need_the_slurm_provider(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    r = pytester.runpytest("--slurm-partition=gpu")
    r.stderr.fnmatch_lines(["*--slurm-partition=gpu is only used with --provider=slurm "
                            "(--provider is not given)*"])
    r = pytester.runpytest("--provider=slurm", "--gpu=h100", "--slurm-constraint={card}")
    r.stderr.fnmatch_lines(["*--slurm-constraint='{card}': unknown placeholder(s) {card}; "
                            "valid: {gpu}*"])
    r = pytester.runpytest("--provider=slurm", "--gpu=local")
    r.stderr.fnmatch_lines(["*--provider=slurm needs --gpu=ALIAS*the card to ask Slurm for*"])


# -- whole runs against the cluster ----------------------------------------------------------
class SlurmRun:
    """``pytest collect_tests --provider=slurm`` in its own process group, as a user types it
    on the login node, or on a laptop that reaches the login node ``login`` with ``--remote``
    (its environment then knows nothing of the cluster: every Slurm command must go over
    SSH); runs of one test share its box folder, node table and state."""

    def __init__(self, tmp: Path, cluster: SlurmCluster, *args: str,
                 login: SSHServer | None = None) -> None:
        self.tmp, self.cluster = tmp, cluster
        self.db, self.box, self.state = tmp / "autotune.db", tmp / "box", tmp / "state"
        env = {k: v for k, v in cluster.env.items()
               if not k.startswith(("PYTEST_", "TRITON_", "EMMY_"))}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(EMMY_STATE_DIR=str(self.state), PYTHONUNBUFFERED="1")
        remote: list[str] = []
        if login is not None:
            env.pop("SLURM_CONF")
            remote = [f"--remote={login.remote}", f"--ssh-key={login.client_key}",
                      f"--known-hosts={login.known_hosts}", f"--box-python={sys.executable}"]
        cmd = [sys.executable, "-m", "pytest", "collect_tests", "-p", "no:cacheprovider",
               "--provider=slurm", "--slurm-gres=none", f"--db={self.db}",
               f"--box-dir={self.box}", "--poll-s=0.5", *remote, *args]
        self.out_path = tmp / f"run-{len(list(tmp.glob('run-*.txt')))}.txt"
        self.started_at = time.time()
        with self.out_path.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for_log(self, card: str, pattern: str, timeout: float = 240.0) -> None:
        """Wait for ``pattern`` in the job's log on the shared filesystem (this run's)."""
        log = self.box / card / "sweep.log"
        deadline = time.monotonic() + timeout
        while True:
            try:
                if log.stat().st_mtime >= self.started_at and re.search(pattern, log.read_text()):
                    return
            except FileNotFoundError:
                pass
            assert self.proc.poll() is None, f"the run ended before {pattern!r}:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} in {log}:\n{self.output[-3000:]}"
            time.sleep(0.1)

    def job_ids(self) -> list[str]:
        return JOB_LINE.findall(self.output)

    def wait_running(self, timeout: float = 240.0) -> str:
        """Wait until ``squeue`` shows the run's job running; its id."""
        deadline = time.monotonic() + timeout
        while True:
            ids = self.job_ids()
            if ids and self.cluster.jobs().get(ids[0]) == "RUNNING":
                return ids[0]
            assert self.proc.poll() is None, f"the run ended before its job ran:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"no job of ours running: {self.cluster.jobs()}" \
                f"\n{self.output[-3000:]}"
            time.sleep(0.1)

    def finish(self, timeout: float = 400.0) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            raise AssertionError(f"the run did not end in {timeout:.0f}s:\n{self.output[-3000:]}") from None
        return rc, self.output


def harness_status(cluster: SlurmCluster, box: Path, gpu: str, *args: str,
                   login: SSHServer | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m harness status --gpu=GPU --box-dir=BOX`` on the login node, or from a
    laptop through ``login`` (then only the login node's sessions know the cluster)."""
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("PYTEST_", "EMMY_"))}
    remote: list[str] = []
    if login is not None:
        env.pop("SLURM_CONF")
        remote = [f"--remote={login.remote}", f"--ssh-key={login.client_key}",
                  f"--known-hosts={login.known_hosts}"]
    return subprocess.run([sys.executable, "-m", "harness", "status", f"--gpu={gpu}",
                           f"--box-dir={box}", *remote, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def run(tmp: Path, cluster: SlurmCluster, *args: str) -> tuple[int, str, SlurmRun]:
    r = SlurmRun(tmp, cluster, *args)
    rc, out = r.finish()
    return rc, out, r


def assert_all_merged(r: SlurmRun) -> set[str]:
    """Every row the jobs wrote on the shared filesystem is in the node table, once."""
    wrote = {row["point_key"] for card in r.box.iterdir() if card.is_dir()
             for row in box_rows(card)}
    points = db_points(r.db)
    assert len(points) == len({(k, regime) for k, regime, _ in points})
    assert wrote and wrote <= {k for k, _, _ in points}
    return wrote


def assert_nothing_of_ours_left(r: SlurmRun) -> None:
    """None of the run's jobs waits or runs; its leases are gone; the box folders are free."""
    ours = set(r.job_ids())
    assert ours, r.output[-2000:]
    assert not ours & r.cluster.live_jobs(), r.cluster.jobs()
    assert not list((r.state / "leases").glob("*.json"))
    assert not list(r.box.glob("*/lock.json"))


@pytest.mark.slow
def test_slurm_session_runs_in_a_batch_job_and_the_next_run_resumes(
        tmp_path: Path, slurm: SlurmCluster) -> None:
    args = ("--gpu=interpret", "--budget-s=60", "--filter=fp32", "-k", "own and softmax")
    rc, out, r = run(tmp_path, slurm, *args)
    assert rc == 0, out[-4000:]
    assert "status: COMPLETE (sweep done + merge done)" in out
    (job,) = r.job_ids()
    assert re.search(rf"box local: Triton CPU interpreter \(interpret\), Slurm job {job} on "
                     rf"{slurm.node}, \d+s in the queue", out), out[-3000:]
    assert slurm.jobs()[job] == "COMPLETED"  # it ended by itself, with its session
    wrote = assert_all_merged(r)
    assert_nothing_of_ours_left(r)
    assert {regime for _, regime, _ in db_points(r.db)} == {"interpret"}

    # the next run finds everything in the node table: nothing is measured again
    rc, out, r2 = run(tmp_path, slurm, *args)
    assert rc == 0, out[-4000:]
    assert f"all {len(wrote)} softmax points of the own slice on Triton CPU interpreter are in " \
           "the node table already" in out
    assert len(db_points(r.db)) == len(wrote)
    assert_nothing_of_ours_left(r2)


@pytest.mark.slow
def test_slurm_two_cards_are_two_jobs(tmp_path: Path, slurm: SlurmCluster) -> None:
    rc, out, r = run(tmp_path, slurm, "--gpu=l40s,h100", "-n", "2", "--slurm-partition={gpu}",
                     "--budget-s=40", "--filter=fp32", "--max-dist=1", "--tail-cap=2", "-k",
                     "cross and softmax")
    assert rc == 0, out[-4000:]
    assert out.count("=== collect-node-data summary ===") == 1
    jobs = {}
    for card in ("l40s", "h100"):  # one job per card, each on its own box folder
        text = (r.box / card / "sweep.log").read_text()
        jobs[card] = re.search(r"\[slurm\] job (\d+)", text).group(1)
        (script,) = (r.box / card / "service").glob("*/job.sh")
        assert "--expect-card" in script.read_text()
    assert jobs["l40s"] != jobs["h100"]
    db = sqlite3.connect(r.db)
    got = dict(db.execute("select gpu, count(*) from node group by gpu").fetchall())
    assert set(got) == {"NVIDIA L40S", "NVIDIA H100 80GB"}
    assert not set(jobs.values()) & slurm.live_jobs()
    assert not list((r.state / "leases").glob("*.json"))
    assert_all_merged(r)


@pytest.mark.slow
def test_slurm_ctrl_c_cancels_only_our_job_and_merges_its_rows(
        tmp_path: Path, slurm: SlurmCluster) -> None:
    other = slurm.submit("-c", "1", "-J", "someone-else", "--wrap", "sleep 600") \
        if slurm.cpus >= 2 else None
    try:
        r = SlurmRun(tmp_path, slurm, *MATMUL)
        r.wait_for_log("interpret", r"\[batch 1\] own matmul")
        (job,) = r.job_ids()
        assert job in slurm.live_jobs()  # squeue shows it while it runs
        os.killpg(r.proc.pid, signal.SIGINT)
        rc, out = r.finish(180)
        assert rc == pytest.ExitCode.INTERRUPTED, out[-3000:]
        assert "status: INTERRUPTED (job own-matmul stopped and harvested; " in out
        assert "Traceback" not in out
        (rows_file,) = (r.box / "interpret" / "rows").glob("bench-*/own-matmul.jsonl")
        n = len(rows_file.read_text().splitlines())
        assert 0 < n < 38
        assert f"stopped and harvested: {n} rows merged" in out
        assert_all_merged(r)
        assert_nothing_of_ours_left(r)
        if other:
            assert other in slurm.live_jobs()  # another user's job is never touched

        # the next run measures what is left, and only that
        rc, out, r2 = run(tmp_path, slurm, *MATMUL)
        assert rc == 0, out[-4000:]
        log = (r.box / "interpret" / "sweep.log").read_text()
        assert f"job own-matmul: {38 - n} of 38 points to measure" in log
        assert len(db_points(r.db)) == 38
        assert_all_merged(r2)
        assert_nothing_of_ours_left(r2)
    finally:
        if other:
            slurm.run("scancel", other)
            slurm.wait_gone(other)


@pytest.mark.slow
def test_slurm_a_job_cancelled_from_outside_is_harvested_and_resumed(
        tmp_path: Path, slurm: SlurmCluster) -> None:
    r = SlurmRun(tmp_path, slurm, *MATMUL)
    r.wait_for_log("interpret", r"\[batch 1\] own matmul")
    (job,) = r.job_ids()
    slurm.run("scancel", job)  # an administrator, or the user in another terminal
    rc, out = r.finish(180)
    assert rc == 1, out[-3000:]
    assert re.search(rf"own matmul: died \(Slurm job {job} was cancelled", out), out[-3000:]
    assert "status: FAILED (1 job(s) failed: own-matmul)" in out
    (rows_file,) = (r.box / "interpret" / "rows").glob("bench-*/own-matmul.jsonl")
    n = len(rows_file.read_text().splitlines())
    assert 0 < n < 38
    assert_all_merged(r)
    assert_nothing_of_ours_left(r)

    rc, out, r2 = run(tmp_path, slurm, *MATMUL)
    assert rc == 0, out[-4000:]
    assert f"job own-matmul: {38 - n} of 38 points to measure" in (
        r.box / "interpret" / "sweep.log").read_text()
    assert len(db_points(r.db)) == 38
    assert_nothing_of_ours_left(r2)


@pytest.mark.slow
def test_slurm_a_job_pending_past_timeout_is_cancelled_and_says_why(
        tmp_path: Path, slurm: SlurmCluster) -> None:
    args = ("--gpu=interpret", "--budget-s=60", "--filter=fp32", "-k", "own and softmax")
    blocker = slurm.submit("-c", str(slurm.cpus), "-J", "someone-else", "--wrap", "sleep 600")
    try:
        rc, out, r = run(tmp_path, slurm, *args, "--timeout-s=4")
        assert rc == 0, out[-4000:]
        (job,) = r.job_ids()
        reason = re.search(rf"--timeout-s=4 reached while Slurm job {job} waited \d+s in the "
                           r"queue \((\w+)[^)]*\) and still waits", out)
        assert reason, out[-3000:]
        assert reason.group(1) in ("Resources", "Priority")  # squeue's word for the busy node
        assert "own softmax: skipped: --timeout-s=4 reached" in out and "status: COMPLETE" in out
        assert slurm.jobs()[job] == "CANCELLED"
        assert blocker in slurm.live_jobs()
        assert not list((r.state / "leases").glob("*.json"))
        assert db_points(r.db) == []
    finally:
        slurm.run("scancel", blocker)
        slurm.wait_gone(blocker)
    rc, out, r2 = run(tmp_path, slurm, *args)  # the node is free: the next run measures
    assert rc == 0, out[-4000:]
    assert "status: COMPLETE (sweep done + merge done)" in out
    assert_all_merged(r2)
    assert_nothing_of_ours_left(r2)


@pytest.mark.slow
def test_slurm_a_node_with_another_card_is_refused(tmp_path: Path, slurm: SlurmCluster) -> None:
    args = ("--gpu=h100", "--budget-s=40", "--filter=fp32", "--max-dist=1", "--tail-cap=2",
            "-k", "cross and softmax or tail and softmax")
    rc, out, r = run(tmp_path, slurm, *args, "--slurm-partition=l40s")
    assert rc == 1, out[-3000:]
    (job,) = r.job_ids()
    assert (f"--gpu=h100 wants NVIDIA H100 80GB but Slurm job {job} ran on "
            in out), out[-3000:]
    assert "which has NVIDIA L40S; the job refused the node and measured nothing" in out
    assert "skipped: box for --gpu=h100 is unusable: see the first job's failure" in out
    assert json.loads((r.box / "h100" / "probe.json").read_text())["card"] == "NVIDIA L40S"
    assert db_points(r.db) == [] and box_rows(r.box / "h100") == []
    assert_nothing_of_ours_left(r)

    rc, out, r2 = run(tmp_path, slurm, *args, "--slurm-partition=h100")  # the right node
    assert rc == 0, out[-4000:]
    db = sqlite3.connect(r.db)
    assert db.execute("select distinct gpu, regime from node").fetchall() == [
        ("NVIDIA H100 80GB", "interpret")]
    assert_nothing_of_ours_left(r2)


# -- the login node over SSH (--remote) ------------------------------------------------------
@pytest.mark.slow
def test_slurm_over_ssh_runs_a_session_from_a_laptop(
        tmp_path: Path, slurm: SlurmCluster, slurm_login: SSHServer) -> None:
    r = SlurmRun(tmp_path, slurm, *MATMUL, login=slurm_login)
    job = r.wait_running()  # squeue shows it while it runs
    rc, out = r.finish()
    assert rc == 0, out[-4000:]
    assert "status: COMPLETE (sweep done + merge done)" in out
    assert r.job_ids() == [job]
    assert re.search(rf"box {re.escape(slurm_login.remote)}: Triton CPU interpreter "
                     rf"\(interpret\), Slurm job {job} on {slurm.node}, \d+s in the queue",
                     out), out[-3000:]
    assert "(None)" not in out  # squeue's word for no reason is not a reason
    assert slurm.jobs()[job] == "COMPLETED"
    assert len(assert_all_merged(r)) == 38
    assert_nothing_of_ours_left(r)
    # from the laptop, afterwards: the session the job ran, and how the job ended
    st = harness_status(slurm, r.box, "interpret", "--json", login=slurm_login)
    assert st.returncode == 0, st.stdout + st.stderr
    seen = json.loads(st.stdout)
    assert seen["slurm"]["job_id"] == job and seen["slurm"]["state"] == "COMPLETED"
    assert seen["alive"] is False and seen["session"]["state"] == "done"


@pytest.mark.slow
def test_slurm_over_ssh_ctrl_c_cancels_only_our_job_and_loses_no_row(
        tmp_path: Path, slurm: SlurmCluster, slurm_login: SSHServer) -> None:
    other = slurm.submit("-c", "1", "-J", "someone-else", "--wrap", "sleep 600") \
        if slurm.cpus >= 2 else None
    try:
        r = SlurmRun(tmp_path, slurm, *MATMUL, login=slurm_login)
        r.wait_for_log("interpret", r"\[batch 1\] own matmul")
        (job,) = r.job_ids()
        assert job in slurm.live_jobs()
        os.killpg(r.proc.pid, signal.SIGINT)
        rc, out = r.finish(180)
        assert rc == pytest.ExitCode.INTERRUPTED, out[-3000:]
        assert "status: INTERRUPTED (job own-matmul stopped and harvested; " in out
        assert "Traceback" not in out
        (rows_file,) = (r.box / "interpret" / "rows").glob("bench-*/own-matmul.jsonl")
        n = len(rows_file.read_text().splitlines())
        assert 0 < n < 38
        assert f"stopped and harvested: {n} rows merged" in out
        assert len(db_points(r.db)) == n
        assert_all_merged(r)
        assert_nothing_of_ours_left(r)
        if other:
            assert other in slurm.live_jobs()  # another user's job is never touched
    finally:
        if other:
            slurm.run("scancel", other)
            slurm.wait_gone(other)


@pytest.mark.slow
def test_slurm_status_shows_the_job_its_state_and_why_it_waits(
        tmp_path: Path, slurm: SlurmCluster, slurm_login: SSHServer) -> None:
    box = tmp_path / "box"
    (box / "h100").mkdir(parents=True)
    blocker = slurm.submit("-c", str(slurm.cpus), "-J", "someone-else", "--wrap", "sleep 600")
    ours = slurm.submit("-c", "1", "--wrap", "sleep 600")
    try:
        # a run's box folder whose session is this job's (as the controller writes it)
        (box / "h100" / "current-session.json").write_text(json.dumps(
            {"run_id": "bench-1", "session_id": "bench-1", "started": time.time(),
             "slurm_job": ours}))
        (box / "h100" / "sweep.log").write_text(f"[slurm] job {ours} on a node: setting up\n")
        deadline = time.monotonic() + 60
        while True:  # the scheduler has looked at it: it waits for a reason
            seen = json.loads(harness_status(slurm, box, "h100", "--json").stdout)
            if seen["slurm"]["reason"]:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        assert seen["slurm"]["state"] == "PENDING" and seen["alive"] is True, seen
        reason = seen["slurm"]["reason"]
        assert reason in ("Resources", "Priority"), seen
        assert seen["tmux_session"] is None and seen["session"] is None
        st = harness_status(slurm, box, "h100", login=slurm_login)  # from a laptop, as text
        assert st.returncode == 0, st.stdout + st.stderr
        # (the scheduler may give the other reason by now)
        assert re.search(rf"session: not started yet \(Slurm job {ours}: PENDING "
                         r"\((Resources|Priority)\)\)", st.stdout), st.stdout
        assert f"[slurm] job {ours} on a node: setting up" in st.stdout

        slurm.run("scancel", blocker)
        deadline = time.monotonic() + 60
        while slurm.jobs().get(ours) != "RUNNING":
            assert time.monotonic() < deadline, slurm.jobs()
            time.sleep(0.2)
        st = harness_status(slurm, box, "h100")
        assert f"Slurm job {ours}: RUNNING on {slurm.node}" in st.stdout, st.stdout

        slurm.run("scancel", ours)
        slurm.wait_gone(ours)
        seen = json.loads(harness_status(slurm, box, "h100", "--json").stdout)
        assert seen["slurm"]["state"] == "CANCELLED" and seen["alive"] is False
    finally:
        slurm.run("scancel", blocker, ours, check=False)
        slurm.wait_gone(blocker, ours)


def test_slurm_status_wants_one_known_card(tmp_path: Path) -> None:
    for gpu, says in (("h100,l40s", "one card's alias"), ("h10O", "unknown card 'h10O'")):
        st = subprocess.run([sys.executable, "-m", "harness", "status", f"--gpu={gpu}",
                             f"--box-dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
        assert st.returncode != 0 and says in st.stderr + st.stdout, st.stderr
