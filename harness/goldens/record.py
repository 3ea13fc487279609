"""Anchors from measurements: the best deployable ``ok`` spec per shape of one card."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.cards import DEPLOYABLE, Card
from harness.goldens import ANCHOR_DIR, Anchor, load_anchor_file, write_anchor_file


def best_anchors(rows: Iterable[Mapping[str, Any]], gpu: str) -> list[Anchor]:
    """Per (kind, shape): the fastest ok row of ``gpu`` in the deployable regime; ties go to
    the lower variance.  Interpret rows, failures and baselines (``baseline=torch``: no
    configuration) are never anchors."""
    from harness.shipped import is_baseline

    best: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in rows:
        if r["gpu"] != gpu or r.get("regime") != DEPLOYABLE or r.get("status") != "ok":
            continue
        if is_baseline(str(r.get("spec") or "")):
            continue
        if r.get("value_us") is None:
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


def record(rows: Iterable[Mapping[str, Any]], card: Card, path: Path | None = None,
           keep_faster: bool = False) -> tuple[Path, int, int]:
    """Write ``card``'s anchors file: measured shapes take their best spec, shapes not in
    ``rows`` keep the anchor they had; with ``keep_faster``, so does a shape whose anchor was
    measured faster than anything in ``rows`` (a short sweep that did not reach it leaves the
    longer sweep's anchor).  Returns (path, anchors written, of which new/changed)."""
    path = path or ANCHOR_DIR / f"{card.alias}.json"
    found = best_anchors(rows, card.name)
    kept: dict[tuple[str, str], Anchor] = {}
    if path.is_file():
        kept = {(a.kind, a.shape_id): a for a in load_anchor_file(path)}
    if keep_faster:
        found = [a for a in found if (a.kind, a.shape_id) not in kept
                 or a.value_us <= kept[(a.kind, a.shape_id)].value_us]
    changed = sum(1 for a in found if kept.get((a.kind, a.shape_id), None) is None
                  or kept[(a.kind, a.shape_id)].spec != a.spec)
    for a in found:
        kept[(a.kind, a.shape_id)] = a
    write_anchor_file(path, card.name, list(kept.values()),
                      comment=f"Anchors of {card.name}: the fastest deployable ok spec per golden "
                              "shape in the node table (python -m harness goldens record).")
    return path, len(kept), changed
