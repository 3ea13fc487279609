"""The parts of a sweep job (harness/box/job.py) and the job itself on a fake clock: no process,
no GPU, no sleeping; time moves only when the fake worker or compile pool says so."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from harness import cards, pools
from harness.box import runner
from harness.box.job import Allotment, Durable, JobStats, Scheduler
from harness.box.runner import BoxWriteError, JobConfig, RowsWriter, Tools, run_job
from harness.cards import INTERPRET
from harness.ledger import Ledger
from harness.points import knob_distance, parse_spec


@pytest.fixture(autouse=True)
def _no_shipped(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs here measure the kind's own configurations only, unless a test is about what
    people ship (those come first, and the baselines compile in the worker)."""
    if "shipped" not in request.node.name:
        monkeypatch.setattr(pools.shipped, "configs", lambda *a: {})


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def _points(n_shapes: int = 3, per_shape: int = 5) -> list[pools.Point]:
    return [pools.Point(key=f"s{s}p{i}", gpu="H200", kind="softmax", shape_id=f"s{s}",
                        shape={"M": s}, knobs={"i": i}, spec=f"spec-{s}-{i}", slice="own")
            for s in range(n_shapes) for i in range(per_shape)]


class RecordingPool:
    workers = 2

    def __init__(self, clock: Clock | None = None, compile_s: float = 0.0) -> None:
        self.submitted: list[str] = []
        self.clock = clock
        self.compile_s = compile_s

    def submit(self, key: str, *_: Any) -> None:
        self.submitted.append(key)

    def wait(self, key: str, timeout: float) -> dict[str, Any] | None:
        if self.clock is not None:
            self.clock.advance(min(self.compile_s, timeout))
        return {"compile_s": self.compile_s} if self.compile_s <= timeout else None


# -- Scheduler ----------------------------------------------------------------------------------
def test_scheduler_hands_out_batches_of_one_shape_and_plans_ahead_into_the_pool() -> None:
    pool = RecordingPool()
    sched = Scheduler(_points(), batch=2, rng=random.Random(0), compile_pool=pool, lookahead=2)
    sid, batch = sched.next_batch()  # type: ignore[misc]
    assert {p.shape_id for p in batch} == {sid} and len(batch) == 2
    # the one handed out and two more planned: each submitted once, the first ones first
    assert len(pool.submitted) == 6 and pool.submitted[:2] == [p.key for p in batch]
    assert len(set(pool.submitted)) == 6


def test_scheduler_gives_every_point_once_and_keeps_the_ones_that_still_need_a_run() -> None:
    sched = Scheduler(_points(), batch=4, rng=random.Random(1), lookahead=1)
    done: set[str] = set()
    handed: list[str] = []
    retried = "s1p3"
    tries = 0
    while (nxt := sched.next_batch()) is not None:
        sid, batch = nxt
        for p in batch:
            handed.append(p.key)
            if p.key == retried and tries == 0:
                tries += 1  # its first attempt failed: a retry is left
            else:
                done.add(p.key)
        sched.settle(sid, batch, lambda p: p.key not in done)
    assert sorted(handed) == sorted([p.key for p in _points()] + [retried])
    assert sched.left == 0 and not sched.in_flight


def test_scheduler_draws_shapes_in_proportion_to_their_points_left() -> None:
    pts = _points(1, 90) + [pools.Point(key=f"b{i}", gpu="H200", kind="softmax", shape_id="b",
                                        shape={"M": 9}, knobs={}, spec=f"b{i}", slice="own")
                            for i in range(10)]
    firsts = [Scheduler(pts, batch=1, rng=random.Random(seed)).next_batch()[0]  # type: ignore[index]
              for seed in range(400)]
    assert 0.83 < firsts.count("s0") / len(firsts) < 0.96


