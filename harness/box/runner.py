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
import json
import os
import random
import secrets
import select
import subprocess
import sys
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import pools
from harness.box.probe import FORCE_INTERPRET_ENV, card_from_probe, probe
from harness.cards import DEPLOYABLE, INTERPRET
from harness.ledger import Ledger

TERMINAL_ROW = ("ok", "bench_fail")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    return f"bench-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(4)}"


class Worker:
    """The bench worker process; restarted when it dies or hangs."""

    def __init__(self, regime: str, warmup: int, iters: int, seed: int, log_path: Path,
                 max_cv: float = 0.05, remeasure: int = 2) -> None:
        self.regime = regime
        self.args = [sys.executable, "-m", "harness.box", "worker", "--warmup", str(warmup),
                     "--iters", str(iters), "--seed", str(seed), "--max-cv", str(max_cv),
                     "--remeasure", str(remeasure),
                     "--device", "cpu" if regime == INTERPRET else "cuda"]
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.restarts = 0
        self._served = 0

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        if self.regime == INTERPRET:
            env["TRITON_INTERPRET"] = "1"
        log = open(self.log_path, "a")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True, env=env, bufsize=1)
        self._served = 0  # points handed to this process
        log.close()
        return self.proc

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


@dataclass
class JobConfig:
    slice: str
    kind: str
    budget_s: float
    rows_path: Path
    ledger_path: Path
    summary_path: Path | None = None
    batch: int = 6
    seed: int = 0
    max_dist: int = 2
    tail_cap: int = 200
    filter: str | None = None
    max_attempts: int = 2
    point_timeout_s: float = 300.0
    warmup: int = 5
    iters: int = 20
    compile_workers: int | None = None  # None: the box's spare cores; 0: no compile-ahead
    max_cv: float = 0.05
    remeasure: int = 2
    run_id: str = field(default_factory=new_run_id)


