"""Splitting one shape's pool of specs into the own / cross / tail slices the sweep measures.

* ``own``: within ``max_dist`` knob steps of one of this card's own anchors;
* ``cross``: otherwise within ``max_dist`` of another card's anchor (that realizes here);
* ``tail``: the rest, subsampled to ``tail_cap`` specs by the sha1 of the spec string, so the
  same specs are picked every session whatever the enumeration order or seed.

Own wins ties and the boundary is inclusive.  The caller filters anchors for realizability
on the live card before passing them in.  Stdlib only: this module runs on the box.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from harness.contract import SLICES
from harness.points import knob_distance, parse_spec

__all__ = ["SLICES", "assign_slices", "tail_order"]



def _tail_rank(spec: str) -> tuple[str, str]:
    return hashlib.sha1(spec.encode("utf-8")).hexdigest(), spec


def tail_order(specs: Iterable[str]) -> list[str]:
    """``specs`` sorted by the sha1 hex digest of each spec string (a stable pseudo-shuffle)."""
    return sorted(specs, key=_tail_rank)


def _min_distance(knobs: Mapping[str, object], anchors: list[dict[str, str]],
                  limit: int) -> int | None:
    """The distance to the nearest anchor where it is at most ``limit``; else a number above
    ``limit`` (None without anchors)."""
    if not anchors:
        return None
    best = limit + 1
    for anchor in anchors:
        best = min(best, knob_distance(knobs, anchor, limit=limit))
        if best == 0:
            break
    return best


def assign_slices(
    specs: Sequence[str],
    own_anchors: Sequence[str],
    cross_anchors: Sequence[str],
    max_dist: int,
    tail_cap: int,
    knobs_of: Mapping[str, Mapping[str, object]] | None = None,
) -> dict[str, list[str]]:
    """Assign each distinct spec of a pool to a slice; returns ``{"own": […], "cross": […], "tail": […]}``.

    Duplicates keep their first occurrence.  ``own`` and ``cross`` keep enumeration order;
    ``tail`` is :func:`tail_order` of the tail specs cut to the first ``tail_cap``.  Specs in
    the tail beyond the cap are in no slice (they are not measured this session).
    ``knobs_of`` (spec → its knobs, where the caller has them) spares parsing the specs.
    """
    if tail_cap < 0:
        raise ValueError(f"tail_cap must be >= 0 (--tail-cap), got {tail_cap}")
    own_knobs = [parse_spec(a) for a in own_anchors]
    cross_knobs = [parse_spec(a) for a in cross_anchors]
    out: dict[str, list[str]] = {name: [] for name in SLICES}
    tail: list[str] = []
    for spec in dict.fromkeys(specs):
        knobs = parse_spec(spec) if knobs_of is None else knobs_of[spec]
        d_own = _min_distance(knobs, own_knobs, max_dist)
        if d_own is not None and d_own <= max_dist:
            out["own"].append(spec)
            continue
        d_cross = _min_distance(knobs, cross_knobs, max_dist)
        if d_cross is not None and d_cross <= max_dist:
            out["cross"].append(spec)
        else:
            tail.append(spec)
    out["tail"] = tail_order(tail)[:tail_cap]
    return out
