"""Tests of the resume ledger: marks, merging, atomic saves and surviving a corrupt file."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from harness.ledger import (
    MAX_ATTEMPTS,
    REGIMES,
    RETRYABLE,
    TERMINAL,
    VERSION,
    Ledger,
    LedgerWarning,
)
from harness.points import point_key

SPECS = ["A=0", "A=1", "A=2,B=x/y", ""]
POINTS = [(point_key("NVIDIA L40S", "softmax_N4096_bf16", s), s) for s in SPECS]
KEY, SPEC = POINTS[0]


def test_constants() -> None:
    assert TERMINAL == {"ok", "bench_fail"}
    assert RETRYABLE == {"timeout", "error", "crash"}
    assert not TERMINAL & RETRYABLE
    assert MAX_ATTEMPTS == 2
    assert VERSION == 1
    assert REGIMES == ("deployable", "interpret")
    assert issubclass(LedgerWarning, UserWarning)


# -- marks --------------------------------------------------------------------------------


def test_fresh_point_needs_run() -> None:
    ledger = Ledger()
    assert ledger.status(KEY, "deployable") is None
    assert ledger.attempts(KEY, "deployable") == 0
    assert ledger.needs_run(KEY, "deployable")
    assert len(ledger) == 0


def test_retryable_until_max_attempts() -> None:
    ledger = Ledger()
    ledger.mark(KEY, SPEC, "deployable", "timeout", error="ran past 1800 s")
    assert ledger.status(KEY, "deployable") == "timeout"
    assert ledger.attempts(KEY, "deployable") == 1
    assert ledger.error(KEY, "deployable") == "ran past 1800 s"
    assert ledger.needs_run(KEY, "deployable")
    ledger.mark(KEY, SPEC, "deployable", "crash")
    assert ledger.attempts(KEY, "deployable") == 2
    assert ledger.error(KEY, "deployable") is None  # the error belongs to its attempt
    assert not ledger.needs_run(KEY, "deployable")
    assert ledger.needs_run(KEY, "deployable", max_attempts=3)


def test_unknown_status_is_retryable() -> None:
    ledger = Ledger()
    ledger.mark(KEY, SPEC, "deployable", "pin_unmatched")
    assert ledger.needs_run(KEY, "deployable")


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_terminal_sticks(status: str) -> None:
    ledger = Ledger()
    ledger.mark(KEY, SPEC, "deployable", status)
    assert not ledger.needs_run(KEY, "deployable", max_attempts=99)
    ledger.mark(KEY, SPEC, "deployable", "error", error="late")
    ledger.mark(KEY, SPEC, "deployable", "ok")
    assert ledger.status(KEY, "deployable") == status
    assert ledger.attempts(KEY, "deployable") == 1
    assert ledger.error(KEY, "deployable") is None


def test_regimes_independent() -> None:
    ledger = Ledger()
    ledger.mark(KEY, SPEC, "interpret", "ok")
    assert not ledger.needs_run(KEY, "interpret")
    assert ledger.needs_run(KEY, "deployable")
    assert ledger.status(KEY, "deployable") is None
    assert ledger.spec(KEY) == SPEC
    assert KEY in ledger and list(ledger) == [KEY]


def test_bad_marks_rejected() -> None:
    ledger = Ledger()
    with pytest.raises(
        ValueError, match=r"unknown regime 'O3'; valid regimes: deployable, interpret"
    ):
        ledger.mark(KEY, SPEC, "O3", "ok")
    with pytest.raises(ValueError, match="status must be"):
        ledger.mark(KEY, SPEC, "deployable", "")
    ledger.mark(KEY, SPEC, "deployable", "ok")
    with pytest.raises(ValueError, match=r"recorded for spec 'A=0', not 'A=9'"):
        ledger.mark(KEY, "A=9", "deployable", "ok")


def test_counts() -> None:
    ledger = Ledger()
    for (key, spec), status in zip(POINTS, ["ok", "ok", "timeout", "bench_fail"], strict=True):
        ledger.mark(key, spec, "deployable", status)
    ledger.mark(KEY, SPEC, "interpret", "error")
    assert ledger.counts("deployable") == {"ok": 2, "timeout": 1, "bench_fail": 1}
    assert ledger.counts("interpret") == {"error": 1}
    assert len(ledger) == 4


# -- update (the box's ledger comes home) -------------------------------------------------


def _ledger(*marks: tuple[str, str]) -> Ledger:
    ledger = Ledger()
    for regime, status in marks:
        ledger.mark(KEY, SPEC, regime, status)
    return ledger


def test_update_terminal_beats_non_terminal() -> None:
    home = _ledger(("deployable", "timeout"), ("deployable", "timeout"))
    home.update(_ledger(("deployable", "ok")))
    assert home.status(KEY, "deployable") == "ok"

    home = _ledger(("deployable", "bench_fail"))
    home.update(_ledger(("deployable", "error"), ("deployable", "error")))
    assert home.status(KEY, "deployable") == "bench_fail"


def test_update_more_attempts_wins_tie_keeps_own() -> None:
    home = _ledger(("deployable", "timeout"))
    home.update(_ledger(("deployable", "timeout"), ("deployable", "crash")))
    assert (home.status(KEY, "deployable"), home.attempts(KEY, "deployable")) == ("crash", 2)
    home.update(_ledger(("deployable", "error"), ("deployable", "error")))
    assert home.status(KEY, "deployable") == "crash"


def test_update_adds_points_and_regimes() -> None:
    home = _ledger(("deployable", "ok"))
    box = Ledger()
    box.mark(KEY, SPEC, "interpret", "timeout")
    key2, spec2 = POINTS[1]
    box.mark(key2, spec2, "deployable", "ok")
    home.update(box)
    assert home.status(KEY, "deployable") == "ok"
    assert home.status(KEY, "interpret") == "timeout"
    assert home.status(key2, "deployable") == "ok"
    box.mark(key2, spec2, "interpret", "ok")  # home holds a copy, not the box's dicts
    assert home.status(key2, "interpret") is None


def test_update_spec_conflict() -> None:
    home = _ledger(("deployable", "ok"))
    other = Ledger()
    other.mark(KEY, "A=9", "deployable", "ok")
    with pytest.raises(ValueError, match="in the ledger being merged"):
        home.update(other)


# -- files --------------------------------------------------------------------------------


def test_missing_file_is_empty(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(Ledger.load(tmp_path / "nope.json")) == 0


def test_save_format_and_atomic(tmp_path: Path) -> None:
    ledger = Ledger()
    ledger.mark(KEY, SPEC, "deployable", "timeout", error="boom")
    path = tmp_path / "deep" / "dir" / "ledger.json"
    ledger.save(path)
    text = path.read_text()
    data = json.loads(text)
    assert data == {
        "version": 1,
        "points": {
            KEY: {"spec": SPEC, "deployable": {"status": "timeout", "attempts": 1, "error": "boom"}}
        },
    }
    assert text == json.dumps(data, indent=1, sort_keys=True) + "\n"
    assert [p.name for p in path.parent.iterdir()] == ["ledger.json"]
    assert Ledger.load(path).to_dict() == ledger.to_dict()


def test_save_replaces_stale_tmp(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    stale = tmp_path / f".ledger.json.{os.getpid()}.tmp"  # a writer of this pid that died
    stale.write_text("half a write")
    _ledger(("deployable", "ok")).save(path)
    assert Ledger.load(path).status(KEY, "deployable") == "ok"
    assert not stale.exists()


def _save_many(path: str, n: int) -> None:
    ledger = _ledger(("deployable", "ok"))
    for _ in range(n):
        ledger.save(path)


def test_two_processes_save_one_ledger_at_once(tmp_path: Path) -> None:
    """The workers of a run with several cards save the same --ledger at once."""
    path = tmp_path / "ledger.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_many, args=(str(path), 300)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert Ledger.load(path).status(KEY, "deployable") == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


_GOOD_ENTRY = {"spec": "A=0", "deployable": {"status": "ok", "attempts": 1}}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("[]", r"top level is a list"),
        ("{not json", r"is not valid JSON"),
        ("", r"is not valid JSON"),
        ("null", r"top level is a NoneType"),
        (json.dumps({"version": 2, "points": {}}), r"version is 2, expected 1"),
        (json.dumps({"points": {}}), r"version is None"),
        (json.dumps({"version": 1}), r"'points' is missing"),
        (json.dumps({"version": 1, "points": {"k": []}}), r"point 'k' is a list"),
        (json.dumps({"version": 1, "points": {"k": {"deployable": {}}}}), r"no string 'spec'"),
        (
            json.dumps({"version": 1, "points": {"k": {**_GOOD_ENTRY, "O3": {}}}}),
            r"unknown field 'O3'",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "points": {"k": {"spec": "", "interpret": {"status": "ok", "attempts": "2"}}},
                }
            ),
            r"bad 'attempts' '2'",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "points": {"k": {"spec": "", "interpret": {"status": "ok", "attempts": True}}},
                }
            ),
            r"bad 'attempts' True",
        ),
    ],
)
def test_unusable_file_starts_fresh_and_is_kept(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(content)
    pattern = (
        rf"ledger {re.escape(str(path))} .*{why}.*starting with fresh resume state.*"
        rf"kept as {re.escape(str(path))}\.corrupt-\d{{8}}-\d{{6}}.*Deleting {re.escape(str(path))} resets"
    )
    with pytest.warns(LedgerWarning, match=pattern):
        ledger = Ledger.load(path)
    assert len(ledger) == 0
    copies = list(tmp_path.glob("ledger.json.corrupt-*"))
    assert len(copies) == 1
    assert copies[0].read_text() == content
    assert path.read_text() == content  # left in place until the next save replaces it


def test_invalid_utf8_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.warns(LedgerWarning, match="not valid JSON"):
        assert len(Ledger.load(path)) == 0


def test_two_corrupt_loads_keep_two_copies(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    for content in ("[]", "[1]"):
        path.write_text(content)
        with pytest.warns(LedgerWarning):
            Ledger.load(path)
    copies = sorted(p.read_text() for p in tmp_path.glob("ledger.json.corrupt-*"))
    assert copies == ["[1]", "[]"]


def test_from_dict_rejects_bad_data() -> None:
    with pytest.raises(ValueError, match="version is 7"):
        Ledger.from_dict({"version": 7, "points": {}})


# -- any interleaving of marks, saves, loads and merges ----------------------------------

_statuses = st.sampled_from(sorted(TERMINAL | RETRYABLE | {"flagged"}))
_points = st.sampled_from(POINTS)
_regimes = st.sampled_from(REGIMES)
_errors = st.one_of(st.none(), st.text(max_size=10))
_marks = st.lists(st.tuples(_points, _regimes, _statuses, _errors), max_size=8)

Model = dict[tuple[str, str], tuple[str, int, "str | None"]]


def _model_mark(model: Model, key: str, regime: str, status: str, error: str | None) -> None:
    old = model.get((key, regime))
    if old is not None and old[0] in TERMINAL:
        return
    model[(key, regime)] = (status, (old[1] if old else 0) + 1, error)


class LedgerMachine(RuleBasedStateMachine):
    """Ledger against a dict model of (key, regime) -> (status, attempts, error)."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.model: Model = {}
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-test-"))
        self.path = self.dir / "sub" / "ledger.json"

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(point=_points, regime=_regimes, status=_statuses, error=_errors)
    def mark(self, point: tuple[str, str], regime: str, status: str, error: str | None) -> None:
        key, spec = point
        self.ledger.mark(key, spec, regime, status, error=error)
        _model_mark(self.model, key, regime, status, error)

    @rule()
    def save_and_load(self) -> None:
        self.ledger.save(self.path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = Ledger.load(self.path)
        assert loaded.to_dict() == self.ledger.to_dict()
        self.ledger = loaded

    @rule(marks=_marks)
    def fold_in_box_ledger(self, marks: list) -> None:
        box = Ledger()
        box_model: Model = {}
        for (key, spec), regime, status, error in marks:
            box.mark(key, spec, regime, status, error=error)
            _model_mark(box_model, key, regime, status, error)
        self.ledger.update(box)
        for slot, theirs in box_model.items():
            mine = self.model.get(slot)
            if (
                mine is None
                or (theirs[0] in TERMINAL and mine[0] not in TERMINAL)
                or ((theirs[0] in TERMINAL) == (mine[0] in TERMINAL) and theirs[1] > mine[1])
            ):
                self.model[slot] = theirs

    @invariant()
    def matches_model(self) -> None:
        for key, _spec in POINTS:
            for regime in REGIMES:
                status, attempts, error = self.model.get((key, regime), (None, 0, None))
                assert self.ledger.status(key, regime) == status
                assert self.ledger.attempts(key, regime) == attempts
                assert self.ledger.error(key, regime) == error
                for max_attempts in (1, 2, 3):
                    expected = status is None or (
                        status not in TERMINAL and attempts < max_attempts
                    )
                    assert self.ledger.needs_run(key, regime, max_attempts) == expected
        assert len(self.ledger) == len({key for key, _ in self.model})
        for regime in REGIMES:
            hist: dict[str, int] = {}
            for (_key, reg), (status, _n, _e) in self.model.items():
                if reg == regime:
                    hist[status] = hist.get(status, 0) + 1
            assert self.ledger.counts(regime) == hist


LedgerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=20, deadline=None)
TestLedgerMachine = LedgerMachine.TestCase


def test_a_ledger_made_from_a_node_table_calls_done_only_what_is_there(tmp_path: Path) -> None:
    records = [("a", "X=1", "interpret", "ok", 1, None),
               ("b", "X=2", "interpret", "timeout", 1, "slow"),
               ("c", "X=3", "interpret", "crash", 2, "boom"),
               ("d", "X=4", "deployable", "bench_fail", 3, "wrong result"),
               ("e", "X=5", "cpu", "ok", 1, None)]  # not a regime: ignored
    book = Ledger.from_records(records, {"id": "db1", "path": "/x/autotune.db"})
    assert not book.needs_run("a", "interpret") and book.needs_run("a", "deployable")
    assert book.needs_run("b", "interpret") and book.error("b", "interpret") == "slow"
    assert not book.needs_run("c", "interpret")  # two attempts: the retries are used up
    assert not book.needs_run("d", "deployable") and book.error("d", "deployable") is None
    assert "e" not in book
    book.save(tmp_path / "ledger.json")
    again = Ledger.load(tmp_path / "ledger.json")
    assert again.bound_to == {"id": "db1", "path": "/x/autotune.db"}
    assert again.to_dict() == book.to_dict()
