"""Every GPU of a box: one measuring lane per GPU (``--box-gpus``), all fed by one job.

Without a GPU the interpreter stands in for the lanes (``--box-gpus N``: N interpreter
workers), so the lanes' sharing is tested here with real worker processes: the scheduler hands
each batch to one lane, no point is measured twice, a lane whose worker dies goes on alone,
rows say their lane, and a whole collection run merges every point once.  The sharing itself
is also tested with fake workers at our seam (``Tools``), and the choice of GPUs with a
listing as ``nvidia-smi`` writes it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness import cards, pools
from harness.box.job import Durable, Scheduler
from harness.box.probe import (
    Lane,
    check_lanes_card,
    cpu_lanes,
    gpu_lanes,
    list_gpus,
)
from harness.box.runner import BoxWriteError, JobConfig, RowsWriter, Tools, run_job
from harness.cards import INTERPRET, INTERPRETER
from harness.contract import LaneError, parse_box_gpus
from harness.ledger import Ledger
from tests.runs import Run, box_rows, db_points

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("ok", "bench_fail")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _null() -> Any:
    return open(os.devnull, "w")  # noqa: SIM115 - the job's log, closed with the process


# -- which GPUs: the option's syntax, the box's GPUs, their card ---------------------------------
@pytest.mark.parametrize(("value", "want"), [
    ("all", "all"), ("ALL", "all"), ("1", 1), ("4", 4), ("0,2,3", (0, 2, 3)), ("3,", (3,)),
    (" 1 , 0 ", (1, 0))])
def test_box_gpus_values(value: str, want: Any) -> None:
    assert parse_box_gpus(value) == want


@pytest.mark.parametrize(("value", "message"), [
    ("0", r"--box-gpus=0: not a number of GPUs; give all \(every GPU of the box\), N"),
    ("-1", r"--box-gpus=-1: not a number of GPUs"),
    ("two", r"--box-gpus=two: not a number of GPUs"),
    ("", r"--box-gpus=: not a number of GPUs"),
    ("0,x", r"--box-gpus=0,x: x is not a GPU index; give all"),
    ("0,,1", r"--box-gpus=0,,1: an empty entry is not a GPU index"),
    ("1,1", r"--box-gpus=1,1 names GPU 1 more than once; name each GPU once")])
def test_a_bad_box_gpus_says_what_is_valid(value: str, message: str) -> None:
    with pytest.raises(LaneError, match=message):
        parse_box_gpus(value)


H200 = "NVIDIA H200"
LISTED = [(0, H200, "GPU-aaaa"), (1, H200, "GPU-bbbb"), (2, H200, "GPU-cccc"),
          (3, "NVIDIA A100-SXM4-80GB", "GPU-dddd")]


def test_lanes_are_the_gpus_asked_for_each_pinned_by_its_uuid() -> None:
    lanes = gpu_lanes(parse_box_gpus("2"), LISTED)
    assert [(lane.index, lane.gpu_index, lane.gpu_uuid) for lane in lanes] == [
        (0, 0, "GPU-aaaa"), (1, 1, "GPU-bbbb")]
    assert lanes[1].env() == {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}
    picked = gpu_lanes(parse_box_gpus("2,0"), LISTED)
    assert [(lane.index, lane.gpu_index) for lane in picked] == [(0, 2), (1, 0)]
    assert len(gpu_lanes("all", LISTED)) == 4
    # one lane is the box's default device, pinned to nothing, as before lanes existed
    assert gpu_lanes(1, LISTED) == (Lane(0),) and Lane(0).env() == {}
    assert Lane(0, 5).env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "5"}


@pytest.mark.parametrize(("value", "message"), [
    ("5", r"--box-gpus=5: this box has 4 GPU\(s\) \(0, 1, 2, 3\); give at most --box-gpus=4"),
    ("0,7", r"--box-gpus=0,7: no GPU 7 on this box; its GPUs are 0, 1, 2, 3")])
def test_gpus_the_box_has_not_are_refused(value: str, message: str) -> None:
    with pytest.raises(LaneError, match=message):
        gpu_lanes(parse_box_gpus(value), LISTED)
    with pytest.raises(LaneError, match=r"--box-gpus=2: nvidia-smi lists no GPU on this box"):
        gpu_lanes(2, [])


def test_a_lane_on_another_card_is_refused_naming_the_gpus_of_the_box_card() -> None:
    h200 = cards.canonicalize(H200)
    assert h200 is not None
    check_lanes_card(gpu_lanes(parse_box_gpus("0,1,2"), LISTED), h200)
    with pytest.raises(LaneError, match=r"--box-gpus: GPU 3 is NVIDIA A100-SXM4-80GB, not the "
                                        r"box's card NVIDIA H200 141GB; one box measures one "
                                        r"card: name the GPUs of that card, e.g. "
                                        r"--box-gpus=0,1,2$"):
        check_lanes_card(gpu_lanes("all", LISTED), h200)


def test_the_cpu_stands_in_for_gpus_with_interpreter_lanes() -> None:
    assert cpu_lanes(parse_box_gpus("3")) == (Lane(0), Lane(1), Lane(2))
    assert cpu_lanes("all") == (Lane(0),)
    with pytest.raises(LaneError, match=r"--box-gpus=0,1 names GPU indices, but this box "
                                        r"measures on the CPU .* e.g. --box-gpus=2"):
        cpu_lanes(parse_box_gpus("0,1"))


def test_the_gpus_are_read_from_nvidia_smi_as_it_writes_them() -> None:
    out = "0, NVIDIA H200, GPU-aaaa\n1, NVIDIA H200, GPU-bbbb\n"

    def smi(argv: list[str], **_: Any) -> Any:
        assert argv == ["nvidia-smi", "--query-gpu=index,name,uuid",
                        "--format=csv,noheader,nounits"]
        return SimpleNamespace(returncode=0, stdout=out)

    assert list_gpus(smi) == [(0, H200, "GPU-aaaa"), (1, H200, "GPU-bbbb")]
    assert list_gpus(lambda *a, **k: SimpleNamespace(returncode=9, stdout="")) == []

    def absent(*_: Any, **__: Any) -> Any:
        raise FileNotFoundError("nvidia-smi")

    assert list_gpus(absent) == []


# -- the shared parts under several threads -----------------------------------------------------
def _h200_points(n_shapes: int = 4, per_shape: int = 12) -> list[pools.Point]:
    return [pools.Point(key=f"s{s}p{i}", gpu="H200", kind="softmax", shape_id=f"s{s}",
                        shape={"M": s}, knobs={"i": i}, spec=f"spec-{s}-{i}", slice="own")
            for s in range(n_shapes) for i in range(per_shape)]


def test_the_scheduler_hands_each_point_to_one_lane(tmp_path: Path) -> None:
    sched = Scheduler(_h200_points(), batch=3, rng=random.Random(0), lookahead=2)
    done: set[str] = set()
    handed: list[str] = []
    lock = threading.Lock()

    def lane() -> None:
        while (planned := sched.next_batch()) is not None:
            sid, batch = planned
            time.sleep(0.001)
            with lock:
                handed.extend(p.key for p in batch)
                done.update(p.key for p in batch)
            sched.settle(sid, batch, lambda p: p.key not in done)

    threads = [threading.Thread(target=lane) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(handed) == sorted(p.key for p in _h200_points())
    assert sched.left == 0 and not sched.in_flight


def test_rows_written_by_many_lanes_stay_whole_lines_and_match_the_marks(tmp_path: Path) -> None:
    ledger = Ledger()
    store = Durable(RowsWriter(tmp_path / "rows.jsonl"), ledger, tmp_path / "ledger.json",
                    time.monotonic, lambda led, path: led.save(path), every_s=0.0)
    pad = "x" * 20_000  # rows longer than a pipe's atomic write

    def lane(n: int) -> None:
        for i in range(60):
            store.record({"point_key": f"l{n}p{i}", "spec": f"s{n}-{i}", "status": "ok",
                          "error": None, "pad": pad}, INTERPRET)
            store.tick()

    threads = [threading.Thread(target=lane, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    store.save()
    store.close()
    rows = _rows(tmp_path / "rows.jsonl")  # every line parses
    assert len(rows) == 240 and len({r["point_key"] for r in rows}) == 240
    saved = Ledger.load(tmp_path / "ledger.json")
    assert {k for k in saved if not saved.needs_run(k, INTERPRET)} == {r["point_key"] for r in rows}


# -- a job on two fake lanes --------------------------------------------------------------------
class LaneWorker:
    """A fake bench worker of one lane: answers after a few real milliseconds; ``crash_once``
    keys crash the first time any lane measures them."""

    restarts = 0

    def __init__(self, crash_once: set[str] | None = None, lock: Any = None) -> None:
        self.keys: list[str] = []
        self.crash_once = crash_once if crash_once is not None else set()
        self.lock = lock or threading.Lock()

    def start(self) -> None:
        pass

    def bench(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        key = json.dumps(req["knobs"], sort_keys=True) + json.dumps(req["shape"], sort_keys=True)
        self.keys.append(key)
        time.sleep(0.004)
        with self.lock:
            if key in self.crash_once:
                self.crash_once.discard(key)
                return {"status": "crash", "error": "bench worker died while benching this point"}
        return {"status": "ok", "value_us": 5.0, "ref_us": 9.0, "n_samples": 3, "variance": 0.0}

    def close(self) -> None:
        pass


def _fake_tools(workers: list[LaneWorker]) -> Tools:
    card = cards.by_alias("h200")
    info = {"regime": INTERPRET, "cc": None, "card": card.name, "host": "here"}
    lanes = tuple(Lane(i, i, f"GPU-{i}", card.name) for i in range(len(workers)))
    return Tools(info=info, card=card, pool=None, worker=workers[0], warmup=1, iters=3,
                 remeasure=0, lanes=lanes, lane_workers=list(workers[1:]))


def _fake_job(tmp_path: Path, **over: Any) -> JobConfig:
    base: dict[str, Any] = dict(slice="own", kind="softmax", budget_s=0, batch=3, seed=2,
                                rows_path=tmp_path / "rows.jsonl",
                                ledger_path=tmp_path / "ledger.json",
                                summary_path=tmp_path / "summary.json", filter="llama3-8b",
                                baselines="none")
    base.update(over)
    return JobConfig.make(**base)


def _pool(cfg: JobConfig, card: cards.Card) -> list[pools.Point]:
    return pools.build(card, kinds=[cfg.kind], filter=cfg.sweep.filter,
                       max_dist=cfg.sweep.max_dist, tail_cap=cfg.sweep.tail_cap,
                       baselines=()).points(cfg.slice, cfg.kind)


def test_two_lanes_share_one_job_and_measure_every_point_once(tmp_path: Path) -> None:
    workers = [LaneWorker(), LaneWorker()]
    cfg = _fake_job(tmp_path)
    told: list[dict[str, Any]] = []  # the session's live account: every row, once written
    summary = run_job(cfg, log=_null(), tools=_fake_tools(workers), on_row=told.append)
    points = _pool(cfg, cards.by_alias("h200"))
    rows = _rows(tmp_path / "rows.jsonl")
    assert sorted(r["point_key"] for r in told) == sorted(r["point_key"] for r in rows)
    assert summary["stop"] == "pool exhausted" and summary["points_done"] == len(points)
    assert sorted(r["point_key"] for r in rows) == sorted(p.key for p in points)
    by_lane = Counter(r["provenance"]["lane"] for r in rows)
    assert by_lane[0] > 0 and by_lane[1] > 0 and by_lane[0] + by_lane[1] == len(points)
    assert {r["provenance"]["gpu_uuid"] for r in rows if r["provenance"]["lane"] == 1} == {"GPU-1"}
    assert {r["gpu"] for r in rows} == {"NVIDIA H200 141GB"}  # one card, whichever GPU
    assert [len(w.keys) for w in workers] == [by_lane[0], by_lane[1]]
    assert summary["lanes"] == 2 and summary["lane_benched"] == [by_lane[0], by_lane[1]]
    assert summary["benched"] == len(points) and summary["ok"] == len(points)
    ledger = Ledger.load(tmp_path / "ledger.json")
    assert {k for k in ledger if not ledger.needs_run(k, INTERPRET)} == {r["point_key"] for r in rows}


def test_a_crash_on_one_lane_is_measured_again_and_no_point_twice(tmp_path: Path) -> None:
    cfg = _fake_job(tmp_path, seed=5)
    points = _pool(cfg, cards.by_alias("h200"))
    crash = {json.dumps(p.knobs, sort_keys=True) + json.dumps(p.shape, sort_keys=True)
             for p in random.Random(1).sample(points, 4)}
    lock = threading.Lock()
    workers = [LaneWorker(crash, lock), LaneWorker(crash, lock)]
    summary = run_job(cfg, log=_null(), tools=_fake_tools(workers))
    rows = _rows(tmp_path / "rows.jsonl")
    terminal = Counter(r["point_key"] for r in rows if r["status"] in TERMINAL)
    assert sorted(terminal) == sorted(p.key for p in points) and set(terminal.values()) == {1}
    assert Counter(r["status"] for r in rows) == {"ok": len(points), "crash": 4}
    assert summary["stop"] == "pool exhausted" and summary["benched"] == len(points) + 4


def test_a_stop_request_ends_every_lane_between_points(tmp_path: Path) -> None:
    workers = [LaneWorker(), LaneWorker()]
    summary = run_job(_fake_job(tmp_path), log=_null(), tools=_fake_tools(workers),
                      should_stop=lambda: len(workers[0].keys) + len(workers[1].keys) >= 10)
    rows = _rows(tmp_path / "rows.jsonl")
    assert summary["stop"] == "stopped on request"
    assert 10 <= len(rows) <= 11 and len({r["point_key"] for r in rows}) == len(rows)


def test_a_lane_that_cannot_write_its_row_ends_the_job_and_every_lane_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = RowsWriter.write
    writes = {"n": 0}

    def write(self: RowsWriter, row: dict[str, Any]) -> None:
        writes["n"] += 1
        if writes["n"] > 5:
            raise BoxWriteError("cannot write rows: No space left on device")
        real_write(self, row)

    monkeypatch.setattr(RowsWriter, "write", write)
    workers = [LaneWorker(), LaneWorker()]
    with pytest.raises(SystemExit, match="No space left"):
        run_job(_fake_job(tmp_path), log=_null(), tools=_fake_tools(workers))
    assert not [t for t in threading.enumerate() if t.name.startswith("lane-")]
    rows = _rows(tmp_path / "rows.jsonl")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(rows) == 5 and summary["benched"] == 5 and "error" in summary
    ledger = Ledger.load(tmp_path / "ledger.json")
    assert {k for k in ledger if not ledger.needs_run(k, INTERPRET)} == {r["point_key"] for r in rows}


# -- real interpreter workers, one per lane ---------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _torch_imported() -> None:
    """The job's probe imports torch: once here, so the jobs below time the job."""
    import torch  # noqa: F401


