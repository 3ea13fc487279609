"""Tests of splitting a pool into own / cross / tail slices (harness.slices)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.points import make_spec, spec_distance
from harness.slices import SLICES, assign_slices, tail_order

POOL10 = [f"A={i}" for i in range(10)]


def test_slice_names() -> None:
    assert SLICES == ("own", "cross", "tail")


def test_tail_cap_literal_example() -> None:
    # Checked by hand: the three smallest sha1 hex digests of "A=0".."A=9".
    out = assign_slices(POOL10, [], [], max_dist=2, tail_cap=3)
    assert out == {"own": [], "cross": [], "tail": ["A=5", "A=9", "A=3"]}


def test_tail_order_is_sha1_order() -> None:
    expected = sorted(POOL10, key=lambda s: hashlib.sha1(s.encode("utf-8")).hexdigest())
    assert tail_order(POOL10) == expected
    assert tail_order(reversed(POOL10)) == expected


def test_own_wins_ties() -> None:
    out = assign_slices(["A=1,B=1"], ["A=0,B=1"], ["A=1,B=0"], max_dist=1, tail_cap=10)
    assert out == {"own": ["A=1,B=1"], "cross": [], "tail": []}


def test_boundary_inclusive() -> None:
    spec = "A=1,B=1,C=1"
    anchor = "A=0,B=0,C=1"  # distance 2
    assert spec_distance(spec, anchor) == 2
    assert assign_slices([spec], [anchor], [], max_dist=2, tail_cap=5)["own"] == [spec]
    assert assign_slices([spec], [], [anchor], max_dist=2, tail_cap=5)["cross"] == [spec]
    assert assign_slices([spec], [anchor], [anchor], max_dist=1, tail_cap=5)["tail"] == [spec]


def test_cross_when_own_too_far() -> None:
    out = assign_slices(["A=1,B=1", "A=9,B=9"], ["A=5,B=5"], ["A=1,B=0"], max_dist=1, tail_cap=10)
    assert out == {"own": [], "cross": ["A=1,B=1"], "tail": ["A=9,B=9"]}


def test_component_aware_distance_used() -> None:
    out = assign_slices(["T=d2/f4x4/cp"], ["T=d2/f2x4/cp"], [], max_dist=1, tail_cap=5)
    assert out["own"] == ["T=d2/f4x4/cp"]


def test_dedupe_keeps_first_occurrence_and_enumeration_order() -> None:
    specs = ["A=3", "A=1", "A=3", "A=2", "A=1"]
    out = assign_slices(specs, ["A=0"], [], max_dist=1, tail_cap=0)
    assert out["own"] == ["A=3", "A=1", "A=2"]  # each 1 step from A=0, enumeration order


def test_anchor_not_in_pool_still_counts() -> None:
    out = assign_slices(["A=1,B=1"], ["A=1,B=2"], [], max_dist=1, tail_cap=5)
    assert out["own"] == ["A=1,B=1"]


def test_negative_tail_cap_rejected() -> None:
    with pytest.raises(ValueError, match="--tail-cap"):
        assign_slices(POOL10, [], [], max_dist=2, tail_cap=-1)


# -- properties ---------------------------------------------------------------------------

_spec = st.fixed_dictionaries(
    {},
    optional={
        "A": st.sampled_from(["0", "1", "2"]),
        "B": st.sampled_from(["0", "1", "2"]),
        "T": st.sampled_from(["d2/cp", "d2/f2/cp", "d3/f2/cp", "d2"]),
    },
).map(make_spec)
_specs = st.lists(_spec, max_size=30)
_anchors = st.lists(_spec, max_size=3)


@settings(max_examples=150)
@given(_specs, _anchors, _anchors, st.integers(0, 4), st.integers(0, 10))
def test_slices_disjoint_and_cover(
    specs: list[str], own: list[str], cross: list[str], max_dist: int, cap: int
) -> None:
    out = assign_slices(specs, own, cross, max_dist, cap)
    assert set(out) == set(SLICES)
    picked = [s for name in SLICES for s in out[name]]
    assert len(picked) == len(set(picked))  # disjoint, no duplicates
    deduped = list(dict.fromkeys(specs))
    in_own_or_cross = set(out["own"]) | set(out["cross"])
    rest = [s for s in deduped if s not in in_own_or_cross]
    assert out["tail"] == tail_order(rest)[:cap]
    assert set(picked) == set(deduped) - set(tail_order(rest)[cap:])
    # own and cross keep enumeration order
    for name in ("own", "cross"):
        assert out[name] == [s for s in deduped if s in set(out[name])]
    # slice rules
    for s in out["own"]:
        assert min(spec_distance(s, a) for a in own) <= max_dist
    for s in out["cross"]:
        assert not own or min(spec_distance(s, a) for a in own) > max_dist
        assert min(spec_distance(s, a) for a in cross) <= max_dist
    for s in rest:
        assert not own or min(spec_distance(s, a) for a in own) > max_dist
        assert not cross or min(spec_distance(s, a) for a in cross) > max_dist


@settings(max_examples=150)
@given(_specs, _anchors, _anchors, st.integers(0, 4), st.integers(0, 10), st.randoms())
def test_tail_independent_of_enumeration_order(
    specs: list[str], own: list[str], cross: list[str], max_dist: int, cap: int, rnd
) -> None:
    shuffled = list(specs)
    rnd.shuffle(shuffled)
    a = assign_slices(specs, own, cross, max_dist, cap)
    b = assign_slices(shuffled, own, cross, max_dist, cap)
    assert a["tail"] == b["tail"]
    assert set(a["own"]) == set(b["own"])
    assert set(a["cross"]) == set(b["cross"])
