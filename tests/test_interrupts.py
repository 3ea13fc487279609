"""The controller's signal handling: the first signal raises where the controller is, except
inside a shielded block (a merge), which it lets finish; a second one raises at once."""

from __future__ import annotations

import os
import signal

import pytest

from harness.interrupts import Interrupted, Interrupts


@pytest.fixture
def interrupts():
    it = Interrupts()
    it.install()
    yield it
    it.uninstall()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_first_signal_raises_a_keyboard_interrupt_naming_it(interrupts: Interrupts, sig: int) -> None:
    with pytest.raises(KeyboardInterrupt) as info:
        os.kill(os.getpid(), sig)
    assert isinstance(info.value, Interrupted) and not info.value.second
    assert info.value.signame == signal.Signals(sig).name
    assert interrupts.stopping and not interrupts.leaving


def test_a_shielded_block_finishes_before_the_first_signal_raises(interrupts: Interrupts) -> None:
    done = []
    with pytest.raises(Interrupted):
        with interrupts.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the merge went on")
    assert done == ["the merge went on"]


def test_a_second_signal_raises_at_once_even_when_shielded(interrupts: Interrupts) -> None:
    with pytest.raises(Interrupted) as info:
        with interrupts.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("the second signal did not raise at once")
    assert info.value.second and interrupts.leaving


def test_uninstall_gives_the_old_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    it = Interrupts()
    it.install()
    assert signal.getsignal(signal.SIGTERM) != before
    it.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
