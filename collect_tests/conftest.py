"""Fixtures of the collection run: the box's lifecycle belongs to a session fixture.

``boxes`` opens a box per card on first use (rent a server if ``--provider`` says so, push,
set up, probe, plan) and, at the end of the session, brings the ledger home, closes the
connection and releases what this run rented, even when jobs failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from harness.collection import BoxState, Collection
from harness.plugin import COLLECTION_KEY, PROGRESS_KEY
from harness.progress import Progress, PytestTerminal


@pytest.fixture(scope="session")
def collection(pytestconfig: pytest.Config) -> Collection:
    coll = pytestconfig.stash.get(COLLECTION_KEY, None)
    if coll is None:
        pytest.skip("no sweep jobs selected")
    return coll


@pytest.fixture(scope="session")
def progress(pytestconfig: pytest.Config) -> Progress:
    """The run's lines while jobs run (outside pytest's output capture; see
    :mod:`harness.progress`)."""
    made = pytestconfig.stash.get(PROGRESS_KEY, None)
    if made is not None:
        return made
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    return Progress(PytestTerminal(reporter, capman, pytestconfig.get_terminal_writer()
                                   if reporter is not None else None))


@pytest.fixture(scope="session")
def boxes(collection: Collection, progress: Progress) -> Iterator[Callable[[str], BoxState]]:
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
