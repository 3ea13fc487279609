"""``python -m harness plan``: what a budget buys, before renting, with the run's own planner.

And ``python -m harness.box plan``, which only counts a card's pools."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import cards
from harness.contract import DEFAULT_S_PER_POINT, JobRef, SessionSpec, SweepOptions, ToolsSpec
from harness.ledger import Ledger
from harness.sessions import format_preview, preview

ROOT = Path(__file__).resolve().parent.parent
SHARES = {"own": 0.6, "cross": 0.25, "tail": 0.15}


def _spec(budget_s: float, jobs: list[JobRef], rate: float = 0.5,
          **sweep: object) -> SessionSpec:
    return SessionSpec(run_id="bench-x", session_id="bench-x", budget_s=budget_s, shares=SHARES,
                       jobs=tuple(jobs), s_per_point={j.kind: rate for j in jobs},
                       compile_s={j.kind: 10.0 for j in jobs}, sweep=SweepOptions(**sweep),
                       tools=ToolsSpec())


def test_a_budget_that_suffices_measures_everything_and_says_what_is_left() -> None:
    jobs = [JobRef("own", "softmax"), JobRef("own", "matmul"), JobRef("tail", "matmul")]
    p = preview(_spec(1000, jobs), cards.INTERPRETER, Ledger())
    by = {(j["slice"], j["kind"]): j for j in p["jobs"]}
    assert all(j["state"] == "all of its points" and j["measures"] == j["points"] > 0
               for j in by.values()), by
    assert p["measures"] == p["points"]
    assert p["unspent_s"] > 900


def test_a_short_budget_is_spent_whole_and_what_the_jobs_leave_tops_them_up() -> None:
    """The first allotments are the shares; what a job leaves flows to the others; once every
    job ran, top-ups spend the rest while points remain: nothing is left unspent."""
    jobs = [JobRef("own", "softmax"), JobRef("own", "matmul"), JobRef("tail", "matmul")]
    # 24 s: softmax's own slice (16 points with its SPLIT twins) fits its share, matmul's not
    p = preview(_spec(24, jobs, rate=0.5), cards.INTERPRETER, Ledger())
    assert p["measures"] < p["points"]
    assert p["unspent_s"] < 3.0  # under what a job can use
    by = {(j["slice"], j["kind"]): j for j in p["jobs"]}
    assert by[("own", "softmax")]["state"] == "all of its points"
    lines = format_preview(p)
    assert lines[0].startswith("what 24s buys on Triton CPU interpreter (interpret)")
    assert lines[-1].startswith("total: about ")


def test_points_in_the_node_table_are_not_planned_again() -> None:
    jobs = [JobRef("own", "softmax")]
    spec = _spec(100, jobs)
    first = preview(spec, cards.INTERPRETER, Ledger())
    from harness import pools

    book = Ledger()
    for pt in pools.build(cards.INTERPRETER, kinds=["softmax"]).points("own", "softmax"):
        book.mark(pt.key, pt.spec, "interpret", "ok")
    again = preview(spec, cards.INTERPRETER, book)
    assert first["points"] > 0 and again["points"] == 0
    assert again["jobs"][0]["state"] == "no points to measure"


def test_the_cli_prints_a_table_or_json(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harness", "plan", "--card", "interpret", "--budget-s", "60",
           "--db", str(tmp_path / "none.db")]
    table = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("what 60s buys on Triton CPU interpreter (interpret)")
    assert f"softmax {DEFAULT_S_PER_POINT['interpret']:g}s" in table.stdout.splitlines()[0]
    assert len(table.stdout.splitlines()) < 40
    js = subprocess.run([*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    data = json.loads(js.stdout)
    assert data["budget_s"] == 60 and data["jobs"] and data["db"] is None
    bad = subprocess.run([*cmd, "--card", "l4os"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "did you mean 'l40s'" in bad.stderr


def test_a_filter_that_starts_with_a_dash_is_a_value_on_both_sides() -> None:
    from harness.box.__main__ import parser

    spec = _spec(10, [JobRef("own", "softmax")], filter="-k")
    assert SessionSpec.from_json(spec.to_json()).sweep.filter == "-k"
    assert parser().parse_args(["plan", "--filter=-k"]).filter == "-k"


def test_torch_compile_baselines_are_counted_apart_and_given_their_time() -> None:
    """The box's count says how many of a job's points are torch.compile's baselines (seconds a
    shape, where a configuration takes milliseconds), and the preview gives them that time."""
    cmd = [sys.executable, "-m", "harness.box", "plan", "--card", "h200", "--kind", "rms_norm",
           "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    shapes = data["remaining"]["own"]["rms_norm"]
    assert data["compile_baselines"]["own"]["rms_norm"] == {s: 1 for s in shapes}
    none = subprocess.run([*cmd, "--baselines=torch"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(none.stdout)["compile_baselines"]["own"] == {}

    h200 = cards.by_alias("h200")
    spec = _spec(240, [JobRef("own", "rms_norm")], rate=0.09)
    p = preview(spec, h200, Ledger())
    own = p["jobs"][0]
    points = sum(shapes.values())
    assert own["points"] == points
    assert own["allotment_s"] >= 1.5 * (points * 0.09 + len(shapes) * 10.0) - 0.1
    assert own["measures"] == points
