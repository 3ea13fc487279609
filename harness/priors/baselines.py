"""Sanity baselines: ``oracle`` (the measured time itself) and ``random`` (seeded noise).

The oracle must score Spearman 1 and regret 1 on any table, and random must hover around
Spearman 0: if either does not, the evaluation is broken, not the prior.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from harness.priors import Row


class OraclePrior:
    """Scores a row by its own measured ``value_us``: the best any prior can do."""

    name = "oracle"
    learns = False
    unit = "us"

    def fit(self, train_rows: Sequence[Row]) -> None:
        pass

    def score(self, rows: Sequence[Row]) -> list[float]:
        return [float(r["value_us"]) for r in rows]


class RandomPrior:
    """A uniform score in [0, 1) per row, fixed by (seed, node key): the same row always
    gets the same score, whatever order or fold it is scored in."""

    name = "random"
    learns = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def fit(self, train_rows: Sequence[Row]) -> None:
        pass

    def score(self, rows: Sequence[Row]) -> list[float]:
        out = []
        for r in rows:
            key = r.get("node_key") or f"{r.get('gpu')}|{r.get('shape_id')}|{r.get('spec')}"
            h = hashlib.sha1(f"{self.seed}|{key}".encode()).digest()
            out.append(int.from_bytes(h[:8], "big") / 2**64)
        return out
