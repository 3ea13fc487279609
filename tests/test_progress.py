"""The run's lines (harness.progress): one line per job, plain lines under 120 characters."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from harness.contract import Entry, SessionStatus
from harness.progress import PLAIN_WIDTH, JobView, Progress, heartbeat_s, job_view, render


class FakeTerminal:
    """Records what a terminal would show: whole lines, and the line redrawn in place."""

    def __init__(self, tty: bool, columns: int = 100) -> None:
        self.tty = tty
        self.columns = columns
        self.lines: list[str] = []  # the finished lines, in order
        self.drawn: str | None = None  # the line drawn in place now
        self.redraws = 0
        self.history: list[str] = []  # every line drawn in place

    def line(self, text: str) -> None:
        assert self.drawn is None, "a whole line written over a line drawn in place"
        self.lines.append(text)

    def redraw(self, text: str) -> None:
        self.drawn = text
        self.redraws += 1
        self.history.append(text)

    def end_redraw(self) -> None:
        self.lines.append(self.drawn or "")
        self.drawn = None

    def width(self) -> int:
        return self.columns


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _view(done: int, **kw: object) -> JobView:
    base = dict(gpu="local", job="own-matmul", place="job 2/24", done=done, total=38,
                elapsed_s=2.0 * done, eta_s=30.0, session_eta_s=250.0,
                shape="attention_batch1_heads2_seq40_head_dim16_causal1_fp16", best_us=23_900.0)
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def test_a_job_line_says_points_pace_both_etas_and_the_best_time() -> None:
    line = render(_view(24, shape="matmul_M33_N64_K32_fp16"), 200)
    assert line == ("local own-matmul [job 2/24]: 24/38 pts, 2.00s/pt, ETA job 00:30, "
                    "session 04:10; best 23.90ms on matmul_M33_N64_K32_fp16")


def test_a_plain_line_shortens_the_shape_then_leaves_it_out_to_fit() -> None:
    line = render(_view(24), 115)
    assert len(line) == 115 and line.endswith("…") and "best 23.90ms on attention_" in line
    assert "ETA job 00:30, session 04:10" in line
    assert render(_view(24), 95) == ("local own-matmul [job 2/24]: 24/38 pts, 2.00s/pt, ETA job "
                                     "00:30, session 04:10; best 23.90ms")


@given(done=st.integers(0, 10**6), total=st.integers(0, 10**6),
       elapsed=st.floats(0, 1e6), eta=st.none() | st.floats(0, 1e6),
       shape=st.text(min_size=0, max_size=200), best=st.none() | st.floats(1e-3, 1e12),
       state=st.sampled_from(["", "waiting", "merging", "done (pool exhausted)",
                              "skipped: " + "x" * 300]),
       width=st.integers(40, 240))
def test_a_line_never_exceeds_its_width(done: int, total: int, elapsed: float,
                                        eta: float | None, shape: str, best: float | None,
                                        state: str, width: int) -> None:
    v = JobView("local", "cross-linear_norm", "job 12/24", done, total, elapsed, eta, eta,
                shape, best, state)
    assert len(render(v, width)) <= width
    assert len(render(v, width, bar=True)) <= width


def test_the_view_of_a_running_entry_comes_from_the_box_s_status() -> None:
    e = Entry("own", "softmax", state="running", allotment_s=10, elapsed_s=4.0, points_total=12,
              points_left=6, benched=6, ok=6, shape="softmax_M7_N50_fp32", best_us=11_700.0,
              eta_s=4.0)
    status = SessionStatus("s", "r", state="running", budget_s=300, eta_s=120.0, entries=[e])
    v = job_view("local", e, "job 1/24", status)
    assert (v.done, v.total, v.eta_s, v.session_eta_s, v.shape, v.best_us, v.state) == (
        6, 12, 4.0, 120.0, "softmax_M7_N50_fp32", 11_700.0, "")
    assert job_view("local", Entry("own", "softmax"), "job 1/24", status).state == "waiting"


def test_plain_lines_heartbeat_at_most_once_per_interval_and_events_always() -> None:
    term, clock = FakeTerminal(tty=False), Clock()
    p = Progress(term, heartbeat_s=60.0, clock=clock)
    p("box local: setup in tmux session emmy-node-setup-1")
    for done in range(0, 38):  # one look a second, a point each
        clock.t += 1.0
        p.show(_view(done))
        p.note("local own-matmul [job 2/24]: merging the rows of own-matmul into /tmp/db")
    p.done(_view(38, state="done (pool exhausted)"))
    assert term.lines[0] == "  [collect] box local: setup in tmux session emmy-node-setup-1"
    beats = term.lines[1:]
    assert len(beats) == 0  # 38 s: no heartbeat yet, no note, no end line without -v
    for done in range(38):
        clock.t += 10.0
        p.show(_view(done, job="own-softmax"))
    beats = term.lines[1:]
    assert 5 <= len(beats) <= 7 and all("own-softmax [job 2/24]" in b for b in beats), beats
    assert all(len(line) < 120 and "statuses" not in line for line in term.lines)


def test_plain_lines_with_v_say_every_change_and_every_step() -> None:
    term, clock = FakeTerminal(tty=False), Clock()
    p = Progress(term, verbose=1, heartbeat_s=60.0, clock=clock)
    for done in (0, 0, 6, 6, 12):
        clock.t += 0.5
        p.show(_view(done))
    p.note("local own-matmul [job 2/24]: merging the rows of own-matmul into " + "/x" * 80)
    p.done(_view(12, state="done (pool exhausted)"))
    assert [line.split(": ", 1)[1].split(",")[0] for line in term.lines[:3]] == [
        "0/38 pts", "6/38 pts", "12/38 pts"]
    assert "merging the rows of own-matmul" in term.lines[3]
    assert term.lines[-1].endswith("in 00:24, done (pool exhausted); best 23.90ms")
    assert all(len(line) < 120 for line in term.lines), [len(x) for x in term.lines]


def test_on_a_terminal_each_job_has_one_line_redrawn_in_place() -> None:
    term = FakeTerminal(tty=True, columns=120)
    p = Progress(term)
    p.note("box local: pushing the harness to /tmp/box")  # drawn, then replaced
    p("box local: setup in tmux session emmy-node-setup-1")
    for done in range(0, 12, 3):
        p.show(_view(done, job="own-softmax", place="job 1/2"))
    p("box local unreachable; the session goes on in tmux, still waiting")  # above the line
    p.show(_view(9, job="own-softmax", place="job 1/2"))
    p.done(_view(12, job="own-softmax", place="job 1/2", state="done (pool exhausted)"))
    p.show(_view(0, job="own-matmul", place="job 2/2", state="waiting"))
    p.done(_view(0, job="own-matmul", place="job 2/2", total=0, state="skipped: no points"))
    p.close()
    assert term.lines == [
        "  [collect] box local: setup in tmux session emmy-node-setup-1",
        "  [collect] box local unreachable; the session goes on in tmux, still waiting",
        term.lines[2],
        "local own-matmul [job 2/2]: skipped: no points"]
    assert term.lines[2].startswith("local own-softmax [job 1/2]: 12/38 pts")
    assert "done (pool exhausted)" in term.lines[2] and len(term.lines[2]) <= 119
    # while it ran: a bar, the pace, both ETAs and the best time, in the terminal's width
    ran = [line for line in term.history if line.startswith("local own-softmax [job 1/2]: 9/")]
    assert ran[-1].startswith("local own-softmax [job 1/2]: 9/38 pts |██")
    assert "ETA job 00:30, session 04:10; best 23.90ms on attention_b" in ran[-1]
    assert all(len(line) <= 119 for line in term.history)
    assert term.redraws >= 8


def test_the_heartbeat_follows_the_budget_within_a_minute_and_five() -> None:
    assert heartbeat_s(60) == 60 and heartbeat_s(300) == 120 and heartbeat_s(7200) == 300
    assert PLAIN_WIDTH < 120


def test_the_box_estimates_a_job_by_its_pace_and_allotment_and_the_session_by_what_is_left(
        tmp_path: Path) -> None:
    """A job ends when its points or its allotment run out, at its pace so far; the session
    when the budget or every job's points left (at the plan's paces) do."""
    from harness.box.service import Service, job_eta_s
    from harness.planner import BudgetPlan, Job

    running = Entry("own", "matmul", state="running", allotment_s=100, elapsed_s=20,
                    points_left=30, benched=10)
    assert job_eta_s(running) == 60  # 30 left at 2 s a point, within the 80 s left
    assert job_eta_s(Entry("own", "matmul", state="running", allotment_s=100, elapsed_s=20,
                           points_left=300, benched=10)) == 80  # the allotment first
    assert job_eta_s(Entry("own", "matmul", state="running", allotment_s=9)) == 9
    service = Service(tmp_path / "session.json")
    service.status = SessionStatus("s", "r", state="running", budget_s=1000, spent_s=200,
                                   entries=[Entry("own", "softmax", state="done", elapsed_s=180,
                                                  points_left=0, benched=90),
                                            running,
                                            Entry("cross", "matmul", points_left=40),
                                            Entry("tail", "matmul", state="skipped")])
    service.plan = BudgetPlan(1000, {"own": 60, "cross": 25, "tail": 15},
                              {Job("own", "matmul"): 40, Job("cross", "matmul"): 40},
                              s_per_point={"matmul": 0.5}, lanes=2)
    service._estimate()
    assert running.eta_s == 60
    assert service.status.eta_s == 60 + 40 * 0.5 / 2 + 1.0  # the plan's pace, on two lanes
    service.status.budget_s = 250  # 50 s left
    service._estimate()
    assert service.status.eta_s == 50
