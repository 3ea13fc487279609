"""The budget planner: which sweep jobs run, in what order, and how many seconds each may use.

A *job* is one (slice, kind) pair, e.g. ``own-softmax``; its pool is the number of points it
still has to measure on this card.  The planner is pure: it is given the wall-clock budget,
the slice shares, the pools of the jobs pytest selected and, where known, how many seconds a
point of each kind takes; it is told as each job finishes how long it took.

Lifecycle: build a :class:`BudgetPlan`, then for each job of :attr:`BudgetPlan.order` in turn
ask :meth:`~BudgetPlan.allotment`, run the job for at most that long, and report it with
:meth:`~BudgetPlan.record` (or :meth:`~BudgetPlan.skip` if it never ran); a measured rate can
be handed in on the way (:meth:`~BudgetPlan.learn`).  Allotments are water-filled from what is
left of the budget every time one is asked for, so time flows both ways:

* the slices still to run share what is left in proportion to their shares (a slice that
  has begun counts what its finished jobs spent against its share), but no slice gets more
  than its jobs can use (their points times the seconds a point takes, with a margin): what
  one cannot use goes to the others in proportion to their shares, *also to the slice running
  now*, so own gets what cross and tail cannot use before they run;
* inside a slice the kinds still to run share the slice's time equally, water-filled the same
  way, so a small kind gets what it needs and the biggest kind the rest;
* a job that finishes early or overruns changes what is left, and so every later allotment;
* a slice with no runnable job, or a zero share, gets nothing.

Without rates (``s_per_point`` not given) every job could use any time, and the allotments
are the shares of what is left, split equally among a slice's kinds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from harness.contract import (
    COMPILE_BASELINE_S,
    JOB_OVERHEAD_S,
    MIN_JOB_S,
    SLICES,
    JobRef,
    SessionSpec,
)

__all__ = ["BudgetPlan", "Job", "Ran", "ShareError", "Simulated", "normalize_shares",
           "run_session", "session_plan", "waterfill"]

T = TypeVar("T")


Job = JobRef  # one sweep job: all points of one kernel kind in one slice (``job.id``)


class ShareError(ValueError):
    """Slice shares that cannot be normalized (negative, not finite, unknown, or all zero)."""


def normalize_shares(shares: Mapping[str, float]) -> dict[str, float]:
    """Turn ``--share-own/--share-cross/--share-tail`` values into fractions that sum to 1.

    Missing slices count as 0.  A zero share means "never run that slice".  Raises
    :class:`ShareError` for an unknown slice, a negative or non-finite share, or all zero.
    """
    for name in shares:
        if name not in SLICES:
            raise ShareError(f"unknown slice {name!r} in shares; valid slices: {', '.join(SLICES)}")
    raw: dict[str, float] = {}
    for name in SLICES:
        value = float(shares.get(name, 0.0))
        if not math.isfinite(value) or value < 0:
            raise ShareError(
                f"--share-{name} must be a finite number >= 0, got {shares.get(name)!r}"
            )
        raw[name] = value
    top = max(raw.values())
    if top <= 0:
        raise ShareError(
            "at least one share must be positive "
            "(--share-own, --share-cross, --share-tail are all zero)"
        )
    # Scale by the largest share first so huge inputs cannot overflow the sum.
    scaled = {name: value / top for name, value in raw.items()}
    total = sum(scaled.values())
    return {name: value / total for name, value in scaled.items()}


# A job gets up to this many times what its points are estimated to take: an estimate that
# is too low strands points, one that is too high only hands the time on to later jobs.
NEED_MARGIN = 1.5


def waterfill(total: float, weights: Mapping[T, float], caps: Mapping[T, float]) -> dict[T, float]:
    """Share ``total`` in proportion to ``weights``, no one more than its cap; what a capped one
    leaves is shared by the rest the same way.  Pure; ``total`` may be infinite."""
    out: dict[T, float] = {}
    active = {k for k, w in weights.items() if w > 0}
    left = total
    while active:
        w_sum = sum(weights[k] for k in active)
        capped = {k for k in active if caps[k] <= left * weights[k] / w_sum}
        if not capped:
            for k in active:
                out[k] = left * weights[k] / w_sum
            return out
        for k in capped:
            out[k] = caps[k]
            left -= caps[k]
        active -= capped
    return out


class BudgetPlan:
    """Order and allotments of the selected sweep jobs under one wall-clock budget.

    ``order``, when given, fixes the run order (slices must still run own → cross → tail);
    otherwise slices run own → cross → tail and inside a slice the kinds with the smallest
    pool first (ties by kind name); jobs with no points and jobs of zero-share slices are left
    out.  :attr:`nominal` is each slice's share of the whole budget, renormalized over the
    slices that have a runnable job.  ``s_per_point`` (kind → seconds a point takes, or one
    number for every kind), ``extra_s`` (job → seconds its few costly points take beyond
    that rate, e.g. ``torch.compile``'s baselines) and ``job_overhead_s`` (a job's own start
    and end) let the allotments follow what each job can use; see the module docstring.
    ``min_job_s`` is the least a job can use at all (the caller skips a job allotted less):
    a job of a few points is not capped under it.  Rates are seconds of one lane; a box that
    measures on ``lanes`` GPUs at once takes a job's points (and its costly points) in a
    ``lanes``-th of that.
    """

    def __init__(self, budget_s: float, shares: Mapping[str, float], pool: Mapping[Job, int],
                 order: Sequence[Job] | None = None,
                 s_per_point: Mapping[str, float] | float | None = None,
                 job_overhead_s: float = 0.0,
                 extra_s: Mapping[Job, float] | None = None,
                 min_job_s: float = 0.0, lanes: int = 1):
        budget_s = float(budget_s)
        if math.isnan(budget_s) or budget_s < 0:
            raise ValueError(f"budget_s (--budget-s) must be >= 0 seconds, got {budget_s!r}")
        self.budget_s = budget_s
        self.shares = normalize_shares(shares)
        for job, count in pool.items():
            if job.slice not in SLICES:
                raise ValueError(
                    f"job {job.id!r} has unknown slice {job.slice!r}; valid slices: {', '.join(SLICES)}"
                )
            if count < 0:
                raise ValueError(f"job {job.id!r} has a negative pool ({count})")
        self.pool: dict[Job, int] = dict(pool)
        self.order: list[Job] = [
            job
            for name in SLICES
            if self.shares[name] > 0
            for job in sorted(
                (j for j, n in pool.items() if j.slice == name and n > 0),
                key=lambda j: (pool[j], j.kind),
            )
        ]
        if order is not None:
            # The caller fixed the run order already (pytest runs items in collection order):
            # keep it, minus the jobs that cannot run, as long as slices stay own → cross → tail.
            runnable = set(self.order)
            self.order = [job for job in order if job in runnable]
            ranks = [SLICES.index(job.slice) for job in self.order]
            if ranks != sorted(ranks) or len(set(self.order)) != len(self.order):
                raise ValueError("order must run slices own → cross → tail with each job once")
            if runnable - set(self.order):
                missing = ", ".join(sorted(j.id for j in runnable - set(self.order)))
                raise ValueError(f"order leaves out runnable jobs: {missing}")
        live = {job.slice for job in self.order}
        live_total = sum(self.shares[name] for name in live)
        self.nominal: dict[str, float] = {
            name: budget_s * self.shares[name] / live_total if name in live else 0.0
            for name in SLICES
        }
        if s_per_point is None or isinstance(s_per_point, Mapping):
            self.rates: dict[str, float] = dict(s_per_point or {})
        else:
            self.rates = {job.kind: float(s_per_point) for job in self.order}
        self.job_overhead_s = float(job_overhead_s)
        self.min_job_s = float(min_job_s)
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes!r}")
        self.lanes = int(lanes)
        self.extra_s: dict[Job, float] = {}
        for job, extra in (extra_s or {}).items():
            if not math.isfinite(extra) or extra < 0:
                raise ValueError(f"job {job.id!r}: extra_s must be a finite number >= 0, "
                                 f"got {extra!r}")
            self.extra_s[job] = float(extra)
        self._spent: dict[Job, float] = {}

    @property
    def spent_s(self) -> float:
        """Seconds recorded as spent by finished jobs."""
        return sum(self._spent.values())

    @property
    def remaining_s(self) -> float:
        """Seconds of the budget not yet spent (never negative)."""
        return max(0.0, self.budget_s - self.spent_s)

    @property
    def next_job(self) -> Job | None:
        """The job to run next, or None when every job of :attr:`order` has finished."""
        done = len(self._spent)
        return self.order[done] if done < len(self.order) else None

    def learn(self, kind: str, s_per_point: float) -> None:
        """A rate measured on the way (e.g. by an earlier job of the same kind), in seconds of
        one lane a point."""
        if math.isfinite(s_per_point) and s_per_point > 0:
            self.rates[kind] = float(s_per_point)

    def need_s(self, job: Job) -> float:
        """What ``job`` can use: its points at its kind's rate and its costly points' extra
        seconds, with a margin (inf: unknown)."""
        rate = self.rates.get(job.kind)
        if rate is None:
            return math.inf
        return max(self.min_job_s,
                   NEED_MARGIN * (self.pool[job] * rate + self.extra_s.get(job, 0.0)) / self.lanes
                   + self.job_overhead_s)

    def _check_next(self, job: Job) -> None:
        if job in self._spent:
            raise ValueError(f"job {job.id!r} has already finished")
        if job not in self.order:
            why = (
                f"its slice has a zero share (--share-{job.slice})"
                if job.slice in self.shares and self.shares[job.slice] == 0
                else "it has no points to measure or was not selected"
            )
            raise ValueError(f"job {job.id!r} is not in the plan: {why}")
        expected = self.next_job
        if job != expected:
            raise ValueError(
                f"job {job.id!r} asked out of order; the next job is {expected.id!r}"
                if expected is not None
                else f"job {job.id!r} asked out of order"
            )

    def allotment(self, job: Job) -> float:
        """Seconds ``job`` (which must be :attr:`next_job`) may use, water-filled from what is
        left of the budget over the jobs still to run."""
        self._check_next(job)
        left = self.remaining_s
        todo = [j for j in self.order if j not in self._spent]
        slices = {j.slice for j in todo}
        # A slice that has begun keeps its share of the time it began with, less what its
        # finished jobs spent: shared out again over what is left, the running slice would
        # take its share of every other slice's share too, job after job.
        spent = {s: sum(t for j, t in self._spent.items() if j.slice == s) for s in slices}
        per_slice = waterfill(left + sum(spent.values()), {s: self.shares[s] for s in slices},
                              {s: spent[s] + sum(self.need_s(j) for j in todo if j.slice == s)
                               for s in slices})
        mine = [j for j in todo if j.slice == job.slice]
        per_job = waterfill(max(0.0, per_slice.get(job.slice, 0.0) - spent[job.slice]),
                            {j: 1.0 for j in mine}, {j: self.need_s(j) for j in mine})
        return min(left, max(0.0, per_job.get(job, 0.0)))

    def record(self, job: Job, spent_s: float) -> None:
        """Report that ``job`` finished having used ``spent_s`` seconds (it may overrun a little)."""
        self._check_next(job)
        spent_s = float(spent_s)
        if not math.isfinite(spent_s) or spent_s < 0:
            raise ValueError(
                f"job {job.id!r}: spent_s must be a finite number >= 0, got {spent_s!r}"
            )
        self._spent[job] = spent_s

    def top_ups(self, points_left: Mapping[Job, int]) -> dict[Job, float]:
        """Once every job of :attr:`order` has run: what is left of the budget, water-filled
        over the jobs that still have points (each capped at what those points take, by the
        shares of their slices, split equally within a slice).  A job that could not know the
        time later jobs would leave unused gets it now."""
        if self.next_job is not None:
            raise ValueError("top-ups come after every job of the plan has run")
        todo = {j: n for j, n in points_left.items() if n > 0 and j in self.order}
        if not todo or self.remaining_s <= 0:
            return {}
        need = {j: self.need_s(Job(j.slice, j.kind)) * n / max(1, self.pool[j])
                for j, n in todo.items()}
        slices = {j.slice for j in todo}
        per_slice = waterfill(self.remaining_s, {s: self.shares[s] for s in slices},
                              {s: sum(need[j] for j in todo if j.slice == s) for s in slices})
        out: dict[Job, float] = {}
        for s in slices:
            mine = [j for j in todo if j.slice == s]
            out.update(waterfill(per_slice.get(s, 0.0), {j: 1.0 for j in mine},
                                 {j: need[j] for j in mine}))
        return out

    def record_top_up(self, job: Job, spent_s: float) -> None:
        """Report the seconds a top-up of ``job`` used."""
        if not math.isfinite(spent_s) or spent_s < 0:
            raise ValueError(f"top-up of {job.id!r}: spent_s must be >= 0, got {spent_s!r}")
        self._spent[job] = self._spent.get(job, 0.0) + float(spent_s)

    def skip(self, job: Job) -> None:
        """Report that ``job`` finished without spending anything (e.g. deselected or nothing left)."""
        self.record(job, 0.0)


def session_plan(spec: SessionSpec, todo: Mapping[Job, int], heavy: Mapping[Job, int],
                 lanes: int) -> BudgetPlan:
    """The plan of a session request: its jobs in its order (those with points to measure and a
    share), ``todo`` points each of which ``heavy`` are ``torch.compile`` baselines (at the
    request's seconds a shape), the request's paces, ``lanes`` measuring at once, and the
    seam's constants.  The box service plans with it, and so does the preview."""
    return BudgetPlan(spec.budget_s, spec.shares, {j: int(todo.get(j, 0)) for j in spec.jobs},
                      order=[j for j in spec.jobs
                             if spec.shares.get(j.slice, 0) > 0 and todo.get(j)],
                      s_per_point=dict(spec.s_per_point), job_overhead_s=JOB_OVERHEAD_S,
                      extra_s={j: n * spec.compile_s.get(j.kind, COMPILE_BASELINE_S)
                               for j, n in heavy.items() if n},
                      min_job_s=MIN_JOB_S, lanes=lanes)


@dataclass(frozen=True)
class Ran:
    """What one run of a job did: the seconds it was charged, the points it still has, and
    (when its pace says something about the kind) the seconds one lane took a point."""

    spent_s: float
    points_left: int
    pace_s: float | None = None


def run_session(plan: BudgetPlan, run: Callable[[Job, float, int], Ran],
                skip: Callable[[Job, float], None] = lambda job, allot: None,
                stopping: Callable[[], bool] = lambda: False) -> None:
    """Run a card's session: every job of ``plan.order`` in turn, each allotted on the clock of
    whoever runs it (``run(job, allotment, round)`` runs it and says what it did; a job allotted
    less than ``plan.min_job_s`` is skipped and said so with ``skip``), then *top-ups*: what is
    left of the budget goes to the jobs that still have points, round after round, until the
    budget or the points run out (or a round measures nothing).  ``stopping`` is asked before
    every run.  The box service runs it for real; the plan preview with :class:`Simulated`."""
    left = {job: plan.pool[job] for job in plan.order}
    for job in plan.order:
        if stopping():
            return
        allot = plan.allotment(job)
        if allot < plan.min_job_s:
            plan.skip(job)
            skip(job, allot)
            continue
        ran = run(job, allot, 0)
        plan.record(job, ran.spent_s)
        left[job] = ran.points_left
        if ran.pace_s is not None:
            plan.learn(job.kind, ran.pace_s)
    rnd, stalled = 0, False
    while not stopping():
        rnd += 1
        todo = {job: n for job, n in left.items() if n > 0}
        if not todo or plan.remaining_s < plan.min_job_s:
            return
        extra = {} if stalled else plan.top_ups(todo)
        runs = [(job, extra[job]) for job in plan.order if extra.get(job, 0.0) >= plan.min_job_s]
        if not runs:  # every share is under what a job can use, or a round measured nothing:
            # the first job with points left takes all that is left
            runs = [(next(job for job in plan.order if todo.get(job)), plan.remaining_s)]
        progressed = False
        for job, allot in runs:
            allot = min(allot, plan.remaining_s)
            if allot < plan.min_job_s or stopping():
                break
            ran = run(job, allot, rnd)
            plan.record_top_up(job, ran.spent_s)
            progressed = progressed or ran.points_left < left[job]
            left[job] = ran.points_left
            if ran.pace_s is not None:
                plan.learn(job.kind, ran.pace_s)
        if not progressed and stalled:
            return  # even all that was left measured nothing (its points time out, say)
        stalled = not progressed


@dataclass
class Simulated:
    """A run of a job as the plan preview imagines it, as the box runs one: after the job's
    own overhead, ``heavy`` costly points first (each ``heavy_s`` seconds of one lane, e.g.
    ``torch.compile``'s baselines), then the rest at the kind's rate, ``lanes`` at a time; a
    point starts while the allotment lasts and runs to its end.  ``log`` collects one entry
    per run."""

    points: Mapping[Job, int]
    rates: Mapping[str, float]
    lanes: int = 1
    heavy: Mapping[Job, int] | None = None
    heavy_s: Mapping[str, float] | None = None
    overhead_s: float = JOB_OVERHEAD_S
    log: list[dict[str, object]] | None = None

    def __post_init__(self) -> None:
        self.left = dict(self.points)
        self.heavy_left = dict(self.heavy or {})
        self.log = [] if self.log is None else self.log

    def __call__(self, job: Job, allot: float, rnd: int) -> Ran:
        clock = self.overhead_s
        measured = 0
        n_heavy = self.heavy_left.get(job, 0)
        each_heavy = (self.heavy_s or {}).get(job.kind, 0.0) / self.lanes
        while n_heavy and clock < allot:
            clock, n_heavy, measured = clock + each_heavy, n_heavy - 1, measured + 1
        self.heavy_left[job] = n_heavy
        rest = self.left[job] - measured - n_heavy
        each = self.rates[job.kind] / self.lanes
        if clock < allot and rest > 0:
            fit = rest if each <= 0 else min(rest, math.ceil((allot - clock) / each))
            clock += fit * each
            measured += fit
        self.left[job] -= measured
        spent = clock
        assert self.log is not None
        self.log.append({"job": job, "round": rnd, "allotment_s": allot, "spent_s": spent,
                         "measures": measured, "points_left": self.left[job]})
        return Ran(spent_s=spent, points_left=self.left[job])
