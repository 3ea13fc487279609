"""``python -m harness report``: PNG plots of the node table and the eval, and an index.html.

Per card × regime:

- ``coverage-<card>.png``: ok and failed rows per kind × slice (stacked bars), for every
  regime the table holds;
- ``distance-<card>.png``: each ok row's time over its shape's best, against the knob
  distance of its spec to the nearest anchor of that shape (any card's);
- ``priors-<card>.png``: one panel per prior × mode: predicted against measured µs on log
  axes for priors that predict times, else the measured time over the best against the
  row's rank in the prior's order inside its shape;
- ``shipped-<card>.png``, where the table holds shipped configurations or baselines
  (:func:`harness.evaluate.compare_shipped`): per kind, the mean regret of each method (the
  learned prior's top-1, top-3 and top-8, the shipped heuristic, the autotune list, the
  transfer prior, torch and torch.compile) on a log axis.

``index.html`` gathers them with the eval tables: plain HTML, images referenced by file name,
no scripts, styles or fonts from anywhere else.  Matplotlib draws through its Agg canvas
(``Figure`` objects, never pyplot), so no display is needed.
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
    for s in e.shapes:
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


# ---------------------------------------------------------------- index.html


def _eval_table(block: CardEval) -> str:
    head = ("<tr><th>prior</th><th>mode</th><th>shapes</th><th>Spearman median</th>"
            "<th>rho n</th><th>regret mean</th><th>median</th><th>worst</th>"
            "<th>&gt;1.2x</th></tr>")
    body = []
    for e in block.evals:
        s = e.summary()
        cells = [e.prior, e.mode, s["n_shapes"], s["spearman_median"], s["n_spearman"],
                 s["regret_mean"], s["regret_median"], s["regret_worst"], len(e.misses)]
        body.append("<tr>" + "".join(
            f"<td>{'-' if c is None else f'{c:.3f}' if isinstance(c, float) else html.escape(str(c))}</td>"
            for c in cells) + "</tr>")
    misses = [f"<li>{html.escape(e.prior)}/{e.mode} <code>{html.escape(m.shape_id)}</code>: "
              f"{m.regret:.2f}x (picked <code>{html.escape(m.pick_spec)}</code>, best "
              f"<code>{html.escape(m.best_spec)}</code>)</li>"
              for e in block.evals for m in e.misses]
    skipped = [f"<li><code>{html.escape(s)}</code>: {n} ok rows</li>"
               for _, s, n in block.skipped]
    out = [f"<table>{head}{''.join(body)}</table>"]
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
        n = total["methods"][m]["scored_alike"]
        if n:
            notes.append(f"{m} scored every row alike on {n} of the shapes (it has no opinion "
                         "there): its pick is the slowest row.")
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
        if block is not None and block.evals and block.evaluated:
            parts.append(f"<h3>Priors</h3>{_eval_table(block)}")
            img = plot_priors(out_dir / f"priors-{name}.png",
                              f"{gpu} ({reg}): predicted against measured", block.evals)
            parts.append(f'<img src="{img.name}" alt="priors on {html.escape(gpu)}">')
        elif block is not None:
            parts.append(f"<p>No shape has {block.min_rows} ok rows: nothing to evaluate.</p>")
        ev = versus.get((gpu, reg))
        if ev is not None:
            img = plot_shipped(out_dir / f"shipped-{name}.png",
                               f"{gpu} ({reg}): mean regret per kind against what people ship",
                               ev)
            parts.append(f"<h3>Against what people ship</h3>{_shipped_table(ev)}"
                         f'<img src="{img.name}" alt="shipped configurations on '
                         f'{html.escape(gpu)}">')
        else:
            parts.append(f"<p>Priors not evaluated on {html.escape(reg)} rows "
                         f"(this report evaluates the {html.escape(regime)} regime; "
                         f"<code>--regime {html.escape(reg)}</code> evaluates these).</p>")
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
