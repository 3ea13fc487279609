"""The parts of one sweep job (:func:`harness.box.runner.run_job`), each on a clock it is given.

- :class:`Scheduler`: which points come next (batches of one shape, drawn in proportion to the
  shape's points not yet planned) and which go to the compile pool ahead of the worker;
- :class:`Allotment`: the job's time (its start, its budget) and each point's bound within it;
- :class:`Durable`: rows written at once, the ledger marked only after a point's row, the rows
  synced and the ledger saved on a schedule;
- :class:`JobStats`: what the job measured and where its time went, and its summary.

They hold no process, GPU or file of their own except :class:`Durable`'s rows file and ledger,
so each is tested on a fake clock (``tests/test_job_parts.py``).
"""

from __future__ import annotations

import random
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
    """The points a job has left and the order it measures them in: the ``first`` points
    (what people ship: :mod:`harness.shipped`) before the others.

    ``next_batch`` keeps ``lookahead`` batches planned beyond the one it hands out (each
    submitted to the compile pool when it is planned) and returns the oldest; ``settle`` drops
    the points of a measured batch that no longer need a run."""

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

    @property
    def left(self) -> int:
        return sum(len(v) for v in self.remaining.values())

    def _draw(self) -> bool:
        """Plan one more batch: a shape drawn in proportion to its points not yet planned."""
        avail = {sid: [p for p in pts if p.key not in self.in_flight]
                 for sid, pts in self.remaining.items()}
        avail = {sid: pts for sid, pts in avail.items() if pts}
        # what people ship (their configurations, the baselines) before the rest
        firsts = {sid: [p for p in pts if p.first] for sid, pts in avail.items()}
        if any(firsts.values()):
            avail = {sid: pts for sid, pts in firsts.items() if pts}
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
        while len(self.planned) <= self.lookahead and self._draw():
            pass
        return self.planned.popleft() if self.planned else None

    def settle(self, sid: str, batch: list[pools.Point],
               needs_run: Callable[[pools.Point], bool]) -> None:
        """The batch was measured (or cut): its points leave the flight; those still needing a
        run (not reached, or a retry left) stay for a later batch."""
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
    times a save's own time apart (the ledger of a long run is large)."""

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

    def record(self, row: dict[str, Any], regime: str) -> None:
        self.rows.write(row)
        self.ledger.mark(row["point_key"], row["spec"], regime, row["status"], row.get("error"))

    def tick(self) -> None:
        if self.clock() >= self.next_save:
            self.save()

    def save(self) -> None:
        t = self.clock()
        self.rows.sync()
        self._save_ledger(self.ledger, self.ledger_path)
        took = self.clock() - t
        self.save_s += took
        self.saves += 1
        self.next_save = self.clock() + max(self.every_s, 20 * took)

    def close(self) -> None:
        self.rows.close()


@dataclass
class JobStats:
    """What a job measured and where its time went."""

    counts: Counter[str] = field(default_factory=Counter)
    times: Counter[str] = field(default_factory=Counter)
    phases: Counter[str] = field(default_factory=Counter)  # the worker's account, by phase
    ready: list[float] = field(default_factory=list)  # seconds each worker start took
    batches: int = 0

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
