"""Anchors from measurements: the best deployable ``ok`` spec per shape of one card."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from harness.cards import DEPLOYABLE, Card
from harness.goldens import ANCHOR_DIR, Anchor, load_anchor_file, write_anchor_file


def best_anchors(rows: Iterable[Mapping[str, Any]], gpu: str,
                 in_pool: Callable[[str, str, str], bool] | None = None) -> list[Anchor]:
    """Per (kind, shape): the fastest ok row of ``gpu`` in the deployable regime; ties go to
    the lower variance.  Interpret rows, failures and baselines (``baseline=torch``: no
    configuration) are never anchors; with ``in_pool(kind, shape_id, spec)``, neither is a
    configuration outside the card's pool (a shipped one beyond its knob space: it is
    measured early every sweep anyway, and an anchor is where a slice is drawn around)."""
    from harness.shipped import is_baseline

    best: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in rows:
        if r["gpu"] != gpu or r.get("regime") != DEPLOYABLE or r.get("status") != "ok":
            continue
        if is_baseline(str(r.get("spec") or "")):
            continue
        if r.get("value_us") is None:
            continue
        if in_pool is not None and not in_pool(r["kind"], r["shape_id"], str(r["spec"])):
            continue
        key = (r["kind"], r["shape_id"])
        cur = best.get(key)
        rank = (r["value_us"], r.get("variance") if r.get("variance") is not None else float("inf"))
        if cur is None or rank < (cur["value_us"], cur.get("variance")
                                  if cur.get("variance") is not None else float("inf")):
            best[key] = r
    return [Anchor(gpu=gpu, kind=k, shape_id=s, spec=r["spec"], value_us=round(r["value_us"], 3),
                   source=f"{r.get('run_id', '')} n={r.get('n_samples')}")
            for (k, s), r in sorted(best.items())]


def full_spec(card: Card) -> Callable[[str, str, str], str | None]:
    """``full(kind, shape_id, spec)``: ``spec`` on ``card`` with every knob it lacks at its
    first value (a configuration written before a knob existed, in today's words), or None
    for a shape that is not golden."""
    from harness import goldens
    from harness import kinds as registry
    from harness.kinds.base import completed
    from harness.points import make_spec, parse_spec

    shapes = {(g.kind, g.shape_id): g for g in goldens.shapes(card.regime)}

    def full(kind: str, shape_id: str, spec: str) -> str | None:
        g = shapes.get((kind, shape_id))
        if g is None:
            return None
        space = registry.get(kind).knob_space(g.shape, card)
        return make_spec(completed(dict(parse_spec(spec)), space))

    return full


def pool_of(card: Card) -> Callable[[str, str, str], bool]:
    """``in_pool`` of :func:`best_anchors` for ``card``: whether a spec is among the
    configurations its pool enumerates for that golden shape (each shape enumerated once)."""
    from harness import goldens
    from harness import kinds as registry
    from harness.points import make_spec

    shapes = {(g.kind, g.shape_id): g for g in goldens.shapes(card.regime)}
    full = full_spec(card)
    specs: dict[tuple[str, str], set[str]] = {}

    def in_pool(kind: str, shape_id: str, spec: str) -> bool:
        g = shapes.get((kind, shape_id))
        if g is None:
            return False
        if (kind, shape_id) not in specs:
            specs[(kind, shape_id)] = {make_spec(x) for x in registry.get(kind).enumerate(g.shape,
                                                                                        card)}
        return full(kind, shape_id, spec) in specs[(kind, shape_id)]

    return in_pool


class Recorded(NamedTuple):
    """What :func:`record` wrote: the file, its anchors, and of those the shapes whose anchor
    is new or another configuration (``changed``) or the same configuration at a time from
    these rows (``retimed``; the same also where one spec lacks a knob the other has at its
    first value)."""

    path: Path
    written: int
    changed: int
    retimed: int


def record(rows: Iterable[Mapping[str, Any]], card: Card, path: Path | None = None,
           keep_faster: bool = False,
           in_pool: Callable[[str, str, str], bool] | None = None) -> Recorded:
    """Write ``card``'s anchors file (``path``, default the card's file under
    harness/goldens/anchors): measured shapes take their best spec, shapes not in ``rows``
    keep the anchor they had; with ``keep_faster``, so does a shape whose anchor was measured
    faster than anything in ``rows`` (a short sweep that did not reach it leaves the longer
    sweep's anchor), and a ``path`` that does not exist yet starts from the card's file.
    Only configurations of the card's pool are anchors (``in_pool``, by default
    :func:`pool_of`)."""
    shipped_path = ANCHOR_DIR / f"{card.alias}.json"
    path = path or shipped_path
    found = best_anchors(rows, card.name, in_pool or pool_of(card))
    kept: dict[tuple[str, str], Anchor] = {}
    # keeping the faster needs what was recorded: a new file elsewhere starts from the card's
    start = path if path.is_file() or not keep_faster else shipped_path
    if start.is_file():
        kept = {(a.kind, a.shape_id): a for a in load_anchor_file(start)}
    if keep_faster:
        found = [a for a in found if (a.kind, a.shape_id) not in kept
                 or a.value_us <= kept[(a.kind, a.shape_id)].value_us]
    full = full_spec(card)

    def same(a: Anchor, old: Anchor) -> bool:
        if old.spec == a.spec:
            return True
        now = full(a.kind, a.shape_id, a.spec)
        return now is not None and now == full(old.kind, old.shape_id, old.spec)

    was = [kept.get((a.kind, a.shape_id)) for a in found]
    changed = sum(1 for a, old in zip(found, was, strict=True) if old is None or not same(a, old))
    retimed = sum(1 for a, old in zip(found, was, strict=True)
                  if old is not None and same(a, old) and old != a)
    for a in found:
        kept[(a.kind, a.shape_id)] = a
    write_anchor_file(path, card.name, list(kept.values()),
                      comment=f"Anchors of {card.name}: the fastest deployable ok spec per golden "
                              "shape in the node table (python -m harness goldens record).")
    return Recorded(path, len(kept), changed, retimed)
