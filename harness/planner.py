"""The budget planner: which sweep jobs run, in what order, and how many seconds each may use.

A *job* is one (slice, kind) pair, e.g. ``own-softmax``; its pool is the number of points it
still has to measure on this card.  The planner is pure: it is given the wall-clock budget,
the slice shares and the pools of the jobs pytest selected, and it is told as each job
finishes how long it took.

Lifecycle: build a :class:`BudgetPlan`, then for each job of :attr:`BudgetPlan.order` in turn
ask :meth:`~BudgetPlan.allotment`, run the job for at most that long, and report it with
:meth:`~BudgetPlan.record` (or :meth:`~BudgetPlan.skip` if it never ran).  Allotments are
recomputed from what earlier jobs really spent, so

* a kind that finishes early leaves its unused time to the kinds after it in its slice
  (small kinds run first and are guaranteed data; the biggest kind gets the rest);
* a slice's unused time flows to later slices, and an overrun shrinks what comes after;
* a slice with no runnable job, or a zero share, gets nothing and its share is spread over
  the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.slices import SLICES

__all__ = ["BudgetPlan", "Job", "ShareError", "normalize_shares"]


@dataclass(frozen=True)
class Job:
    """One sweep job: all points of one kernel kind in one slice."""

    slice: str
    kind: str

    @property
    def id(self) -> str:
        """The job's stable name, also its test id: ``"{slice}-{kind}"``."""
        return f"{self.slice}-{self.kind}"


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


class BudgetPlan:
    """Order and allotments of the selected sweep jobs under one wall-clock budget.

    ``order``, when given, fixes the run order (slices must still run own → cross → tail);
    otherwise it is computed as below.

    ``pool`` maps each *selected* job to the number of points it still has to measure.
    :attr:`order` runs slices own → cross → tail, and inside a slice the kinds with the
    smallest pool first (ties by kind name); jobs with no points and jobs of zero-share
    slices are left out.  :attr:`nominal` is each slice's first-pass budget: ``budget_s``
    times its share renormalized over the slices that have a runnable job.

    A job's allotment is its slice's available time divided by the kinds of the slice still
    to run (this one included), where available time is the slice's nominal budget plus what
    earlier slices left unused (or minus what they overran) minus what this slice spent so
    far.  It is never negative and never more than ``budget_s`` minus everything spent.
    """

    def __init__(self, budget_s: float, shares: Mapping[str, float], pool: Mapping[Job, int],
                 order: Sequence[Job] | None = None):
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
        """Seconds ``job`` (which must be :attr:`next_job`) may use; recomputed from what was spent."""
        self._check_next(job)
        index = SLICES.index(job.slice)
        through_slice = sum(self.nominal[name] for name in SLICES[: index + 1])
        spent = self.spent_s
        available = min(through_slice - spent, self.budget_s - spent)
        kinds_left = sum(1 for j in self.order if j.slice == job.slice and j not in self._spent)
        return max(0.0, available) / kinds_left

    def record(self, job: Job, spent_s: float) -> None:
        """Report that ``job`` finished having used ``spent_s`` seconds (it may overrun a little)."""
        self._check_next(job)
        spent_s = float(spent_s)
        if not math.isfinite(spent_s) or spent_s < 0:
            raise ValueError(
                f"job {job.id!r}: spent_s must be a finite number >= 0, got {spent_s!r}"
            )
        self._spent[job] = spent_s

    def skip(self, job: Job) -> None:
        """Report that ``job`` finished without spending anything (e.g. deselected or nothing left)."""
        self.record(job, 0.0)
