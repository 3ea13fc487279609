"""Tests of the budget planner: job order, shares, allotments and how unused time flows."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.planner import BudgetPlan, Job, ShareError, normalize_shares
from harness.slices import SLICES

SHARES = {"own": 60, "cross": 20, "tail": 20}


def _pool() -> dict[Job, int]:
    return {
        Job("own", "matmul"): 100,
        Job("own", "softmax"): 5,
        Job("own", "reduce"): 5,
        Job("cross", "matmul"): 10,
        Job("tail", "matmul"): 0,
    }


# -- shares -------------------------------------------------------------------------------


def test_normalize_shares() -> None:
    assert normalize_shares({"own": 60, "cross": 25, "tail": 15}) == pytest.approx(
        {"own": 0.6, "cross": 0.25, "tail": 0.15}
    )
    assert normalize_shares({"cross": 3}) == {"own": 0.0, "cross": 1.0, "tail": 0.0}


@pytest.mark.parametrize(
    ("shares", "match"),
    [
        ({"own": 60, "cross": -1, "tail": 15}, r"--share-cross must be .*>= 0, got -1"),
        ({"own": -0.5}, r"--share-own must be .*got -0.5"),
        ({"own": math.nan}, r"--share-own"),
        ({"own": 0, "cross": 0, "tail": 0}, r"at least one share must be positive"),
        ({}, r"at least one share must be positive"),
        ({"owns": 1}, r"unknown slice 'owns'.*own, cross, tail"),
    ],
)
def test_bad_shares(shares: dict, match: str) -> None:
    with pytest.raises(ShareError, match=match):
        normalize_shares(shares)
    assert issubclass(ShareError, ValueError)


# -- order and nominal --------------------------------------------------------------------


def test_job_id() -> None:
    assert Job("own", "rms_norm").id == "own-rms_norm"


def test_order_slices_then_smallest_pool_then_name() -> None:
    plan = BudgetPlan(100, SHARES, _pool())
    assert [j.id for j in plan.order] == ["own-reduce", "own-softmax", "own-matmul", "cross-matmul"]


def test_nominal_renormalized_over_runnable_slices() -> None:
    plan = BudgetPlan(100, SHARES, _pool())  # tail has no points: its 20 % is spread
    assert plan.nominal == pytest.approx({"own": 75.0, "cross": 25.0, "tail": 0.0})


def test_zero_share_slice_never_runs() -> None:
    plan = BudgetPlan(100, {"own": 0, "cross": 1, "tail": 1}, _pool())
    assert [j.id for j in plan.order] == ["cross-matmul"]
    assert plan.nominal == {"own": 0.0, "cross": 100.0, "tail": 0.0}
    with pytest.raises(
        ValueError, match=r"'own-matmul' is not in the plan: .*zero share \(--share-own\)"
    ):
        plan.allotment(Job("own", "matmul"))


def test_empty_job_not_in_plan() -> None:
    plan = BudgetPlan(100, SHARES, _pool())
    with pytest.raises(ValueError, match=r"'tail-matmul' is not in the plan: it has no points"):
        plan.allotment(Job("tail", "matmul"))


def test_nothing_to_run() -> None:
    plan = BudgetPlan(100, SHARES, {Job("own", "matmul"): 0})
    assert plan.order == []
    assert plan.next_job is None
    assert plan.nominal == {"own": 0.0, "cross": 0.0, "tail": 0.0}


# -- allotments ---------------------------------------------------------------------------


def test_allotments_flow_inside_and_across_slices() -> None:
    plan = BudgetPlan(100, SHARES, _pool())
    reduce_, softmax, matmul, cross = plan.order
    assert plan.allotment(reduce_) == pytest.approx(25.0)  # 75 / 3 kinds
    plan.record(reduce_, 10.0)  # 15 s unused: own's later kinds share it (own keeps 75 s)
    assert plan.allotment(softmax) == pytest.approx((75 - 10) / 2)
    plan.record(softmax, 32.5)
    assert plan.allotment(matmul) == pytest.approx(75 - 42.5)
    plan.record(matmul, 30.0)  # 2.5 s unused flows to cross
    assert plan.allotment(cross) == pytest.approx(27.5)
    assert plan.spent_s == pytest.approx(72.5)
    plan.record(cross, 27.5)
    assert plan.next_job is None
    assert plan.remaining_s == pytest.approx(0.0)


def test_a_slice_that_uses_all_it_gets_takes_only_its_share() -> None:
    """The case of a 300 s H200 sweep: eight own jobs each spent what they were given, and the
    own slice, given its share of what was left before each job, took 74% of the budget for a
    60% share; six tail jobs were then skipped with 1 to 3 s each."""
    pool = {**{Job("own", k): 10_000 for k in "abcdefgh"},
            **{Job("tail", k): 10_000 for k in "abcdef"}}
    plan = BudgetPlan(300, {"own": 60, "cross": 25, "tail": 15}, pool)
    for job in list(plan.order):
        plan.record(job, plan.allotment(job))
        if job.slice == "tail":
            assert plan._spent[job] == pytest.approx(300 * 15 / 75 / 6)
    assert sum(t for j, t in plan._spent.items() if j.slice == "own") == pytest.approx(240.0)


def test_time_flows_back_to_a_slice_from_the_slices_that_cannot_use_it() -> None:
    """The case seen on a real plan: cross and tail run dry quickly, own has points left."""
    pool = {Job("own", "matmul"): 10_000, Job("cross", "matmul"): 100, Job("tail", "matmul"): 50}
    plan = BudgetPlan(1000, SHARES, pool, s_per_point=0.1)
    own, cross, tail = plan.order
    # cross can use 1.5 × 100 × 0.1 = 15 s and tail 7.5 s: own gets the rest, now (whatever
    # the shares say)
    assert plan.allotment(own) == pytest.approx(1000 - 15 - 7.5)
    plan.record(own, 977.5)
    assert plan.allotment(cross) == pytest.approx(15.0)


def test_an_exhausted_slice_shares_its_time_in_proportion() -> None:
    """Own runs dry: its unused time goes to cross and tail 25:15 (0.625 for cross)."""
    pool = {Job("own", "softmax"): 10, Job("cross", "matmul"): 10_000, Job("tail", "matmul"): 10_000}
    plan = BudgetPlan(1000, {"own": 60, "cross": 25, "tail": 15}, pool, s_per_point=0.1)
    own, cross, tail = plan.order
    assert plan.allotment(own) == pytest.approx(1.5)  # 10 points: all it can use
    plan.record(own, 1.0)
    assert plan.allotment(cross) == pytest.approx(999.0 * 25 / 40)


def test_a_small_kind_gets_what_it_needs_and_the_big_one_the_rest() -> None:
    pool = {Job("own", "softmax"): 20, Job("own", "matmul"): 5000}
    plan = BudgetPlan(100, {"own": 1}, pool, s_per_point={"softmax": 0.1, "matmul": 0.1},
                      job_overhead_s=2.0)
    softmax, matmul = plan.order
    assert plan.allotment(softmax) == pytest.approx(1.5 * 20 * 0.1 + 2.0)
    plan.record(softmax, 4.0)
    assert plan.allotment(matmul) == pytest.approx(96.0)
    plan.learn("matmul", 0.001)  # faster than thought: capped at what it can use
    assert plan.allotment(matmul) == pytest.approx(1.5 * 5000 * 0.001 + 2.0)


def test_a_job_of_a_few_costly_points_gets_their_time() -> None:
    """A later session's own jobs may hold only torch.compile's baselines (seconds each, where
    the kind's rate says 0.05 s a point): what they need is their extra seconds, not their
    count at the rate, so they are not starved by the tail jobs after them."""
    pool = {Job("own", "matmul"): 10, Job("tail", "matmul"): 5000}
    rates = {"matmul": 0.05}
    starved = BudgetPlan(240, {"own": 60, "cross": 25, "tail": 15}, pool, s_per_point=rates,
                         job_overhead_s=2.0)
    assert starved.allotment(Job("own", "matmul")) == pytest.approx(1.5 * 10 * 0.05 + 2.0)
    plan = BudgetPlan(240, {"own": 60, "cross": 25, "tail": 15}, pool, s_per_point=rates,
                      job_overhead_s=2.0, extra_s={Job("own", "matmul"): 5 * 10.0})
    own = plan.allotment(Job("own", "matmul"))
    assert own == pytest.approx(1.5 * (10 * 0.05 + 50.0) + 2.0)
    plan.record(Job("own", "matmul"), 40.0)
    assert plan.allotment(Job("tail", "matmul")) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="extra_s"):
        BudgetPlan(240, {"own": 1}, pool, extra_s={Job("own", "matmul"): -1.0})


def test_a_job_of_a_few_points_is_not_capped_under_the_least_a_job_can_use() -> None:
    """Seen on an H200: a cross job of 7 points needed 2.6 s by its kind's pace, was given
    exactly that, and was then skipped as under the 3 s a job needs to measure anything."""
    pool = {Job("cross", "mlp_geglu"): 7, Job("cross", "matmul"): 5000}
    rates = {"mlp_geglu": 0.061, "matmul": 0.08}
    capped = BudgetPlan(300, {"cross": 1}, pool, s_per_point=rates, job_overhead_s=2.0)
    assert capped.allotment(Job("cross", "mlp_geglu")) == pytest.approx(1.5 * 7 * 0.061 + 2.0)
    plan = BudgetPlan(300, {"cross": 1}, pool, s_per_point=rates, job_overhead_s=2.0,
                      min_job_s=3.0)
    assert plan.allotment(Job("cross", "mlp_geglu")) == pytest.approx(3.0)


def test_overrun_shrinks_later_allotments_and_never_negative() -> None:
    plan = BudgetPlan(100, SHARES, _pool())
    reduce_, softmax, matmul, cross = plan.order
    plan.record(reduce_, 10.0)
    plan.record(softmax, 32.5)
    plan.record(matmul, 40.0)  # 7.5 s over its allotment
    assert plan.allotment(cross) == pytest.approx(17.5)  # what is left: 100 - 82.5

    plan = BudgetPlan(100, SHARES, _pool())
    plan.record(plan.order[0], 150.0)  # far over the whole budget
    assert plan.allotment(plan.order[1]) == 0.0
    assert plan.remaining_s == 0.0


def test_skip_leaves_all_time_to_the_rest() -> None:
    plan = BudgetPlan(90, {"own": 1}, {Job("own", "a"): 1, Job("own", "b"): 2, Job("own", "c"): 3})
    a, b, c = plan.order
    assert plan.allotment(a) == pytest.approx(30.0)
    plan.skip(a)
    assert plan.allotment(b) == pytest.approx(45.0)
    plan.skip(b)
    assert plan.allotment(c) == pytest.approx(90.0)


def test_out_of_order_and_double_record_rejected() -> None:
    plan = BudgetPlan(100, SHARES, _pool())
    first, second = plan.order[:2]
    with pytest.raises(
        ValueError, match=r"'own-softmax' asked out of order; the next job is 'own-reduce'"
    ):
        plan.allotment(second)
    with pytest.raises(ValueError, match="out of order"):
        plan.record(second, 1.0)
    plan.record(first, 1.0)
    with pytest.raises(ValueError, match="already finished"):
        plan.record(first, 1.0)


@pytest.mark.parametrize("spent", [-1.0, math.inf, math.nan])
def test_bad_spent_rejected(spent: float) -> None:
    plan = BudgetPlan(100, SHARES, _pool())
    with pytest.raises(ValueError, match="spent_s must be"):
        plan.record(plan.order[0], spent)


@pytest.mark.parametrize("budget", [-1.0, math.nan])
def test_bad_budget_rejected(budget: float) -> None:
    with pytest.raises(ValueError, match="--budget-s"):
        BudgetPlan(budget, SHARES, _pool())


def test_bad_pool_rejected() -> None:
    with pytest.raises(ValueError, match="unknown slice 'near'"):
        BudgetPlan(1, SHARES, {Job("near", "matmul"): 3})
    with pytest.raises(ValueError, match="negative pool"):
        BudgetPlan(1, SHARES, {Job("own", "matmul"): -3})


def test_infinite_budget() -> None:
    plan = BudgetPlan(math.inf, SHARES, _pool())
    assert plan.allotment(plan.order[0]) == math.inf


# -- properties ---------------------------------------------------------------------------

KINDS = ["matmul", "reduce", "rms_norm", "softmax", "attention"]

_pools = st.dictionaries(
    st.builds(Job, st.sampled_from(SLICES), st.sampled_from(KINDS)), st.integers(0, 50), max_size=12
)
_shares = st.fixed_dictionaries({name: st.integers(0, 100) for name in SLICES}).filter(
    lambda s: sum(s.values()) > 0
)
_budgets = st.floats(1.0, 1e5)
_fracs = st.lists(st.floats(0.0, 1.0), min_size=15, max_size=15)


def _run(plan: BudgetPlan, fracs: list[float]) -> list[tuple[float, float, float]]:
    """Run every job spending ``frac × allotment``; returns (spent before, allotment, spent)."""
    steps = []
    for job, frac in zip(plan.order, fracs, strict=False):  # fracs is long enough
        before = plan.spent_s
        allot = plan.allotment(job)
        plan.record(job, frac * allot)
        steps.append((before, allot, frac * allot))
    return steps


@settings(max_examples=200)
@given(_budgets, _shares, _pools)
def test_order_is_sorted_and_excludes_empty_and_zero_share(budget, shares, pool) -> None:
    plan = BudgetPlan(budget, shares, pool)
    expected = [
        j
        for name in SLICES
        if shares[name] > 0
        for j in sorted(
            (j for j in pool if j.slice == name and pool[j] > 0), key=lambda j: (pool[j], j.kind)
        )
    ]
    assert plan.order == expected
    for name in SLICES:
        if shares[name] == 0:
            assert all(j.slice != name for j in plan.order)
            assert plan.nominal[name] == 0.0
    if plan.order:
        assert sum(plan.nominal.values()) == pytest.approx(budget)


@settings(max_examples=200)
@given(_budgets, _shares, _pools, _fracs)
def test_budget_never_exceeded_when_jobs_keep_to_allotments(budget, shares, pool, fracs) -> None:
    plan = BudgetPlan(budget, shares, pool)
    for before, allot, _spent in _run(plan, fracs):
        assert allot > 0  # every runnable job gets some time
        assert before + allot <= budget * (1 + 1e-9)
    assert plan.spent_s <= budget * (1 + 1e-9)


@settings(max_examples=200)
@given(_budgets, _shares, _pools, st.lists(st.floats(0.0, 3.0), min_size=15, max_size=15))
def test_overruns_only_cost_themselves(budget, shares, pool, fracs) -> None:
    plan = BudgetPlan(budget, shares, pool)
    overrun = 0.0
    for before, allot, spent in _run(plan, fracs):
        assert allot >= 0
        assert allot <= max(0.0, budget - before) * (1 + 1e-9)
        overrun += max(0.0, spent - allot)
    assert plan.spent_s <= (budget + overrun) * (1 + 1e-9)


def _next_allotment_after(budget, shares, pool, fracs, i: int, frac_i: float) -> float:
    plan = BudgetPlan(budget, shares, pool)
    fracs = list(fracs)
    fracs[i] = frac_i
    _run(plan, fracs[: i + 1])
    return plan.allotment(plan.order[i + 1])


@settings(max_examples=100)
@given(_budgets, _shares, _pools, _fracs, st.data())
def test_unused_time_of_a_kind_flows_to_next_kinds(budget, shares, pool, fracs, data) -> None:
    order = BudgetPlan(budget, shares, pool).order
    pairs = [i for i in range(len(order) - 1) if order[i].slice == order[i + 1].slice]
    assume(pairs)
    i = data.draw(st.sampled_from(pairs))
    thrifty = _next_allotment_after(budget, shares, pool, fracs, i, 0.0)
    greedy = _next_allotment_after(budget, shares, pool, fracs, i, 1.0)
    assert thrifty > greedy


@settings(max_examples=100)
@given(_budgets, _shares, _pools, _fracs, st.data())
def test_unused_slice_time_flows_to_later_slices(budget, shares, pool, fracs, data) -> None:
    order = BudgetPlan(budget, shares, pool).order
    edges = [i for i in range(len(order) - 1) if order[i].slice != order[i + 1].slice]
    assume(edges)
    i = data.draw(st.sampled_from(edges))
    thrifty = _next_allotment_after(budget, shares, pool, fracs, i, 0.0)
    greedy = _next_allotment_after(budget, shares, pool, fracs, i, 1.0)
    assert thrifty > greedy


@settings(max_examples=100)
@given(
    st.fixed_dictionaries(
        {name: st.one_of(st.just(0.0), st.floats(1e-6, 1e300)) for name in SLICES}
    )
)
def test_normalized_shares_sum_to_one(shares) -> None:
    assume(sum(shares.values()) > 0)
    out = normalize_shares(shares)
    assert sum(out.values()) == pytest.approx(1.0)
    assert all((out[n] == 0) == (shares[n] == 0) for n in SLICES)


def test_explicit_order_is_kept_and_checked():
    pool = {Job("own", "matmul"): 50, Job("own", "softmax"): 5, Job("tail", "matmul"): 9,
            Job("cross", "softmax"): 0}
    order = [Job("own", "matmul"), Job("own", "softmax"), Job("cross", "softmax"), Job("tail", "matmul")]
    plan = BudgetPlan(100.0, {"own": 60, "cross": 25, "tail": 15}, pool, order=order)
    assert plan.order == [Job("own", "matmul"), Job("own", "softmax"), Job("tail", "matmul")]
    assert plan.allotment(Job("own", "matmul")) == pytest.approx(plan.nominal["own"] / 2)
    with pytest.raises(ValueError, match="own → cross → tail"):
        BudgetPlan(100.0, {"own": 60, "cross": 25, "tail": 15}, pool, order=list(reversed(order)))
    with pytest.raises(ValueError, match="leaves out runnable jobs: own-softmax"):
        BudgetPlan(100.0, {"own": 60, "cross": 25, "tail": 15}, pool, order=order[:1] + order[3:])


@settings(max_examples=300)
@given(_budgets, _shares, _pools, st.dictionaries(st.sampled_from(KINDS), st.floats(0.01, 10.0)))
def test_with_true_rates_no_budget_is_left_while_a_job_has_points_left(budget, shares, pool, rates) -> None:
    """Jobs spend what their points take (at the rate the plan was told) or their allotment;
    if some job ran out of time with points left, at most 5% of the budget was left unspent."""
    rates = {k: rates.get(k, 1.0) for k in KINDS}
    plan = BudgetPlan(budget, shares, pool, s_per_point=rates)
    stranded = False
    for job in list(plan.order):
        allot = plan.allotment(job)
        need = plan.pool[job] * rates[job.kind]
        stranded |= allot < need
        plan.record(job, min(allot, need))
    # then the top-ups: what is left goes to the jobs with points left
    left = {job: 0 for job in plan.order}
    for _ in range(3):
        points = {}
        for job in plan.order:
            done_s = plan._spent[job]
            points[job] = max(0, plan.pool[job] - int(done_s / rates[job.kind] + 1e-9))
        extra = plan.top_ups(points)
        for job, allot in extra.items():
            plan.record_top_up(job, min(allot, points[job] * rates[job.kind]))
        left = points
    still = any(left[job] > 1 for job in plan.order)  # a last point may not fit
    if stranded and still:
        assert plan.remaining_s <= 0.05 * budget + max(rates.values()) + 1e-6


# -- the session: every job in turn, then top-ups, on the clock of whoever runs it -----------

def test_a_box_of_several_lanes_needs_a_lanes_th_of_the_time() -> None:
    pool = {Job("own", "softmax"): 100}
    one = BudgetPlan(1000, SHARES, pool, s_per_point=1.0)
    four = BudgetPlan(1000, SHARES, pool, s_per_point=1.0, lanes=4)
    assert four.need_s(Job("own", "softmax")) == pytest.approx(
        one.need_s(Job("own", "softmax")) / 4)
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        BudgetPlan(10, SHARES, pool, lanes=0)


def test_a_session_runs_each_job_once_in_order_then_tops_up_what_is_left() -> None:
    from harness.planner import Ran, run_session

    pool = {Job("own", "softmax"): 10, Job("own", "matmul"): 100, Job("tail", "matmul"): 50}
    plan = BudgetPlan(100, SHARES, pool, s_per_point={"softmax": 0.1, "matmul": 0.1},
                      min_job_s=3.0)
    left = dict(pool)
    runs: list[tuple[str, int, float]] = []

    def run(job: Job, allot: float, rnd: int) -> Ran:
        # each job measures 1 point a second (ten times slower than the plan was told)
        n = min(left[job], int(allot))
        left[job] -= n
        runs.append((job.id, rnd, round(allot, 1)))
        return Ran(spent_s=float(n) if left[job] == 0 else allot, points_left=left[job])

    run_session(plan, run)
    assert [r[:2] for r in runs[:3]] == [("own-softmax", 0), ("own-matmul", 0), ("tail-matmul", 0)]
    assert all(rnd > 0 for _, rnd, _ in runs[3:]) and runs[3:]  # top-ups after the last job
    assert plan.remaining_s < 3.0  # spent while points remained
    assert sum(left.values()) > 0


def test_a_top_up_round_that_measures_nothing_gets_all_that_is_left_once_then_ends() -> None:
    from harness.planner import Ran, run_session

    pool = {Job("own", "softmax"): 10}
    plan = BudgetPlan(100, SHARES, pool, s_per_point=1.0, min_job_s=3.0)
    calls = []

    def run(job: Job, allot: float, rnd: int) -> Ran:
        calls.append((rnd, round(allot, 1)))
        return Ran(spent_s=1.0, points_left=10)  # every point times out, none is measured

    run_session(plan, run)
    assert [rnd for rnd, _ in calls] == [0, 1, 2]
    assert calls[2][1] == round(plan.budget_s - 2.0, 1)  # the last try: all that was left


def test_a_job_allotted_under_what_a_job_can_use_is_skipped_and_said() -> None:
    from harness.planner import Ran, run_session

    pool = {Job("own", "softmax"): 10, Job("tail", "softmax"): 10}
    plan = BudgetPlan(4, {"own": 90, "tail": 10}, pool, s_per_point=1.0, min_job_s=3.0)
    skipped, ran = [], []
    run_session(plan, lambda job, allot, rnd: ran.append((job.id, rnd)) or Ran(allot, 10),
                skip=lambda job, allot: skipped.append((job.id, round(allot, 1))))
    assert skipped == [("tail-softmax", 0.4)]
    assert ran == [("own-softmax", 0)]


def test_stopping_is_asked_before_every_run() -> None:
    from harness.planner import Ran, run_session

    pool = {Job("own", "softmax"): 10, Job("own", "matmul"): 10}
    plan = BudgetPlan(100, SHARES, pool, s_per_point=1.0)
    ran = []
    run_session(plan, lambda job, allot, rnd: ran.append(job.id) or Ran(1.0, 0),
                stopping=lambda: len(ran) >= 1)
    assert ran == [plan.order[0].id]


@settings(max_examples=200)
@given(st.floats(10.0, 5000.0), _shares, _pools,
       st.dictionaries(st.sampled_from(KINDS), st.floats(0.01, 1.5)),
       st.dictionaries(st.sampled_from(KINDS), st.floats(0.2, 5.0)), st.integers(1, 4))
def test_a_session_never_ends_with_budget_unspent_while_a_job_has_points(
        budget, shares, pool, told, truth, lanes) -> None:
    """Whatever the rates the plan was told, and however fast the jobs really are (each point
    under what a job can use), the session ends with every point measured or the budget spent
    (less than a job can use left); each run overruns its allotment by at most a point."""
    from harness.planner import Simulated, run_session

    told = {k: told.get(k, 0.1) for k in KINDS}
    truth = {k: truth.get(k, 1.0) for k in KINDS}
    plan = BudgetPlan(budget, shares, pool, s_per_point=told, lanes=lanes, min_job_s=3.0,
                      job_overhead_s=1.0)
    sim = Simulated({j: n for j, n in pool.items()}, truth, lanes=lanes, overhead_s=1.0)
    run_session(plan, sim)
    left = sum(sim.left[j] for j in plan.order)
    assert sim.log is not None
    for r in sim.log:
        assert r["spent_s"] <= r["allotment_s"] + max(truth.values()) / lanes + 1e-9
    assert left == 0 or plan.remaining_s < 3.0