def _interp_job(tmp_path: Path, **over: Any) -> JobConfig:
    base: dict[str, Any] = dict(slice="own", kind="rms_norm", budget_s=0, batch=2, seed=1,
                                rows_path=tmp_path / "rows.jsonl",
                                ledger_path=tmp_path / "ledger.json",
                                summary_path=tmp_path / "summary.json", compile_workers=0,
                                box_gpus="2")
    base.update(over)
    return JobConfig.make(**base)


@pytest.fixture
def interpret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("EMMY_FORCE_INTERPRET", "1")


def test_a_job_on_two_interpreter_lanes_measures_every_point_once(
        tmp_path: Path, interpret_env: None) -> None:
    cfg = _interp_job(tmp_path)
    summary = run_job(cfg, log=_null())
    points = _pool(cfg, INTERPRETER)
    rows = _rows(tmp_path / "rows.jsonl")
    assert sorted(r["point_key"] for r in rows) == sorted(p.key for p in points)
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    lanes = Counter(r["provenance"]["lane"] for r in rows)
    assert set(lanes) == {0, 1}, lanes
    assert all(r["provenance"]["gpu_uuid"] is None and r["gpu"] == INTERPRETER.name
               and r["regime"] == INTERPRET for r in rows)
    assert summary["lanes"] == 2 and summary["lane_benched"] == [lanes[0], lanes[1]]
    assert (tmp_path / "worker.log").exists() and (tmp_path / "worker-lane1.log").exists()


