"""``python -m harness.box plan --card CARD --budget-s B``: what a budget buys, before renting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.box.__main__ import budget_preview, format_preview

ROOT = Path(__file__).resolve().parent.parent
SHARES = {"own": 60.0, "cross": 25.0, "tail": 15.0}


def payload(own: dict[str, int], tail: dict[str, int]) -> dict:
    return {"card": "NVIDIA H200 141GB", "regime": "deployable",
            "remaining": {"own": {k: {"s1": n} for k, n in own.items()}, "cross": {},
                          "tail": {k: {"s1": n} for k, n in tail.items()}}}


def test_a_budget_that_suffices_measures_everything_and_says_what_is_left() -> None:
    p = budget_preview(payload({"softmax": 100, "matmul": 300}, {"matmul": 200}), 1000, 0.1, SHARES)
    assert [(j["slice"], j["kind"], j["measures"], j["state"]) for j in p["jobs"]] == [
        ("own", "softmax", 100, "all of its points"), ("own", "matmul", 300, "all of its points"),
        ("tail", "matmul", 200, "all of its points")]
    assert (p["measures"], p["points"], p["unspent_s"]) == (600, 600, 940.0)


def test_a_short_budget_is_shared_and_a_job_under_ten_seconds_is_skipped() -> None:
    p = budget_preview(payload({"softmax": 1000, "matmul": 5000}, {"matmul": 5000}), 100, 0.1, SHARES)
    by = {(j["slice"], j["kind"]): j for j in p["jobs"]}
    # cross is empty: own gets 60/75 of the 100 s, over two kinds
    assert by[("own", "softmax")]["allotment_s"] == 40.0
    assert by[("own", "softmax")]["state"] == "budget spent"
    assert by[("tail", "matmul")]["state"] == "budget spent"
    assert p["measures"] < p["points"]
    short = budget_preview(payload({"softmax": 10}, {"matmul": 10}), 8, 0.1, SHARES)
    assert [j["state"] for j in short["jobs"]] == ["skipped (under 10 s)", "skipped (under 10 s)"]
    lines = format_preview(p)
    assert lines[0].startswith("what 100s buys on NVIDIA H200 141GB (deployable)")
    assert lines[-1].startswith("total: about ")


def test_the_cli_prints_a_table_or_json() -> None:
    cmd = [sys.executable, "-m", "harness.box", "plan", "--card", "interpret", "--budget-s", "60"]
    table = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("what 60s buys on Triton CPU interpreter (interpret)")
    assert len(table.stdout.splitlines()) < 40
    js = subprocess.run([*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    data = json.loads(js.stdout)
    assert data["budget"]["budget_s"] == 60 and data["budget"]["jobs"]


def test_a_filter_that_starts_with_a_dash_reaches_the_box_as_a_value() -> None:
    from harness.box.__main__ import parser
    from harness.boxctl import pool_args

    args = pool_args({"max_dist": 2, "tail_cap": 200, "filter": "-k"})
    assert args[-1] == "--filter=-k"
    assert parser().parse_args(["plan", *args]).filter == "-k"


def test_torch_compile_baselines_are_counted_apart_and_given_their_time() -> None:
    """The pool file says how many of a job's points are torch.compile's baselines (seconds a
    shape, where a configuration takes milliseconds), and the preview gives them that time."""
    cmd = [sys.executable, "-m", "harness.box", "plan", "--card", "h200", "--kind", "rms_norm",
           "--budget-s", "240", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    shapes = data["remaining"]["own"]["rms_norm"]
    assert data["compile_baselines"]["own"]["rms_norm"] == {s: 1 for s in shapes}
    own = next(j for j in data["budget"]["jobs"] if j["slice"] == "own")
    points = sum(shapes.values())
    assert own["allotment_s"] >= 1.5 * (points * 0.09 + len(shapes) * 10.0) - 0.1
    assert own["measures"] == points
    none = subprocess.run([*cmd, "--baselines=torch"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(none.stdout)["compile_baselines"]["own"] == {}
