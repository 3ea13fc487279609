"""Rented servers: the command provider against local sshd boxes, SkyPilot at our seam."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cards import by_alias
from harness.remote.providers import (
    CommandProvider,
    Lease,
    ProviderError,
    SkyPilotProvider,
    parse_up_output,
    substitute,
)
from tests.sshd import SSHD

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_cloud.py"

pytest_plugins = ["pytester"]


# -- pure parts ----------------------------------------------------------------------------
@pytest.mark.parametrize(("out", "target", "handle"), [
    ('{"ssh_host": "10.0.0.5", "ssh_port": 2222, "ssh_user": "ubuntu", "id": "i-123"}',
     "ubuntu@10.0.0.5:2222", "i-123"),
    ('booting...\n{"ssh_target": "root@h:22", "delete_info": {"zone": "z", "name": "n"}}\n',
     "root@h:22", '{"name": "n", "zone": "z"}'),
    ("created\nubuntu@1.2.3.4:22\n", "ubuntu@1.2.3.4:22", None),
    ('{\n "ssh_host": "h",\n "handle": "abc"\n}', "h", "abc"),
])
def test_up_output_forms(out: str, target: str, handle: str | None) -> None:
    got = parse_up_output(out)
    assert got[0] == target and got[1] == handle


def test_up_output_without_a_server_is_an_error_showing_it() -> None:
    with pytest.raises(ProviderError, match="(?s)printed no server.*quota exceeded"):
        parse_up_output("error: quota exceeded\n")


def test_values_are_substituted_inside_one_argv_word() -> None:
    argv = substitute("mycloud create --gpu {gpu} --name 'box {gpu_name}'",
                      {"gpu": "h100", "gpu_name": "x; rm -rf / $(boom)"}, "--up-cmd")
    assert argv == ["mycloud", "create", "--gpu", "h100", "--name", "box x; rm -rf / $(boom)"]
    with pytest.raises(ProviderError, match=r"--down-cmd: unknown placeholder\(s\) \{hndle\}"):
        substitute("down {hndle}", {"handle": "h"}, "--down-cmd")


def test_lease_is_on_disk_until_released(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def runner(argv, timeout):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, '{"ssh_target": "u@h:22", "id": "vm-1"}', "")

    prov = CommandProvider("cloud up {gpu}", "cloud down {handle}", runner=runner)
    lease = prov.acquire(by_alias("l40s"), lambda lease: lease.save(tmp_path))
    (path,) = tmp_path.glob("*.json")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert Lease.load(path).release_command == "cloud down vm-1"
    lease.release(runner)
    assert calls == [["cloud", "up", "l40s"], ["cloud", "down", "vm-1"]]
    assert not path.exists()


def test_skypilot_launches_one_gpu_and_downs_the_cluster() -> None:
    calls: list[list[str]] = []

    def runner(argv, timeout):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")

    saved: list[Lease] = []
    lease = SkyPilotProvider(runner=runner).acquire(by_alias("h100"), saved.append)
    assert saved == [lease]  # recorded before the launch
    assert calls[0][:4] == ["sky", "launch", "-y", "-c"] and calls[0][-2:] == ["--gpus", "H100:1"]
    assert lease.target == calls[0][4]  # SkyPilot puts the cluster into ~/.ssh/config
    lease.release(runner)
    assert calls[1] == ["sky", "down", "-y", lease.target]


def test_skypilot_failed_launch_takes_the_half_made_cluster_down() -> None:
    calls: list[list[str]] = []

    def runner(argv, timeout):
        calls.append(list(argv))
        rc = 1 if argv[1] == "launch" else 0
        return subprocess.CompletedProcess(argv, rc, "", "no capacity")

    with pytest.raises(ProviderError, match="(?s)exit 1.*no capacity"):
        SkyPilotProvider(runner=runner).acquire(by_alias("h200"), lambda lease: None)
    assert calls[-1][:3] == ["sky", "down", "-y"]


# -- the whole run against local sshd boxes ----------------------------------------------------
def _cmd(tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    if not SSHD.is_file():  # the fake cloud's servers are local sshd boxes
        pytest.skip(f"{SSHD} not found: install openssh-server "
                    "(apt-get install openssh-server) to run the SSH tests")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    clouds = tmp_path / "cloud"
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "-p", "no:cacheprovider",
           "--provider=command", f"--up-cmd={sys.executable} {FAKE} up {clouds}/{{gpu}} '{{gpu_name}}'",
           f"--down-cmd={sys.executable} {FAKE} down {{handle}}", f"--box-python={sys.executable}",
           f"--db={tmp_path / 'autotune.db'}", "--poll-s=0.5", "--filter=fp32",
           f"--known-hosts={tmp_path / 'known_hosts'}", "--max-dist=1", "--tail-cap=2", *args]
    return cmd, env


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd, env = _cmd(tmp_path, *args)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _events(tmp_path: Path, gpu: str) -> list[str]:
    f = tmp_path / "cloud" / gpu / "events"
    return f.read_text().split("\n")[:-1] if f.exists() else []


@pytest.mark.slow
def test_rented_box_runs_and_is_released(tmp_path: Path) -> None:
    r = _run(tmp_path, "--gpu=h100", "--budget-s=60", "-k", "cross and softmax")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert _events(tmp_path, "h100") == ["up NVIDIA H100 80GB", "down"]
    assert not list((tmp_path / "state" / "leases").glob("*.json"))
    db = sqlite3.connect(tmp_path / "autotune.db")
    assert db.execute("select distinct gpu, regime from node").fetchall() == [
        ("NVIDIA H100 80GB", "interpret")]


@pytest.mark.slow
def test_rented_box_is_released_after_a_failure_and_kept_on_request(tmp_path: Path) -> None:
    r = _run(tmp_path, "--gpu=l40s", "--budget-s=20", "-k", "cross and softmax",
             "--box-python=/nonexistent/python3")
    assert r.returncode != 0
    assert "--box-python=/nonexistent/python3 on " in r.stdout
    assert "cannot import torch and triton" in r.stdout
    assert _events(tmp_path, "l40s") == ["up NVIDIA L40S", "down"]

    r = _run(tmp_path, "--gpu=l40s", "--budget-s=20", "-k", "cross and softmax", "--keep-server")
    try:
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert _events(tmp_path, "l40s")[-1] == "up NVIDIA L40S"
        assert f"release it with: {sys.executable} {FAKE} down {tmp_path / 'cloud' / 'l40s'}" in r.stdout
    finally:
        subprocess.run([sys.executable, str(FAKE), "down", str(tmp_path / "cloud" / "l40s")])


@pytest.mark.slow
def test_two_cards_at_once_under_xdist(tmp_path: Path) -> None:
    r = _run(tmp_path, "--gpu=l40s,h100", "-n", "2", "--budget-s=40", "-k", "cross and softmax")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert out.count("=== collect-node-data summary ===") == 1
    assert out.count("merged ") == 1
    db = sqlite3.connect(tmp_path / "autotune.db")
    got = dict(db.execute("select gpu, count(*) from node group by gpu").fetchall())
    assert set(got) == {"NVIDIA L40S", "NVIDIA H100 80GB"}
    for gpu in ("l40s", "h100"):
        assert _events(tmp_path, gpu)[-1] == "down"
    # one receipt lists both cards
    assert "NVIDIA L40S:" in out and "NVIDIA H100 80GB:" in out
    json.dumps(got)


@pytest.mark.slow
def test_a_gone_runs_rented_server_is_harvested_then_released(tmp_path: Path) -> None:
    """A run killed (-9) mid-job leaves its rented server and lease behind; the next session
    with this node table merges what that server measured, then releases it."""
    cmd, env = _cmd(tmp_path, "--gpu=l40s", "--budget-s=300", "--max-dist=2", "-k", "cross and matmul")
    out = (tmp_path / "a.txt").open("w")
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    box = tmp_path / "cloud" / "l40s" / "box"
    deadline = time.monotonic() + 180
    while not any(f.stat().st_size for f in box.glob("rows/bench-*/cross-matmul.jsonl")):
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "a.txt").read_text()
        time.sleep(0.2)
    first.kill()
    first.wait(30)
    (lease,) = (tmp_path / "state" / "leases").glob("*.json")
    try:
        # another session of this node table (it rents an H100 for its own job)
        r = _run(tmp_path, "--gpu=h100", "--budget-s=30", "-k", "cross and softmax")
        text = r.stdout + r.stderr
        assert r.returncode == 0, text[-4000:]
        assert _events(tmp_path, "l40s") == ["up NVIDIA L40S", "down"], text[-3000:]
        assert "released abandoned server" in text and not lease.exists()
        assert "rows that earlier runs left unmerged" in text
        (rows_file,) = box.glob("rows/bench-*/cross-matmul.jsonl")
        wrote = {json.loads(x)["point_key"] for x in rows_file.read_text().splitlines()}
        db = sqlite3.connect(tmp_path / "autotune.db")
        have = {k for (k,) in db.execute("select point_key from node where gpu = 'NVIDIA L40S'")}
        assert wrote and wrote <= have
    finally:
        subprocess.run([sys.executable, str(FAKE), "down", str(tmp_path / "cloud" / "l40s")])


def test_leases_of_other_sessions_are_left_alone_unless_their_owner_is_gone(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session releases only what it rented; another session's lease only once that
    controller is provably gone (same machine, process gone); the rest are listed."""
    from harness.owner import Owner, process_start

    state = pytester.path / "state"
    monkeypatch.setenv("EMMY_STATE_DIR", str(state))
    me = Owner.here("other-session")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    marks = pytester.path / "released"
    marks.mkdir()
    owners = {"live": {**me.__dict__, "pid": os.getpid(), "pid_start": process_start(os.getpid())},
              "gone": {**me.__dict__, "pid": dead.pid, "pid_start": "x"},
              "old-version": None}
    for name, owner in owners.items():
        Lease(provider="command", gpu="l40s", target=f"u@{name}:22", handle=name,
              release_argv=["touch", str(marks / name)], owner=owner).save(state / "leases")
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    pytester.makepyfile(test_job="""
from harness.harvest import job_property

def test_job(record_property):
    record_property(*job_property(gpu="l40s", slice="own", kind="softmax", card="NVIDIA L40S",
                                  state="done (pool exhausted)"))
""")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--db={pytester.path / 'db.sqlite'}")
    assert result.ret == 0
    assert sorted(p.name for p in marks.iterdir()) == ["gone"]
    result.stdout.fnmatch_lines(["released abandoned server u@gone:22"], consecutive=False)
    for name in ("live", "old-version"):
        result.stdout.fnmatch_lines([f"note: server u@{name}:22 was rented by another run *left "
                                     f"alone. Release it once it is done with: touch {marks / name}"],
                                    consecutive=False)


