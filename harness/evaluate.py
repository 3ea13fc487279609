"""Evaluate priors on the node table: rank quality (Spearman) and top-1 regret per shape.

For one card and regime, a *shape* with at least ``min_rows`` ``ok`` rows is a test case:
the prior scores its rows (lower = predicted faster), and

- **Spearman** is the rank correlation between the scores and the measured ``value_us``
  (1 = the prior orders the configurations exactly as measured, -1 = exactly backwards;
  undefined, and left out of the median, when the scores or the times are all equal);
- **regret** is the measured time of the prior's pick (its lowest score) over the best
  measured time; when several rows share the lowest score the pick is the *slowest* of them,
  so a prior that cannot tell configurations apart is not rewarded for it.

A prior that scores every row of a shape alike (``transfer`` where no other card anchors the
shape; NaN scores, "no opinion", count as alike) **abstains** there: it has no pick, and the
shape is left out of its Spearman and regret figures and counted apart.

A card × regime × prior × mode is summarized by the median Spearman over its shapes and the
mean / median / worst regret; shapes whose pick is more than ``MISS_RATIO`` times the best
are listed (the prior "misses the best").  Shapes with too few rows are counted as skipped.

Modes (what the prior was fitted on before it scored a shape):

- ``shape-out``: the other shapes of the same card and regime.  A prior that learns is
  fitted once per *fold*: the shapes are dealt to ``folds`` folds kind by kind
  (:func:`shape_folds`), so a fold holds out as few shapes of any one kind as it can, and a
  shape is scored by the fit that did not see it.  Where no kind has more shapes than there
  are folds, a shape's own kind is trained on exactly as in leave-one-shape-out, at a
  fraction of the fits; ``folds=0`` is leave-one-shape-out itself (one fit per shape);
- ``card-out``: every row of the other cards in the regime (leave-one-card-out), only when
  the table holds two or more cards there, and only for priors that learn.

Only ``ok`` rows of the current featurizer version take part.  Baseline rows
(``baseline=torch``, ``baseline=compile``: :func:`harness.shipped.is_baseline`) are not
configurations: no prior is fitted on or scored on them, and they are never a shape's best.

:func:`compare_shipped` then sets the priors' picks beside what people ship instead of tuning
(:mod:`harness.shipped`): per shape, the time of each method's pick over the best measured
configuration: the learned prior's top-1 and its best of top-3 and top-8, the shipped
heuristic's one configuration, the best of the published autotune list, the transfer prior's
top-1, and the two baselines, with how many measurements each needs to come within
``WITHIN`` of the best.

Pure apart from the priors themselves: rows in, :class:`CardEval` and :class:`ShippedEval`
values out; :func:`format_text`, :func:`format_shipped` and :func:`to_json` render them.
:func:`evaluate` reports each fit through an optional ``progress`` callback.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import shipped
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
    """One prior on one shape: its Spearman, its pick and the regret of that pick; no pick
    (``abstained``) where the prior scored every row alike."""

    kind: str
    shape_id: str
    n_rows: int
    spearman: float | None
    regret: float | None  # None: abstained
    pick_spec: str | None
    pick_us: float | None
    best_spec: str
    best_us: float
    # Kept for the plots, left out of the JSON.
    scores: list[float] = field(default_factory=list, repr=False)
    values: list[float] = field(default_factory=list, repr=False)
    specs: list[str] = field(default_factory=list, repr=False)

    @property
    def abstained(self) -> bool:
        return self.regret is None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape_id": self.shape_id, "n_rows": self.n_rows,
                "abstained": self.abstained, "spearman": self.spearman, "regret": self.regret,
                "pick_spec": self.pick_spec, "pick_us": self.pick_us,
                "best_spec": self.best_spec, "best_us": self.best_us}


@dataclass
class PriorEval:
    """One prior in one mode on one card × regime: per-shape results and their summary.
    ``folds``: the fits of a learning prior in shape-out mode (0: not fitted per fold)."""

    prior: str
    mode: str
    shapes: list[ShapeResult]
    unit: str = ""
    folds: int = 0

    @property
    def scored(self) -> list[ShapeResult]:
        """The shapes the prior has a pick on (it did not abstain)."""
        return [s for s in self.shapes if not s.abstained]

    @property
    def abstained(self) -> list[ShapeResult]:
        return [s for s in self.shapes if s.abstained]

    @property
    def spearmans(self) -> list[float]:
        return [s.spearman for s in self.scored if s.spearman is not None]

    @property
    def spearman_median(self) -> float | None:
        rhos = self.spearmans
        return statistics.median(rhos) if rhos else None

    @property
    def regrets(self) -> list[float]:
        return [s.regret for s in self.scored if s.regret is not None]

    @property
    def misses(self) -> list[ShapeResult]:
        return sorted((s for s in self.scored if s.regret is not None and s.regret > MISS_RATIO),
                      key=lambda s: (-(s.regret or 0.0), s.shape_id))

    def summary(self) -> dict[str, Any]:
        r = self.regrets
        return {
            "prior": self.prior, "mode": self.mode, "n_shapes": len(self.shapes),
            "n_abstained": len(self.abstained), "folds": self.folds,
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
                "abstained": [s.shape_id for s in self.abstained],
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
    baselines: int = 0  # ok baseline rows (baseline=torch, baseline=compile): not configurations

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "regime": self.regime, "min_rows": self.min_rows,
                "nodes": self.nodes, "ok": self.ok,
                "failed": self.nodes - self.ok, "stale": self.stale,
                "baselines": self.baselines,
                "shapes_evaluated": len(self.evaluated),
                "skipped": [{"kind": k, "shape_id": s, "ok_rows": n} for k, s, n in self.skipped],
                "evaluations": [e.to_json() for e in self.evals]}


# ---------------------------------------------------------------- the evaluation


def _shape(row: Row) -> ShapeKey:
    return (str(row["kind"]), str(row["shape_id"]))


def _measured(row: Row) -> bool:
    """An ``ok`` row of the current featurizer version with a positive time."""
    return (row.get("status") == "ok" and (row.get("feat_ver") or FEAT_VER) == FEAT_VER
            and isinstance(row.get("value_us"), (int, float)) and row["value_us"] > 0)


def _is_baseline(row: Row) -> bool:
    return shipped.is_baseline(str(row.get("spec") or ""))


def _usable(row: Row) -> bool:
    """A measured configuration: what priors are fitted and scored on, and a shape's best
    comes from.  Baseline rows are measured but are not configurations."""
    return _measured(row) and not _is_baseline(row)


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


def abstains(scores: Sequence[float]) -> bool:
    """Whether ``scores`` (of one shape's rows) say nothing: every row scored alike."""
    return len(set(scores)) <= 1


def score_shape(prior_scores: Sequence[float], rows: Sequence[Row]) -> ShapeResult:
    """The result of one shape's rows scored ``prior_scores`` (pure)."""
    values = [float(r["value_us"]) for r in rows]
    best = min(range(len(values)), key=lambda j: values[j])
    kind, shape_id = _shape(rows[0])
    out = ShapeResult(kind=kind, shape_id=shape_id, n_rows=len(rows), spearman=None,
                      regret=None, pick_spec=None, pick_us=None,
                      best_spec=str(rows[best]["spec"]), best_us=values[best],
                      scores=list(prior_scores), values=values,
                      specs=[str(r["spec"]) for r in rows])
    if not abstains(prior_scores):
        i = pick(prior_scores, values)
        out.spearman = spearman(prior_scores, values)
        out.regret, out.pick_spec, out.pick_us = values[i] / values[best], str(rows[i]["spec"]), \
            values[i]
    return out


FOLDS = 6
"""Fits of a learning prior in shape-out mode (see :func:`shape_folds`)."""

Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: called as the fits of one card × prior × mode go by
(``done`` of ``total``, 0 before the first); ``what`` names them (``"[card] prior mode"``)."""


def shape_folds(shapes: Sequence[ShapeKey], folds: int = FOLDS) -> list[list[ShapeKey]]:
    """``shapes`` dealt to ``folds`` folds kind by kind, in order, one card to each fold in
    turn and carrying on from kind to kind: a fold holds at most ``ceil(n / folds)`` of a
    kind's ``n`` shapes, and the folds' sizes differ by at most one.  ``folds`` 0 (or more
    folds than shapes): one fold per shape (leave-one-shape-out).  Empty folds are dropped."""
    if folds < 0:
        raise ValueError(f"folds must be >= 0 (0: one fold per shape), got {folds}")
    ordered = sorted(shapes)
    if folds == 0 or folds >= len(ordered):
        return [[k] for k in ordered]
    out: list[list[ShapeKey]] = [[] for _ in range(folds)]
    for i, key in enumerate(ordered):  # sorted by kind: a kind's shapes go to folds in turn
        out[i % folds].append(key)
    return [f for f in out if f]


def evaluate(
    rows: Iterable[Row],
    priors: Sequence[Prior],
    *,
    regime: str = "deployable",
    gpus: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    min_rows: int = MIN_ROWS,
    folds: int = FOLDS,
    progress: Progress | None = None,
) -> list[CardEval]:
    """Evaluate ``priors`` on node ``rows`` (any cards, regimes and statuses).

    Only rows of ``regime`` are used.  ``gpus`` / ``kinds`` choose what is *evaluated*; the
    priors still train on every kind of the card (shape-out) or every other card (card-out),
    so a filter never changes a shape's numbers.  ``folds``: see :func:`shape_folds`.
    """
    if folds < 0:
        raise ValueError(f"folds must be >= 0 (0: one fold per shape), got {folds}")
    tell = progress or (lambda what, done, total: None)
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
        n_base = sum(1 for r in card_all if r.get("status") == "ok" and _is_baseline(r))
        block = CardEval(
            gpu=gpu, regime=regime, nodes=len(card_all), ok=n_ok, baselines=n_base,
            stale=n_ok - n_base - sum(len(g) for g in groups.values()),
            evaluated=sorted(k for k, g in groups.items() if len(g) >= min_rows),
            skipped=sorted((k[0], k[1], len(g)) for k, g in groups.items() if len(g) < min_rows),
            min_rows=min_rows,
        )
        others = [r for g, rs in by_card.items() if g != gpu for r in rs]
        for prior in priors:
            unit = str(getattr(prior, "unit", ""))
            what = f"[{gpu}] {prior.name} {SHAPE_OUT}"
            results: dict[ShapeKey, ShapeResult] = {}
            n_folds = 0
            if learns(prior) and block.evaluated:
                dealt = shape_folds(block.evaluated, folds)
                n_folds = len(dealt)
                tell(what, 0, n_folds)
                for done, fold in enumerate(dealt, 1):
                    held = set(fold)
                    _fit(prior, [r for r in train_pool if _shape(r) not in held])
                    for key in fold:
                        results[key] = score_shape(_score(prior, groups[key]), groups[key])
                    tell(what, done, n_folds)
            else:
                _fit(prior, [])
                results = {k: score_shape(_score(prior, groups[k]), groups[k])
                           for k in block.evaluated}
            block.evals.append(PriorEval(prior.name, SHAPE_OUT,
                                         [results[k] for k in block.evaluated], unit, n_folds))
            if learns(prior) and others and block.evaluated:
                what = f"[{gpu}] {prior.name} {CARD_OUT}"
                tell(what, 0, 1)
                _fit(prior, others)
                block.evals.append(PriorEval(prior.name, CARD_OUT, [
                    score_shape(_score(prior, groups[k]), groups[k]) for k in block.evaluated
                ], unit))
                tell(what, 1, 1)
        out.append(block)
    return out


# ---------------------------------------------------------------- rendering


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str], left: Sequence[int] = (0,),
           indent: str = "  ") -> list[str]:
    """A tabulate table, columns right-aligned but those in ``left``, indented."""
    from tabulate import tabulate

    cols = range(len(headers))
    text = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True,
                    colalign=tuple("left" if i in left else "right" for i in cols))
    return [indent + line.rstrip() for line in text.splitlines()]


def format_text(blocks: Sequence[CardEval], *, verbose: bool = False) -> str:
    """The tables a user reads: one per card × regime, a line per prior × mode.  ``verbose``
    also lists every pick over ``MISS_RATIO`` times the best, the shapes each prior abstained
    on and the shapes skipped; otherwise one line says how many there are."""
    if not blocks:
        return "no rows to evaluate"
    lines: list[str] = []
    for b in blocks:
        lines.append(f"[{b.gpu}] {b.regime}: {b.nodes} rows, {b.ok} ok, {b.nodes - b.ok} failed"
                     + (f", {b.stale} ok of another featurizer version" if b.stale else "")
                     + (f", {b.baselines} ok baselines (not configurations)"
                        if b.baselines else ""))
        lines.append(f"  {len(b.evaluated)} shapes evaluated (>= {b.min_rows} ok configurations), "
                     f"{len(b.skipped)} skipped; regret = time of the pick / best")
        if b.evals and b.evaluated:
            table = []
            for e in b.evals:
                s = e.summary()
                mode = e.mode + (f" ({e.folds} folds)" if e.folds else "")
                table.append([e.prior, mode, str(s["n_shapes"]),
                              str(s["n_abstained"] or "-"), _f(s["spearman_median"]),
                              _f(s["regret_mean"]), _f(s["regret_median"]),
                              _f(s["regret_worst"]), str(len(e.misses))])
            lines += _table(table, ("prior", "mode", "shapes", "abstains", "rho med",
                                    "regret mean", "median", "worst", f">{MISS_RATIO}x"),
                            left=(0, 1))
            missing = [(e, m) for e in b.evals for m in e.misses]
            abstaining = [e for e in b.evals if e.abstained]
            if abstaining:
                lines.append("  abstains: every row of the shape scored alike (no opinion); left "
                             "out of the prior's figures")
            if verbose:
                if missing:
                    lines.append(f"  misses best (pick > {MISS_RATIO}x the best):")
                for e, m in missing:
                    lines.append(f"    {e.prior}/{e.mode} {m.shape_id}: {m.regret:.2f}x "
                                 f"(picked {m.pick_spec} at {m.pick_us:.4g} us; best "
                                 f"{m.best_spec} at {m.best_us:.4g} us)")
                for e in abstaining:
                    lines.append(f"    {e.prior}/{e.mode} abstains on: "
                                 + ", ".join(s.shape_id for s in e.abstained))
            elif missing:
                lines.append(f"  {len(missing)} picks over {MISS_RATIO}x the best (-v lists "
                             "them and the shapes each prior abstains on)")
        if verbose:
            for _kind, shape_id, n in b.skipped:
                lines.append(f"  skipped {shape_id}: {n} ok row{'s' if n != 1 else ''} "
                             f"(needs {b.min_rows})")
        elif b.skipped:
            lines.append(f"  skipped {len(b.skipped)} shape{'s' if len(b.skipped) != 1 else ''} "
                         f"with fewer than {b.min_rows} ok rows (-v lists them)")
        lines.append("")
    return "\n".join(lines).rstrip()


def format_eval(blocks: Sequence[CardEval], versus: Sequence[ShippedEval] = (), *,
                verbose: bool = False) -> str:
    """What ``python -m harness eval`` prints: :func:`format_text`, then
    :func:`format_shipped` where there is a comparison."""
    text = format_text(blocks, verbose=verbose)
    return f"{text}\n\n{format_shipped(versus)}" if versus else text


def to_json(blocks: Sequence[CardEval], **context: Any) -> dict[str, Any]:
    """A machine-readable dict of the evaluation (``context`` adds top-level keys)."""
    return {**context, "miss_ratio": MISS_RATIO,
            "cards": [b.to_json() for b in blocks]}


# ---------------------------------------------------------------- against what people ship

LEARNED, TRANSFER = "learned", "transfer"
TOP_K = (3, 8)
WITHIN = 1.05
METHODS = ("learned", "learned_top3", "learned_top8", "heuristic", "autotune_list", "transfer",
           "torch", "compile")
"""Every method of the comparison, in the order of the tables."""
WALKS = ("learned", "heuristic", "autotune_list", "transfer")
"""The methods whose measurements to come within ``WITHIN`` of the best are counted."""
NOT_EVALUATED, NOT_MEASURED, NO_RULE, NO_LIST, NO_CARD, ABSTAINS = (
    "not evaluated", "not measured", "no rule", "no list", "no card or shape", "abstains")


@dataclass(frozen=True)
class Pick:
    """What one method picks on one shape, and that pick's measured time over the best.

    ``to_within``: measurements the method takes to come within ``WITHIN`` of the best (the
    prior's walk in score order; 1 for the heuristic, the list's measured length for the
    autotune list); None when it never does, or for a method that is not a walk."""

    spec: str
    value_us: float
    regret: float
    to_within: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "value_us": self.value_us, "regret": self.regret,
                "to_within": self.to_within}


@dataclass
class ShippedShape:
    """Every method on one shape: the picks it has, and why the others have none."""

    kind: str
    shape_id: str
    n_rows: int  # measured configurations of the shape (baselines not counted)
    best_spec: str
    best_us: float
    picks: dict[str, Pick] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # method → why it has no pick
    listed: int = 0  # configurations of the autotune list this card can run
    listed_measured: int = 0  # of which measured
    abstained: list[str] = field(default_factory=list)  # priors that scored every row alike

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape_id": self.shape_id, "n_rows": self.n_rows,
                "best_spec": self.best_spec, "best_us": self.best_us,
                "picks": {m: p.to_json() for m, p in self.picks.items()},
                "missing": dict(self.missing), "abstained": list(self.abstained),
                "autotune_list": {"listed": self.listed, "measured": self.listed_measured}}


def _rate(shapes: Sequence[ShippedShape], a: str, b: str) -> dict[str, Any]:
    """Shapes where method ``a``'s pick is at least as fast as ``b``'s, of those with both."""
    both = [s for s in shapes if a in s.picks and b in s.picks]
    wins = sum(1 for s in both if s.picks[a].value_us <= s.picks[b].value_us)
    return {"wins": wins, "n": len(both), "rate": wins / len(both) if both else None}


WIN_RATES = (("learned", "heuristic"), ("learned_top8", "autotune_list"))
"""(a, b): the fraction of shapes where ``a`` is at least as fast as ``b``."""


def summarize_shipped(shapes: Sequence[ShippedShape]) -> dict[str, Any]:
    """Per method: shapes with a pick, mean / median / worst regret, how many came within
    ``WITHIN`` of the best and the median measurements that took, and why the others have no
    pick; and the win rates of :data:`WIN_RATES`."""
    methods: dict[str, Any] = {}
    for m in METHODS:
        picks = [s.picks[m] for s in shapes if m in s.picks]
        r = [p.regret for p in picks]
        entry: dict[str, Any] = {
            "n": len(picks),
            "regret_mean": statistics.fmean(r) if r else None,
            "regret_median": statistics.median(r) if r else None,
            "regret_worst": max(r) if r else None,
            "missing": dict(sorted(Counter(s.missing[m] for s in shapes
                                           if m in s.missing).items())),
            "abstained": sum(1 for s in shapes if m in s.abstained),
        }
        if m in WALKS:
            counts = [p.to_within for p in picks if p.to_within is not None]
            entry["within"] = len(counts)
            entry["to_within_median"] = statistics.median(counts) if counts else None
        methods[m] = entry
    listed = [s for s in shapes if s.listed]
    return {"n_shapes": len(shapes), "methods": methods,
            "autotune_list": {"listed": sum(s.listed for s in listed),
                              "measured": sum(s.listed_measured for s in listed)},
            "win_rates": {f"{a}<={b}": _rate(shapes, a, b) for a, b in WIN_RATES}}


@dataclass
class ShippedEval:
    """The comparison on one card × regime.  ``learned`` / ``transfer``: the priors whose
    shape-out picks fill those columns (None: not evaluated)."""

    gpu: str
    regime: str
    shapes: list[ShippedShape]
    learned: str | None = None
    transfer: str | None = None

    @property
    def has_shipped(self) -> bool:
        """Whether any shape has a shipped configuration or a baseline measured."""
        return any(m in s.picks for s in self.shapes
                   for m in ("heuristic", "autotune_list", "torch", "compile"))

    @property
    def kinds(self) -> list[str]:
        return sorted({s.kind for s in self.shapes})

    def summary(self, kind: str | None = None) -> dict[str, Any]:
        return summarize_shipped([s for s in self.shapes if kind is None or s.kind == kind])

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "regime": self.regime, "within": WITHIN, "top_k": list(TOP_K),
                "learned": self.learned, "transfer": self.transfer,
                "summary": self.summary(),
                "kinds": {k: self.summary(k) for k in self.kinds},
                "shapes": [s.to_json() for s in self.shapes]}


def walk_order(scores: Sequence[float], values: Sequence[float]) -> list[int]:
    """Row indices in a prior's order: lowest score first; tied scores slowest first, so a
    prior that cannot tell rows apart is never credited with the faster of them."""
    return sorted(range(len(scores)), key=lambda i: (scores[i], -values[i]))


def _prior_picks(result: ShapeResult, name: str, best: float, top_k: Sequence[int] = ()
                 ) -> dict[str, Pick]:
    order = walk_order(result.scores, result.values)
    if not order:
        return {}
    values, specs = result.values, result.specs
    to_within = next(n for n, i in enumerate(order, 1) if values[i] <= WITHIN * best
                     or n == len(order))
    reached = values[order[to_within - 1]] <= WITHIN * best
    first = order[0]
    out = {name: Pick(specs[first], values[first], values[first] / best,
                      to_within if reached else None)}
    for k in top_k:
        i = min(order[:k], key=lambda j: values[j])
        out[f"{name}_top{k}"] = Pick(specs[i], values[i], values[i] / best)
    return out


def _shape_of(row: Row) -> Mapping[str, Any] | None:
    shape = row.get("shape_spec") or row.get("shape")
    return shape if isinstance(shape, Mapping) else None


def _shipped_specs(kind: str, shape: Mapping[str, Any] | None, gpu: str
                   ) -> tuple[str | None, list[str]] | None:
    """(the heuristic's spec or None, the autotune list's specs) of a shape on card ``gpu``;
    None when the card is not in the catalog, runs the interpreter, or the shape is unknown."""
    from harness.cards import INTERPRET, UnknownCardError, by_name
    from harness.points import make_spec

    if shape is None:
        return None
    try:
        card = by_name(gpu)
    except UnknownCardError:
        return None
    if card.regime == INTERPRET:
        return None
    try:
        h = shipped.heuristic(kind, shape, card)
        listed = shipped.autotune_list(kind, shape, card)
    except (KeyError, TypeError, ValueError):
        return None
    return (make_spec(h) if h else None), [make_spec(k) for k in listed]


def compare_shipped_shape(rows: Sequence[Row], *, learned: ShapeResult | None = None,
                          transfer: ShapeResult | None = None,
                          shipped_specs: tuple[str | None, list[str]] | None = None
                          ) -> ShippedShape:
    """Every method on one shape's measured rows (configurations and baselines); ``learned``
    / ``transfer``: the priors' results on the shape; ``shipped_specs``: the heuristic's spec
    and the autotune list's (:func:`harness.shipped.heuristic`, :func:`~harness.shipped.autotune_list`
    as specs), None where the card has none."""
    configs = [r for r in rows if not _is_baseline(r)]
    kind, shape_id = _shape(rows[0])
    best_row = min(configs, key=lambda r: float(r["value_us"]))
    best = float(best_row["value_us"])
    out = ShippedShape(kind=kind, shape_id=shape_id, n_rows=len(configs),
                       best_spec=str(best_row["spec"]), best_us=best)
    for name, result, top_k in ((LEARNED, learned, TOP_K), (TRANSFER, transfer, ())):
        abstained = result is not None and result.abstained
        got = _prior_picks(result, name, best, top_k) if result and not abstained else {}
        if abstained:
            out.abstained.append(name)
        out.picks.update(got)
        for m in (name, *(f"{name}_top{k}" for k in top_k)):
            if m not in got:
                out.missing[m] = ABSTAINS if abstained else NOT_EVALUATED
    by_spec: dict[str, float] = {}
    for r in configs:  # a spec measured twice counts at its slower time
        spec, v = str(r["spec"]), float(r["value_us"])
        by_spec[spec] = max(v, by_spec.get(spec, v))
    if shipped_specs is None:
        out.missing["heuristic"] = out.missing["autotune_list"] = NO_CARD
    else:
        h_spec, listed = shipped_specs
        if h_spec is None:
            out.missing["heuristic"] = NO_RULE
        elif h_spec not in by_spec:
            out.missing["heuristic"] = NOT_MEASURED
        else:
            v = by_spec[h_spec]
            out.picks["heuristic"] = Pick(h_spec, v, v / best, 1 if v <= WITHIN * best else None)
        measured = [s for s in listed if s in by_spec]
        out.listed, out.listed_measured = len(listed), len(measured)
        if not listed:
            out.missing["autotune_list"] = NO_LIST
        elif not measured:
            out.missing["autotune_list"] = NOT_MEASURED
        else:
            s = min(measured, key=lambda x: by_spec[x])
            v = by_spec[s]
            out.picks["autotune_list"] = Pick(s, v, v / best,
                                              len(measured) if v <= WITHIN * best else None)
    for name in shipped.BASELINES:
        spec = f"{shipped.BASELINE_KNOB}={name}"
        times = [float(r["value_us"]) for r in rows if r["spec"] == spec]
        if times:
            out.picks[name] = Pick(spec, max(times), max(times) / best)
        else:
            out.missing[name] = NOT_MEASURED
    return out


def _shape_out(block: CardEval, prior: str | None) -> dict[ShapeKey, ShapeResult]:
    for e in block.evals:
        if e.prior == prior and e.mode == SHAPE_OUT:
            return {(s.kind, s.shape_id): s for s in e.shapes}
    return {}


def compare_shipped(rows: Iterable[Row], blocks: Sequence[CardEval], *,
                    learned: str = LEARNED, transfer: str = TRANSFER) -> list[ShippedEval]:
    """Per card × regime of ``blocks`` (the results of :func:`evaluate` on ``rows``): every
    evaluated shape set against what people ship.  The learned and transfer columns come from
    the priors named ``learned`` and ``transfer`` in shape-out mode (absent when they were not
    evaluated); the heuristic, the autotune list and the baselines from the measured rows."""
    groups: dict[tuple[str, str], dict[ShapeKey, list[Row]]] = defaultdict(
        lambda: defaultdict(list))
    for r in rows:
        if _measured(r):
            groups[(str(r["gpu"]), str(r.get("regime")))][_shape(r)].append(r)
    out = []
    for b in blocks:
        card_groups = groups.get((b.gpu, b.regime), {})
        learned_results = _shape_out(b, learned)
        transfer_results = _shape_out(b, transfer)
        shapes = []
        for key in b.evaluated:
            rs = card_groups.get(key, [])
            if not any(not _is_baseline(r) for r in rs):
                continue
            specs = _shipped_specs(key[0], next((s for r in rs if (s := _shape_of(r))), None),
                                   b.gpu)
            shapes.append(compare_shipped_shape(rs, learned=learned_results.get(key),
                                                transfer=transfer_results.get(key),
                                                shipped_specs=specs))
        out.append(ShippedEval(b.gpu, b.regime, shapes,
                               learned=learned if learned_results else None,
                               transfer=transfer if transfer_results else None))
    return out


COLUMNS = {"learned": "learned", "learned_top3": "top-3", "learned_top8": "top-8",
           "heuristic": "heuristic", "autotune_list": "autotune", "transfer": "transfer",
           "torch": "torch", "compile": "compile"}
"""Each method's column title in the tables."""


