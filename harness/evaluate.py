"""Evaluate priors on the node table: rank quality (Spearman) and top-1 regret per shape.

For one card and regime, a *shape* with at least ``min_rows`` ``ok`` rows is a test case:
the prior scores its rows (lower = predicted faster), and

- **Spearman** is the rank correlation between the scores and the measured ``value_us``
  (1 = the prior orders the configurations exactly as measured, -1 = exactly backwards;
  undefined, and left out of the median, when the scores or the times are all equal);
- **regret** is the measured time of the prior's pick (its lowest score) over the best
  measured time; when several rows share the lowest score the pick is the *slowest* of them,
  so a prior that cannot tell configurations apart is not rewarded for it.

A card × regime × prior × mode is summarized by the median Spearman over its shapes and the
mean / median / worst regret; shapes whose pick is more than ``MISS_RATIO`` times the best
are listed (the prior "misses the best").  Shapes with too few rows are counted as skipped.

Modes (what the prior was fitted on before it scored a shape):

- ``shape-out``: every other shape of the same card and regime (leave-one-shape-out);
- ``card-out``: every row of the other cards in the regime (leave-one-card-out), only when
  the table holds two or more cards there, and only for priors that learn.

Only ``ok`` rows of the current featurizer version take part.  Pure apart from the priors
themselves: rows in, :class:`CardEval` values out; :func:`format_text` and :func:`to_json`
render them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.priors import Prior, learns
from harness.stats import _ranks, spearman  # noqa: F401 - part of this module's API
from harness.store import FEAT_VER

Row = Mapping[str, Any]
ShapeKey = tuple[str, str]  # (kind, shape_id)

MIN_ROWS = 3
MISS_RATIO = 1.2
SHAPE_OUT, CARD_OUT = "shape-out", "card-out"
MODES = (SHAPE_OUT, CARD_OUT)


class EvalError(ValueError):
    """A prior that broke its contract (wrong number of scores, an exception in it)."""


class RequestError(EvalError):
    """An evaluation the user asked for wrongly: a missing DB, an unknown card or kind, a
    regime the table has no rows of."""


# ---------------------------------------------------------------- pure statistics


def pick(scores: Sequence[float], values: Sequence[float]) -> int:
    """Index of the prior's pick: the lowest score; among tied lowest, the slowest measured."""
    low = min(scores)
    tied = [i for i, s in enumerate(scores) if s == low]
    return max(tied, key=lambda i: values[i])


def clean_scores(scores: Sequence[Any]) -> list[float]:
    """Scores as floats; NaN (no opinion) becomes +inf, so it is never preferred."""
    out = []
    for s in scores:
        v = float(s)
        out.append(math.inf if math.isnan(v) else v)
    return out


# ---------------------------------------------------------------- results


@dataclass
class ShapeResult:
    """One prior on one shape: its Spearman, its pick and the regret of that pick."""

    kind: str
    shape_id: str
    n_rows: int
    spearman: float | None
    regret: float
    pick_spec: str
    pick_us: float
    best_spec: str
    best_us: float
    # Kept for the plots, left out of the JSON.
    scores: list[float] = field(default_factory=list, repr=False)
    values: list[float] = field(default_factory=list, repr=False)
    specs: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape_id": self.shape_id, "n_rows": self.n_rows,
                "spearman": self.spearman, "regret": self.regret, "pick_spec": self.pick_spec,
                "pick_us": self.pick_us, "best_spec": self.best_spec, "best_us": self.best_us}


