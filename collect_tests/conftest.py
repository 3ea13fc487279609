"""Fixtures of the collection run: the box's lifecycle belongs to a session fixture.

``boxes`` opens a box per card on first use (rent a server if ``--provider`` says so, push,
set up, probe, plan) and, at the end of the session, brings the ledger home, closes the
connection and releases what this run rented, even when jobs failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from harness.collection import BoxState, Collection
from harness.plugin import COLLECTION_KEY


@pytest.fixture(scope="session")
def collection(pytestconfig: pytest.Config) -> Collection:
    coll = pytestconfig.stash.get(COLLECTION_KEY, None)
    if coll is None:
        pytest.skip("no sweep jobs selected")
    return coll


@pytest.fixture(scope="session")
def progress(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Write a line to the terminal while a job runs (outside pytest's output capture)."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is None:
            return
        with capman.global_and_fixture_disabled():
            reporter.write_line(f"  [collect] {line}")

    return say


@pytest.fixture(scope="session")
def boxes(collection: Collection, progress: Callable[[str], None]) -> Iterator[Callable[[str], BoxState]]:
    opened: list[str] = []

    def get(gpu: str) -> BoxState:
        if gpu not in opened:
            opened.append(gpu)
        return collection.open_box(gpu, progress)

    try:
        yield get
    finally:
        errors = []
        for gpu in opened:
            try:
                collection.close_box(gpu, progress)
            except Exception as exc:  # noqa: BLE001 - close every box, then report
                errors.append(f"{gpu}: {exc}")
        if errors:
            raise RuntimeError("closing boxes failed: " + "; ".join(errors))