def test_a_lane_whose_worker_is_killed_goes_on_and_nothing_is_lost(
        tmp_path: Path, interpret_env: None) -> None:
    cfg = _interp_job(tmp_path, kind="matmul", batch=3)
    tools = Tools.start(cfg.tools, cfg.sweep.seed, tmp_path / "worker.log")
    out: dict[str, Any] = {}
    job = threading.Thread(target=lambda: out.update(run_job(cfg, log=_null(), tools=tools)))
    killed = None
    try:
        job.start()
        victim = tools.lane_workers[0]
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and job.is_alive():
            rows = _rows(cfg.rows_path) if cfg.rows_path.exists() else []
            if any(r["provenance"]["lane"] == 1 for r in rows) and victim.pid:
                killed = victim.pid
                os.kill(killed, signal.SIGKILL)  # mid-point, or between two
            time.sleep(0.02)
        job.join(180)
        assert victim.pid != killed
        assert killed is not None, "lane 1 measured nothing before the job ended"
        assert not job.is_alive() and out, "the job did not end"
    finally:
        tools.close()
    points = _pool(cfg, INTERPRETER)
    rows = _rows(cfg.rows_path)
    terminal = Counter(r["point_key"] for r in rows if r["status"] in TERMINAL)
    assert sorted(terminal) == sorted(p.key for p in points) and set(terminal.values()) == {1}
    crashes = [r for r in rows if r["status"] == "crash"]
    assert len(crashes) <= 1 and all(r["provenance"]["lane"] == 1 for r in crashes)
    assert len(rows) == len(points) + len(crashes)
    after = Counter(r["provenance"]["lane"] for r in rows)
    assert after[0] > 0 and after[1] > 0
    assert out["stop"] == "pool exhausted" and out["points_done"] == len(points)
    assert out["worker_restarts"] == len(crashes)  # a death seen mid-point is counted