@dataclass
class PriorEval:
    """One prior in one mode on one card × regime: per-shape results and their summary."""

    prior: str
    mode: str
    shapes: list[ShapeResult]
    unit: str = ""

    @property
    def spearmans(self) -> list[float]:
        return [s.spearman for s in self.shapes if s.spearman is not None]

    @property
    def spearman_median(self) -> float | None:
        rhos = self.spearmans
        return statistics.median(rhos) if rhos else None

    @property
    def regrets(self) -> list[float]:
        return [s.regret for s in self.shapes]

    @property
    def misses(self) -> list[ShapeResult]:
        return sorted((s for s in self.shapes if s.regret > MISS_RATIO),
                      key=lambda s: (-s.regret, s.shape_id))

    def summary(self) -> dict[str, Any]:
        r = self.regrets
        return {
            "prior": self.prior, "mode": self.mode, "n_shapes": len(self.shapes),
            "spearman_median": self.spearman_median, "n_spearman": len(self.spearmans),
            "regret_mean": statistics.fmean(r) if r else None,
            "regret_median": statistics.median(r) if r else None,
            "regret_worst": max(r) if r else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(),
                "misses": [{"kind": s.kind, "shape_id": s.shape_id, "regret": s.regret,
                            "pick_spec": s.pick_spec, "best_spec": s.best_spec}
                           for s in self.misses],
                "shapes": [s.to_json() for s in self.shapes]}


@dataclass
class CardEval:
    """Everything evaluated on one card in one regime."""

    gpu: str
    regime: str
    nodes: int  # rows of this card and regime in the table (of the kinds asked for)
    ok: int
    stale: int  # ok rows of another featurizer version, left out
    evaluated: list[ShapeKey]
    skipped: list[tuple[str, str, int]]  # (kind, shape_id, ok rows)
    evals: list[PriorEval] = field(default_factory=list)
    min_rows: int = MIN_ROWS

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "regime": self.regime, "min_rows": self.min_rows,
                "nodes": self.nodes, "ok": self.ok,
                "failed": self.nodes - self.ok, "stale": self.stale,
                "shapes_evaluated": len(self.evaluated),
                "skipped": [{"kind": k, "shape_id": s, "ok_rows": n} for k, s, n in self.skipped],
                "evaluations": [e.to_json() for e in self.evals]}


# ---------------------------------------------------------------- the evaluation


def _shape(row: Row) -> ShapeKey:
    return (str(row["kind"]), str(row["shape_id"]))


def _usable(row: Row) -> bool:
    return (row.get("status") == "ok" and (row.get("feat_ver") or FEAT_VER) == FEAT_VER
            and isinstance(row.get("value_us"), (int, float)) and row["value_us"] > 0)


def _score(prior: Prior, rows: Sequence[Row]) -> list[float]:
    try:
        scores = prior.score(rows)
    except Exception as e:  # a plug-in's bug: say whose, keep the cause
        raise EvalError(f"prior {prior.name!r} failed to score {len(rows)} rows: {e!r}") from e
    scores = list(scores)
    if len(scores) != len(rows):
        raise EvalError(f"prior {prior.name!r} returned {len(scores)} scores for {len(rows)} rows; "
                        "score() must return one score per row, in order")
    return clean_scores(scores)


def _fit(prior: Prior, rows: Sequence[Row]) -> None:
    try:
        prior.fit(rows)
    except Exception as e:
        raise EvalError(f"prior {prior.name!r} failed to fit on {len(rows)} rows: {e!r}") from e


def score_shape(prior_scores: Sequence[float], rows: Sequence[Row]) -> ShapeResult:
    """The result of one shape's rows scored ``prior_scores`` (pure)."""
    values = [float(r["value_us"]) for r in rows]
    i = pick(prior_scores, values)
    best = min(range(len(values)), key=lambda j: values[j])
    kind, shape_id = _shape(rows[0])
    return ShapeResult(kind=kind, shape_id=shape_id, n_rows=len(rows),
                       spearman=spearman(prior_scores, values),
                       regret=values[i] / values[best], pick_spec=str(rows[i]["spec"]),
                       pick_us=values[i], best_spec=str(rows[best]["spec"]), best_us=values[best],
                       scores=list(prior_scores), values=values,
                       specs=[str(r["spec"]) for r in rows])


