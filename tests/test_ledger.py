"""The ledger a worker shares with its supervisor: what it holds, started, and its deadline."""

import math
import multiprocessing
import time

from django_jobstate.ledger import HELD, RELEASED, STARTED, Ledger


def ledger(size: int = 4) -> Ledger:
    return Ledger(multiprocessing.get_context("spawn"), size)


def test_an_overdue_attempt_is_reported_once_and_never_hides_the_next_ones_deadline():
    book = ledger()
    book.hold([11, 12])
    assert book.start(0, timeout=0.01)
    assert book.overdue(time.monotonic()) is None  # not yet
    time.sleep(0.02)
    assert book.overdue(time.monotonic()) == 11
    assert book.overdue(time.monotonic()) is None  # once: the process is being stopped
    # The first attempt returned late meanwhile, and the next one started: whatever the
    # supervisor or watchdog does about the first, the second keeps its own deadline.
    book.finish()
    assert book.start(1, timeout=0.01)
    time.sleep(0.02)
    assert book.overdue(time.monotonic()) == 12


def test_no_deadline_without_a_timeout_or_an_attempt_in_hand():
    book = ledger()
    book.hold([11])
    assert book.next_deadline() == math.inf
    book.start(0, timeout=None)
    assert book.overdue(time.monotonic() + 10**6) is None
    book.finish()
    assert book.next_deadline() == math.inf


def test_held_attempts_are_released_only_behind_a_slow_one_and_then_never_started():
    book = ledger()
    book.hold([11, 12, 13])
    assert book.release_held(time.monotonic(), after=0) == []  # nothing in hand yet
    book.start(0, timeout=None)
    assert book.release_held(time.monotonic(), after=60) == []  # not slow yet
    assert book.release_held(time.monotonic() + 61, after=60) == [12, 13]
    book.finish()
    assert not book.start(1, timeout=None)
    assert book.marks() == {11: STARTED, 12: RELEASED, 13: RELEASED}


def test_a_new_batch_replaces_the_last_one():
    book = ledger()
    book.hold([11, 12, 13])
    book.start(0, timeout=None)
    book.hold([21])
    assert book.marks() == {21: HELD}
