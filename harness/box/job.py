"""The parts of one sweep job (:func:`harness.box.runner.run_job`), each on a clock it is given.

- :class:`Scheduler`: which points come next (batches of one shape, drawn in proportion to the
  shape's points not yet planned) and which go to the compile pool ahead of the worker;
- :class:`Allotment`: the job's time (its start, its budget) and each point's bound within it;
- :class:`Durable`: rows written at once, the ledger marked only after a point's row, the rows
  synced and the ledger saved on a schedule;
- :class:`JobStats`: what the job measured and where its time went, and its summary.

They hold no process, GPU or file of their own except :class:`Durable`'s rows file and ledger,
so each is tested on a fake clock (``tests/test_job_parts.py``).  A box measuring on several
GPUs runs one lane per GPU, each a thread with its own bench worker; the lanes share one
:class:`Scheduler`, one :class:`Allotment` and one :class:`Durable`, which is why the scheduler
and the rows and ledger take a lock (``tests/test_lanes.py``), and each lane counts in a
:class:`JobStats` of its own (:meth:`JobStats.combine` sums them for the summary).
"""

from __future__ import annotations

import random
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import pools
from harness.ledger import Ledger
from harness.shipped import is_baseline

Clock = Callable[[], float]


class Scheduler:
    """The points a job has left and the order it measures them in: the card's own anchors,
    what people ship (:mod:`harness.shipped`), the anchors' neighbours one knob step away, then
    the others (:attr:`pools.Point.tier`).

    ``next_batch`` keeps ``lookahead`` batches planned beyond the one it hands out (each
    submitted to the compile pool when it is planned) and returns the oldest; ``settle`` drops
    the points of a measured batch that no longer need a run.  Both take the scheduler's lock:
    a batch goes to one lane, and a point is in at most one batch at a time."""

    def __init__(self, points: Iterable[pools.Point], batch: int, rng: random.Random,
                 compile_pool: Any = None, lookahead: int = 0) -> None:
        self.remaining: dict[str, list[pools.Point]] = {}
        for p in points:
            self.remaining.setdefault(p.shape_id, []).append(p)
        self.batch = max(1, batch)
        self.rng = rng
        self.compile_pool = compile_pool
        self.lookahead = lookahead
        self.planned: deque[tuple[str, list[pools.Point]]] = deque()
        self.in_flight: set[str] = set()
        self.lock = threading.RLock()

    @property
    def left(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.remaining.values())

    def _draw(self) -> bool:
        """Plan one more batch: a shape drawn in proportion to its points not yet planned."""
        avail = {sid: [p for p in pts if p.key not in self.in_flight]
                 for sid, pts in self.remaining.items()}
        avail = {sid: pts for sid, pts in avail.items() if pts}
        # the card's own anchors (the fastest of earlier sweeps), what people ship (their
        # configurations, the baselines), the anchors' neighbours, then the rest (Point.tier)
        if avail:
            tier = min(p.tier for pts in avail.values() for p in pts)
            avail = {sid: ahead for sid, pts in avail.items()
                     if (ahead := [p for p in pts if p.tier == tier])}
        if not avail:
            return False
        shape_ids = sorted(avail)
        sid = self.rng.choices(shape_ids, weights=[len(avail[s]) for s in shape_ids])[0]
        batch = self.rng.sample(avail[sid], min(self.batch, len(avail[sid])))
        self.in_flight.update(p.key for p in batch)
        if self.compile_pool is not None:
            for p in batch:
                if not is_baseline(p.knobs):  # torch compiles its own, in the worker
                    self.compile_pool.submit(p.key, p.kind, p.shape, p.knobs)
        self.planned.append((sid, batch))
        return True

    def next_batch(self) -> tuple[str, list[pools.Point]] | None:
        with self.lock:
            self.prime()
            return self.planned.popleft() if self.planned else None

    def prime(self) -> None:
        """Plan (and submit to the compile pool) the batches ahead now: a session primes the
        next job's first batches while the job before it ends."""
        with self.lock:
            while len(self.planned) <= self.lookahead and self._draw():
                pass

    @property
    def dry(self) -> bool:
        """Every point left is planned or in flight: nothing more goes to the compile pool
        (until a measured batch hands a point back)."""
        with self.lock:
            return all(p.key in self.in_flight for pts in self.remaining.values() for p in pts)

    @property
    def keys(self) -> set[str]:
        """The keys of the points this scheduler still holds (planned or not)."""
        with self.lock:
            return {p.key for pts in self.remaining.values() for p in pts}

    def settle(self, sid: str, batch: list[pools.Point],
               needs_run: Callable[[pools.Point], bool]) -> None:
        """The batch was measured (or cut): its points leave the flight; those still needing a
        run (not reached, or a retry left) stay for a later batch."""
        with self.lock:
            self.in_flight.difference_update(p.key for p in batch)
            kept = [p for p in self.remaining.get(sid, []) if needs_run(p)]
            if kept:
                self.remaining[sid] = kept
            else:
                self.remaining.pop(sid, None)


@dataclass(frozen=True)
class Allotment:
    """A job's time: ``budget_s`` from ``started`` on ``clock`` (0: no budget).  A point's bound
    covers the wait for its compile and the worker's call together: the smaller of
    ``point_timeout_s`` and what is left of the budget plus ``grace_s``."""

    budget_s: float
    started: float
    clock: Clock
    point_timeout_s: float
    grace_s: float

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.started) if self.budget_s else float("inf")

    def spent(self) -> bool:
        return self.left_s() <= 0

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def compile_wait_s(self) -> float:
        """How long a point may wait for its compile."""
        return min(self.point_timeout_s, self.left_s() + self.grace_s)

    def call_bound(self, waited: float) -> tuple[float, bool]:
        """(bound of the worker's call, whether the budget sets it rather than the point's own
        bound) after ``waited`` seconds for its compile.  A bound <= 0: its own bound is spent."""
        own = self.point_timeout_s - waited
        if own <= 0:
            return own, False
        by_budget = self.left_s() + self.grace_s
        return (by_budget, True) if by_budget < own else (own, False)


