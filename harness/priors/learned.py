"""``learned``: gradient-boosted trees on the features dict, target ``log(value_us)``.

The model sees every numeric feature of a row (H_* card attributes, S_* shape facts, the
knobs; the C_* compile facts only as ``learned_c``, since a prior that ranks configurations
before they are compiled cannot know them), strings as categories (``S_dtype``, ``S_kind``,
a ``/``-valued knob), plus the :mod:`~harness.priors.roofline` estimate and its facts
(``R_*``: programs, waves, padding, …).  The trees could not compute a quantity like
``cdiv(M, BLOCK_M)`` from M and BLOCK_M themselves, and such quantities are what carries
from the shapes trained on to a shape never seen.

Relative (the default), what the trees learn is shaped for picking a shape's fastest
configuration rather than for predicting every time equally well:

- the target is a configuration's log time over its shape's *best*, clipped at
  :data:`CLIP`: a configuration ``e`` times slower than the best is simply slow; how much
  slower does not move the pick, and would otherwise dominate the squared loss;
- ``T_*`` say how the same configuration (kind and knobs) did on the *other* shapes trained
  on: how many (``T_n``), its mean target there (``T_mean``) and that mean weighted by how
  alike the shapes are (``T_similar``, weights ``exp(-d² / 2σ²)`` summing to
  ``T_similarity``; ``d``: the distance between the shapes' S_* facts in octaves).  In
  ``fit`` a row's own shape is left out of its encoding, so the trees see the training rows
  as they will see the rows of a shape they were not trained on;
- two models, their log predictions averaged (:data:`ROOFLINE_WEIGHTS`).  One learns the
  target as it is and never sees the roofline's ranking of the shape.  The other starts from
  that ranking (``R_rel_time``: the roofline's log estimate over its best estimate among the
  shape's rows; clipped like the target) and learns the correction to it, and sees the
  ranking as a feature too: where the trees have nothing to say (a shape unlike any trained on, say a
  much smaller problem, where launches dominate) the roofline's opinion counts; where the
  roofline ranks badly (a kind it models poorly, or a card whose balance it gets wrong) the
  first model holds the pick.  They share the iteration budget (each ``max_iter / 2``
  iterations at twice the learning rate): the pair costs what one model did.

scikit-learn is imported only here: install the ``eval`` extra (``pip install -e .[eval]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.priors import Row, row_knobs
from harness.priors.roofline import estimate

MAX_CATEGORIES = 250  # HistGradientBoosting's categorical limit is max_bins (255)
CLIP = 1.0
"""Relative targets (and the roofline's ranking, as a starting point) are clipped at e-fold."""
SIMILAR_OCTAVES = 2.0
"""σ of the shape similarity that weights a configuration's results on other shapes."""
ROOFLINE_WEIGHTS = (0.0, 1.0)
"""Relative: one model per weight, its target the relative time less that weight times the
roofline's clipped ranking (added back when scoring); their log predictions are averaged."""
BAG = 3
"""Each model is the mean of this many tree ensembles, each drawing its own features at every
split (:data:`MAX_FEATURES`) and, on big tables, its own early-stopping rows: one ensemble's
pick moved by up to 2.4x on a shape when a later session added a few rows elsewhere."""
MAX_FEATURES = 0.7
"""The share of the features each split of a bagged ensemble may choose from."""
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
                 relative: bool = True, learning_rate: float = 0.05, bag: int = BAG,
                 max_features: float = MAX_FEATURES) -> None:
        if bag < 1 or not 0.0 < max_features <= 1.0:
            raise ValueError(f"bag must be >= 1 (got {bag}) and max_features in (0, 1] "
                             f"(got {max_features})")
        self.seed = seed
        self.bag = bag
        self.max_features = max_features
        self.compile_facts = compile_facts
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        # relative (the default): learn each configuration's time relative to its shape's best
        # (log, clipped), so the trees spend themselves on what ranks configurations, not on
        # how big a shape is; the shape's level comes back from the roofline estimate.
        # Otherwise the absolute log time (``learned_abs``), one model, no ``T_*``.
        self.relative = relative
        self._bias = 0.0
        self.name = "learned_c" if compile_facts else "learned"
        if not relative:
            self.name += "_abs"
        self._model: Any = None  # absolute: one model; relative: one per ROOFLINE_WEIGHTS
        self._columns: list[str] = []
        self._categories: dict[str, dict[str, int]] = {}
        self._fallback = 0.0
        self._n_train = 0
        self._raw_cache: dict[str, dict[str, Any]] = {}
        # Relative: per model, per configuration, its mean target on each shape trained on;
        # each of those shapes' S_* facts; distances between shapes, as computed.
        self._seen: list[dict[Any, dict[Any, float]]] = []
        self._shapes: dict[Any, dict[str, float]] = {}
        self._d2: dict[tuple[Any, Any], float] = {}
        self._member_columns: list[list[str]] = []  # per model: its feature columns

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

    def _matrix(self, raws: Sequence[dict[str, Any]], columns: Sequence[str] | None = None
                ) -> Any:
        import numpy as np

        columns = self._columns if columns is None else columns
        out = []
        for raw in raws:
            vec = []
            for col in columns:
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
        return np.asarray(out, dtype=float).reshape(len(out), len(columns))

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
        self._seen, self._shapes, self._d2, self._member_columns = [], {}, {}, []
        targets = [target]
        member_raws = [raws]
        if self.relative:
            rank = _roofline_rank(rows, raws)
            groups = _groups(rows)
            offsets = []
            for shape, idx in groups.items():
                best = min(target[i] for i in idx)
                roof = sum(raws[i]["R_log_time"] for i in idx) / len(idx)
                offsets.append(best - roof)
                for i in idx:
                    target[i] = min(target[i] - best, CLIP)
                self._shapes[shape] = _shape_facts(raws[idx[0]])
            self._bias = sum(offsets) / len(offsets)
            targets = [[t - w * min(q, CLIP) for t, q in zip(target, rank, strict=True)]
                       for w in ROOFLINE_WEIGHTS]
            member_raws = [self._encode_fit(rows, _with_rank(raws, rank, w), t, groups)
                           for w, t in zip(ROOFLINE_WEIGHTS, targets, strict=True)]
        self._fallback = sorted(target)[len(target) // 2]
        strings: dict[str, set[str]] = {}
        for raw in raws:
            for key, v in raw.items():
                if isinstance(v, str):
                    strings.setdefault(key, set()).add(v)
        # A column with any string is categorical (a knob may mix "4" and 4 across kinds).
        self._categories = {
            key: {v: i for i, v in enumerate(sorted(vals))}
            for key, vals in strings.items() if len(vals) <= MAX_CATEGORIES
        }
        for member in member_raws:
            # a column with no value in any row (``T_mean`` when every row's shape is the only
            # one trained on) is left out: the trees cannot bin it
            numeric = {key for raw in member for key, v in raw.items()
                       if isinstance(v, (int, float)) and not math.isnan(v)}
            self._member_columns.append(
                sorted((numeric - set(strings)) | set(self._categories)))
        self._columns = self._member_columns[0]
        if len(rows) < 2 or not self._columns:
            return
        models = []
        for member, columns, t in zip(member_raws, self._member_columns, targets, strict=True):
            model = _Bag([HistGradientBoostingRegressor(
                max_iter=max(1, self.max_iter // len(targets)),
                learning_rate=self.learning_rate * len(targets),
                min_samples_leaf=min(20, max(2, len(rows) // 20)),
                l2_regularization=1e-3,
                max_features=self.max_features,
                categorical_features=[c in self._categories for c in columns] or None,
                # Big tables hold out 10% to stop when the trees stop improving.
                early_stopping=len(rows) > EARLY_STOP_ABOVE,
                n_iter_no_change=20,
                random_state=self.seed + k,
            ) for k in range(self.bag)])
            with _threads(len(rows)):
                model.fit(self._matrix(member, columns), np.asarray(t))
            models.append(model)
        self._model = models if self.relative else models[0]
        self._n_train = len(rows)

    def score(self, rows: Sequence[Row]) -> list[float]:
        if not rows:
            return []
        if self._model is None:
            return [math.exp(self._fallback)] * len(rows)
        raws = [self._raw(r) for r in rows]
        if not self.relative:
            with _threads(self._n_train):
                pred = [float(p) for p in self._model.predict(self._matrix(raws))]
            return [math.exp(p) for p in pred]
        rank = _roofline_rank(rows, raws)
        groups = _groups(rows)
        facts = {shape: _shape_facts(raws[idx[0]]) for shape, idx in groups.items()}
        pred = [0.0] * len(rows)
        for seen, weight, columns, model in zip(self._seen, ROOFLINE_WEIGHTS,
                                                self._member_columns, self._model, strict=True):
            member = _with_rank(raws, rank, weight)
            for shape, idx in groups.items():
                for i in idx:
                    member[i].update(self._encoding(seen, rows[i], raws[i], shape, facts[shape],
                                                    leave_out=False))
            with _threads(self._n_train):
                got = model.predict(self._matrix(member, columns))
            for i, p in enumerate(got):
                pred[i] += (float(p) + weight * min(rank[i], CLIP)) / len(self._model)
        # back to µs: the shape's roofline level plus the learned offset
        for idx in groups.values():
            level = sum(raws[i]["R_log_time"] for i in idx) / len(idx) + self._bias
            for i in idx:
                pred[i] += level
        return [math.exp(p) for p in pred]

    # ---- how a configuration did on the other shapes

    def _encode_fit(self, rows: Sequence[Row], raws: Sequence[dict[str, Any]],
                    target: Sequence[float], groups: Mapping[Any, list[int]]
                    ) -> list[dict[str, Any]]:
        """Remember each configuration's mean ``target`` per shape (a new entry of
        ``self._seen``); ``raws`` (copies) with their ``T_*``, each leaving its shape out."""
        per: dict[Any, dict[Any, list[float]]] = {}
        for shape, idx in groups.items():
            for i in idx:
                per.setdefault(_config_key(raws[i], rows[i]), {}).setdefault(shape, []).append(
                    target[i])
        seen = {k: {s: sum(v) / len(v) for s, v in by_shape.items()} for k, by_shape in per.items()}
        self._seen.append(seen)
        out = list(raws)
        for shape, idx in groups.items():
            for i in idx:
                out[i].update(self._encoding(seen, rows[i], raws[i], shape, self._shapes[shape],
                                             leave_out=True))
        return out

    def _encoding(self, seen: Mapping[Any, Mapping[Any, float]], row: Row,
                  raw: Mapping[str, Any], shape: Any, facts: Mapping[str, float], *,
                  leave_out: bool) -> dict[str, float]:
        """``T_*`` of one row of ``shape`` (whose S_* facts are ``facts``); ``leave_out``: not
        from the shape itself (fitting); otherwise from every shape trained on (scoring)."""
        got = [(s, v) for s, v in seen.get(_config_key(raw, row), {}).items()
               if not (leave_out and s == shape)]
        out = {"T_n": float(len(got)), "T_mean": math.nan, "T_similar": math.nan,
               "T_similarity": 0.0}
        if not got:
            return out
        out["T_mean"] = sum(v for _, v in got) / len(got)
        weights = [math.exp(-self._distance2(shape, facts, s) / (2 * SIMILAR_OCTAVES ** 2))
                   for s, _ in got]
        total = sum(weights)
        out["T_similarity"] = total
        if total > 1e-12:
            out["T_similar"] = sum(w * v for w, (_, v) in zip(weights, got, strict=True)) / total
        return out

    def _distance2(self, shape: Any, facts: Mapping[str, float], other: Any) -> float:
        key = (shape, other)
        if key not in self._d2:
            theirs = self._shapes[other]
            self._d2[key] = sum((facts.get(k, 0.0) - theirs.get(k, 0.0)) ** 2
                                for k in sorted(set(facts) | set(theirs)))
        return self._d2[key]


def _shape_key(row: Row) -> Any:
    return (row.get("gpu"), row.get("regime"), row.get("shape_id"))


def _groups(rows: Sequence[Row]) -> dict[Any, list[int]]:
    """Row indices per shape, in the rows' order."""
    groups: dict[Any, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(_shape_key(r), []).append(i)
    return groups


def _roofline_rank(rows: Sequence[Row], raws: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per row, the roofline's ranking of its shape: its log estimate over the best estimate
    among the shape's rows (0 for the roofline's pick)."""
    out = [0.0] * len(rows)
    for idx in _groups(rows).values():
        best = min(raws[i]["R_log_time"] for i in idx)
        for i in idx:
            out[i] = raws[i]["R_log_time"] - best
    return out


def _with_rank(raws: Sequence[Mapping[str, Any]], rank: Sequence[float], weight: float
               ) -> list[dict[str, Any]]:
    """Copies of ``raws`` (the cached features stay as they are) for the model of roofline
    ``weight``: the one that starts from the roofline's ranking also sees it, as
    ``R_rel_time``; the other stays independent of it."""
    out = [dict(raw) for raw in raws]
    if weight:
        for raw, q in zip(out, rank, strict=True):
            raw["R_rel_time"] = q
    return out


def _config_key(raw: Mapping[str, Any], row: Row) -> Any:
    """A configuration across shapes: the kind and the knobs."""
    return (str(raw.get("S_kind", row.get("kind"))),
            tuple(sorted((k, str(v)) for k, v in row_knobs(row).items())))


def _shape_facts(raw: Mapping[str, Any]) -> dict[str, float]:
    """A shape's S_* facts for the similarity: sizes in octaves, strings as indicators (the
    flop and byte totals follow from the sizes)."""
    out = {}
    for k, v in raw.items():
        if not k.startswith("S_") or k in ("S_flops", "S_bytes"):
            continue
        if isinstance(v, str):
            out[f"{k}={v}"] = 1.0
        elif isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = math.log2(max(float(v), 1.0))
    return out


class _Bag:
    """Tree ensembles fitted alike (their seeds apart); predicts their mean."""

    def __init__(self, models: list[Any]) -> None:
        self.models = models

    def fit(self, x: Any, y: Any) -> _Bag:
        for model in self.models:
            model.fit(x, y)
        return self

    def predict(self, x: Any) -> Any:
        return sum(model.predict(x) for model in self.models) / len(self.models)
