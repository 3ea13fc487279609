"""The tables the run's summary ends with, drawn by tabulate within :data:`WIDTH` columns.

- :func:`jobs_table`: per card, one row per kind and one column per slice; a cell says what
  the job measured (points, seconds, failures, points left) and a job that ended otherwise
  than by its points or its allotment running out has a numbered note under the table.
- :func:`best_per_shape`: the best configuration this run measured on each shape, its time
  and its ratio to torch's own op and to ``torch.compile`` where the node table has them.

A long shape name or configuration is broken across lines at its ``_`` or ``,`` (never
cut), so that every line stays within :data:`WIDTH` columns where it can.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from harness.contract import SLICES
from harness.progress import format_us

WIDTH = 119
"""The longest line of the summary (a CI log's lines stay under 120 characters)."""
PLAIN_ENDS = ("done (pool exhausted)", "done (budget spent)")
"""A job's end that its cell says by itself (points left or not)."""


def jobs_table(jobs: Sequence[Any]) -> list[str]:
    """The jobs of the run (``harness.harvest.JobReport``), per card a kind × slice table."""
    cards = list(dict.fromkeys(j.card or j.gpu for j in jobs))
    out: list[str] = []
    notes: list[str] = []
    for card in cards:
        mine = [j for j in jobs if (j.card or j.gpu) == card]
        slices = [s for s in SLICES if any(j.slice == s for j in mine)]
        kinds = list(dict.fromkeys(j.kind for j in sorted(mine, key=lambda j: j.kind)))
        cells: dict[tuple[str, str], str] = {}
        for j in mine:
            text, note = _cell(j)
            if note:
                who = f"{card} " if len(cards) > 1 else ""
                notes.append(f"[{len(notes) + 1}] {who}{j.slice} {j.kind}: {note}")
                text += f" [{len(notes)}]"
            cells[(j.kind, j.slice)] = text
        rows = [[k, *(cells.get((k, s), "") for s in slices)] for k in kinds]
        if len(cards) > 1:
            out.append(f"jobs on {card}:")
        out.extend(tabulate(rows, headers=["kind", *slices], tablefmt="simple",
                            disable_numparse=True).splitlines())
    for note in notes:
        out.extend(textwrap.wrap(note, WIDTH, subsequent_indent="    ",
                                 break_on_hyphens=False) or [note])
    return out


def _cell(j: Any) -> tuple[str, str | None]:
    """A job's cell, and its note when its end needs more words than a cell has."""
    tops = j.top_ups or []
    benched = j.benched + sum(t.get("benched") or 0 for t in tops)
    failed = j.failed + sum(t.get("failed") or 0 for t in tops)
    seconds = j.seconds + sum(t.get("seconds") or 0 for t in tops)
    state = str(j.state or "")
    parts = [f"{benched} in {seconds:.1f}s" if seconds < 100 else f"{benched} in {seconds:.0f}s"]
    if failed:
        parts.append(f"{failed} failed")
    if not tops and j.points_total and j.points_done is not None \
            and j.points_total > j.points_done and state == "done (budget spent)":
        parts.append(f"{j.points_total - j.points_done} left")
    if tops:  # the time left over once every job had run
        parts.append("topped up" if len(tops) == 1 else f"topped up {len(tops)}x")
    text = ", ".join(parts)
    odd_tops = [t for t in tops if t.get("state") not in PLAIN_ENDS]
    if state in PLAIN_ENDS and not odd_tops:
        return text, None
    if state in PLAIN_ENDS:
        return text, "; ".join(f"top-up {t.get('round')}: {t.get('state')}" for t in odd_tops)
    word = state.split(":")[0].split(" (")[0].split(";")[0] or "not run"
    note = state if state != "not run" else (f"not run: {j.reason}" if j.reason else None)
    return (f"{text}, {word}" if benched else word), note


def _wrap(text: str, width: int, sep: str) -> str:
    """``text`` broken after its ``sep`` into lines of at most ``width`` (a part longer than
    that stays whole)."""
    parts = text.split(sep)
    lines: list[str] = []
    cur = ""
    for i, part in enumerate(parts):
        piece = part + (sep if i < len(parts) - 1 else "")
        if cur and len(cur) + len(piece) > width:
            lines.append(cur)
            cur = piece
        else:
            cur += piece
    lines.append(cur)
    return "\n".join(lines)


def best_table(best: Sequence[tuple[str, str, str, float, str, str]], steady: bool = False
               ) -> list[str]:
    """(card, shape, configuration, µs, ratio to torch, ratio to torch.compile) per shape as
    the summary's table: the card named once when there is one, a ratio column only when some
    shape has it; ``steady``: the times are at each shape's reference clock (said so)."""
    cards = list(dict.fromkeys(b[0] for b in best))
    show_torch = any(b[4] != "-" for b in best)
    show_compile = any(b[5] != "-" for b in best)
    cols: list[tuple[str, list[str]]] = []
    if len(cards) > 1:
        cols.append(("card", [b[0][:24] for b in best]))
    cols.append(("shape", [b[1] for b in best]))
    cols.append(("time", [format_us(b[3]) for b in best]))
    if show_torch:
        cols.append(("torch", [b[4] for b in best]))
    if show_compile:
        cols.append(("compile", [b[5] for b in best]))
    conf = "best configuration this run"
    cols.append((conf, [b[2] for b in best]))
    # tabulate pads a header by two: a column is as wide as its header and two, or its values
    width = {name: max(len(name) + 2, *(len(v) for v in values)) for name, values in cols}
    room = WIDTH - sum(w for name, w in width.items() if name not in ("shape", conf)) \
        - 2 * (len(cols) - 1)
    values = {name: v for name, v in cols}
    shape_w, conf_w = width["shape"], width[conf]
    if shape_w + conf_w > room:  # break shape names and configurations, in the fewest lines
        def lines(sw: int) -> int:
            cw = max(len(conf) + 2, room - sw)
            return sum(max(_wrap(a, sw, "_").count("\n"), _wrap(b, cw, ",").count("\n"))
                       for a, b in zip(values["shape"], values[conf], strict=True))
        shape_w = min(range(min(shape_w, max(16, room - len(conf) - 2)), 15, -1), key=lines)
        conf_w = max(len(conf) + 2, room - shape_w)
    values["shape"] = [_wrap(v, shape_w, "_") for v in values["shape"]]
    values[conf] = [_wrap(v, conf_w, ",") for v in values[conf]]
    rows = list(zip(*(values[name] for name, _ in cols), strict=True))
    title = "best configuration per shape measured in this run"
    if len(cards) == 1:
        title += f" on {cards[0]}"
    notes = ["times at each shape's reference clock"] if steady else []
    if show_torch or show_compile:
        notes.append("torch, compile: its time over theirs")
    if notes:
        title += f" ({'; '.join(notes)})"
    table = tabulate(rows, headers=[name for name, _ in cols], tablefmt="simple",
                     disable_numparse=True)
    return [*textwrap.wrap(title + ":", WIDTH), *table.splitlines()]


def best_per_shape(conn: Any, run_ids: list[str]) -> list[str]:
    """The best configuration this run measured on each shape, with its time and its ratio to
    torch's own op and to torch.compile where the node table has them: the table the summary
    ends with ([] when the run measured nothing).  Times are at each shape's reference clock
    (:mod:`harness.steady`, over every ok row of the shape in the table)."""
    from harness.shipped import BASELINE_KNOB
    from harness.steady import MEASURED, steadied

    if not run_ids:
        return []
    marks = ",".join("?" * len(run_ids))
    cols = ("gpu", "regime", "kind", "shape_id", "spec", "value_us", "ref_us", "run_id")
    rows = steadied(dict(zip(cols, r, strict=True)) for r in conn.execute(
        f"SELECT {', '.join(cols)} FROM node WHERE status = 'ok' AND value_us > 0 AND "
        f"(gpu, shape_id) IN (SELECT gpu, shape_id FROM node WHERE run_id IN ({marks}))",
        run_ids))
    mine = set(run_ids)
    best: dict[tuple[str, str], tuple[float, str]] = {}
    base: dict[tuple[str, str, str], float] = {}
    for r in rows:
        key, us, spec = (r["gpu"], r["shape_id"]), r["value_us"], str(r["spec"])
        if spec.startswith(f"{BASELINE_KNOB}="):
            base[(*key, spec.split("=", 1)[1])] = us
        elif r["run_id"] in mine and (key not in best or us < best[key][0]):
            best[key] = (us, spec)
    if not best:
        return []
    steady = any(MEASURED in r for r in rows if r["run_id"] in mine)

    def ratio(gpu: str, shape: str, name: str, us: float) -> str:
        b = base.get((gpu, shape, name))
        return f"{us / b:.2f}x" if b else "-"

    return best_table([(gpu, shape, spec, us, ratio(gpu, shape, "torch", us),
                        ratio(gpu, shape, "compile", us))
                       for (gpu, shape), (us, spec) in sorted(best.items())], steady)
