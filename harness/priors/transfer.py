"""``transfer``: a configuration near another card's best configuration is predicted fast.

The score of a row is the knob distance (:func:`harness.points.knob_distance`) from its spec
to the nearest anchor that *another* card recorded for the same (kind, shape).  The
evaluated card's own anchors are left out: they were picked from the very measurements being
scored.  A shape that no other card anchors gets the same score on every row (no opinion),
which the regret counts as a tie (the worst of the shape).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from harness.goldens import Anchor
from harness.points import SpecError, knob_distance, parse_spec
from harness.priors import Row

NO_ANCHOR = 0.0
"""The score of every row of a shape no other card anchors."""


class TransferPrior:
    """Knob distance to the nearest other-card anchor of the same shape (lower = closer)."""

    name = "transfer"
    learns = False

    def __init__(self, anchors: Iterable[Anchor] | None = None) -> None:
        if anchors is None:
            from harness import goldens

            anchors = goldens.anchors()
        self._by_shape: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = defaultdict(list)
        for a in anchors:
            try:
                knobs = parse_spec(a.spec)
            except SpecError:
                continue  # an anchor file is data: one bad spec must not void the others
            self._by_shape[(a.kind, a.shape_id)].append((a.gpu, knobs))

    def fit(self, train_rows: Sequence[Row]) -> None:
        pass

    def distance(self, row: Row) -> int | None:
        """Distance to the nearest other-card anchor; None when no other card has one."""
        others = [k for gpu, k in self._by_shape.get((row["kind"], row["shape_id"]), ())
                  if gpu != row["gpu"]]
        if not others:
            return None
        knobs = parse_spec(row["spec"])
        return min(knob_distance(knobs, k) for k in others)

    def score(self, rows: Sequence[Row]) -> list[float]:
        out = []
        for r in rows:
            d = self.distance(r)
            out.append(NO_ANCHOR if d is None else float(d))
        return out