class Durable:
    """A job's rows and ledger on disk.  ``record`` writes a point's row at once and only then
    marks it in the ledger (a point whose row could not be written is never marked); ``tick``
    syncs the rows and saves the ledger when a save is due: every ``every_s`` and at least 20
    times a save's own time apart (the ledger of a long run is large).  Every call takes the
    lock, so the lanes of a job write whole rows and never save a ledger halfway marked."""

    def __init__(self, rows: Any, ledger: Ledger, ledger_path: Path, clock: Clock,
                 save_ledger: Callable[[Ledger, Path], None], every_s: float) -> None:
        self.rows = rows
        self.ledger = ledger
        self.ledger_path = ledger_path
        self.clock = clock
        self._save_ledger = save_ledger
        self.every_s = every_s
        self.next_save = clock() + every_s
        self.save_s = 0.0
        self.saves = 0
        self.lock = threading.RLock()

    def record(self, row: dict[str, Any], regime: str) -> None:
        with self.lock:
            self.rows.write(row)
            self.ledger.mark(row["point_key"], row["spec"], regime, row["status"],
                             row.get("error"))

    def tick(self) -> None:
        with self.lock:
            if self.clock() >= self.next_save:
                self.save()

    def save(self) -> None:
        with self.lock:
            t = self.clock()
            self.rows.sync()
            self._save_ledger(self.ledger, self.ledger_path)
            took = self.clock() - t
            self.save_s += took
            self.saves += 1
            self.next_save = self.clock() + max(self.every_s, 20 * took)

    def close(self) -> None:
        with self.lock:
            self.rows.close()


@dataclass
class JobStats:
    """What a job measured and where its time went."""

    counts: Counter[str] = field(default_factory=Counter)
    times: Counter[str] = field(default_factory=Counter)
    phases: Counter[str] = field(default_factory=Counter)  # the worker's account, by phase
    ready: list[float] = field(default_factory=list)  # seconds each worker start took
    batches: int = 0
    lane_benched: list[int] = field(default_factory=list)  # per lane, when several measured

    @classmethod
    def combine(cls, lanes: list[JobStats]) -> JobStats:
        """The job's statistics from its lanes': counts, times and batches summed (times are
        then lane-seconds), start-up the first lane's to start measuring."""
        out = cls(lane_benched=[s.benched for s in lanes])
        for s in lanes:
            out.counts.update(s.counts)
            out.times.update({k: v for k, v in s.times.items() if k != "startup"})
            out.phases.update(s.phases)
            out.ready.extend(s.ready)
            out.batches += s.batches
        started = [s.times["startup"] for s in lanes if s.times["startup"]]
        if started:
            out.times["startup"] = min(started)
        return out

    def started_measuring(self, elapsed_s: float) -> None:
        if self.times["startup"] == 0:
            self.times["startup"] = elapsed_s

    def compile_waited(self, seconds: float, compiled: bool) -> None:
        self.times["compile_wait"] += seconds
        if compiled:
            self.times["compiled_ahead"] += 1

    def worker_answered(self, seconds: float, res: dict[str, Any]) -> None:
        """Count a worker's answer; takes its own accounts (phases, start-up) out of ``res``."""
        self.times["worker"] += seconds
        self.phases.update(res.pop("phase_s", None) or {})
        if "worker_ready_s" in res:
            self.ready.append(res.pop("worker_ready_s"))

    def measured(self, res: dict[str, Any]) -> None:
        self.counts[res["status"]] += 1
        if res["status"] == "ok":
            self.times["timed_kernels"] += (res.get("n_samples") or 0) * (
                (res.get("value_us") or 0) + (res.get("ref_us") or 0)) * 1e-6
            self.times["remeasured"] += res.get("remeasured") or 0

    @property
    def benched(self) -> int:
        return sum(self.counts.values())

    def progress(self) -> str:
        return (f"done {self.benched}, ok {self.counts['ok']}, "
                f"failed {self.benched - self.counts['ok']}")

    def summary(self, *, elapsed_s: float, budget_s: float, ledger_saves_s: float
                ) -> dict[str, Any]:
        t = self.times
        return {"benched": self.benched, "ok": self.counts["ok"],
                "failed": self.benched - self.counts["ok"], "statuses": dict(self.counts),
                "batches": self.batches, "elapsed_s": round(elapsed_s, 2), "budget_s": budget_s,
                "lanes": max(1, len(self.lane_benched)),
                "lane_benched": self.lane_benched or [self.benched],
                "over_budget_s": round(elapsed_s - budget_s, 2) if budget_s else None,
                "compiled_ahead": int(t["compiled_ahead"]),
                "remeasured": int(t["remeasured"]),
                "time_s": {"startup": round(t["startup"], 2),
                           "compile_wait": round(t["compile_wait"], 2),
                           "worker": round(t["worker"], 2),
                           "timed_kernels": round(t["timed_kernels"], 3),
                           "ledger_saves": round(ledger_saves_s, 3),
                           "worker_phases": {k: round(v, 3) for k, v in sorted(self.phases.items())},
                           "worker_ready": self.ready}}
