"""Rented servers: the command provider against local sshd boxes, SkyPilot at our seam."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_cloud.py"


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
def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["EMMY_STATE_DIR"] = str(tmp_path / "state")
    clouds = tmp_path / "cloud"
    cmd = [sys.executable, "-m", "pytest", "collect_tests", "-p", "no:cacheprovider",
           "--provider=command", f"--up-cmd={sys.executable} {FAKE} up {clouds}/{{gpu}} '{{gpu_name}}'",
           f"--down-cmd={sys.executable} {FAKE} down {{handle}}", f"--box-python={sys.executable}",
           f"--db={tmp_path / 'autotune.db'}", "--poll-s=0.5", "--filter=fp32",
           "--max-dist=1", "--tail-cap=2", *args]
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
