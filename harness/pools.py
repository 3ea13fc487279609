"""Pools: every realizable spec of each golden shape on one card, split into slices.

Pure Python (no torch): the box builds pools for its live card, and the controller can build
them for any catalog card to show what a budget buys before anything is rented.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness import goldens, shipped
from harness import kinds as registry
from harness.cards import Card
from harness.contract import SweepOptions
from harness.kinds.base import completed
from harness.points import knob_distance, make_spec, parse_spec, point_key
from harness.slices import SLICES, assign_slices


@dataclass(frozen=True)
class Point:
    """One thing to measure: (card, shape, spec) and the slice it fell in."""

    key: str
    gpu: str
    kind: str
    shape_id: str
    spec: str
    slice: str
    shape: dict[str, Any] = field(hash=False, compare=False)
    knobs: dict[str, Any] = field(hash=False, compare=False)
    # a shipped configuration or a baseline (harness.shipped): measured early (Point.tier)
    first: bool = field(default=False, compare=False)
    # knob steps to this card's nearest own anchor (the fastest of earlier sweeps) where that
    # is 0 or 1, else None (Point.tier)
    steps: int | None = field(default=None, compare=False)

    @property
    def tier(self) -> int:
        """The order a job measures its points in: 0 the card's own anchors (one or two a
        shape, so a short sweep has each shape's known best), 1 what people ship (the rules,
        the tutorial lists, the baselines), 2 one knob step from an anchor (or nearest it on a
        kernel it has not run: :func:`path_twins`), 3 the rest, drawn at random."""
        if self.steps == 0:
            return 0
        if self.first:
            return 1
        return 2 if self.steps == 1 else 3


@dataclass
class ShapePool:
    golden: goldens.GoldenShape
    enumerated: int
    own_anchors: list[str]
    cross_anchors: list[str]
    points: list[Point]


@dataclass
class PoolSet:
    card: Card
    shapes: list[ShapePool]
    skipped_anchors: list[goldens.Anchor]

    def points(self, slice_: str | None = None, kind: str | None = None) -> list[Point]:
        return [p for sp in self.shapes for p in sp.points
                if (slice_ is None or p.slice == slice_) and (kind is None or p.kind == kind)]

    def counts(self, keep: Iterable[str] | None = None) -> dict[str, dict[str, dict[str, int]]]:
        """slice → kind → shape_id → number of points (only keys in ``keep`` when given)."""
        wanted = None if keep is None else set(keep)
        out: dict[str, dict[str, dict[str, int]]] = {s: defaultdict(dict) for s in SLICES}
        for sp in self.shapes:
            c = Counter(p.slice for p in sp.points if wanted is None or p.key in wanted)
            for s in SLICES:
                if c[s]:
                    out[s][sp.golden.kind][sp.golden.shape_id] = c[s]
        return {s: dict(v) for s, v in out.items()}


def path_twins(anchors: list[dict[str, Any]], spec_knobs: dict[str, dict[str, Any]],
               path_knobs: Iterable[str], exclude: Iterable[str] = (),
               per_value: int = 4) -> list[str]:
    """For each anchor and each value of a path knob (one that picks another kernel) that the
    anchor does not take, the specs of that value nearest the anchor in knob steps (at most
    ``per_value``; among those as many steps away, the nearest in the knobs' values, by the
    sum of their log2 ratios).  They carry an anchor's measured neighbourhood over to a
    kernel it has not run, so a short sweep measures the new kernel where the old was best."""
    skip = set(exclude)
    out: list[str] = []
    for knob in path_knobs:
        values: dict[Any, list[str]] = defaultdict(list)
        for spec, knobs in spec_knobs.items():
            if knob in knobs and spec not in skip:
                values[knobs[knob]].append(spec)
        for a in anchors:
            for value, specs in values.items():
                if a.get(knob) == value:
                    continue
                dist = {x: knob_distance(spec_knobs[x], a) for x in specs}
                if dist:
                    near = min(dist.values())
                    ties = sorted((x for x in specs if dist[x] == near),
                                  key=lambda x: _value_gap(spec_knobs[x], a))
                    out += [x for x in ties if x not in out][:per_value]
    return out


def _value_gap(knobs: dict[str, Any], other: dict[str, Any]) -> float:
    """How far apart two configurations' numeric knob values are: the sum of the absolute
    log2 ratios of the positive ones they share."""
    gap = 0.0
    for key, value in knobs.items():
        theirs = other.get(key)
        if (isinstance(value, int) and isinstance(theirs, int) and value > 0 and theirs > 0
                and value != theirs):
            gap += abs(math.log2(value / theirs))
    return gap


def build(card: Card, *, kinds: list[str] | None = None, filter: str | None = None,
          max_dist: int = SweepOptions.max_dist, tail_cap: int = SweepOptions.tail_cap,
          anchors: list[goldens.Anchor] | None = None,
          shapes: list[goldens.GoldenShape] | None = None,
          baselines: tuple[str, ...] = shipped.BASELINES) -> PoolSet:
    """Enumerate and slice every golden shape of ``card``'s regime."""
    if shapes is None:
        shapes = goldens.shapes(card.regime, kinds=kinds, filter=filter)
    if anchors is None:
        anchors = goldens.anchors()
    by_shape: dict[tuple[str, str], list[goldens.Anchor]] = defaultdict(list)
    for a in anchors:
        by_shape[(a.kind, a.shape_id)].append(a)
    out: list[ShapePool] = []
    skipped: list[goldens.Anchor] = []
    for g in shapes:
        kind = registry.get(g.kind)
        knob_list = kind.enumerate(g.shape, card)
        space = kind.knob_space(g.shape, card)
        spec_knobs = {make_spec(k): k for k in knob_list}
        enumerated = len(spec_knobs)
        own, cross = [], []
        for a in by_shape.get((g.kind, g.shape_id), []):
            spec = make_spec(completed(dict(parse_spec(a.spec)), space))
            if spec not in spec_knobs:
                skipped.append(a)  # the realizability filter: it does not enumerate here
            elif a.gpu == card.name:
                own.append(spec)
            else:
                cross.append(spec)
        sliced = assign_slices(list(spec_knobs), own, cross, max_dist, tail_cap,
                               knobs_of=spec_knobs)
        # what people ship (rules, tutorial lists, torch baselines) is measured early, in the
        # own slice, wherever the slicing put it
        first = {make_spec(k): k
                 for ks in shipped.configs(g.kind, g.shape, card, baselines).values()
                 for k in ks}
        if first:
            sliced = {s: [x for x in specs if x not in first] for s, specs in sliced.items()}
            sliced["own"] = list(first) + sliced["own"]
            spec_knobs = {**spec_knobs, **first}
        # this card's own anchors before what people ship, their neighbours one knob step away
        # after it: each slice's points in the order a job measures them (Point.tier)
        own_knobs = [spec_knobs[a] for a in own]
        steps = {x: d for x in sliced["own"] if own_knobs
                 and (d := min(knob_distance(spec_knobs[x], a, limit=1) for a in own_knobs)) <= 1}
        # a kernel the anchors do not run (Kind.path_knobs): its configurations nearest each
        # anchor count as the anchor's neighbours, in the own slice wherever they fell
        for x in path_twins(own_knobs, spec_knobs, kind.path_knobs, exclude=first):
            if x not in sliced["own"]:
                sliced = {s: [y for y in specs if y != x] for s, specs in sliced.items()}
                sliced["own"].append(x)
            steps.setdefault(x, 1)
        pts = sorted((Point(key=point_key(card.name, g.shape_id, spec), gpu=card.name,
                            kind=g.kind, shape_id=g.shape_id, spec=spec, slice=s,
                            shape=dict(g.shape), knobs=dict(spec_knobs[spec]),
                            first=spec in first, steps=steps.get(spec) if s == "own" else None)
                      for s in SLICES for spec in sliced[s]),
                     key=lambda p: (SLICES.index(p.slice), p.tier))
        out.append(ShapePool(golden=g, enumerated=enumerated, own_anchors=own,
                             cross_anchors=cross, points=pts))
    return PoolSet(card=card, shapes=out, skipped_anchors=skipped)