# -- Allotment ----------------------------------------------------------------------------------
def test_allotment_bounds_a_point_by_its_own_timeout_or_the_budget_plus_the_grace() -> None:
    clock = Clock()
    a = Allotment(budget_s=60, started=clock(), clock=clock, point_timeout_s=30, grace_s=5)
    assert a.left_s() == 60 and not a.spent()
    assert a.call_bound(waited=10) == (20, False)  # its own bound, less the compile wait
    clock.advance(50)
    assert a.compile_wait_s() == 15  # 10 s left + the grace
    assert a.call_bound(waited=2) == (15, True)  # the budget is nearer than its own bound
    assert a.call_bound(waited=31)[0] < 0  # the compile wait ate its own bound
    clock.advance(10)
    assert a.spent() and a.elapsed_s() == 60
    unbounded = Allotment(0, clock(), clock, 30, 5)
    clock.advance(1e6)
    assert not unbounded.spent() and unbounded.call_bound(0) == (30, False)


# -- Durable ------------------------------------------------------------------------------------
class Rows:
    def __init__(self, fail: bool = False) -> None:
        self.written: list[dict[str, Any]] = []
        self.syncs = 0
        self.fail = fail

    def write(self, row: dict[str, Any]) -> None:
        if self.fail:
            raise BoxWriteError("no space left on device")
        self.written.append(row)

    def sync(self) -> None:
        self.syncs += 1

    def close(self) -> None:
        pass


def _row(key: str = "k1", status: str = "ok") -> dict[str, Any]:
    return {"point_key": key, "spec": f"spec-{key}", "status": status, "error": None}


def test_durable_marks_a_point_only_after_its_row_is_written(tmp_path: Path) -> None:
    clock = Clock()
    ledger = Ledger()
    store = Durable(Rows(fail=True), ledger, tmp_path / "l.json", clock, lambda *_: None, 10)
    with pytest.raises(BoxWriteError):
        store.record(_row(), INTERPRET)
    assert ledger.needs_run("k1", INTERPRET)
    ok = Durable(Rows(), ledger, tmp_path / "l.json", clock, lambda *_: None, 10)
    ok.record(_row(), INTERPRET)
    assert not ledger.needs_run("k1", INTERPRET) and ok.rows.written == [_row()]


def test_durable_syncs_and_saves_on_its_schedule_spaced_by_a_slow_save(tmp_path: Path) -> None:
    clock = Clock()
    saved: list[float] = []

    def save_ledger(ledger: Ledger, path: Path) -> None:
        saved.append(clock())
        clock.advance(2.0)  # a large ledger: 2 s a save

    rows = Rows()
    store = Durable(rows, Ledger(), tmp_path / "l.json", clock, save_ledger, every_s=10)
    clock.advance(9.9)
    store.tick()
    assert saved == []
    clock.advance(0.2)
    store.tick()
    assert len(saved) == 1 and rows.syncs == 1
    clock.advance(15)  # the next save is 20 x 2 s after the last, not 10 s
    store.tick()
    assert len(saved) == 1
    clock.advance(30)
    store.tick()
    assert len(saved) == 2 and store.saves == 2 and store.save_s == 4.0


# -- JobStats -----------------------------------------------------------------------------------
def test_job_stats_count_statuses_time_and_the_workers_own_account() -> None:
    s = JobStats()
    s.started_measuring(3.0)
    s.started_measuring(9.0)  # only the first counts
    s.compile_waited(0.5, compiled=True)
    s.compile_waited(1.0, compiled=False)
    res = {"status": "ok", "n_samples": 10, "value_us": 40.0, "ref_us": 60.0, "remeasured": 1,
           "phase_s": {"timed": 0.2, "warmup": 0.1}, "worker_ready_s": 4.5}
    s.worker_answered(0.7, res)
    assert "phase_s" not in res and "worker_ready_s" not in res
    s.measured(res)
    s.measured({"status": "crash"})
    out = s.summary(elapsed_s=12.345, budget_s=10, ledger_saves_s=0.25)
    assert out["benched"] == 2 and out["ok"] == 1 and out["failed"] == 1
    assert out["statuses"] == {"ok": 1, "crash": 1}
    assert out["over_budget_s"] == 2.35 and out["compiled_ahead"] == 1 and out["remeasured"] == 1
    t = out["time_s"]
    assert t["startup"] == 3.0 and t["compile_wait"] == 1.5 and t["worker"] == 0.7
    assert t["timed_kernels"] == pytest.approx(10 * 100e-6) and t["ledger_saves"] == 0.25
    assert t["worker_phases"] == {"timed": 0.2, "warmup": 0.1} and t["worker_ready"] == [4.5]


