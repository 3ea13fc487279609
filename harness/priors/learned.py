"""``learned``: gradient-boosted trees on the features dict, target ``log(value_us)``.

The model sees every numeric feature of a row (H_* card attributes, S_* shape facts, the
knobs; the C_* compile facts only as ``learned_c``, since a prior that ranks configurations
before they are compiled cannot know them), strings as categories (``S_dtype``, ``S_kind``,
a ``/``-valued knob), plus the :mod:`~harness.priors.roofline` estimate and its facts
(``R_*``: programs, waves, padding, …).  The trees could not compute a quantity like
``cdiv(M, BLOCK_M)`` from M and BLOCK_M themselves, and such quantities are what carries
from the shapes trained on to a shape never seen.

scikit-learn is imported only here: install the ``eval`` extra (``pip install -e .[eval]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.priors import Row, row_knobs
from harness.priors.roofline import estimate

MAX_CATEGORIES = 250  # HistGradientBoosting's categorical limit is max_bins (255)
EARLY_STOP_ABOVE = 5_000
SINGLE_THREAD_BELOW = 20_000
"""Training rows under which the trees are grown on one thread: OpenMP's per-split
synchronization costs more than it saves on small tables (20x slower on a 2-core VM)."""


def _threads(n_rows: int) -> Any:
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1 if n_rows < SINGLE_THREAD_BELOW else None,
                             user_api="openmp")


class LearnedPrior:
    """HistGradientBoostingRegressor on the row features; scores are predicted µs."""

    name = "learned"
    learns = True
    unit = "us"

    def __init__(self, seed: int = 0, compile_facts: bool = False, max_iter: int = 400,
                 relative: bool = True, learning_rate: float = 0.05) -> None:
        self.seed = seed
        self.compile_facts = compile_facts
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        # relative (the default): learn each configuration's time relative to its shape's mean
        # (log), so the trees spend themselves on what ranks configurations, not on how big a
        # shape is; the shape's level comes back from the roofline estimate.  Otherwise the
        # absolute log time (``learned_abs``).
        self.relative = relative
        self._bias = 0.0
        self.name = "learned_c" if compile_facts else "learned"
        if not relative:
            self.name += "_abs"
        self._model: Any = None
        self._columns: list[str] = []
        self._categories: dict[str, dict[str, int]] = {}
        self._fallback = 0.0
        self._n_train = 0
        self._raw_cache: dict[str, dict[str, Any]] = {}

    # ---- features

    def _raw(self, row: Row) -> dict[str, Any]:
        # Every fold sees the same rows again: build a row's features once.
        key = row.get("node_key")
        if key is not None and key in self._raw_cache:
            return self._raw_cache[key]
        feats = dict(row.get("features") or {})
        knobs = row_knobs(row)
        feats.update(knobs)
        if not self.compile_facts:
            feats = {k: v for k, v in feats.items() if not k.startswith("C_")}
        feats.update(estimate(feats, knobs))
        feats["R_log_time"] = math.log(max(feats["R_time_us"], 1e-9))
        if key is not None:
            self._raw_cache[key] = feats
        return feats

    def _matrix(self, raws: Sequence[dict[str, Any]]) -> Any:
        import numpy as np

        out = []
        for raw in raws:
            vec = []
            for col in self._columns:
                v = raw.get(col)
                if col in self._categories:
                    code = self._categories[col].get(str(v)) if v is not None else None
                    vec.append(math.nan if code is None else float(code))
                elif isinstance(v, bool):
                    vec.append(float(v))
                elif isinstance(v, (int, float)) and math.isfinite(v):
                    vec.append(float(v))
                else:
                    vec.append(math.nan)
            out.append(vec)
        return np.asarray(out, dtype=float).reshape(len(out), len(self._columns))

    # ---- the prior

    def fit(self, train_rows: Sequence[Row]) -> None:
        import numpy as np
        from sklearn.ensemble import HistGradientBoostingRegressor

        rows = [r for r in train_rows
                if isinstance(r.get("value_us"), (int, float)) and r["value_us"] > 0]
        self._model = None
        if not rows:
            self._fallback = 0.0
            return
        raws = [self._raw(r) for r in rows]
        target = [math.log(r["value_us"]) for r in rows]
        if self.relative:
            groups: dict[Any, list[int]] = {}
            for i, r in enumerate(rows):
                groups.setdefault(_shape_key(r), []).append(i)
            offsets = []
            for idx in groups.values():
                center = sum(target[i] for i in idx) / len(idx)
                roof = sum(raws[i]["R_log_time"] for i in idx) / len(idx)
                offsets.append(center - roof)
                for i in idx:
                    target[i] -= center
            self._bias = sum(offsets) / len(offsets)
        self._fallback = sorted(target)[len(target) // 2]
        strings: dict[str, set[str]] = {}
        numeric: set[str] = set()
        for raw in raws:
            for key, v in raw.items():
                if isinstance(v, str):
                    strings.setdefault(key, set()).add(v)
                elif isinstance(v, (int, float)):
                    numeric.add(key)
        # A column with any string is categorical (a knob may mix "4" and 4 across kinds).
        self._categories = {
            key: {v: i for i, v in enumerate(sorted(vals))}
            for key, vals in strings.items() if len(vals) <= MAX_CATEGORIES
        }
        self._columns = sorted((numeric - set(strings)) | set(self._categories))
        if len(rows) < 2 or not self._columns:
            return
        model = HistGradientBoostingRegressor(
            max_iter=self.max_iter,
            learning_rate=self.learning_rate,
            min_samples_leaf=min(20, max(2, len(rows) // 20)),
            l2_regularization=1e-3,
            categorical_features=[c in self._categories for c in self._columns] or None,
            # Big tables hold out 10% to stop when the trees stop improving.
            early_stopping=len(rows) > EARLY_STOP_ABOVE,
            n_iter_no_change=20,
            random_state=self.seed,
        )
        with _threads(len(rows)):
            model.fit(self._matrix(raws), np.asarray(target))
        self._model = model
        self._n_train = len(rows)

    def score(self, rows: Sequence[Row]) -> list[float]:
        if not rows:
            return []
        if self._model is None:
            return [math.exp(self._fallback)] * len(rows)
        raws = [self._raw(r) for r in rows]
        with _threads(self._n_train):
            pred = [float(p) for p in self._model.predict(self._matrix(raws))]
        if self.relative:  # back to µs: the shape's roofline level plus the learned offset
            groups: dict[Any, list[int]] = {}
            for i, r in enumerate(rows):
                groups.setdefault(_shape_key(r), []).append(i)
            for idx in groups.values():
                level = sum(raws[i]["R_log_time"] for i in idx) / len(idx) + self._bias
                for i in idx:
                    pred[i] += level
        return [math.exp(p) for p in pred]


def _shape_key(row: Row) -> Any:
    return (row.get("gpu"), row.get("regime"), row.get("shape_id"))
