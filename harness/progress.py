"""What a person sees while a collection run measures: one line per job, drawn by tqdm.

Each job's line says the card and the job, its place in the session, its points measured of
those it had to measure, its pace, the seconds to go of the job and of the card's session (the
box's own estimates, :class:`harness.contract.Entry` ``eta_s``), and the best time so far on
the shape it measures.

- On a terminal the line redraws itself in place at every look at the box and stays, with
  the job's result, once the job is home.  Events a person must see (a box unreachable, a stop,
  a session that died) are printed above it.
- Elsewhere (CI, a file) the same facts come as plain lines, each under :data:`PLAIN_WIDTH`
  characters: the events, and a job's line at most once every :func:`heartbeat_s` (a few for
  a short run, one every five minutes for a long one, whatever its jobs do).  With ``-v`` every change of a job's
  line is printed, and so is every routine step (pushing, merging, the box log's lines).
"""

from __future__ import annotations

import shutil
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tqdm import tqdm

from harness.contract import Entry, SessionStatus

PLAIN_WIDTH = 119
"""The longest plain line (a CI log's lines stay under 120 characters)."""
PREFIX = "  [collect] "


def heartbeat_s(budget_s: float) -> float:
    """How often, at most, a plain job line is printed: a fifth of the budget twice over,
    within a minute and five (a 300 s run prints two; an hour's run one every five
    minutes)."""
    return min(300.0, max(60.0, budget_s / 2.5))


@dataclass(frozen=True)
class JobView:
    """What one job's line shows (plain values, from the box's status)."""

    gpu: str
    job: str  # the entry's id: own-matmul, own-matmul.top1
    place: str  # "job 3/24", "top-up"
    done: int = 0  # points measured by this run of the job
    total: int = 0  # of those it had to measure
    elapsed_s: float = 0.0  # the box's seconds of the job
    eta_s: float | None = None  # the job's seconds to go
    session_eta_s: float | None = None  # the card's session's
    shape: str | None = None  # the shape measured now
    best_us: float | None = None  # the best ok time on it so far
    state: str = ""  # "waiting", "merging", or the job's result once it is home

    @property
    def key(self) -> tuple[str, str]:
        return (self.gpu, self.job)


def job_view(gpu: str, entry: Entry, place: str, status: SessionStatus | None) -> JobView:
    """The line of a run the box reports (running, or ended and not yet home)."""
    state = {"planned": "waiting", "running": ""}.get(entry.state, entry.state)
    return JobView(gpu=gpu, job=entry.id, place=place, done=entry.benched,
                   total=entry.benched + entry.points_left, elapsed_s=entry.elapsed_s,
                   eta_s=entry.eta_s, shape=entry.shape, best_us=entry.best_us,
                   session_eta_s=status.eta_s if status is not None and not status.final
                   else None, state=state)


def format_us(us: float) -> str:
    """A kernel time, in the unit that suits it: 41.7us, 8.38ms, 1.20s."""
    if us < 1e3:
        return f"{us:.1f}us"
    if us < 1e6:
        return f"{us / 1e3:.2f}ms"
    return f"{us / 1e6:.2f}s"


def render(v: JobView, width: int, bar: bool = False) -> str:
    """One job's line in at most ``width`` characters: tqdm's meter (with a bar on a
    terminal), the ETAs and the best time; the shape's name is shortened, then left out, to
    fit."""
    rate = v.done / v.elapsed_s if v.done and v.elapsed_s > 0 else None
    if v.state and v.state != "waiting":
        when = f"in {tqdm.format_interval(v.elapsed_s)}, {v.state}"
    else:
        eta = [f"job {tqdm.format_interval(v.eta_s)}" if v.eta_s is not None else "",
               f"session {tqdm.format_interval(v.session_eta_s)}"
               if v.session_eta_s is not None else ""]
        when = ", ".join(x for x in (v.state, "ETA " + ", ".join(e for e in eta if e)
                                     if any(eta) else "") if x)
    head = f"{v.gpu} {v.job} [{v.place}]"
    if not v.done and not v.total and v.state and v.state != "waiting":  # skipped, say
        line = f"{head}: {v.state}"
        return line if len(line) <= width else line[:width - 1] + "…"
    shape = v.shape or ""
    bests = [""]
    if v.best_us is not None:
        best = f"; best {format_us(v.best_us)}"
        bests = [best + f" on {shape}" if shape else best, best, ""]

    def meter(best: str, with_bar: bool) -> str:
        fmt = ("{desc}: {n_fmt}/{total_fmt} pts |{bar}| {rate_fmt}" if with_bar else
               "{desc}: {n_fmt}/{total_fmt} pts, {rate_fmt}") + (", {when}" if when else "") \
            + "{best}"
        text = tqdm.format_meter(v.done, v.total or None, v.elapsed_s,
                                 ncols=width if with_bar else None, prefix=head, unit="pt",
                                 rate=rate, bar_format=fmt, when=when, best=best)
        return text if with_bar else " ".join(text.split())

    def fitted(best: str, room: int) -> str:  # the shape's name cut to the room there is
        over = len(meter(best, False)) - room
        if over > 0 and shape and best.endswith(shape) and len(shape) - over >= 12:
            return best[:len(best) - over - 1] + "…"
        return best

    # the best time before the bar (of at least 10 columns), the bar before the shape's name
    named = [b for b in bests[:2] if b]
    tries = [(b, True) for b in named] + [(b, False) for b in named] + [("", True), ("", False)]
    for best, with_bar in tries:
        if with_bar and not bar:
            continue
        best = fitted(best, width - 12 if with_bar else width)
        text = meter(best, False)
        if with_bar and len(text) + 12 <= width:
            return meter(best, True)
        if not with_bar and len(text) <= width:
            return text
    return text[:width - 1] + "…"