WRONG_CARD = '''
import subprocess, sys
args = sys.argv[1:]
if args[0] == "up" and args[2] == "NVIDIA L40S":  # the cloud hands out another card
    args[2] = "NVIDIA A10G"
sys.exit(subprocess.call([sys.executable, {fake!r}, *args]))
'''


@pytest.mark.slow
def test_a_box_with_another_card_is_a_usage_error_and_the_other_card_measures_on(
        tmp_path: Path) -> None:
    """Two cards under xdist, one box with another card: that card is refused in one message
    (its server given back at once, none of its jobs run or report), the other card's jobs
    run and merge, and the run ends with exit status 4."""
    wrapper = tmp_path / "wrong_cloud.py"
    wrapper.write_text(WRONG_CARD.format(fake=str(FAKE)))
    cmd, env = _cmd(tmp_path, "--gpu=l40s,h100", "-n", "2", "--budget-s=40", "-k",
                    "cross and softmax", f"--report-json={tmp_path / 'report.json'}")
    clouds = tmp_path / "cloud"
    cmd = [f"--up-cmd={sys.executable} {wrapper} up {clouds}/{{gpu}} '{{gpu_name}}'"
           if arg.startswith("--up-cmd=") else arg for arg in cmd]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, out[-4000:]
    assert out.count("--gpu=l40s wants NVIDIA L40S but box ") == 1, out[-4000:]
    assert "has NVIDIA A10G; nothing was set up or measured" in " ".join(out.split())
    assert "SKIPPED" not in out and "FAILED" not in out.replace("status: FAILED", ""), out[-4000:]
    assert "1 passed" in out.splitlines()[-1], out[-2000:]
    assert _events(tmp_path, "l40s") == ["up NVIDIA A10G", "down"]  # given back at once
    assert _events(tmp_path, "h100")[-1] == "down"
    db = sqlite3.connect(tmp_path / "autotune.db")
    assert {g for (g,) in db.execute("select distinct gpu from node")} == {"NVIDIA H100 80GB"}
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["exit_status"] == 4 and list(rep["refused"]) == ["l40s"]
    assert [(j["gpu"], j["outcome"]) for j in rep["jobs"] if j["outcome"] != "not_run"] == [
        ("h100", "passed")]