def evaluate(
    rows: Iterable[Row],
    priors: Sequence[Prior],
    *,
    regime: str = "deployable",
    gpus: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    min_rows: int = MIN_ROWS,
) -> list[CardEval]:
    """Evaluate ``priors`` on node ``rows`` (any cards, regimes and statuses).

    Only rows of ``regime`` are used.  ``gpus`` / ``kinds`` choose what is *evaluated*; the
    priors still train on every kind of the card (shape-out) or every other card (card-out),
    so a filter never changes a shape's numbers.
    """
    in_regime = [r for r in rows if r.get("regime") == regime]
    usable = [r for r in in_regime if _usable(r)]
    by_card: dict[str, list[Row]] = defaultdict(list)
    for r in usable:
        by_card[str(r["gpu"])].append(r)
    cards = sorted({str(r["gpu"]) for r in in_regime})
    if gpus is not None:
        cards = [g for g in cards if g in gpus]
    out = []
    for gpu in cards:
        def wanted(r: Row) -> bool:
            return kinds is None or r["kind"] in kinds

        card_all = [r for r in in_regime if r["gpu"] == gpu and wanted(r)]
        train_pool = by_card.get(gpu, [])
        groups: dict[ShapeKey, list[Row]] = defaultdict(list)
        for r in train_pool:
            if wanted(r):
                groups[_shape(r)].append(r)
        n_ok = sum(1 for r in card_all if r.get("status") == "ok")
        block = CardEval(
            gpu=gpu, regime=regime, nodes=len(card_all), ok=n_ok,
            stale=n_ok - sum(len(g) for g in groups.values()),
            evaluated=sorted(k for k, g in groups.items() if len(g) >= min_rows),
            skipped=sorted((k[0], k[1], len(g)) for k, g in groups.items() if len(g) < min_rows),
            min_rows=min_rows,
        )
        others = [r for g, rs in by_card.items() if g != gpu for r in rs]
        for prior in priors:
            unit = str(getattr(prior, "unit", ""))
            results = []
            if learns(prior):
                for key in block.evaluated:
                    _fit(prior, [r for r in train_pool if _shape(r) != key])
                    results.append(score_shape(_score(prior, groups[key]), groups[key]))
            else:
                _fit(prior, [])
                results = [score_shape(_score(prior, groups[k]), groups[k])
                           for k in block.evaluated]
            block.evals.append(PriorEval(prior.name, SHAPE_OUT, results, unit))
            if learns(prior) and others and block.evaluated:
                _fit(prior, others)
                block.evals.append(PriorEval(prior.name, CARD_OUT, [
                    score_shape(_score(prior, groups[k]), groups[k]) for k in block.evaluated
                ], unit))
        out.append(block)
    return out


# ---------------------------------------------------------------- rendering


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_text(blocks: Sequence[CardEval]) -> str:
    """The tables a user reads: one per card × regime, a line per prior × mode."""
    if not blocks:
        return "no rows to evaluate"
    lines: list[str] = []
    for b in blocks:
        lines.append(f"[{b.gpu}] {b.nodes} nodes ({b.regime}: {b.ok} ok, {b.nodes - b.ok} failed"
                     + (f", {b.stale} of another featurizer version" if b.stale else "") + ")")
        lines.append(f"  {len(b.evaluated)} shapes evaluated (>= {b.min_rows} ok rows), "
                     f"{len(b.skipped)} skipped")
        if b.evals and b.evaluated:
            header = (f"  {'prior':<12} {'mode':<10} {'shapes':>6} {'rho med':>8} {'rho n':>6} "
                      f"{'regret mean':>12} {'median':>7} {'worst':>7} {'>' + str(MISS_RATIO) + 'x':>6}")
            lines.append(header)
            lines.append("  " + "-" * (len(header) - 2))
            for e in b.evals:
                s = e.summary()
                lines.append(
                    f"  {e.prior:<12} {e.mode:<10} {s['n_shapes']:>6} "
                    f"{_f(s['spearman_median']):>8} {s['n_spearman']:>6} "
                    f"{_f(s['regret_mean']):>12} {_f(s['regret_median']):>7} "
                    f"{_f(s['regret_worst']):>7} {len(e.misses):>6}")
            missing = [(e, m) for e in b.evals for m in e.misses]
            if missing:
                lines.append(f"  misses best (pick > {MISS_RATIO}x the best):")
                for e, m in missing:
                    lines.append(f"    {e.prior}/{e.mode} {m.shape_id}: {m.regret:.2f}x "
                                 f"(picked {m.pick_spec} at {m.pick_us:.4g} us; best "
                                 f"{m.best_spec} at {m.best_us:.4g} us)")
        for _kind, shape_id, n in b.skipped:
            lines.append(f"  skipped {shape_id}: {n} ok row{'s' if n != 1 else ''} "
                         f"(needs {b.min_rows})")
        lines.append("")
    return "\n".join(lines).rstrip()