# -- the job on a fake clock --------------------------------------------------------------------
class FakeWorker:
    """Answers each point after ``point_s`` of the fake clock; ``hang`` keys never answer."""

    restarts = 0

    def __init__(self, clock: Clock, point_s: float = 1.0, hang: set[str] | None = None) -> None:
        self.clock = clock
        self.point_s = point_s
        self.hang = hang or set()
        self.calls: list[float] = []

    def start(self) -> None:
        pass

    def bench(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.calls.append(timeout_s)
        if json.dumps(req["knobs"], sort_keys=True) in self.hang:
            self.clock.advance(timeout_s)
            return {"status": "timeout", "error": "no answer"}
        self.clock.advance(self.point_s)
        return {"status": "ok", "value_us": 5.0, "ref_us": 9.0, "n_samples": 3, "variance": 0.0}

    def close(self) -> None:
        pass


def _tools(worker: Any, pool: Any = None, compile_worker: Any = None) -> Tools:
    card = cards.by_alias("h200")
    info = {"regime": INTERPRET, "cc": None, "card": card.name, "host": "here"}
    return Tools(info=info, card=card, pool=pool, worker=worker, warmup=1, iters=3, remeasure=0,
                 baseline_workers={0: compile_worker} if compile_worker else {})


def _job(tmp_path: Path, **over: Any) -> JobConfig:
    base: dict[str, Any] = dict(slice="own", kind="softmax", budget_s=10.0, batch=4, seed=1,
                                rows_path=tmp_path / "rows.jsonl",
                                ledger_path=tmp_path / "ledger.json",
                                summary_path=tmp_path / "summary.json", point_timeout_s=300.0)
    base.update(over)
    return JobConfig.make(**base)


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_job_starts_no_point_once_its_allotment_is_spent(tmp_path: Path) -> None:
    clock = Clock()
    worker = FakeWorker(clock, point_s=1.0)
    summary = run_job(_job(tmp_path, budget_s=10.0), log=open("/dev/null", "w"),  # noqa: SIM115
                      clock=clock, tools=_tools(worker), started=clock() - 2.0)
    # 2 s of the allotment went to start-up: points start at 2..9 s, none at 10 s
    assert summary["benched"] == 8 and summary["stop"] == "budget spent"
    assert summary["elapsed_s"] == 10.0 and summary["over_budget_s"] == 0.0
    rows = _read(tmp_path / "rows.jsonl")
    assert len(rows) == 8 and len({r["point_key"] for r in rows}) == 8
    assert rows[0]["provenance"]["iters"] == 3  # the tools' timing, not the job's defaults
    ledger = Ledger.load(tmp_path / "ledger.json")
    assert all(not ledger.needs_run(r["point_key"], INTERPRET) for r in rows)


def test_a_point_cut_by_the_budget_is_a_timeout_row_at_most_the_grace_late(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "BUDGET_GRACE_S", 5.0)
    clock = Clock()
    job = _job(tmp_path, budget_s=6.0, batch=1, seed=4)
    # which point comes fourth with this seed: make that one hang
    sched = Scheduler(pools.build(cards.by_alias("h200"), kinds=["softmax"]).points("own", "softmax"),
                      1, random.Random(4))
    order = [sched.next_batch()[1][0] for _ in range(4)]  # type: ignore[index]
    worker = FakeWorker(clock, point_s=1.0,
                        hang={json.dumps(order[3].knobs, sort_keys=True)})
    summary = run_job(job, log=open("/dev/null", "w"), clock=clock,  # noqa: SIM115
                      tools=_tools(worker))
    assert summary["stop"] == "budget spent" and summary["benched"] == 4
    assert worker.calls[3] == 3.0 + 5.0  # 3 s of the allotment left + the grace
    assert summary["over_budget_s"] == 5.0
    last = _read(tmp_path / "rows.jsonl")[-1]
    assert last["status"] == "timeout" and "allotment ran out" in last["error"]


def test_a_stop_request_ends_the_job_between_points_and_keeps_what_it_measured(
        tmp_path: Path) -> None:
    clock = Clock()
    worker = FakeWorker(clock)
    summary = run_job(_job(tmp_path, budget_s=0), log=open("/dev/null", "w"),  # noqa: SIM115
                      clock=clock, tools=_tools(worker), should_stop=lambda: len(worker.calls) >= 5)
    assert summary["stop"] == "stopped on request" and summary["benched"] == 5
    assert len(_read(tmp_path / "rows.jsonl")) == 5


def test_a_compile_that_outlasts_the_allotment_leaves_its_point_for_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "BUDGET_GRACE_S", 2.0)
    clock = Clock()
    worker = FakeWorker(clock)
    pool = RecordingPool(clock, compile_s=20.0)
    summary = run_job(_job(tmp_path, budget_s=5.0), log=open("/dev/null", "w"),  # noqa: SIM115
                      clock=clock, tools=_tools(worker, pool))
    assert summary["stop"] == "budget spent" and summary["benched"] == 0
    assert worker.calls == [] and summary["elapsed_s"] == 7.0  # the wait ran to the grace
    assert summary["time_s"]["compile_wait"] == 7.0 and pool.submitted