def _mm(entry: Mapping[str, Any]) -> str:
    if entry["n"] == 0:
        return "-"
    return f"{entry['regret_mean']:.2f}/{entry['regret_median']:.2f}"


def _win(rate: Mapping[str, Any]) -> str:
    return "-" if not rate["n"] else f"{rate['wins']}/{rate['n']}"


def format_shipped(evals: Sequence[ShippedEval]) -> str:
    """The comparison tables: per card × regime, one line per method over every shape, then
    one line per kind of mean/median regret per method and the win rates."""
    lines: list[str] = []
    for ev in evals:
        total = ev.summary()
        lines.append(f"[{ev.gpu}] against what people ship ({ev.regime}, {total['n_shapes']} "
                     f"shapes): regret = time of the pick / best measured configuration")
        table = []
        for m in METHODS:
            e = total["methods"][m]
            within = f"{e['within']}/{e['n']}" if m in WALKS and e["n"] else "-"
            missing = ", ".join(f"{why} {n}" for why, n in e["missing"].items())
            table.append([m, str(e["n"]), _f(e["regret_mean"]), _f(e["regret_median"]),
                          _f(e["regret_worst"]), within, _f(e.get("to_within_median"), 1),
                          missing])
        lines += _table(table, ("method", "shapes", "mean", "median", "worst",
                                f"within {WITHIN - 1:.0%}", "measured", "not picked"),
                        left=(0, 7))
        listed = total["autotune_list"]
        lines.append(f"  measured: median measurements to within {WITHIN - 1:.0%} of the best "
                     "(shapes that get there)"
                     + (f"; {listed['measured']} of {listed['listed']} autotune-list "
                        "configurations measured" if listed["listed"] else ""))
        (a1, b1), (a2, b2) = WIN_RATES
        heads = ("kind", "shapes", *(COLUMNS[m] for m in METHODS),
                 f"{COLUMNS[a1]}<={COLUMNS[b1][:4]}", f"{COLUMNS[a2]}<={COLUMNS[b2][:4]}")
        table = []
        for kind, s in [*((k, ev.summary(k)) for k in ev.kinds), ("all", total)]:
            table.append([kind, str(s["n_shapes"]), *(_mm(s["methods"][m]) for m in METHODS),
                          *(_win(s["win_rates"][f"{a}<={b}"]) for a, b in WIN_RATES)])
        lines.append("  mean/median regret per kind:")
        lines += _table(table, heads)
        rates = []
        for a, b in WIN_RATES:
            r = total["win_rates"][f"{a}<={b}"]
            rates.append(f"{a} at least as fast as {b} on "
                         + (f"{r['wins']} of {r['n']} shapes ({r['rate']:.0%})" if r["n"]
                            else "no shape (none has both)"))
        lines.append("  " + "; ".join(rates))
        if ev.learned is None:
            lines.append(f"  the {LEARNED} prior was not evaluated (--prior {LEARNED} adds it)")
        lines.append("")
    return "\n".join(lines).rstrip()


