"""Times at one clock: each row's time scaled by its shape's reference.

The box times every configuration interleaved with the kind's reference (torch's op or the
fp32 reference, :meth:`harness.box.bench.Bencher._time_ab`), so a row's ``ref_us`` is the
same kernel timed under the same conditions as its ``value_us``.  A card that lowers its clock
under sustained load (an H100 at its 700 W limit on the large GEMMs) times one configuration
slower in one minute of a sweep than in the next, and the reference moves with it: in one
H100 sweep the reference of matmul M4096 N28672 K4096 ranged over 1.24x between rows, and the
row with the lowest time was 1.10x its reference while another configuration was 1.01x.

:func:`steadied` gives each such row the time it would have had at its shape's typical
reference time: ``value_us * median(ref_us of the shape's rows) / ref_us``, the measured
time kept as ``measured_us``.  Ranking, anchors and "who is faster" comparisons then compare
configurations at one clock.  Rows without a reference time (failures, rows written before
``ref_us`` existed) and interpreter rows (the Triton interpreter's kernel and torch's CPU
reference do not slow down alike) keep their time.  The node table itself is never rewritten.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from harness.cards import INTERPRET

MEASURED = "measured_us"  # the key that keeps a steadied row's time as measured


def _ref(row: Mapping[str, Any]) -> float | None:
    ref = row.get("ref_us")
    if row.get("status", "ok") != "ok" or row.get("value_us") is None:
        return None
    if row.get("regime") == INTERPRET:  # the reference runs in torch on the CPU, not alike
        return None
    if isinstance(ref, bool) or not isinstance(ref, (int, float)) or not ref > 0:
        return None
    return float(ref)


def shape_refs(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], float]:
    """The median reference time of each (card, regime, kind, shape) over its ok rows."""
    refs: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in rows:
        ref = _ref(r)
        if ref is not None:
            refs[_key(r)].append(ref)
    return {k: statistics.median(v) for k, v in refs.items()}


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row.get("gpu"), row.get("regime"), row.get("kind"), row.get("shape_id"))


def steadied(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (copies) with each ok row's ``value_us`` at its shape's median reference time
    and the measured time under ``measured_us``; other rows unchanged.  Order is kept."""
    rows = list(rows)
    medians = shape_refs(rows)
    out = []
    for r in rows:
        row = dict(r)
        ref = _ref(row)
        if ref is not None:
            row[MEASURED] = row["value_us"]
            row["value_us"] = float(row["value_us"]) * medians[_key(row)] / ref
        out.append(row)
    return out
