"""The seam between the controller and the box is declared once (``harness.contract``).

Both sides import it, neither imports the other, each option has one default whichever side
parses it, the session's request and status round-trip through JSON, and the row the box
writes is the row the merge reads."""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import contract
from harness.contract import (
    ROW_FIELDS,
    Entry,
    JobRef,
    Layout,
    OptionError,
    SessionSpec,
    SessionStatus,
    SweepOptions,
    ToolsSpec,
    add_options,
)

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"
# what the box may import of this project: the pure core and the contract
CORE = {"harness.cards", "harness.kinds", "harness.goldens", "harness.points", "harness.slices",
        "harness.pools", "harness.ledger", "harness.planner", "harness.shipped",
        "harness.contract", "harness.stats"}


def _imports(path: Path) -> set[str]:
    """The project modules a file imports (at any depth: lazy imports count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("harness"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            out.update(f"{node.module}.{a.name}" if node.module == "harness" else node.module
                       for a in node.names)
    return out


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _within(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def test_the_box_imports_only_the_core_and_the_contract() -> None:
    wrong = {f"{_module(p)} imports {name}"
             for p in sorted((HARNESS / "box").glob("*.py")) for name in _imports(p)
             if not _within(name, CORE | {"harness.box"})}
    assert not wrong, sorted(wrong)


def test_the_core_imports_neither_side() -> None:
    core_files = [p for p in HARNESS.rglob("*.py") if _within(_module(p), CORE)]
    assert len(core_files) > 10
    wrong = {f"{_module(p)} imports {name}" for p in core_files for name in _imports(p)
             if not _within(name, CORE)}
    assert not wrong, sorted(wrong)


def test_the_controller_imports_nothing_from_the_box() -> None:
    controller = [p for p in HARNESS.rglob("*.py")
                  if not _within(_module(p), CORE | {"harness.box"})]
    assert any(p.name == "collection.py" for p in controller)
    wrong = {f"{_module(p)} imports {name}" for p in controller for name in _imports(p)
             if _within(name, {"harness.box"})}
    assert not wrong, sorted(wrong)


def test_the_contract_needs_only_the_standard_library() -> None:
    tree = ast.parse((HARNESS / "contract.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


class _Recorder:
    """Stands in for pytest's parser and its option group: records each option declared."""

    def __init__(self) -> None:
        self.options: dict[str, dict[str, Any]] = {}

    def getgroup(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        for name in names:
            self.options[name] = kwargs


def test_every_option_that_reaches_the_box_has_one_default_on_both_sides() -> None:
    from harness import plugin
    from harness.box.__main__ import parser

    rec = _Recorder()
    plugin.pytest_addoption(rec)  # type: ignore[arg-type]
    box = parser()
    run = next(a for a in box._subparsers._group_actions  # type: ignore[union-attr]
               if isinstance(a, argparse._SubParsersAction)).choices["run"]
    parsed = run.parse_args(["--slice", "own", "--kind", "softmax", "--budget-s", "1",
                             "--rows", "r", "--ledger", "l"])
    for spec in (SweepOptions, ToolsSpec):
        for f in spec.__dataclass_fields__.values():
            flag = f.metadata["flag"]
            assert getattr(parsed, f.name) == f.default, flag
            if f.metadata["user"]:
                assert rec.options[flag]["default"] == f.default, flag
                assert rec.options[flag]["help"] == next(
                    a.help for a in run._actions if flag in a.option_strings), flag
            else:
                assert flag not in rec.options
    assert SweepOptions.from_namespace(parsed) == SweepOptions()
    assert ToolsSpec.from_namespace(parsed) == ToolsSpec()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch": 0}, r"--batch=0: must be at least 1"),
    ({"point_timeout_s": float("nan")}, r"--point-timeout-s=nan: must be a positive number"),
    ({"baselines": "torch,jax"}, r"--baselines=torch,jax: jax is not a baseline"),
    ({"filter": "a\nb"}, r"--filter=a\nb: must be text without control characters"),
])
def test_a_bad_sweep_option_says_which_and_what_is_valid(kwargs: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        SweepOptions(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"box_gpus": "0"}, r"--box-gpus=0: not a number of GPUs"),
    ({"iters": 10}, r"--iters=10: below 20 is under the measurement quality bar"),
    ({"max_cv": 0.0}, r"--max-cv=0: must be a positive fraction"),
])
def test_a_bad_tools_option_says_which_and_what_is_valid(kwargs: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        ToolsSpec(**kwargs)


def test_values_are_written_one_way() -> None:
    assert SweepOptions(baselines="compile, torch").baselines == "torch,compile"
    assert SweepOptions(baselines="none").baselines == "none"
    assert ToolsSpec(box_gpus="3,").box_gpus == "3,"
    assert ToolsSpec(box_gpus=" ALL ").box_gpus == "all"


_kinds = st.sampled_from(["matmul", "softmax", "rms_norm", "reduce"])
_jobs = st.lists(st.builds(JobRef, st.sampled_from(contract.SLICES), _kinds), max_size=8,
                 unique=True)
_specs = st.builds(
    SessionSpec, run_id=st.from_regex(r"bench-[0-9a-f]{1,12}", fullmatch=True),
    session_id=st.from_regex(r"bench-[0-9a-f]{1,8}(\.[0-9])?", fullmatch=True),
    budget_s=st.floats(0, 1e6), shares=st.fixed_dictionaries(
        {s: st.floats(0, 100) for s in contract.SLICES}),
    jobs=_jobs.map(tuple), s_per_point=st.dictionaries(_kinds, st.floats(1e-4, 100)),
    compile_s=st.dictionaries(_kinds, st.floats(0, 100)),
    sweep=st.builds(SweepOptions, max_dist=st.integers(0, 5), tail_cap=st.integers(0, 500),
                    filter=st.none() | st.text(st.characters(min_codepoint=32,
                                                            blacklist_categories=("Cs", "Cc"))),
                    batch=st.integers(1, 20), seed=st.integers(-10, 10**6),
                    point_timeout_s=st.floats(0.1, 1e4)),
    tools=st.builds(ToolsSpec, box_gpus=st.sampled_from(["1", "2", "all", "0,2", "3,"]),
                    compile_workers=st.none() | st.integers(0, 16)))


@settings(max_examples=200)
@given(_specs)
def test_a_session_request_round_trips_through_json(spec: SessionSpec) -> None:
    again = SessionSpec.from_json(spec.to_json())
    assert again == spec
    assert json.loads(again.to_json()) == json.loads(spec.to_json())


def test_a_request_of_another_version_or_kind_is_refused_saying_why() -> None:
    spec = SessionSpec(run_id="bench-1", session_id="bench-1", budget_s=1.0, shares={"own": 1},
                       jobs=(JobRef("own", "softmax"),), s_per_point={}, compile_s={})
    data = json.loads(spec.to_json())
    with pytest.raises(OptionError, match="this box code reads version 1: push the same harness"):
        SessionSpec.from_json(json.dumps({**data, "version": 2}))
    with pytest.raises(OptionError, match="not a session request"):
        SessionSpec.from_json(json.dumps({"jobs": []}))
    with pytest.raises(OptionError, match="not a usable run or session id"):
        SessionSpec(run_id="../x", session_id="s", budget_s=1.0, shares={}, jobs=(),
                    s_per_point={}, compile_s={})


@given(st.lists(st.builds(Entry, st.sampled_from(contract.SLICES), _kinds,
                          round=st.integers(0, 3),
                          state=st.sampled_from(["planned", "running", *contract.FINAL]),
                          reason=st.none() | st.text(), allotment_s=st.floats(0, 1e4),
                          elapsed_s=st.floats(0, 1e4), benched=st.integers(0, 10**6),
                          shape=st.none() | st.text(), best_us=st.none() | st.floats(0, 1e9),
                          eta_s=st.none() | st.floats(0, 1e5)), max_size=6),
       st.none() | st.floats(0, 1e5))
def test_a_session_status_round_trips_through_json(entries: list[Entry], eta: float | None
                                                   ) -> None:
    status = SessionStatus("bench-1", "bench-1", state="running", entries=entries, eta_s=eta)
    again = SessionStatus.from_json(status.to_json())
    assert again == status
    assert "\n" not in status.to_json()  # one line: a poll prints it whole


def test_an_entry_is_named_by_its_job_and_round_and_its_files_follow() -> None:
    lay = Layout("/box", "bench-1", "bench-1.2")
    top = Entry("own", "softmax", round=2)
    assert top.id == "own-softmax.top2" and Entry("own", "softmax").id == "own-softmax"
    assert lay.rows(top.id) == "/box/rows/bench-1/own-softmax.top2.jsonl"
    assert lay.summary("own-softmax") == "/box/summary/bench-1/own-softmax.json"
    assert lay.service("status.json") == "/box/service/bench-1.2/status.json"


def test_the_row_the_box_writes_is_the_row_the_merge_reads() -> None:
    from harness import pools
    from harness.box.runner import make_row
    from harness.cards import INTERPRETER
    from harness.rows import row_to_node

    point = pools.build(INTERPRETER, kinds=["softmax"]).points("own", "softmax")[0]
    info = {"regime": "interpret", "cc": [0, 0], "host": "h", "versions": {"torch": "x"}}
    row = make_row(point, {"status": "ok", "value_us": 3.5, "n_samples": 3}, info,
                   INTERPRETER.features(), {"S_M": 1}, "bench-1",
                   {"warmup": 1, "iters": 3, "max_cv": 0.05})
    assert set(row) == set(ROW_FIELDS)
    node = row_to_node(json.loads(json.dumps(row)))  # the merge takes it as it is
    # the revision of the kind's kernel code rides along into the node table
    from harness.kinds import source_rev

    assert row["provenance"]["kernel_rev"] == source_rev("softmax")
    provenance = node["provenance"]
    provenance = json.loads(provenance) if isinstance(provenance, str) else provenance
    assert provenance["kernel_rev"] == source_rev("softmax")
    for key in contract.REQUIRED_ROW_KEYS:
        broken = {k: v for k, v in row.items() if k != key}
        with pytest.raises(ValueError, match=f"missing required keys: {key}"):
            row_to_node(broken)


def test_counting_a_rows_file_never_fails_on_what_a_line_holds() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    lines = [json.dumps({"status": "ok"}), "not json", deep, "[1]", json.dumps({"status": "crash"})]
    assert contract.count_statuses(lines) == {"benched": 2, "ok": 1, "failed": 1,
                                              "statuses": {"ok": 1, "crash": 1}}


def test_the_generated_options_are_ordinary_argparse_options() -> None:
    p = argparse.ArgumentParser()
    add_options(p.add_argument, SweepOptions, ToolsSpec)
    ns = p.parse_args(["--batch=3", "--max-cv", "0.1", "--box-gpus=2", "--filter=-k"])
    assert SweepOptions.from_namespace(ns) == SweepOptions(batch=3, filter="-k")
    assert ToolsSpec.from_namespace(ns) == ToolsSpec(max_cv=0.1, box_gpus="2")
    assert "(default 6)" in p.format_help()