class Terminal(Protocol):
    """Where the lines go: whole lines, and (on a terminal) one line redrawn in place."""

    tty: bool

    def line(self, text: str) -> None: ...

    def redraw(self, text: str) -> None: ...

    def end_redraw(self) -> None: ...

    def width(self) -> int: ...


class PytestTerminal:
    """pytest's terminal, written outside its output capture (the run's tests capture)."""

    def __init__(self, reporter: Any, capman: Any, writer: Any = None) -> None:
        self.reporter = reporter
        self.capman = capman
        self.writer = writer  # pytest's TerminalWriter: where its current line stands
        self.tty = bool(reporter is not None and getattr(reporter, "isatty", False))

    def _out(self, write: Callable[[], None]) -> None:
        if self.reporter is None:
            return
        if self.capman is None:
            write()
            return
        with self.capman.global_and_fixture_disabled():
            write()

    def line(self, text: str) -> None:
        def write() -> None:
            if self.writer is not None and self.writer.width_of_current_line:
                self.reporter.write("\n")  # after pytest's letters, which have no file name
            self.reporter.write_line(text)
        self._out(write)

    def redraw(self, text: str) -> None:
        def write() -> None:
            self.reporter.rewrite(text, erase=True)
            self.reporter.flush()
        self._out(write)

    def end_redraw(self) -> None:
        self._out(lambda: self.reporter.write("\n", flush=True))

    def width(self) -> int:
        # measured with pytest's capture off: under it, stdout is not the terminal
        got: list[int] = []
        self._out(lambda: got.append(int(self.writer.fullwidth) if self.writer is not None
                                     else shutil.get_terminal_size().columns))
        return got[0] if got else 80


class Progress:
    """The run's lines (see the module's docstring).  Called with a line: an event everyone
    sees; :meth:`note`: a routine step; :meth:`show` and :meth:`done`: a job's line."""

    def __init__(self, term: Terminal, *, verbose: int = 0, heartbeat_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.term = term
        self.verbose = verbose
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.live: JobView | None = None  # the job whose line is drawn now (terminal)
        self.transient = False  # a routine step drawn where the next line goes (terminal)
        self.last_plain = clock()  # when a plain line was last printed
        self.shown: dict[tuple[str, str], JobView] = {}  # what each job's plain line said

    @property
    def tty(self) -> bool:
        return self.term.tty

    # -- events --------------------------------------------------------------------------------
    def __call__(self, line: str) -> None:
        if self.tty:
            self._above(line)
        else:
            self._plain(line)

    def note(self, line: str) -> None:
        """A routine step: on a terminal drawn until the next line replaces it (never over a
        job's line); elsewhere printed only with ``-v``."""
        if self.tty:
            if self.live is None:
                self.term.redraw((PREFIX + line)[:max(10, self.term.width() - 1)])
                self.transient = True
        elif self.verbose > 0:
            self._plain(line)

    # -- a job's line --------------------------------------------------------------------------
    def show(self, view: JobView) -> None:
        """The job's line as the box reports it now."""
        if self.tty:
            if self.live is not None and self.live.key != view.key:
                self.done(self.live)
            self.live = view
            self.transient = False
            self.term.redraw(render(view, self.term.width() - 1, bar=True))
            return
        before = self.shown.get(view.key)
        changed = before is None or (before.done, before.state) != (view.done, view.state)
        due = self.clock() - self.last_plain >= self.heartbeat_s
        if (self.verbose > 0 and changed) or (due and view.state != "waiting"):
            self.shown[view.key] = view
            self._plain(render(view, PLAIN_WIDTH - len(PREFIX)))

    def done(self, view: JobView) -> None:
        """The job is home: on a terminal its line stays with its result (``view.state``);
        elsewhere it is printed only with ``-v`` (the summary has every job)."""
        if self.tty:
            if self.live is not None and self.live.key != view.key:
                self.done(self.live)
            self.term.redraw(render(view, self.term.width() - 1, bar=True))
            self.term.end_redraw()
            self.live = None
            self.transient = False
        elif self.verbose > 0:
            self._plain(render(view, PLAIN_WIDTH - len(PREFIX)))

    def state(self, key: tuple[str, str], state: str) -> None:
        """A step of the job whose line is drawn now (``merging``), said in its line."""
        if self.tty and self.live is not None and self.live.key == key:
            self.show(replace(self.live, state=state))

    def close(self) -> None:
        """A job's line left as it is (the run ends or is interrupted)."""
        if self.tty and (self.live is not None or self.transient):
            self.term.end_redraw()
        self.live = None
        self.transient = False

    # -- output --------------------------------------------------------------------------------
    def _plain(self, line: str) -> None:
        width = PLAIN_WIDTH - len(PREFIX)
        parts = textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False,
                              break_long_words=True) or [""]
        for part in parts:
            self.term.line(PREFIX + part)
        self.last_plain = self.clock()

    def _above(self, line: str) -> None:
        """A line printed above the job's line, which is drawn again under it."""
        if self.live is not None or self.transient:
            self.term.redraw(PREFIX + line)
            self.term.end_redraw()
        else:
            self.term.line(PREFIX + line)
        self.transient = False
        if self.live is not None:
            self.term.redraw(render(self.live, self.term.width() - 1, bar=True))