def test_a_full_disk_ends_the_job_with_an_error_and_no_mark_without_its_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    worker = FakeWorker(clock)
    real_write = RowsWriter.write
    writes = {"n": 0}

    def write(self: RowsWriter, row: dict[str, Any]) -> None:
        writes["n"] += 1
        if writes["n"] > 3:
            raise BoxWriteError("cannot write rows: No space left on device")
        real_write(self, row)

    monkeypatch.setattr(RowsWriter, "write", write)
    with pytest.raises(SystemExit, match="No space left"):
        run_job(_job(tmp_path, budget_s=0), log=open("/dev/null", "w"),  # noqa: SIM115
                clock=clock, tools=_tools(worker))
    rows = _read(tmp_path / "rows.jsonl")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(rows) == 3 and summary["benched"] == 3 and "error" in summary
    ledger = Ledger.load(tmp_path / "ledger.json")
    marked = [k for k in ledger if not ledger.needs_run(k, INTERPRET)]
    assert sorted(marked) == sorted(r["point_key"] for r in rows)


def test_anchors_and_shipped_points_come_first_and_baselines_skip_the_compile_pool(
        tmp_path: Path) -> None:
    clock = Clock()
    worker, compile_worker = FakeWorker(clock), FakeWorker(clock)
    pool = RecordingPool(clock, compile_s=0.0)
    card = cards.by_alias("h200")
    pts = pools.build(card, kinds=["matmul"]).points("own", "matmul")
    first = [p for p in pts if p.tier <= 1]  # the card's own anchors, then what people ship
    assert any(p.first for p in first) and any(not p.first for p in first)
    for sid in {p.shape_id for p in pts}:  # each shape's pool lists them first too
        of = [p for p in pts if p.shape_id == sid]
        assert of[:sum(p.tier <= 1 for p in of)] == [p for p in of if p.tier <= 1]
    summary = run_job(_job(tmp_path, kind="matmul", budget_s=0, batch=4), log=open("/dev/null", "w"),  # noqa: SIM115
                      clock=clock, tools=_tools(worker, pool, compile_worker),
                      should_stop=lambda: len(worker.calls) + len(compile_worker.calls)
                      >= len(first))
    assert summary["benched"] == len(first)
    # torch.compile's baselines ran in a worker of their own, everything else in the other
    n_compile = sum(p.knobs.get("baseline") == "compile" for p in first)
    assert n_compile and len(compile_worker.calls) == n_compile
    rows = _read(tmp_path / "rows.jsonl")
    assert {r["spec"] for r in rows} == {p.spec for p in first}
    baselines = [p.key for p in first if p.knobs.get("baseline")]
    assert baselines and not set(baselines) & set(pool.submitted)
    assert set(pool.submitted) >= {p.key for p in first if not p.knobs.get("baseline")}


