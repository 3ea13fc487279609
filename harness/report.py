"""``python -m harness report``: PNG plots of the node table and the eval, and an index.html.

Per card × regime:

- ``coverage-<card>.png``: ok and failed rows per kind × slice (stacked bars), for every
  regime the table holds;
- ``distance-<card>.png``: each ok row's time over its shape's best, against the knob
  distance of its spec to the nearest anchor of that shape (any card's);
- ``regret-<card>.png``, for the regime evaluated: per kind (and over all shapes), each
  prior's regret on every shape it has a pick on (dots) and their mean (a bar), on a log
  axis; shapes a prior abstains on are counted under the panel, not drawn;
- ``priors-<card>.png``: one panel per prior × mode: predicted against measured µs on log
  axes for priors that predict times, else the measured time over the best against the
  row's rank in the prior's order inside its shape;
- ``shipped-<card>.png``, where the table holds shipped configurations or baselines
  (:func:`harness.evaluate.compare_shipped`): per kind, the mean regret of each method (the
  learned prior's top-1, top-3 and top-8, the shipped heuristic, the autotune list, the
  transfer prior, torch and torch.compile) on a log axis;
- ``baselines-<card>.png``, where torch's op or ``torch.compile`` was measured: per shape,
  the best configuration's time in µs against torch's and torch.compile's (and the learned
  prior's pick), shapes grouped by kind, on a log axis.

``index.html`` gathers them with the eval tables: plain HTML, images referenced by file name,
no scripts, styles or fonts from anywhere else.  Matplotlib draws through its Agg canvas
(``Figure`` objects, never pyplot), so no display is needed: PNGs any browser, CI artifact
viewer or chat shows, with log axes and legends that hand-written SVG would have to
re-implement.
"""

from __future__ import annotations

import html
import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.evaluate import (
    COLUMNS,
    METHODS,
    SHAPE_OUT,
    WALKS,
    WIN_RATES,
    WITHIN,
    CardEval,
    PriorEval,
    ShippedEval,
    compare_shipped,
)
from harness.goldens import Anchor
from harness.points import SpecError, knob_distance, parse_spec
from harness.shipped import is_baseline

Row = Mapping[str, Any]
SLICE_ORDER = ("own", "cross", "tail")


def slug(*parts: str) -> str:
    """A file-name-safe token of ``parts`` (``NVIDIA H200 141GB``, ``deployable`` →
    ``nvidia-h200-141gb-deployable``)."""
    return re.sub(r"[^a-z0-9]+", "-", " ".join(parts).lower()).strip("-") or "card"


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


# ---------------------------------------------------------------- the data behind the plots


def coverage(rows: Iterable[Row]) -> dict[tuple[str, str], dict[tuple[str, str], Counter[str]]]:
    """(gpu, regime) → (kind, slice) → Counter of ``ok`` / ``failed``."""
    out: dict[tuple[str, str], dict[tuple[str, str], Counter[str]]] = defaultdict(
        lambda: defaultdict(Counter))
    for r in rows:
        card = (str(r["gpu"]), str(r.get("regime") or "?"))
        cell = (str(r.get("kind") or "?"), str(r.get("slice") or "?"))
        out[card][cell]["ok" if r.get("status") == "ok" else "failed"] += 1
    return out


def anchor_distances(rows: Iterable[Row], anchors: Iterable[Anchor]
                     ) -> list[tuple[int, float, str]]:
    """(distance to the nearest anchor of the shape, time / shape's best, slice) per ok row
    of a shape that has an anchor.  Baseline rows are not configurations: left out."""
    by_shape: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for a in anchors:
        try:
            by_shape[(a.kind, a.shape_id)].append(parse_spec(a.spec))
        except SpecError:
            continue
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if (r.get("status") == "ok" and (r["kind"], r["shape_id"]) in by_shape
                and not is_baseline(str(r.get("spec") or ""))):
            groups[(r["kind"], r["shape_id"])].append(r)
    out = []
    for key, rs in groups.items():
        best = min(float(r["value_us"]) for r in rs)
        for r in rs:
            knobs = parse_spec(r["spec"])
            d = min(knob_distance(knobs, a) for a in by_shape[key])
            out.append((d, float(r["value_us"]) / best, str(r.get("slice") or "?")))
    return out