# ---------------------------------------------------------------- from a node DB


@dataclass
class EvalRequest:
    """What ``python -m harness eval`` / ``report`` asked for, before any rows are read."""

    db: Any  # a path
    gpu: str | None = None  # alias or canonical name
    kinds: list[str] | None = None
    regime: str | None = None  # None: the one the table holds (:func:`table_regime`)
    priors: list[str] = field(default_factory=list)
    anchors_dir: Any = None  # a path; None: harness/goldens/anchors
    seed: int = 0
    min_rows: int = MIN_ROWS
    folds: int = FOLDS
    as_measured: bool = False  # False: every row's time at its shape's reference clock


@dataclass
class EvalRun:
    """What :func:`run_request` gives back: the results, every row read, and the regime
    evaluated (the one asked for, or the table's)."""

    blocks: list[CardEval]
    rows: list[dict[str, Any]]
    regime: str


def table_regime(rows: Iterable[Row]) -> str:
    """The regime to evaluate when none is asked for: ``deployable`` where the table holds
    any such rows (the only regime priors train on), else the one it holds."""
    from harness.store import REGIMES

    have = {str(r.get("regime")) for r in rows}
    return next((reg for reg in REGIMES if reg in have), REGIMES[0])


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


def run_request(req: EvalRequest, *, allow_empty: bool = False,
                progress: Progress | None = None) -> EvalRun:
    """Read the DB, build the priors, evaluate.

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
    if req.regime is not None and req.regime not in REGIMES:
        raise RequestError(f"--regime {req.regime!r}; valid regimes: {', '.join(REGIMES)}")
    if req.folds < 0:
        raise RequestError(f"--folds {req.folds}: give a number of folds, or 0 for one fold "
                           f"per shape (leave-one-shape-out; the default is {FOLDS})")
    for kind in req.kinds or ():
        if kind not in kind_registry.names():
            raise RequestError(f"--kind {kind!r}; valid kinds: {', '.join(kind_registry.names())}")
    anchors = tuple(goldens.anchors(Path(req.anchors_dir) if req.anchors_dir else None))
    ctx = prior_registry.PriorContext(anchors=anchors, seed=req.seed)
    built = [prior_registry.make(name, ctx) for name in (req.priors or prior_registry.DEFAULT_PRIORS)]
    with NodeStore(db) as store:
        rows = store.rows()
    if not req.as_measured:
        from harness.steady import steadied

        rows = steadied(rows)
    regime = req.regime or table_regime(rows)
    in_regime = {str(r["gpu"]) for r in rows if r.get("regime") == regime}
    if not in_regime and allow_empty:
        return EvalRun([], rows, regime)
    if not in_regime:
        have = sorted({str(r.get("regime")) for r in rows})
        raise RequestError(f"{db} has no {regime} rows"
                           + (f" (it has {', '.join(have)} rows: try --regime {have[0]})" if have
                              else " (it is empty)"))
    gpus = None
    if req.gpu:
        gpu = resolve_gpu(req.gpu, {str(r["gpu"]) for r in rows})
        if gpu not in in_regime:
            raise RequestError(f"{db} has no {regime} rows of {gpu}; cards with {regime} "
                               f"rows: {', '.join(sorted(in_regime))}")
        gpus = [gpu]
    blocks = evaluate(rows, built, regime=regime, gpus=gpus, kinds=req.kinds,
                      min_rows=req.min_rows, folds=req.folds, progress=progress)
    return EvalRun(blocks, rows, regime)
