"""Ctrl-C, SIGTERM and SIGHUP of the controller: stop cleanly once, leave at once the second time.

The first signal raises :class:`Interrupted` (a ``KeyboardInterrupt``, so pytest ends the
session as interrupted) where the controller is; the collection then stops the job in flight,
brings its rows home and merges them.  Inside :meth:`Interrupts.shielded` (a merge) the first
signal waits until the block ends, so a merge is never cut.  A second signal raises at once,
even there: the controller leaves and the rows left on the box are merged by the next run.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s)


class Interrupted(KeyboardInterrupt):
    """The controller was asked to stop by a signal."""

    def __init__(self, signame: str, second: bool = False) -> None:
        super().__init__(f"{signame}{' again' if second else ''}")
        self.signame = signame
        self.second = second


class Interrupts:
    """The controller's handlers for SIGINT, SIGTERM and SIGHUP (installed in the main thread
    only; elsewhere it is inert)."""

    def __init__(self) -> None:
        self.count = 0
        self.signame = ""
        self._shield = 0
        self._pending = False
        self._saved: dict[int, Any] = {}

    @property
    def stopping(self) -> bool:
        return self.count > 0

    @property
    def leaving(self) -> bool:
        """A second signal came: do nothing slow any more."""
        return self.count > 1

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self._saved:
            return
        for sig in SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.signame = signal.Signals(signum).name
        if self.count > 1:
            raise Interrupted(self.signame, second=True)
        if self._shield:
            self._pending = True
            return
        raise Interrupted(self.signame)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Hold a first signal until the block ends (a second one still raises at once)."""
        self._shield += 1
        try:
            yield
        finally:
            self._shield -= 1
        if self._pending and not self._shield:
            self._pending = False
            raise Interrupted(self.signame)