# ---------------------------------------------------------------- plots


def plot_coverage(path: Path, title: str, cells: Mapping[tuple[str, str], Counter[str]]) -> Path:
    keys = sorted(cells, key=lambda c: (c[0], SLICE_ORDER.index(c[1])
                                        if c[1] in SLICE_ORDER else 9, c[1]))
    ok = [cells[k]["ok"] for k in keys]
    failed = [cells[k]["failed"] for k in keys]
    fig = _figure(max(6.0, 0.45 * len(keys) + 2), 4.2)
    ax = fig.add_subplot()
    xs = range(len(keys))
    ax.bar(xs, ok, width=0.6, color="#4c9a2a", label="ok")
    ax.bar(xs, failed, width=0.6, bottom=ok, color="#c0392b", label="failed")
    for x, a, b in zip(xs, ok, failed, strict=True):
        ax.annotate(f"{a}/{b}", (x, a + b), ha="center", va="bottom", fontsize=7)
    pad = max(0.0, (4 - len(keys)) / 2)  # a lone bar stays a bar, centred
    ax.set_xlim(-0.5 - pad, len(keys) - 0.5 + pad)
    ax.margins(y=0.1)
    ax.set_xticks(list(xs), [f"{k}/{s}" for k, s in keys], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("rows")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


def plot_distance(path: Path, title: str, points: Sequence[tuple[int, float, str]]) -> Path:
    fig = _figure(6.5, 4.2)
    ax = fig.add_subplot()
    rng = random.Random(0)  # jitter only: the same picture every run
    colors = {"own": "#1f77b4", "cross": "#ff7f0e", "tail": "#7f7f7f"}
    for sl in sorted({p[2] for p in points}):
        sel = [p for p in points if p[2] == sl]
        ax.scatter([p[0] + rng.uniform(-0.2, 0.2) for p in sel], [p[1] for p in sel], s=10,
                   alpha=0.6, color=colors.get(sl, "#9467bd"), label=sl)
    by_d: dict[int, list[float]] = defaultdict(list)
    for d, ratio, _ in points:
        by_d[d].append(ratio)
    ds = sorted(by_d)
    if ds:
        ax.plot(ds, [sorted(by_d[d])[len(by_d[d]) // 2] for d in ds], color="black",
                marker="o", label="median")
        ax.legend(fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("knob distance to the nearest anchor of the shape")
    ax.set_ylabel("measured time / best of the shape")
    ax.set_title(title if points else f"{title}\n(no ok rows of anchored shapes)", fontsize=10)
    fig.savefig(path)
    return path


def _within_shape_rank(e: PriorEval) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in e.scored:
        order = sorted(range(s.n_rows), key=lambda i: s.scores[i])
        for rank, i in enumerate(order):
            xs.append(rank / max(1, s.n_rows - 1))
            ys.append(s.values[i] / s.best_us)
    return xs, ys


def plot_priors(path: Path, title: str, evals: Sequence[PriorEval]) -> Path:
    n = max(1, len(evals))
    cols = min(3, n)
    rows_n = math.ceil(n / cols)
    fig = _figure(4.0 * cols, 3.4 * rows_n)
    fig.suptitle(title, fontsize=10)
    for i, e in enumerate(evals):
        ax = fig.add_subplot(rows_n, cols, i + 1)
        rho = e.spearman_median
        label = f"{e.prior} ({e.mode}), rho med {rho:.2f}" if rho is not None else \
            f"{e.prior} ({e.mode}), rho n/a"
        pred = [sc for s in e.shapes for sc in s.scores]
        meas = [v for s in e.shapes for v in s.values]
        if e.unit == "us" and pred and all(0 < p < math.inf for p in pred):
            ax.scatter(pred, meas, s=8, alpha=0.6)
            lo = min(min(pred), min(meas))
            hi = max(max(pred), max(meas))
            ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("predicted us")
            ax.set_ylabel("measured us")
        else:
            xs, ys = _within_shape_rank(e)
            ax.scatter(xs, ys, s=8, alpha=0.6)
            ax.set_yscale("log")
            ax.set_xlabel("rank in the prior's order (0 = its pick)")
            ax.set_ylabel("measured / best")
        ax.set_title(label, fontsize=8)
    fig.savefig(path)
    return path


METHOD_STYLE = {
    "learned": ("#1f77b4", "o"), "learned_top3": ("#6baed6", "o"),
    "learned_top8": ("#c6dbef", "o"), "heuristic": ("#d62728", "s"),
    "autotune_list": ("#ff7f0e", "s"), "transfer": ("#9467bd", "^"),
    "torch": ("#2ca02c", "D"), "compile": ("#7f7f7f", "D"),
}


def plot_shipped(path: Path, title: str, ev: ShippedEval) -> Path:
    """Mean regret per kind (and over all shapes) of every method, as points on a log axis."""
    groups = [(k, ev.summary(k)) for k in ev.kinds] + [("all", ev.summary())]
    fig = _figure(max(7.0, 1.1 * len(groups) + 2.5), 4.4)
    ax = fig.add_subplot()
    width = 0.8 / len(METHODS)
    for j, m in enumerate(METHODS):
        xs, ys = [], []
        for x, (_, s) in enumerate(groups):
            mean = s["methods"][m]["regret_mean"]
            if mean is not None:
                xs.append(x - 0.4 + width * (j + 0.5))
                ys.append(mean)
        color, marker = METHOD_STYLE[m]
        ax.scatter(xs, ys, s=30, color=color, marker=marker, edgecolors="black",
                   linewidths=0.4, label=m.replace("_top", " top-"), zorder=3)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for x in range(1, len(groups)):
        ax.axvline(x - 0.5, color="#dddddd", linewidth=0.6)
    ax.set_yscale("log")
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_xticks(range(len(groups)), [f"{k}\n({s['n_shapes']})" for k, s in groups],
                  fontsize=8)
    ax.set_ylabel("mean regret (time / best configuration)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    fig.savefig(path)
    return path


RATIO_TICKS = (1.0, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)


def _ratio_ticks(ax: Any) -> None:
    """Plain ratio labels (1.1, 2, 10) on a log y axis, not powers of ten."""
    from matplotlib.ticker import FixedLocator, NullFormatter, StrMethodFormatter

    lo, hi = ax.get_ylim()
    gap = 0.06 * math.log(max(hi / lo, 1.01))  # labels at least 6% of the axis apart
    ticks: list[float] = []
    for t in RATIO_TICKS:
        if lo <= t <= hi and (not ticks or math.log(t / ticks[-1]) >= gap):
            ticks.append(t)
    ticks = ticks or [1.0]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


PRIOR_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def plot_regret(path: Path, title: str, evals: Sequence[PriorEval]) -> Path:
    """Per kind and over all shapes: each prior's regret on every shape it picks on (dots,
    jittered) and their mean (a bar), on a log axis.  Shapes a prior abstains on are not
    drawn; the legend counts them."""
    kinds = sorted({s.kind for e in evals for s in e.shapes})
    groups = [*kinds, "all"]
    n = max(1, len(evals))
    width = 0.8 / n
    fig = _figure(max(7.0, 0.35 * n * len(groups) + 2.5), 4.6)
    ax = fig.add_subplot()
    rng = random.Random(0)  # jitter only: the same picture every run
    for j, e in enumerate(evals):
        color = PRIOR_COLORS[j % len(PRIOR_COLORS)]
        label = e.prior + (f" ({e.mode})" if e.mode != "shape-out" else "")
        if e.abstained:
            label += f", abstains on {len(e.abstained)}"
        first = True
        for x, kind in enumerate(groups):
            regrets = [s.regret for s in e.scored
                       if s.regret is not None and (kind == "all" or s.kind == kind)]
            if not regrets:
                continue
            centre = x - 0.4 + width * (j + 0.5)
            ax.scatter([centre + rng.uniform(-0.3, 0.3) * width for _ in regrets], regrets,
                       s=9, alpha=0.55, color=color, linewidths=0, zorder=3)
            mean = sum(regrets) / len(regrets)
            ax.hlines(mean, centre - 0.45 * width, centre + 0.45 * width, color=color,
                      linewidth=2.5, zorder=4, label=label if first else None)
            first = False
    ax.axhline(1.0, color="black", linewidth=0.8)
    for x in range(1, len(groups)):
        ax.axvline(x - 0.5, color="#dddddd", linewidth=0.6)
    ax.set_yscale("log")
    _ratio_ticks(ax)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    counts = {k: len({s.shape_id for e in evals for s in e.shapes if s.kind == k}) for k in kinds}
    counts["all"] = len({s.shape_id for e in evals for s in e.shapes})
    ax.set_xticks(range(len(groups)), [f"{k}\n({counts[k]})" for k in groups], fontsize=8)
    ax.set_ylabel("regret (time of the pick / best; bar = mean)")
    ax.set_title(title, fontsize=10)
    if evals:
        ax.legend(fontsize=7, ncol=min(4, n), loc="upper left")
    fig.savefig(path)
    return path


BASELINE_STYLE = {"best": ("best configuration", "black", "|", 90),
                  "learned": ("learned pick", "#1f77b4", "o", 22),
                  "torch": ("torch", "#2ca02c", "D", 22),
                  "compile": ("torch.compile", "#7f7f7f", "s", 22)}


def plot_baselines(path: Path, title: str, ev: ShippedEval) -> Path:
    """Per shape with torch's op or torch.compile measured: the best configuration's time
    against theirs (and the learned prior's pick), in µs on a log axis, shapes grouped by
    kind (one row each, fastest best first within a kind)."""
    shapes = sorted((s for s in ev.shapes if "torch" in s.picks or "compile" in s.picks),
                    key=lambda s: (s.kind, s.best_us, s.shape_id))
    fig = _figure(8.0, max(3.0, 0.24 * len(shapes) + 1.6))
    ax = fig.add_subplot()
    ys = list(range(len(shapes)))
    for key, (label, color, marker, size) in BASELINE_STYLE.items():
        pts = [(y, s.best_us if key == "best" else s.picks[key].value_us)
               for y, s in zip(ys, shapes, strict=True) if key == "best" or key in s.picks]
        if pts:
            ax.scatter([v for _, v in pts], [y for y, _ in pts], marker=marker, s=size,
                       color=color, label=label, zorder=3,
                       linewidths=1.5 if marker == "|" else 0.4,
                       edgecolors=None if marker == "|" else "black")
    for y, (a, b) in enumerate(zip(shapes, shapes[1:], strict=False)):
        if a.kind != b.kind:
            ax.axhline(y + 0.5, color="#dddddd", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yticks(ys, [s.shape_id for s in shapes], fontsize=6)
    ax.set_ylim(len(shapes) - 0.5, -0.5)  # the first kind on top
    ax.set_xlabel("time (us)")
    ax.set_title(title if shapes else f"{title}\n(no baseline measured)", fontsize=10)
    if shapes:
        ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path)
    return path


# ---------------------------------------------------------------- index.html


def _eval_table(block: CardEval) -> str:
    head = ("<tr><th>prior</th><th>mode</th><th>shapes</th><th>abstains</th>"
            "<th>Spearman median</th><th>rho n</th><th>regret mean</th><th>median</th>"
            "<th>worst</th><th>&gt;1.2x</th></tr>")
    body = []
    for e in block.evals:
        s = e.summary()
        mode = e.mode + (f" ({e.folds} folds)" if e.folds else "")
        cells = [e.prior, mode, s["n_shapes"], s["n_abstained"], s["spearman_median"],
                 s["n_spearman"], s["regret_mean"], s["regret_median"], s["regret_worst"],
                 len(e.misses)]
        body.append("<tr>" + "".join(
            f"<td>{'-' if c is None else f'{c:.3f}' if isinstance(c, float) else html.escape(str(c))}</td>"
            for c in cells) + "</tr>")
    misses = [f"<li>{html.escape(e.prior)}/{e.mode} <code>{html.escape(m.shape_id)}</code>: "
              f"{m.regret:.2f}x (picked <code>{html.escape(m.pick_spec)}</code>, best "
              f"<code>{html.escape(m.best_spec)}</code>)</li>"
              for e in block.evals for m in e.misses]
    skipped = [f"<li><code>{html.escape(s)}</code>: {n} ok rows</li>"
               for _, s, n in block.skipped]
    abstained = [f"<li>{html.escape(e.prior)}/{e.mode}: "
                 + ", ".join(f"<code>{html.escape(s.shape_id)}</code>" for s in e.abstained)
                 + "</li>" for e in block.evals if e.abstained]
    out = [f"<table>{head}{''.join(body)}</table>"]
    if abstained:
        out.append("<p>Abstains (every row of the shape scored alike: no opinion, no pick; "
                   f"left out of the prior's figures):</p><ul>{''.join(abstained)}</ul>")
    if misses:
        out.append(f"<p>Misses best (pick &gt; 1.2x the best):</p><ul>{''.join(misses)}</ul>")
    if skipped:
        out.append(f"<p>Skipped (fewer than {block.min_rows} ok rows):</p><ul>{''.join(skipped)}</ul>")
    return "\n".join(out)


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _shipped_table(ev: ShippedEval) -> str:
    total = ev.summary()
    head = ("<tr><th>method</th><th>shapes</th><th>regret mean</th><th>median</th>"
            f"<th>worst</th><th>within {WITHIN - 1:.0%}</th><th>measurements to "
            f"{WITHIN - 1:.0%} (median)</th><th>not picked</th></tr>")
    body = []
    for m in METHODS:
        e = total["methods"][m]
        within = f"{e['within']}/{e['n']}" if m in WALKS and e["n"] else "-"
        missing = ", ".join(f"{why} {n}" for why, n in e["missing"].items())
        cells = [m, str(e["n"]), _num(e["regret_mean"]), _num(e["regret_median"]),
                 _num(e["regret_worst"]), within, _num(e.get("to_within_median"), 1), missing]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    kinds_head = ("<tr><th>kind</th><th>shapes</th>"
                  + "".join(f"<th>{html.escape(COLUMNS[m])}</th>" for m in METHODS)
                  + "".join(f"<th>{html.escape(a)} &le; {html.escape(b)}</th>"
                            for a, b in WIN_RATES) + "</tr>")
    kinds_body = []
    for kind, s in [*((k, ev.summary(k)) for k in ev.kinds), ("all", total)]:
        cells = [kind, str(s["n_shapes"])]
        for m in METHODS:
            e = s["methods"][m]
            cells.append("-" if not e["n"] else
                         f"{e['regret_mean']:.2f} / {e['regret_median']:.2f}")
        for a, b in WIN_RATES:
            r = s["win_rates"][f"{a}<={b}"]
            cells.append("-" if not r["n"] else f"{r['wins']}/{r['n']} ({r['rate']:.0%})")
        kinds_body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                          + "</tr>")
    listed = total["autotune_list"]
    notes = [f"Regret = measured time of the method's pick / best measured configuration of "
             f"the shape (torch and torch.compile below 1: faster than every configuration "
             f"measured). Measurements to {WITHIN - 1:.0%}: rows measured in the method's "
             "order until one is within that of the best."]
    if listed["listed"]:
        notes.append(f"Autotune list: {listed['measured']} of the {listed['listed']} "
                     "configurations listed for these shapes measured.")
    for m in ("learned", "transfer"):
        n = total["methods"][m]["abstained"]
        if n:
            notes.append(f"{m} abstains on {n} of the shapes (every row scored alike: no "
                         "opinion); they are left out of its figures.")
    if ev.learned is None:
        notes.append("The learned prior was not evaluated: its columns are empty.")
    return "\n".join([f"<table>{head}{''.join(body)}</table>",
                      f"<p>Mean / median regret per kind, and win rates:</p>"
                      f"<table>{kinds_head}{''.join(kinds_body)}</table>",
                      *(f"<p>{html.escape(n)}</p>" for n in notes)])


_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:80em}"
          "table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
          "td:first-child,td:nth-child(2){text-align:left}img{max-width:100%;display:block}")


def write_report(out_dir: Path, rows: Sequence[Row], blocks: Sequence[CardEval],
                 anchors: Sequence[Anchor], *, regime: str = "deployable", db: str = "") -> Path:
    """Write the PNGs and ``index.html`` into ``out_dir`` (created); returns the index path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cov = coverage(rows)
    by_card = {(b.gpu, b.regime): b for b in blocks}
    versus = {(e.gpu, e.regime): e for e in compare_shipped(rows, blocks) if e.has_shipped}
    sections = []
    for gpu, reg in sorted(cov):
        name = slug(gpu, reg)
        n = sum(sum(c.values()) for c in cov[(gpu, reg)].values())
        parts = [f"<h2>[{html.escape(gpu)}] {n} nodes ({html.escape(reg)})</h2>"]
        img = plot_coverage(out_dir / f"coverage-{name}.png",
                            f"{gpu} ({reg}): rows per kind/slice", cov[(gpu, reg)])
        parts.append(f'<h3>Coverage</h3><img src="{img.name}" alt="coverage of {html.escape(gpu)}">')
        card_rows = [r for r in rows if r["gpu"] == gpu and r.get("regime") == reg]
        img = plot_distance(out_dir / f"distance-{name}.png",
                            f"{gpu} ({reg}): time vs distance to the nearest anchor",
                            anchor_distances(card_rows, anchors))
        parts.append(f'<h3>Time against distance to the nearest anchor</h3>'
                     f'<img src="{img.name}" alt="distance plot of {html.escape(gpu)}">')
        block = by_card.get((gpu, reg))
        if block is None:
            parts.append(f"<p>Priors not evaluated on {html.escape(reg)} rows "
                         f"(this report evaluates the {html.escape(regime)} regime; "
                         f"<code>--regime {html.escape(reg)}</code> evaluates these).</p>")
        elif block.evals and block.evaluated:
            parts.append(f"<h3>Priors</h3>{_eval_table(block)}")
            shape_out = [e for e in block.evals if e.mode == SHAPE_OUT]
            img = plot_regret(out_dir / f"regret-{name}.png",
                              f"{gpu} ({reg}): regret per prior and kind", shape_out)
            parts.append(f'<h3>Regret per prior and kind</h3><img src="{img.name}" '
                         f'alt="regret per prior and kind on {html.escape(gpu)}">')
            img = plot_priors(out_dir / f"priors-{name}.png",
                              f"{gpu} ({reg}): predicted against measured", block.evals)
            parts.append(f'<h3>Predicted against measured</h3><img src="{img.name}" '
                         f'alt="priors on {html.escape(gpu)}">')
        else:
            parts.append(f"<p>No shape has {block.min_rows} ok rows: nothing to evaluate.</p>")
        ev = versus.get((gpu, reg))
        if ev is not None:
            img = plot_shipped(out_dir / f"shipped-{name}.png",
                               f"{gpu} ({reg}): mean regret per kind against what people ship",
                               ev)
            parts.append(f"<h3>Against what people ship</h3>{_shipped_table(ev)}"
                         f'<img src="{img.name}" alt="shipped configurations on '
                         f'{html.escape(gpu)}">')
            if any(m in s.picks for s in ev.shapes for m in ("torch", "compile")):
                img = plot_baselines(out_dir / f"baselines-{name}.png",
                                     f"{gpu}: best configuration, torch, torch.compile",
                                     ev)
                parts.append(f'<h3>Best time per shape against torch and torch.compile</h3>'
                             f'<img src="{img.name}" alt="best time per shape against torch '
                             f'on {html.escape(gpu)}">')
        sections.append("\n".join(parts))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>collect-node-data report</title>", f"<style>{_STYLE}</style></head><body>",
        "<h1>collect-node-data report</h1>",
        f"<p>Node table <code>{html.escape(db)}</code>, {len(rows)} rows; priors evaluated on "
        f"the {html.escape(regime)} regime; written {stamp}. Lower prior score = predicted "
        "faster; regret = measured time of the prior's pick / best measured time.</p>",
        *(sections or ["<p>The node table is empty.</p>"]),
        "</body></html>",
    ])
    index = out_dir / "index.html"
    index.write_text(doc + "\n")
    return index