def make_row(point: pools.Point, res: dict[str, Any], info: dict[str, Any], card_feats: dict[str, Any],
             shape_feats: dict[str, Any], cfg: JobConfig,
             gpu: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
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
        "run_id": cfg.run_id, "measured_at": utc_now(),
        "provenance": {"host": info.get("host"), "device_name": info.get("device_name"),
                       "gpu_uuid": info.get("gpu_uuid"), **info.get("versions", {}),
                       "warmup": cfg.warmup, "iters": cfg.iters, "max_cv": cfg.max_cv,
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
    """What jobs measure with: the probe of the box, the compile pool and the bench worker.

    A job started alone (``python -m harness.box run``) makes its own and closes them at its
    end; the box service (:mod:`harness.box.service`) makes them once and keeps them warm for
    every job of the session.  Where the box likely has a GPU, the pool (warming up) and the
    worker (starting torch and CUDA) start before the probe, in parallel with it."""

    info: dict[str, Any]
    card: Any
    pool: Any
    worker: Worker
    warmup: int
    iters: int
    remeasure: int
    owns_pool: bool = False

    @classmethod
    def start(cls, cfg: JobConfig, worker_log: Path, compile_pool: Any = None) -> Tools:
        from harness.box.compiler import CompilePool, default_workers

        n_pool = default_workers() if cfg.compile_workers is None else cfg.compile_workers
        pool, worker, made = compile_pool, None, False  # made: started early, here
        if compile_pool is None and gpu_likely():
            pool = CompilePool(n_pool, target=_pool_target()) if n_pool > 0 else None
            made = pool is not None
            if pool is not None:
                pool.warm()
            worker = Worker(DEPLOYABLE, cfg.warmup, cfg.iters, cfg.seed, worker_log,
                            max_cv=cfg.max_cv, remeasure=cfg.remeasure)
            worker.start()
        try:
            info = probe()
            card = card_from_probe(info)
        except BaseException:
            _close_early(pool if made else None, worker)
            raise
        regime = info["regime"]
        if regime == INTERPRET:  # CPU timings: few calls, not worth timing again
            warmup, iters, remeasure = 1, 3, 0
            if made:
                _close_early(pool, worker)
                pool, worker, made = None, None, False
        else:
            warmup, iters, remeasure = cfg.warmup, cfg.iters, cfg.remeasure
            if pool is None and compile_pool is None and n_pool > 0:
                pool, made = CompilePool(n_pool, target=_pool_target()), True
        if worker is None:
            worker = Worker(regime, warmup, iters, cfg.seed, worker_log, max_cv=cfg.max_cv,
                            remeasure=remeasure)
        # tools started for one job close their pool with the job, one handed in too
        return cls(info=info, card=card, pool=pool, worker=worker, warmup=warmup, iters=iters,
                   remeasure=remeasure, owns_pool=pool is not None)

    @property
    def regime(self) -> str:
        return str(self.info["regime"])

    def close(self) -> None:
        self.worker.close()
        if self.owns_pool and self.pool is not None:
            self.pool.close()


def _close_early(pool: Any, worker: Any) -> None:
    if pool is not None:
        pool.close()
    if worker is not None:
        worker.close()


# The rows file is synced and the ledger saved at least this often (seconds), and at the end.
LEDGER_SAVE_S = 10.0


# A point started near the end of the allotment may run this far past it before it is cut (and
# left for the next run): the bound that keeps every job within about a minute of its allotment.
BUDGET_GRACE_S = 20.0


def run_job(cfg: JobConfig, log: Any = sys.stdout, clock: Any = time.monotonic,
            compile_pool: Any = None, *, tools: Tools | None = None,
            started: float | None = None,
            should_stop: Any = None) -> dict[str, Any]:
    """Run one job to its budget or the end of its pool; returns (and writes) the summary.

    The coming batches are drawn ahead and compile in a process pool (``compiler.CompilePool``)
    while the bench worker measures the current one.  Each point's bound is the smaller of
    ``point_timeout_s`` (compile wait and worker call together) and what is left of the budget
    plus ``BUDGET_GRACE_S``.  A point the worker was running at that bound is a ``timeout`` row
    (an attempt); one still waiting for its compile when the budget ran out has no row and is
    measured next run.  When its rows file or ledger cannot be
    written (a full disk), the job stops, keeps the whole rows already written, writes the
    summary with an ``error`` and exits with status 1.

    ``tools`` are the box service's (kept warm across jobs; else the job makes and closes its
    own); ``started`` is when the job's time began on ``clock`` (default: now); ``should_stop``
    is asked before every point (the service's stop request).  ``compile_pool`` is a test
    seam."""
    from harness import kinds as registry
    from harness.box.gpustate import GpuState

    t0 = clock() if started is None else started
    cfg.rows_path.parent.mkdir(parents=True, exist_ok=True)
    own_tools = tools is None
    if tools is None:
        tools = Tools.start(cfg, cfg.rows_path.parent / "worker.log", compile_pool)
    try:
        info, card, regime = tools.info, tools.card, tools.regime
        warmup, iters = tools.warmup, tools.iters
        cfg.warmup, cfg.iters, cfg.remeasure = warmup, iters, tools.remeasure
        ledger = Ledger.load(cfg.ledger_path)
        pool = pools.build(card, kinds=[cfg.kind], filter=cfg.filter, max_dist=cfg.max_dist,
                           tail_cap=cfg.tail_cap)
        points = pool.points(cfg.slice, cfg.kind)
    except BaseException:
        if own_tools:
            tools.close()
        raise
    remaining: dict[str, list[pools.Point]] = defaultdict(list)
    for p in points:
        if ledger.needs_run(p.key, regime, cfg.max_attempts):
            remaining[p.shape_id].append(p)
    total, todo = len(points), sum(len(v) for v in remaining.values())
    compile_pool = tools.pool
    n_compile = compile_pool.workers if compile_pool is not None else 0
    print(f"[sweep] card {card.name} ({regime}); job {cfg.slice}-{cfg.kind}: {todo} of {total} "
          f"points to measure; budget {cfg.budget_s:.0f}s; "
          f"{n_compile or 'no'} compile-ahead processes; run {cfg.run_id}", file=log, flush=True)
    kind = registry.get(cfg.kind)
    card_feats = card.features()
    rng = random.Random(cfg.seed)
    worker = tools.worker
    restarts_before = worker.restarts
    if todo:  # its start-up (torch, CUDA) overlaps the pool's first compiles
        worker.start()
    gpu_state = GpuState(info.get("gpu_uuid")) if regime != INTERPRET else None
    counts: Counter[str] = Counter()
    times: Counter[str] = Counter()
    phases: Counter[str] = Counter()  # the worker's own account of its time, by phase
    ready: list[float] = []  # seconds each bench worker took to start (one per restart)
    batch_i = 0
    stop = "pool exhausted"
    error: str | None = None
    planned: deque[tuple[str, list[pools.Point]]] = deque()
    in_flight: set[str] = set()
    lookahead = -(-2 * n_compile // max(1, cfg.batch)) if compile_pool is not None else 0

    def draw() -> bool:
        """Plan the next batch: a shape drawn in proportion to its points not yet planned."""
        avail = {sid: [p for p in pts if p.key not in in_flight] for sid, pts in remaining.items()}
        avail = {sid: pts for sid, pts in avail.items() if pts}
        if not avail:
            return False
        shape_ids = sorted(avail)
        sid = rng.choices(shape_ids, weights=[len(avail[s]) for s in shape_ids])[0]
        batch = rng.sample(avail[sid], min(cfg.batch, len(avail[sid])))
        in_flight.update(p.key for p in batch)
        if compile_pool is not None:
            for p in batch:
                compile_pool.submit(p.key, p.kind, p.shape, p.knobs)
        planned.append((sid, batch))
        return True

    def left_s() -> float:
        return cfg.budget_s - (clock() - t0) if cfg.budget_s else float("inf")

    rows_file = RowsWriter(cfg.rows_path)

    def save() -> float:
        """Sync the rows, then save the ledger; returns when the next save is due (the ledger
        of a long run is large: its saves are spaced to stay a few percent of the time)."""
        t = clock()
        rows_file.sync()
        _save_ledger(ledger, cfg.ledger_path)
        took = clock() - t
        times["ledger_saves"] += took
        return clock() + max(LEDGER_SAVE_S, 20 * took)

    next_save = clock() + LEDGER_SAVE_S
    try:
        while True:
            if left_s() <= 0:
                stop = "budget spent"
                break
            if should_stop is not None and should_stop():
                stop = "stopped on request"
                break
            while len(planned) <= lookahead and draw():
                pass
            if not planned:
                break
            sid, batch = planned.popleft()
            if times["startup"] == 0:
                times["startup"] = clock() - t0
            batch_i += 1
            tb = clock()
            statuses = []
            shape_feats = kind.shape_features(batch[0].shape)
            state = gpu_state.read() if gpu_state else {}
            cut = False
            for p in batch:
                if left_s() <= 0 or (should_stop is not None and should_stop()):
                    cut = True  # no point starts once the allotment is spent or a stop asked
                    break
                req: dict[str, Any] = {"kind": p.kind, "shape": p.shape, "knobs": p.knobs}
                waited = 0.0
                if compile_pool is not None:
                    tw = clock()
                    ans = compile_pool.wait(p.key, min(cfg.point_timeout_s,
                                                       left_s() + BUDGET_GRACE_S))
                    waited = clock() - tw
                    times["compile_wait"] += waited
                    if ans is not None and "error" not in ans:
                        req["compiled_ahead"] = ans
                        times["compiled_ahead"] += 1
                if left_s() <= 0:  # the allotment ran out while its compile was awaited
                    cut = True
                    break
                # the point's own bound covers the wait for its compile and the worker's call
                own_left = cfg.point_timeout_s - waited
                if own_left <= 0:
                    res = {"status": "timeout", "error": f"its compile did not finish in "
                           f"{waited:.0f}s (--point-timeout-s)"}
                    bound = own_left
                else:
                    bound = min(own_left, left_s() + BUDGET_GRACE_S)
                    tw = clock()
                    res = worker.bench(req, bound)
                    times["worker"] += clock() - tw
                    phases.update(res.pop("phase_s", None) or {})
                    if "worker_ready_s" in res:
                        ready.append(res.pop("worker_ready_s"))
                if res["status"] == "timeout" and 0 < bound < own_left:
                    # cut by the budget, not by its own bound: it ran at least the grace, so it
                    # is a timeout row (an attempt) and a kernel that hangs is retired
                    cut = True
                    res["error"] = (f"no answer in {bound:.0f}s, when the job's allotment ran "
                                    f"out (its own bound is {cfg.point_timeout_s:.0f}s)")
                res["compiled_ahead"] = "compiled_ahead" in req
                after = gpu_state.read() if gpu_state else {}
                row = make_row(p, res, info, card_feats, shape_feats, cfg, (state, after))
                state = after
                # written at once: a job killed mid-batch keeps the points it measured; a
                # point whose row could not be written is never marked in the ledger
                rows_file.write(row)
                ledger.mark(p.key, p.spec, regime, res["status"], res.get("error"))
                statuses.append(res["status"])
                counts[res["status"]] += 1
                if res["status"] == "ok":
                    times["timed_kernels"] += (res.get("n_samples") or 0) * (
                        (res.get("value_us") or 0) + (res.get("ref_us") or 0)) * 1e-6
                    times["remeasured"] += res.get("remeasured") or 0
                if cut:
                    break
            in_flight.difference_update(p.key for p in batch)
            if clock() >= next_save:
                next_save = save()
            remaining[sid] = [p for p in remaining.get(sid, [])
                              if ledger.needs_run(p.key, regime, cfg.max_attempts)]
            if not remaining[sid]:
                del remaining[sid]
            left = sum(len(v) for v in remaining.values())
            n_ok = statuses.count("ok")
            print(f"[batch {batch_i}] {cfg.slice} {cfg.kind} {sid}: {n_ok}/{len(statuses)} ok "
                  f"({clock() - tb:.1f}s) statuses={statuses} | done {sum(counts.values())}, "
                  f"ok {counts['ok']}, failed {sum(counts.values()) - counts['ok']}, "
                  f"left {left}, {max(0.0, left_s()):.0f}s of budget left",
                  file=log, flush=True)
            if cut:
                asked = left_s() > 0 and should_stop is not None and should_stop()
                stop = "stopped on request" if asked else "budget spent"
                break
        save()
    except BoxWriteError as exc:
        error, stop = str(exc), "failed: rows or ledger not written"
        print(f"[sweep] error: {exc}", file=log, flush=True)
        try:  # keep the marks of the rows that are in the file, once they are durable
            rows_file.sync()
            _save_ledger(ledger, cfg.ledger_path)
        except BoxWriteError as again:
            print(f"[sweep] error: {again}", file=log, flush=True)
    except BaseException:  # ended by a signal or a bug: the marks of the durable rows are kept
        with contextlib.suppress(BoxWriteError):
            save()
        raise
    finally:
        rows_file.close()
        if own_tools:
            tools.close()
        elif compile_pool is not None and hasattr(compile_pool, "forget"):
            compile_pool.forget()
    elapsed = clock() - t0
    done = sum(1 for p in points if not ledger.needs_run(p.key, regime, cfg.max_attempts))
    benched = sum(counts.values())
    summary = {"run_id": cfg.run_id, "slice": cfg.slice, "kind": cfg.kind, "card": card.name,
               "regime": regime, "stop": stop, "points_total": total, "points_done": done,
               "benched": benched, "ok": counts["ok"],
               "failed": benched - counts["ok"], "statuses": dict(counts),
               "batches": batch_i, "elapsed_s": round(elapsed, 2), "budget_s": cfg.budget_s,
               "over_budget_s": round(elapsed - cfg.budget_s, 2) if cfg.budget_s else None,
               "worker_restarts": worker.restarts - restarts_before,
               "compile_workers": n_compile,
               # what the pool compiled for without asking CUDA (None: Triton asked the GPU)
               "compile_target": list(t) if (t := getattr(compile_pool, "target", None)) else None,
               "compile_pool_broken": getattr(compile_pool, "broken", None),
               "compiled_ahead": int(times["compiled_ahead"]),
               "remeasured": int(times["remeasured"]),
               "time_s": {"startup": round(times["startup"], 2),
                          "compile_wait": round(times["compile_wait"], 2),
                          "worker": round(times["worker"], 2),
                          "timed_kernels": round(times["timed_kernels"], 3),
                          "ledger_saves": round(times["ledger_saves"], 3),
                          "worker_phases": {k: round(v, 3) for k, v in sorted(phases.items())},
                          "worker_ready": ready}}
    if error:
        summary["error"] = error
    print(f"sweep done: {cfg.slice}-{cfg.kind} {done}/{total} points ({benched} benched "
          f"this run: {counts['ok']} ok, {summary['failed']} failed) in {elapsed:.0f}s; {stop}",
          file=log, flush=True)
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
