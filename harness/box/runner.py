"""The sweep job: bench batches of one slice × kind until its allotment or pool is spent.

Lifecycle: probe the card → build the pool → drop points the ledger says are done → loop
{draw a shape ∝ its remaining points, draw up to ``--batch`` points of it, bench them in the
worker, append their rows, mark the ledger} → summary line + summary file.  The rows file is
synced and the ledger saved every ``LEDGER_SAVE_S`` or so and at the end (never a mark before
its row is durable): a job killed between saves measures at most those seconds' points again.
The coming batches are drawn ahead and compile in a process pool on the box's CPU cores while
the GPU measures.  The budget is checked before each point, and a point's time bound never
reaches more than ``BUDGET_GRACE_S`` past the allotment, so a job ends within about that of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import kinds as registry
from harness import pools, shipped
from harness.box.job import Allotment, Durable, JobStats, Scheduler
from harness.box.probe import (
    FORCE_INTERPRET_ENV,
    ONE_LANE,
    Lane,
    check_lanes_card,
    cpu_lanes,
    gpu_lanes,
    list_gpus,
    probe,
)
from harness.cards import DEPLOYABLE, INTERPRET, card_from_probe
from harness.contract import (
    BUDGET_GRACE_S,
    SweepOptions,
    ToolsSpec,
    new_run_id,
    parse_baselines,
    parse_box_gpus,
)
from harness.ledger import Ledger
from harness.shipped import is_baseline


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Worker:
    """The bench worker process; restarted when it dies or hangs."""

    def __init__(self, regime: str, warmup: int, iters: int, seed: int, log_path: Path,
                 max_cv: float = ToolsSpec.max_cv, remeasure: int = ToolsSpec.remeasure,
                 env: dict[str, str] | None = None) -> None:
        self.regime = regime
        self.env = dict(env or {})  # over the box's environment: a lane's GPU (Lane.env)
        self.args = [sys.executable, "-m", "harness.box", "worker", "--warmup", str(warmup),
                     "--iters", str(iters), "--seed", str(seed), "--max-cv", str(max_cv),
                     "--remeasure", str(remeasure),
                     "--device", "cpu" if regime == INTERPRET else "cuda"]
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.restarts = 0
        self._served = 0

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, **self.env}
        if self.regime == INTERPRET:
            env["TRITON_INTERPRET"] = "1"
        log = open(self.log_path, "a")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True, env=env, bufsize=1)
        self._served = 0  # points handed to this process
        log.close()
        return self.proc

    def sibling(self, log_path: Path, env: dict[str, str] | None = None) -> Worker:
        """Another worker like this one (its own process, its own log), on this one's GPU or,
        given ``env``, on the GPU that environment pins it to."""
        other = Worker.__new__(Worker)
        other.regime, other.args, other.log_path = self.regime, list(self.args), log_path
        other.env = dict(self.env if env is None else env)
        other.proc, other.restarts, other._served = None, 0, 0
        return other

    @property
    def pid(self) -> int | None:
        """The worker process's id while it runs."""
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def start(self) -> None:
        """Start the worker now rather than at the first point."""
        if not (self.proc and self.proc.poll() is None):
            self._start()

    def bench(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        proc = self.proc if self.proc and self.proc.poll() is None else self._start()
        assert proc.stdin and proc.stdout
        self._served += 1
        try:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._lost("bench worker exited before the point ran")
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            self.kill()
            return {"status": "timeout", "error": f"bench worker exceeded {timeout_s:.0f}s on this point"}
        line = proc.stdout.readline()
        if not line:
            return self._lost("bench worker died while benching this point")
        res = json.loads(line)
        if proc.poll() is not None or res.get("status") == "crash":
            # the worker quits after a context-fatal error; the next point gets a fresh one
            self.kill()
        return res

    def _lost(self, what: str) -> dict[str, Any]:
        try:
            rc = self.proc.wait(timeout=10) if self.proc else None
        except subprocess.TimeoutExpired:  # still tearing down its CUDA context
            self.proc.kill()  # type: ignore[union-attr]
            rc = None
        self.proc = None
        self.restarts += 1
        return {"status": "crash", "error": f"{what} (exit {rc}); see {self.log_path.name}: "
                + _tail(self.log_path, 8)}

    def kill(self) -> None:
        """End the worker (a hung or broken one): the next point starts a fresh one."""
        if self.proc:
            self.restarts += 1
        self._end()

    def _end(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # SIGKILLed; the OS reaps it
        self.proc = None

    def close(self) -> None:
        """Let the worker finish and exit; one that was never given a point (it may still be
        starting up) is simply ended."""
        if self.proc and self.proc.poll() is None:
            if not self._served:
                self._end()
                return
            assert self.proc.stdin
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


class BoxWriteError(RuntimeError):
    """The job could not write its rows file or ledger (a full disk, an I/O error): it stops."""


class RowsWriter:
    """The job's rows file, open for appending: each row lands as one whole JSON line or not at
    all.  A write that fails midway (no space left, an I/O error) is cut back to the last whole
    line, so the file only ever holds complete rows; ``sync`` makes them durable.  The file is
    created 0600.  ``write`` is ``os.write`` unless a test hands in another."""

    def __init__(self, path: Path, write: Any = os.write) -> None:
        self.path = path
        self._write = write
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.good = os.lseek(self.fd, 0, os.SEEK_END)  # the end of the last whole line
        self.rows = 0

    def write(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        try:
            done = 0
            while done < len(line):  # a write may land only partly (a disk filling up)
                done += self._write(self.fd, line[done:])
        except OSError as exc:
            try:
                os.ftruncate(self.fd, self.good)  # never leave half a row behind
            except OSError:
                pass  # the reader skips a cut line (and says so)
            raise BoxWriteError(
                f"cannot write the rows file {self.path}: {exc.strerror or exc}; the job stopped "
                f"with the {self.rows} rows written before it kept whole in the file. Free space "
                "on the box (or fix the error) and run again: the points not written are measured "
                "then") from exc
        self.good += len(line)
        self.rows += 1

    def sync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise BoxWriteError(f"cannot sync the rows file {self.path}: {exc.strerror or exc}"
                                ) from exc

    def close(self) -> None:
        os.close(self.fd)


def _save_ledger(ledger: Ledger, path: Path) -> None:
    try:
        ledger.save(path)
    except OSError as exc:
        raise BoxWriteError(f"cannot save the ledger {path}: {exc.strerror or exc}; the points of "
                            "this batch are measured again next run") from exc


def _tail(path: Path, n: int) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@dataclass(frozen=True)
class JobConfig:
    """One job's run: its slice and kind, its allotment, where its rows, ledger and summary go,
    and the options of the contract (the worker's warmup and iters are those of :class:`Tools`,
    which lowers them on the CPU)."""

    slice: str
    kind: str
    budget_s: float
    rows_path: Path
    ledger_path: Path
    summary_path: Path | None = None
    sweep: SweepOptions = field(default_factory=SweepOptions)
    tools: ToolsSpec = field(default_factory=ToolsSpec)
    run_id: str = field(default_factory=new_run_id)

    @classmethod
    def make(cls, *, slice: str, kind: str, budget_s: float, rows_path: Path,
             ledger_path: Path, summary_path: Path | None = None, run_id: str | None = None,
             **options: Any) -> JobConfig:
        """A job with options given by name (``batch=2``, ``max_cv=0.1``, …), each going to the
        contract's value that declares it; an unknown name is an error."""
        sweep = {f.name for f in dataclasses.fields(SweepOptions)}
        tools = {f.name for f in dataclasses.fields(ToolsSpec)}
        unknown = sorted(set(options) - sweep - tools)
        if unknown:
            raise TypeError(f"unknown job option(s): {', '.join(unknown)}")
        return cls(slice=slice, kind=kind, budget_s=budget_s, rows_path=rows_path,
                   ledger_path=ledger_path, summary_path=summary_path,
                   sweep=SweepOptions(**{k: v for k, v in options.items() if k in sweep}),
                   tools=ToolsSpec(**{k: v for k, v in options.items() if k in tools}),
                   run_id=run_id or new_run_id())


def make_row(point: pools.Point, res: dict[str, Any], info: dict[str, Any],
             card_feats: dict[str, Any], shape_feats: dict[str, Any], run_id: str,
             timing: dict[str, Any],
             gpu: tuple[dict[str, Any], dict[str, Any]] | None = None, *, lane: int = 0,
             gpu_uuid: str | None = None) -> dict[str, Any]:
    """A point's row; ``timing``: the worker's warmup, iters and max_cv; ``lane`` and
    ``gpu_uuid``: the lane that measured it and its GPU (default: the probe's GPU).  ``gpu``,
    the card's name, is every lane's: their rows merge as one card's."""
    features = {**card_feats, **shape_feats, **point.knobs, **res.get("compile", {})}
    before, after = gpu or ({}, {})
    return {
        "point_key": point.key, "gpu": point.gpu, "regime": info["regime"], "kind": point.kind,
        "shape_id": point.shape_id, "shape": point.shape, "spec": point.spec,
        "knobs": point.knobs, "slice": point.slice, "status": res["status"],
        "value_us": res.get("value_us"), "ref_us": res.get("ref_us"),
        "variance": res.get("variance"), "n_samples": res.get("n_samples"),
        "error": res.get("error"), "features": features, "cc": info["cc"],
        "compile_s": res.get("compile_s"), "bench_s": res.get("bench_s"),
        "run_id": run_id, "measured_at": utc_now(),
        "provenance": {"host": info.get("host"), "device_name": info.get("device_name"),
                       "gpu_uuid": gpu_uuid or info.get("gpu_uuid"), "lane": lane,
                       **info.get("versions", {}),
                       "kernel_rev": registry.source_rev(point.kind),
                       "warmup": timing["warmup"], "iters": timing["iters"],
                       "max_cv": timing["max_cv"],
                       "cv": res.get("cv"), "remeasured": res.get("remeasured"),
                       "compiled_ahead": bool(res.get("compiled_ahead")),
                       "first_launch_s": res.get("first_launch_s"),
                       "guard_us": res.get("guard_us"),
                       "sm_mhz": [before.get("sm_mhz"), after.get("sm_mhz")],
                       "temp_c": [before.get("temp_c"), after.get("temp_c")]},
    }


def gpu_likely() -> bool:
    """A cheap guess, before the probe, that this box will measure on a GPU: an NVIDIA device
    node and no request for the interpreter.  Only what starts early depends on it."""
    return (not os.environ.get(FORCE_INTERPRET_ENV) and not os.environ.get("TRITON_INTERPRET")
            and Path("/dev/nvidiactl").exists())


def _pool_target() -> tuple[str, int, int] | None:
    """What the compile pool compiles for, from NVML (no CUDA context); None: Triton asks."""
    from harness.box.gpustate import compute_capability

    if os.environ.get("EMMY_POOL_ASKS_CUDA"):  # the escape hatch: let Triton ask the GPU
        return None
    cc = compute_capability()
    return ("cuda", cc, 32) if cc else None


@dataclass
class Tools:
    """What jobs measure with: the probe of the box, the compile pool and the bench workers,
    one per measuring lane (``--box-gpus``: one lane per GPU, each worker pinned to its GPU;
    the interpreter stands in for them on a box without a GPU).

    A job started alone (``python -m harness.box run``) makes its own and closes them at its
    end; the box service (:mod:`harness.box.service`) makes them once and keeps them warm for
    every job of the session.  Where the box likely has a GPU, the pool (warming up) and the
    workers (starting torch and CUDA) start before the probe, in parallel with it."""

    info: dict[str, Any]
    card: Any
    pool: Any
    worker: Worker  # lane 0's
    warmup: int
    iters: int
    remeasure: int
    owns_pool: bool = False
    lanes: tuple[Lane, ...] = ONE_LANE
    lane_workers: list[Any] = field(default_factory=list)  # lanes 1, 2, …
    # lane → torch.compile's own worker on that lane's GPU, made at its first point
    baseline_workers: dict[int, Any] = field(default_factory=dict)

    @property
    def workers(self) -> list[Any]:
        """Every lane's bench worker, lane 0's first."""
        return [self.worker, *self.lane_workers]

    def worker_for(self, knobs: Any, lane: int = 0) -> Any:
        """The bench worker for a point on a lane.  torch.compile's baselines run in a worker
        of their own, on the lane's GPU: Inductor changes the process it compiles in (its
        environment, compile threads, Triton's cache folder), and the worker that times the
        Triton kernels must not see it (in one process, every later kernel's first launch
        compiled again)."""
        worker = self.worker if lane == 0 else self.lane_workers[lane - 1]
        if knobs.get(shipped.BASELINE_KNOB) != "compile":
            return worker
        if lane not in self.baseline_workers:
            log = getattr(worker, "log_path", None)
            name = "worker-compile.log" if lane == 0 else f"worker-compile-lane{lane}.log"
            self.baseline_workers[lane] = worker.sibling(log.with_name(name) if log
                                                         else Path(name))
        return self.baseline_workers[lane]

    @classmethod
    def start(cls, spec: ToolsSpec, seed: int, worker_log: Path,
              compile_pool: Any = None) -> Tools:
        """The tools ``spec`` asks for (``seed``: of the workers' inputs); a ``--box-gpus`` this
        box cannot give (too many GPUs, an index it has not, a GPU of another card) raises
        :class:`~harness.contract.LaneError` before anything is measured."""
        from harness.box.compiler import CompilePool, default_workers

        want = parse_box_gpus(spec.box_gpus)
        n_pool = default_workers() if spec.compile_workers is None else spec.compile_workers
        pool, workers, made = compile_pool, [], False  # made: started early, here
        lanes: tuple[Lane, ...] | None = None
        if compile_pool is None and gpu_likely():
            lanes = gpu_lanes(want, list_gpus() if want != 1 else [])
            pool = CompilePool(n_pool, target=_pool_target()) if n_pool > 0 else None
            made = pool is not None
            if pool is not None:
                pool.warm()
            workers = [Worker(DEPLOYABLE, spec.warmup, spec.iters, seed,
                              _lane_log(worker_log, lane), max_cv=spec.max_cv,
                              remeasure=spec.remeasure, env=lane.env()) for lane in lanes]
            for w in workers:
                w.start()
        try:
            info = probe()
            card = card_from_probe(info)
            if info["regime"] == INTERPRET:
                lanes = cpu_lanes(want)
            elif lanes is None:
                lanes = gpu_lanes(want, list_gpus() if want != 1 else [])
            check_lanes_card(lanes, card)
        except BaseException:
            _close_early(pool if made else None, workers)
            raise
        regime = info["regime"]
        if regime == INTERPRET:  # CPU timings: few calls, not worth timing again
            warmup, iters, remeasure = 1, 3, 0
            if made or workers:  # started early for a GPU the probe did not find
                _close_early(pool if made else None, workers)
                pool, workers, made = None, [], False
        else:
            warmup, iters, remeasure = spec.warmup, spec.iters, spec.remeasure
            if pool is None and compile_pool is None and n_pool > 0:
                pool, made = CompilePool(n_pool, target=_pool_target()), True
        if not workers:
            workers = [Worker(regime, warmup, iters, seed, _lane_log(worker_log, lane),
                              max_cv=spec.max_cv, remeasure=remeasure, env=lane.env())
                       for lane in lanes]
        # tools started for one job close their pool with the job, one handed in too
        return cls(info=info, card=card, pool=pool, worker=workers[0], warmup=warmup,
                   iters=iters, remeasure=remeasure, owns_pool=pool is not None, lanes=lanes,
                   lane_workers=workers[1:])

    @property
    def regime(self) -> str:
        return str(self.info["regime"])

    def close(self) -> None:
        for w in (*self.workers, *self.baseline_workers.values()):
            w.close()
        if self.owns_pool and self.pool is not None:
            self.pool.close()


def _lane_log(worker_log: Path, lane: Lane) -> Path:
    """Lane 0's worker logs to ``worker.log``, lane N's to ``worker-laneN.log``."""
    if lane.index == 0:
        return worker_log
    return worker_log.with_name(f"{worker_log.stem}-lane{lane.index}{worker_log.suffix}")


def _close_early(pool: Any, workers: list[Any]) -> None:
    if pool is not None:
        pool.close()
    for worker in workers:
        worker.close()


# The rows file is synced and the ledger saved at least this often (seconds), and at the end.
LEDGER_SAVE_S = 10.0


# Where a job's compiles of the coming job start: when its own are all planned, or this many
# seconds before its allotment ends (the next job's first batches then compile meanwhile).
PREFETCH_S = 5.0


def lookahead(n_compile: int, batch: int, n_lanes: int) -> int:
    """Batches planned beyond the one a lane measures: enough to keep ``n_compile`` pool
    processes busy twice over, and each lane's next batch compiling while it measures one."""
    return -(-2 * n_compile // max(1, batch)) + n_lanes - 1 if n_compile else 0


def job_points(tools: Tools, cfg: JobConfig) -> list[pools.Point]:
    """Every point of the job's slice and kind on the box's card."""
    s = cfg.sweep
    return pools.build(tools.card, kinds=[cfg.kind], filter=s.filter, max_dist=s.max_dist,
                       tail_cap=s.tail_cap, baselines=parse_baselines(s.baselines)
                       ).points(cfg.slice, cfg.kind)


def run_job(cfg: JobConfig, log: Any = sys.stdout, clock: Any = time.monotonic,
            compile_pool: Any = None, *, tools: Tools | None = None,
            started: float | None = None, should_stop: Any = None,
            points: list[pools.Point] | None = None, ledger: Ledger | None = None,
            scheduler: Scheduler | None = None, prefetch: Any = None,
            on_row: Any = None) -> dict[str, Any]:
    """Run one job to its budget or the end of its pool; returns (and writes) the summary.

    The coming batches are drawn ahead and compile in a process pool (``compiler.CompilePool``)
    while the bench worker measures the current one.  Each point's bound is the smaller of
    ``point_timeout_s`` (compile wait and worker call together) and what is left of the budget
    plus ``BUDGET_GRACE_S``.  A point the worker was running at that bound is a ``timeout`` row
    (an attempt); one still waiting for its compile when the budget ran out has no row and is
    measured next run.  When its rows file or ledger cannot be written (a full disk), the job
    stops, keeps the whole rows already written, writes the summary with an ``error`` and
    exits with status 1.

    ``tools`` are the box service's (kept warm across jobs; else the job makes and closes its
    own); ``started`` is when the job's time began on ``clock`` (default: now); ``should_stop``
    is asked before every point (the service's stop request).  The session hands in what it
    made once: the job's ``points``, the run's ``ledger`` and a ``scheduler`` whose first
    batches already compile; ``prefetch`` is called once when the job's own compiles are all
    planned or its allotment nearly spent (the session starts the next job's compiles);
    ``on_row`` is handed each row once it is written (the session's live account of the job).
    ``compile_pool`` is a test seam.  The parts (scheduler, allotment, durability, statistics)
    are in :mod:`harness.box.job`."""
    time_ = Allotment(cfg.budget_s, clock() if started is None else started, clock,
                      cfg.sweep.point_timeout_s, BUDGET_GRACE_S)
    cfg.rows_path.parent.mkdir(parents=True, exist_ok=True)
    own_tools = tools is None
    if tools is None:
        tools = Tools.start(cfg.tools, cfg.sweep.seed, cfg.rows_path.parent / "worker.log",
                            compile_pool)
    try:
        if ledger is None:
            ledger = Ledger.load(cfg.ledger_path)
        if points is None:
            points = job_points(tools, cfg)
    except BaseException:
        if own_tools:
            tools.close()
        raise
    book = ledger
    regime = tools.regime
    pool = tools.pool
    n_compile = pool.workers if pool is not None else 0

    def needs_run(p: pools.Point) -> bool:
        return book.needs_run(p.key, regime, cfg.sweep.max_attempts)

    n_lanes = len(tools.lanes)
    sched = scheduler or Scheduler([p for p in points if needs_run(p)], cfg.sweep.batch,
                                   random.Random(cfg.sweep.seed), pool,
                                   lookahead(n_compile, cfg.sweep.batch, n_lanes))
    lanes_note = f"; {n_lanes} lanes" if n_lanes > 1 else ""
    print(f"[sweep] card {tools.card.name} ({regime}); job {cfg.slice}-{cfg.kind}: "
          f"{sched.left} of {len(points)} points to measure; budget {cfg.budget_s:.0f}s; "
          f"{n_compile or 'no'} compile-ahead processes{lanes_note}; run {cfg.run_id}",
          file=log, flush=True)
    restarts_before = sum(w.restarts for w in tools.workers)
    if sched.left:  # their start-up (torch, CUDA) overlaps the pool's first compiles
        for worker in tools.workers:
            worker.start()
    stats = JobStats()
    store = Durable(RowsWriter(cfg.rows_path), ledger, cfg.ledger_path, clock, _save_ledger,
                    LEDGER_SAVE_S)
    stop, error = "pool exhausted", None
    try:
        stop = _measure(cfg, tools, sched, time_, store, stats, should_stop, needs_run, log,
                        prefetch, on_row)
        store.save()
    except BoxWriteError as exc:
        error, stop = str(exc), "failed: rows or ledger not written"
        print(f"[sweep] error: {exc}", file=log, flush=True)
        try:  # keep the marks of the rows that are in the file, once they are durable
            store.rows.sync()
            _save_ledger(ledger, cfg.ledger_path)
        except BoxWriteError as again:
            print(f"[sweep] error: {again}", file=log, flush=True)
    except BaseException:  # ended by a signal or a bug: the marks of the durable rows are kept
        with contextlib.suppress(BoxWriteError):
            store.save()
        raise
    finally:
        store.close()
        if own_tools:
            tools.close()
        elif pool is not None and hasattr(pool, "forget"):
            pool.forget(p.key for p in points)  # (the next job's compiles go on)
    elapsed = time_.elapsed_s()
    done = sum(1 for p in points if not needs_run(p))
    summary = {"run_id": cfg.run_id, "slice": cfg.slice, "kind": cfg.kind,
               "card": tools.card.name, "regime": regime, "stop": stop,
               "points_total": len(points), "points_done": done,
               **stats.summary(elapsed_s=elapsed, budget_s=cfg.budget_s,
                               ledger_saves_s=store.save_s),
               "worker_restarts": sum(w.restarts for w in tools.workers) - restarts_before,
               "compile_workers": n_compile,
               # what the pool compiled for without asking CUDA (None: Triton asked the GPU)
               "compile_target": list(t) if (t := getattr(pool, "target", None)) else None,
               "compile_pool_broken": getattr(pool, "broken", None)}
    if error:
        summary["error"] = error
    print(f"sweep done: {cfg.slice}-{cfg.kind} {done}/{len(points)} points ({stats.benched} "
          f"benched this run: {stats.counts['ok']} ok, {summary['failed']} failed) in "
          f"{elapsed:.0f}s; {stop}", file=log, flush=True)
    if cfg.summary_path:
        tmp = cfg.summary_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(summary, indent=1, sort_keys=True))
            os.replace(tmp, cfg.summary_path)
        except OSError as exc:  # the controller counts the rows file instead
            print(f"[sweep] cannot write the summary {cfg.summary_path}: {exc}", file=log,
                  flush=True)
    if error:  # exit status 1: the job failed, but the rows it wrote stay for the harvest
        raise SystemExit(f"error: {error}")
    return summary


def _measure(cfg: JobConfig, tools: Tools, sched: Scheduler, time_: Allotment, store: Durable,
             stats: JobStats, should_stop: Any, needs_run: Any, log: Any,
             prefetch: Any = None, on_row: Any = None) -> str:
    """The job's loop: batch after batch until the pool, the allotment or a stop ends it;
    returns why it ended.  One lane measures in this thread; several measure in a thread each
    (:class:`_Lanes`), and ``stats`` then holds their sum."""
    job = _Lanes(cfg, tools, sched, time_, store, should_stop, needs_run, log, prefetch, on_row)
    if len(tools.lanes) == 1:
        return job.lane(tools.lanes[0], stats)
    return job.run_all(stats)


class _Lanes:
    """What the lanes of one job share, and each lane's loop: take the next batch (under the
    job's lock: a batch goes to one lane), measure its points with the lane's own worker,
    record each row (under the lock: whole rows, a mark only after its row), settle the batch.

    A lane that finds nothing to take while another lane measures waits for it: that lane may
    hand points back (a crash with a retry left).  A lane whose worker dies restarts it alone
    at its next point (:class:`Worker`); a lane that fails (a rows file it cannot write) halts
    the others after their current point, and the job then fails as a job of one lane does."""

    def __init__(self, cfg: JobConfig, tools: Tools, sched: Scheduler, time_: Allotment,
                 store: Durable, should_stop: Any, needs_run: Any, log: Any,
                 prefetch: Any = None, on_row: Any = None) -> None:
        self.cfg, self.tools, self.sched, self.time_ = cfg, tools, sched, time_
        self.store, self.should_stop, self.needs_run, self.log = store, should_stop, needs_run, log
        self.kind = registry.get(cfg.kind)
        self.card_feats = tools.card.features()
        self.timing = {"warmup": tools.warmup, "iters": tools.iters, "max_cv": cfg.tools.max_cv}
        self.prefetch = prefetch  # called once: the next job's compiles may start
        self.on_row = on_row  # each written row (under ``guard``)
        self.guard = threading.Condition(threading.Lock())
        self.halt = threading.Event()  # set under ``guard``: no row is recorded after it
        self.busy = 0  # lanes measuring a batch
        self.batches = 0  # batches handed out, every lane's
        self.lane_stats: list[JobStats] = []

    def asked(self) -> bool:
        return self.should_stop is not None and bool(self.should_stop())

    def run_all(self, stats: JobStats) -> str:
        """Every lane in a thread of its own; returns why the job ended once they all have."""
        self.lane_stats = [JobStats() for _ in self.tools.lanes]
        ends: dict[int, str] = {}
        errors: list[BaseException] = []

        def run(lane: Lane) -> None:
            try:
                ends[lane.index] = self.lane(lane, self.lane_stats[lane.index])
            except BaseException as exc:  # noqa: BLE001 - handed to the job's thread
                with self.guard:
                    errors.append(exc)
                    self.halt.set()
                    self.guard.notify_all()

        threads = [threading.Thread(target=run, args=(lane,), daemon=True,
                                    name=f"lane-{lane.index}") for lane in self.tools.lanes]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)  # short joins: a signal reaches this thread between them
        except BaseException:  # a signal: the lanes record nothing more, the job's clean-up runs
            with self.guard:
                self.halt.set()
                self.guard.notify_all()
            raise
        finally:
            combined = JobStats.combine(self.lane_stats)
            for name in ("counts", "times", "phases"):
                getattr(stats, name).update(getattr(combined, name))
            stats.ready.extend(combined.ready)
            stats.batches += combined.batches
            stats.lane_benched = combined.lane_benched
        if errors:
            raise errors[0]
        reasons = set(ends.values())
        for reason in ("budget spent", "stopped on request"):
            if reason in reasons:
                return reason
        return "pool exhausted"

    def _take(self) -> tuple[str, list[pools.Point]] | str:
        """The next batch for a lane, or why the lane ends.  Called under ``guard``."""
        while True:
            if self.halt.is_set():
                return "halted"
            if self.busy == 0 and self.sched.left == 0:  # every point measured, however late
                return "pool exhausted"
            if self.time_.spent():
                return "budget spent"
            if self.asked():
                return "stopped on request"
            planned = self.sched.next_batch()
            if self.prefetch is not None and (self.sched.dry or self.time_.left_s() < PREFETCH_S):
                prefetch, self.prefetch = self.prefetch, None
                prefetch()
            if planned is not None:
                self.busy += 1
                self.batches += 1
                return planned
            if self.busy == 0:
                return "pool exhausted"
            self.guard.wait(0.5)

    def lane(self, lane: Lane, stats: JobStats) -> str:
        """One lane's loop; returns why it ended."""
        from harness.box.gpustate import GpuState

        cfg, tools, time_ = self.cfg, self.tools, self.time_
        info, regime, pool = tools.info, tools.regime, tools.pool
        several = len(tools.lanes) > 1
        gpu_uuid = lane.gpu_uuid or info.get("gpu_uuid")
        gpu_state = GpuState(gpu_uuid) if regime != INTERPRET else None
        while True:
            with self.guard:
                planned = self._take()
                number = self.batches
            if isinstance(planned, str):
                return planned
            sid, batch = planned
            stats.started_measuring(time_.elapsed_s())
            stats.batches += 1
            tb = time_.clock()
            statuses: list[str] = []
            shape_feats = self.kind.shape_features(batch[0].shape)
            state = gpu_state.read() if gpu_state else {}
            cut, settled = False, False
            try:
                for p in batch:
                    if self.halt.is_set():
                        return "halted"
                    if time_.spent() or self.asked():
                        cut = True  # no point starts once the allotment is spent or a stop asked
                        break
                    res, cut = _measure_point(p, cfg, pool, tools.worker_for(p.knobs, lane.index),
                                              time_, stats)
                    if res is None:  # the allotment ran out while its compile was awaited
                        break
                    after = gpu_state.read() if gpu_state else {}
                    row = make_row(p, res, info, self.card_feats, shape_feats, cfg.run_id,
                                   self.timing, (state, after), lane=lane.index,
                                   gpu_uuid=lane.gpu_uuid)
                    state = after
                    with self.guard:
                        if self.halt.is_set():  # the job is ending: this point is measured again
                            return "halted"
                        # written at once: a job killed mid-batch keeps the points it measured;
                        # a point whose row could not be written is never marked in the ledger
                        self.store.record(row, regime)
                        stats.measured(res)
                        if self.on_row is not None:
                            self.on_row(row)
                    statuses.append(res["status"])
                    if cut:
                        break
                with self.guard:
                    if self.halt.is_set():  # the job's files may be closed already
                        return "halted"
                    self.store.tick()
                    # settled and no longer busy in one step: a lane waiting for points sees
                    # the ones this batch hands back
                    self.sched.settle(sid, batch, self.needs_run)
                    self.busy -= 1
                    settled = True
                    self.guard.notify_all()
                    progress = JobStats.combine(self.lane_stats).progress() if several \
                        else stats.progress()
                    on = f" on lane {lane.index}" if several else ""
                    others = ", ".join(f"{n} {word}" for word, n in
                                       sorted(Counter(statuses).items()) if word != "ok")
                    print(f"[batch {number}] {cfg.slice} {cfg.kind} {sid}{on}: "
                          f"{statuses.count('ok')}/{len(statuses)} ok "
                          f"({time_.clock() - tb:.1f}s{'; ' + others if others else ''}) | "
                          f"{progress}, "
                          f"left {self.sched.left}, {max(0.0, time_.left_s()):.0f}s of budget "
                          "left", file=self.log, flush=True)
            finally:
                if not settled:  # ended by an error or the job's end: the others go on alone
                    with self.guard:
                        self.busy -= 1
                        self.guard.notify_all()
            if cut:
                return "stopped on request" if not time_.spent() and self.asked() \
                    else "budget spent"


def _measure_point(p: pools.Point, cfg: JobConfig, pool: Any, worker: Any, time_: Allotment,
                   stats: JobStats) -> tuple[dict[str, Any] | None, bool]:
    """One point: wait for its compile, then the worker's call, within the point's bound.
    Returns (its result, None when the allotment ran out during the compile wait; whether the
    job's allotment cut it)."""
    req: dict[str, Any] = {"kind": p.kind, "shape": p.shape, "knobs": p.knobs}
    waited = 0.0
    if pool is not None and not is_baseline(p.knobs):
        tw = time_.clock()
        ans = pool.wait(p.key, time_.compile_wait_s())
        waited = time_.clock() - tw
        compiled = ans is not None and "error" not in ans
        if compiled:
            req["compiled_ahead"] = ans
        stats.compile_waited(waited, compiled)
    if time_.spent():
        return None, True
    bound, by_budget = time_.call_bound(waited)
    if bound <= 0:
        res: dict[str, Any] = {"status": "timeout", "error": f"its compile did not finish in "
                               f"{waited:.0f}s (--point-timeout-s)"}
    else:
        tw = time_.clock()
        res = worker.bench(req, bound)
        stats.worker_answered(time_.clock() - tw, res)
    cut = False
    if res["status"] == "timeout" and by_budget:
        # cut by the budget, not by its own bound: it ran at least the grace, so it is a
        # timeout row (an attempt) and a kernel that hangs is retired
        cut = True
        res["error"] = (f"no answer in {bound:.0f}s, when the job's allotment ran out (its own "
                        f"bound is {cfg.sweep.point_timeout_s:.0f}s)")
    res["compiled_ahead"] = "compiled_ahead" in req
    return res, cut