def test_a_job_that_measured_every_point_says_so_even_when_the_last_ended_past_its_allotment(
        tmp_path: Path) -> None:
    """Its points all measured, a job's pool is exhausted, whatever the clock says after."""
    clock = Clock()
    everything = run_job(_job(tmp_path / "a", budget_s=1000.0), log=open("/dev/null", "w"),  # noqa: SIM115
                         clock=clock, tools=_tools(FakeWorker(clock)), started=clock())
    n = everything["benched"]
    assert everything["stop"] == "pool exhausted" and n > 1
    clock = Clock()
    # the last point starts half a second before the allotment ends and ends after it
    summary = run_job(_job(tmp_path / "b", budget_s=n - 0.5), log=open("/dev/null", "w"),  # noqa: SIM115
                      clock=clock, tools=_tools(FakeWorker(clock)), started=clock())
    assert summary["benched"] == n and summary["elapsed_s"] > n - 0.5
    assert summary["stop"] == "pool exhausted"


def test_the_cards_own_anchors_then_shipped_points_then_neighbours_then_the_rest() -> None:
    """A short sweep measures each shape's fastest configuration of earlier sweeps (the card's
    own anchors: one or two a shape), then what people ship, then the configurations one knob
    step from an anchor (and those nearest it on a kernel it does not run), before anything
    else is drawn at random."""
    card = cards.by_alias("h200")
    pool = pools.build(card, kinds=["matmul"])
    pts = pool.points("own", "matmul")
    anchors = {sp.golden.shape_id: [parse_spec(a) for a in sp.own_anchors] for sp in pool.shapes}
    # an anchor's nearest configurations on a kernel it does not run (GLUON, where pooled)
    twins = {sp.golden.shape_id: set(pools.path_twins(
        [dict(parse_spec(a)) for a in sp.own_anchors], {p.spec: p.knobs for p in sp.points},
        ("GLUON",), exclude=[p.spec for p in sp.points if p.first])) for sp in pool.shapes}
    by_tier: dict[int, set[str]] = {t: set() for t in range(4)}
    for p in pts:
        by_tier[p.tier].add(p.key)
        d = min(knob_distance(p.knobs, a) for a in anchors[p.shape_id])
        near = d == 1 or p.spec in twins[p.shape_id]
        assert p.tier == (0 if d == 0 else 1 if p.first else 2 if near else 3), (p.spec, d)
    assert all(by_tier.values())
    assert len(by_tier[0]) == sum(len(a) for a in anchors.values())
    for sid in {p.shape_id for p in pts}:  # each shape's pool lists them in that order too
        tiers = [p.tier for p in pts if p.shape_id == sid]
        assert tiers == sorted(tiers)
    sched = Scheduler(pts, batch=3, rng=random.Random(7))
    order: list[str] = []
    measured: set[str] = set()
    ahead = len(by_tier[0]) + len(by_tier[1]) + len(by_tier[2])
    while len(order) < ahead + 30:
        sid, batch = sched.next_batch()  # type: ignore[misc]
        order += [p.key for p in batch]
        measured.update(order)
        sched.settle(sid, batch, lambda p: p.key not in measured)
    start = 0
    for t in range(3):
        assert set(order[start:start + len(by_tier[t])]) == by_tier[t], t
        start += len(by_tier[t])
    assert set(order[start:]) <= by_tier[3]
    # another card's anchors and the tail are drawn at random, as before
    assert all(p.tier == 3 for p in pool.points("cross", "matmul") + pool.points("tail", "matmul"))
