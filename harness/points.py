"""Spec strings, point keys and the knob distance that every slice and ledger entry is built on.

A *spec* is a kernel configuration written as one stable string: the knobs sorted by name and
joined ``K1=V1,K2=V2``.  It is the ledger key's input, the node key's input and part of test
ids, so it must be canonical (one configuration, one string) and must parse back unambiguously
— which is why ``,`` and ``=`` are refused inside keys and values.

A *point* is (card, shape, spec); its key is ``"{gpu}|{shape_id}|{sha1(spec)[:16]}"``.

The *knob distance* counts differing knobs, component-aware: a value made of ``/``-separated
parts (``d2/f4x4/cp``) counts each differing part, so two stage pipelines that differ in one
stage are one step apart rather than "different".

Stdlib only: this module is imported on the box.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = [
    "SpecError",
    "knob_distance",
    "make_spec",
    "parse_spec",
    "point_key",
    "spec_digest",
    "spec_distance",
]

_FORBIDDEN = (",", "=")


class SpecError(ValueError):
    """A knob mapping that cannot be written as a spec, or a string that is not one."""


def _check_part(what: str, key: str, text: str) -> None:
    for ch in _FORBIDDEN:
        if ch in text:
            raise SpecError(
                f"knob {what} {text!r} (knob {key!r}) contains {ch!r}; "
                "spec keys and values may not contain ',' or '=' because a spec is "
                "written K1=V1,K2=V2"
            )


def make_spec(knobs: Mapping[str, object]) -> str:
    """Write ``knobs`` as a canonical spec: values through ``str()``, sorted by key, ``K=V,K=V``.

    An empty mapping gives ``""``.  Raises :class:`SpecError` naming the key (and value) for
    an empty or non-string key, or a ``,`` / ``=`` in a key or a value.
    """
    items: list[tuple[str, str]] = []
    for key, value in knobs.items():
        if not isinstance(key, str):
            raise SpecError(f"knob key {key!r} is a {type(key).__name__}; knob keys must be str")
        if not key:
            raise SpecError(f"empty knob key (value {value!r}); every knob needs a name")
        text = str(value)
        if "," in key or "=" in key or "," in text or "=" in text:
            _check_part("key", key, key)
            _check_part("value", key, text)
        items.append((key, text))
    items.sort()
    return ",".join(f"{k}={v}" for k, v in items)


def parse_spec(spec: str) -> dict[str, str]:
    """Read a spec back into its knobs (the inverse of :func:`make_spec`); ``""`` gives ``{}``.

    Item order is not checked (the dict has none), but every item must be ``K=V`` with a
    non-empty key, no second ``=``, and no key repeated; otherwise :class:`SpecError`.
    """
    if spec == "":
        return {}
    knobs: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"spec {spec!r}: item {item!r} is not K=V")
        if not key:
            raise SpecError(f"spec {spec!r}: item {item!r} has an empty key")
        if "=" in value:
            raise SpecError(f"spec {spec!r}: item {item!r} has more than one '='")
        if key in knobs:
            raise SpecError(f"spec {spec!r}: knob {key!r} appears twice")
        knobs[key] = value
    return knobs


def spec_digest(spec: str) -> str:
    """The 16-hex-digit digest of a spec used in point keys: ``sha1(spec)[:16]``."""
    return hashlib.sha1(spec.encode("utf-8")).hexdigest()[:16]


def point_key(gpu: str, shape_id: str, spec: str) -> str:
    """The ledger key of one point: ``"{gpu}|{shape_id}|{spec_digest(spec)}"``.

    ``gpu`` and ``shape_id`` may not contain ``|``, so a key splits back into its parts.
    """
    for what, text in (("gpu", gpu), ("shape_id", shape_id)):
        if "|" in text:
            raise ValueError(
                f"{what} {text!r} contains '|', which separates the parts of a point key"
            )
    return f"{gpu}|{shape_id}|{spec_digest(spec)}"


def _value_distance(a: str, b: str) -> int:
    if a == b:
        return 0
    if "/" not in a and "/" not in b:
        return 1
    pa, pb = a.split("/"), b.split("/")
    width = max(len(pa), len(pb))
    pa += [""] * (width - len(pa))
    pb += [""] * (width - len(pb))
    # Padding makes "a/" and "a" segment-equal although the values differ; counting such a
    # pair as one step keeps "distance 0" meaning "same value" (and keeps it a metric).
    return max(1, sum(x != y for x, y in zip(pa, pb, strict=True)))


def knob_distance(a: Mapping[str, object], b: Mapping[str, object],
                  limit: int | None = None) -> int:
    """How many knob steps apart two configurations are (component-aware).

    Over the union of keys, a missing knob counts as ``""``.  Equal values are 0 apart.  If
    either value contains ``/``, both are split on ``/``, the shorter padded with ``""``, and
    the differing segments are counted (at least 1, since the values differ).  Otherwise 1.
    Values go through ``str()``, as in :func:`make_spec`.  With ``limit``, the count stops
    once it passes ``limit`` (the answer is then some number above it).
    """
    total = 0
    for key, x in a.items():
        y = b.get(key, "")
        if (t := type(x)) is type(y) and (t is int or t is str) and x == y:
            continue  # the same value, so the same str(): 0 apart (the common case, fast)
        va, vb = str(x), str(y)
        if va != vb:
            total += _value_distance(va, vb)
            if limit is not None and total > limit:
                return total
    for key, y in b.items():
        if key not in a:
            vb = str(y)
            if vb:
                total += _value_distance("", vb)
                if limit is not None and total > limit:
                    return total
    return total


def spec_distance(a: str, b: str) -> int:
    """:func:`knob_distance` between two spec strings."""
    return knob_distance(parse_spec(a), parse_spec(b))