def test_the_box_cli_refuses_gpu_indices_on_a_cpu_box(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_"))}
    env["EMMY_FORCE_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, "-m", "harness.box", "run", "--slice", "own", "--kind",
                        "rms_norm", "--budget-s", "5", "--rows", str(tmp_path / "r.jsonl"),
                        "--ledger", str(tmp_path / "l.json"), "--box-gpus", "0,1"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: --box-gpus=0,1 names GPU indices, but this box measures on the CPU" in r.stderr
    assert not (tmp_path / "r.jsonl").exists()
    bad = subprocess.run([sys.executable, "-m", "harness.box", "run", "--slice", "own", "--kind",
                          "rms_norm", "--budget-s", "5", "--rows", str(tmp_path / "r.jsonl"),
                          "--ledger", str(tmp_path / "l.json"), "--box-gpus", "0"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "error: --box-gpus=0: not a number of GPUs" in bad.stderr


# -- the option on the controller, and a whole run ---------------------------------------------

@pytest.mark.parametrize(("value", "message"), [
    ("0", r"--box-gpus=0: not a number of GPUs; give all \(every GPU of the box\), N \(the first N"),
    ("1,1", r"--box-gpus=1,1 names GPU 1 more than once"),
    ("gpu0", r"--box-gpus=gpu0: not a number of GPUs")])
def test_a_bad_box_gpus_is_a_usage_error_before_anything_starts(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str,
        message: str) -> None:
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    shutil.copytree(ROOT / "collect_tests", pytester.path / "collect_tests")
    monkeypatch.setenv("EMMY_STATE_DIR", str(pytester.path / "state"))
    tmp = pytester.path
    result = pytester.runpytest("collect_tests", "-p", "no:cacheprovider", "-k", "own and softmax",
                                "--budget-s=5", f"--db={tmp / 'db' / 'autotune.db'}",
                                f"--box-dir={tmp / 'box'}", f"--box-gpus={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:]
    result.stderr.re_match_lines([f".*{message}.*"])
    assert not (tmp / "box").exists() and not (tmp / "db").exists()
    assert not (tmp / "state").exists()


@pytest.fixture
def tmux_socket():
    name = f"emmy-lanes-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


@pytest.mark.slow
def test_a_collection_run_on_two_lanes_merges_every_point_once(tmp_path: Path,
                                                                tmux_socket: str) -> None:
    run = Run(tmp_path, tmux_socket, "-k", "own and rms_norm", "--budget-s=120", "--batch=2",
              "--box-gpus=2")
    rc, out = run.finish()
    assert rc == 0, out[-3000:]
    assert "status: COMPLETE (sweep done + merge done)" in out, out[-3000:]
    written = box_rows(run.box)
    n = len(_pool(_interp_job(tmp_path), INTERPRETER))
    assert len(written) == n and len({r["point_key"] for r in written}) == n
    assert {r["provenance"]["lane"] for r in written} == {0, 1}
    assert f"merged {n} node rows ({n} new, 0 replaced, 0 kept, 0 duplicate)" in out
    in_db = db_points(run.db)
    assert sorted(k for k, _, _ in in_db) == sorted(r["point_key"] for r in written)
    assert out.count("merged ") == out.count(f"merged {n} node rows")  # merged once
    status = json.loads(next((run.box / "service").glob("*/status.json")).read_text())
    assert status["lanes"] == 2 and status["state"] == "done"