def to_json(blocks: Sequence[CardEval], **context: Any) -> dict[str, Any]:
    """A machine-readable dict of the evaluation (``context`` adds top-level keys)."""
    return {**context, "miss_ratio": MISS_RATIO,
            "cards": [b.to_json() for b in blocks]}


# ---------------------------------------------------------------- from a node DB


@dataclass
class EvalRequest:
    """What ``python -m harness eval`` / ``report`` asked for, before any rows are read."""

    db: Any  # a path
    gpu: str | None = None  # alias or canonical name
    kinds: list[str] | None = None
    regime: str = "deployable"
    priors: list[str] = field(default_factory=list)
    anchors_dir: Any = None  # a path; None: harness/goldens/anchors
    seed: int = 0
    min_rows: int = MIN_ROWS


def resolve_gpu(value: str, known: Iterable[str]) -> str:
    """A ``--gpu`` value as the canonical name in the ``gpu`` column: a catalog alias or
    name, or any name the table holds; otherwise :class:`RequestError` listing both."""
    from harness.cards import UnknownCardError, aliases, by_alias

    known = sorted(set(known))
    if value in known:
        return value
    try:
        return by_alias(value).name
    except UnknownCardError:
        raise RequestError(
            f"--gpu {value!r} names no card; aliases: {', '.join(aliases())}; cards in this "
            f"table: {', '.join(known) or '(none)'}"
        ) from None


def run_request(req: EvalRequest, *, allow_empty: bool = False
                ) -> tuple[list[CardEval], list[dict[str, Any]]]:
    """Read the DB, build the priors, evaluate; returns the results and every row read.

    Raises :class:`RequestError` (or :class:`harness.priors.PriorError`) for what the user must
    fix: a missing DB, an unknown card, kind or prior, a regime the table has no rows of
    (with ``allow_empty``, that last one gives no results instead)."""
    from pathlib import Path

    from harness import goldens
    from harness import kinds as kind_registry
    from harness import priors as prior_registry
    from harness.store import REGIMES, NodeStore

    db = Path(req.db)
    if not db.is_file():
        raise RequestError(f"no node table at {db} (give --db, or set $EMMY_TUNE_DB)")
    if req.regime not in REGIMES:
        raise RequestError(f"--regime {req.regime!r}; valid regimes: {', '.join(REGIMES)}")
    for kind in req.kinds or ():
        if kind not in kind_registry.names():
            raise RequestError(f"--kind {kind!r}; valid kinds: {', '.join(kind_registry.names())}")
    anchors = tuple(goldens.anchors(Path(req.anchors_dir) if req.anchors_dir else None))
    ctx = prior_registry.PriorContext(anchors=anchors, seed=req.seed)
    built = [prior_registry.make(name, ctx) for name in (req.priors or prior_registry.DEFAULT_PRIORS)]
    with NodeStore(db) as store:
        rows = store.rows()
    in_regime = {str(r["gpu"]) for r in rows if r.get("regime") == req.regime}
    if not in_regime and allow_empty:
        return [], rows
    if not in_regime:
        have = sorted({str(r.get("regime")) for r in rows})
        raise RequestError(f"{db} has no {req.regime} rows"
                        + (f" (it has {', '.join(have)} rows: try --regime {have[0]})" if have
                           else " (it is empty)"))
    gpus = None
    if req.gpu:
        gpu = resolve_gpu(req.gpu, {str(r["gpu"]) for r in rows})
        if gpu not in in_regime:
            raise RequestError(f"{db} has no {req.regime} rows of {gpu}; cards with {req.regime} "
                            f"rows: {', '.join(sorted(in_regime))}")
        gpus = [gpu]
    blocks = evaluate(rows, built, regime=req.regime, gpus=gpus, kinds=req.kinds,
                      min_rows=req.min_rows)
    return blocks, rows
