"""Tests of spec strings, point keys and knob distance (harness.points)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.points import (
    SpecError,
    knob_distance,
    make_spec,
    parse_spec,
    point_key,
    spec_digest,
    spec_distance,
)

# -- examples -----------------------------------------------------------------------------


def test_spec_is_sorted_by_key_and_values_stringified() -> None:
    assert make_spec({"num_warps": 4, "BLOCK_M": 128, "ALPHA": "x"}) == (
        "ALPHA=x,BLOCK_M=128,num_warps=4"
    )


def test_empty_mapping_is_empty_spec() -> None:
    assert make_spec({}) == ""
    assert parse_spec("") == {}


def test_empty_value_allowed() -> None:
    assert make_spec({"RASTER": "", "A": 1}) == "A=1,RASTER="
    assert parse_spec("A=1,RASTER=") == {"A": "1", "RASTER": ""}


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"a": "1,2"}, r"value '1,2' \(knob 'a'\) contains ','"),
        ({"a": "x=y"}, r"value 'x=y' \(knob 'a'\) contains '='"),
        ({"a,b": 1}, r"key 'a,b'.*contains ','"),
        ({"a=b": 1}, r"key 'a=b'.*contains '='"),
        ({"": 1}, r"empty knob key"),
        ({3: 1}, r"knob key 3 is a int"),
    ],
)
def test_make_spec_rejects(knobs: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        make_spec(knobs)


def test_spec_error_is_value_error() -> None:
    assert issubclass(SpecError, ValueError)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("a", r"'a' is not K=V"),
        ("a=1,", r"'' is not K=V"),
        (",a=1", r"'' is not K=V"),
        ("=1", r"empty key"),
        ("a=1=2", r"more than one '='"),
        ("a=1,a=2", r"'a' appears twice"),
    ],
)
def test_parse_spec_rejects(spec: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_spec(spec)


def test_parse_spec_accepts_any_item_order() -> None:
    assert parse_spec("b=2,a=1") == {"a": "1", "b": "2"}


def test_digest_and_point_key() -> None:
    spec = "BLOCK_M=128,num_warps=4"
    digest = hashlib.sha1(spec.encode()).hexdigest()[:16]
    assert spec_digest(spec) == digest
    assert len(digest) == 16
    assert point_key("NVIDIA L40S", "M4096xN4096xK4096_bf16", spec) == (
        f"NVIDIA L40S|M4096xN4096xK4096_bf16|{digest}"
    )


@pytest.mark.parametrize(("gpu", "shape"), [("a|b", "s"), ("g", "s|t")])
def test_point_key_rejects_separator(gpu: str, shape: str) -> None:
    with pytest.raises(ValueError, match=r"contains '\|'"):
        point_key(gpu, shape, "")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ({"T": "d2/f4x4/cp"}, {"T": "d2/f2x4/cp"}, 1),
        ({}, {"T": "a/b/c"}, 3),
        ({"T": "d2/cp"}, {"T": "d2/cp/ring"}, 1),
        ({"A": "1", "B": "2"}, {"A": "1", "B": "3"}, 1),
        ({"A": "1"}, {"B": "1"}, 2),
        ({"A": "1", "T": "a/b"}, {"A": "2", "T": "x/y"}, 3),
        ({"A": ""}, {}, 0),
        ({"T": "a/"}, {"T": "a"}, 1),  # differ, though segment-equal after padding
        ({"A": 4}, {"A": "4"}, 0),
    ],
)
def test_knob_distance_examples(a: dict, b: dict, expected: int) -> None:
    assert knob_distance(a, b) == expected
    assert knob_distance(b, a) == expected


def test_spec_distance() -> None:
    assert spec_distance("A=1,T=d2/f4x4/cp", "A=1,T=d2/f2x4/cp") == 1
    assert spec_distance("", "T=a/b/c") == 3
    assert spec_distance("A=1", "A=1") == 0


# -- properties ---------------------------------------------------------------------------

_key = st.text(
    st.characters(blacklist_characters=",=", blacklist_categories=("Cs",)), min_size=1, max_size=8
)
_value = st.text(st.characters(blacklist_characters=",=", blacklist_categories=("Cs",)), max_size=8)
_knobs = st.dictionaries(_key, _value, max_size=6)

# Small alphabets so that values collide and share segments often.
_seg_value = st.lists(st.sampled_from(["", "a", "b", "d2"]), min_size=1, max_size=4).map("/".join)
_small_knobs = st.dictionaries(st.sampled_from(["A", "B", "T", "W"]), _seg_value, max_size=4)


def _filled(a: dict[str, str], keys: set[str]) -> dict[str, str]:
    return {k: a.get(k, "") for k in keys}


@settings(max_examples=200)
@given(_knobs)
def test_spec_round_trip(knobs: dict[str, str]) -> None:
    spec = make_spec(knobs)
    assert parse_spec(spec) == knobs
    assert make_spec(parse_spec(spec)) == spec


@settings(max_examples=100)
@given(_knobs)
def test_spec_independent_of_insertion_order(knobs: dict[str, str]) -> None:
    assert make_spec(dict(reversed(list(knobs.items())))) == make_spec(knobs)


@settings(max_examples=200)
@given(_small_knobs, _small_knobs)
def test_distance_symmetric_and_zero_iff_equal(a: dict[str, str], b: dict[str, str]) -> None:
    d = knob_distance(a, b)
    assert d == knob_distance(b, a)
    assert d >= 0
    keys = set(a) | set(b)
    assert (d == 0) == (_filled(a, keys) == _filled(b, keys))


@settings(max_examples=200)
@given(_small_knobs, _small_knobs, _small_knobs)
def test_distance_triangle_inequality(
    a: dict[str, str], b: dict[str, str], c: dict[str, str]
) -> None:
    assert knob_distance(a, c) <= knob_distance(a, b) + knob_distance(b, c)


@settings(max_examples=100)
@given(_small_knobs, _small_knobs)
def test_spec_distance_matches_knob_distance(a: dict[str, str], b: dict[str, str]) -> None:
    assert spec_distance(make_spec(a), make_spec(b)) == knob_distance(a, b)


def _distance_as_defined(a: dict, b: dict) -> int:
    """The docstring's definition, written out: over the union of keys, a missing knob is
    ``""``, values compared through ``str()``."""
    from harness.points import _value_distance

    return sum(_value_distance(str(a.get(k, "")), str(b.get(k, "")))
               for k in a.keys() | b.keys() if str(a.get(k, "")) != str(b.get(k, "")))


_mixed_value = st.one_of(st.integers(-3, 3), st.booleans(), st.sampled_from(
    ["", "0", "1", "True", "a/b", "a/c", "a/", "a", "1.0"]), st.sampled_from([1.0, 0.0, -0.0]))
_mixed_knobs = st.dictionaries(st.sampled_from(["A", "B", "C", "D"]), _mixed_value, max_size=4)


@settings(max_examples=400)
@given(_mixed_knobs, _mixed_knobs, st.one_of(st.none(), st.integers(0, 4)))
def test_knob_distance_is_its_definition_with_any_values_and_limit(a: dict, b: dict,
                                                                   limit: int | None) -> None:
    """Ints against their strings, bools against ints, floats, "/" values, missing keys: the
    fast path for equal values changes no answer; with a limit, any answer above it stays
    above it."""
    want = _distance_as_defined(a, b)
    got = knob_distance(a, b, limit=limit)
    if limit is None or want <= limit:
        assert got == want
    else:
        assert got > limit
