"""The ledger a worker shares with its supervisor: what it holds, started, and its deadline."""

import math
import multiprocessing
import time

import pytest

from django_jobstate.runner.ledger import HELD, RELEASED, STARTED, Ledger


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
    book.finish(0)
    assert book.start(1, timeout=0.01)
    time.sleep(0.02)
    assert book.overdue(time.monotonic()) == 12


def test_no_deadline_without_a_timeout_or_an_attempt_in_hand():
    book = ledger()
    book.hold([11])
    assert book.next_deadline() == math.inf
    book.start(0, timeout=None)
    assert book.overdue(time.monotonic() + 10**6) is None
    book.finish(0)
    assert book.next_deadline() == math.inf


def test_held_attempts_are_released_only_behind_a_slow_one_and_then_never_started():
    book = ledger()
    book.hold([11, 12, 13])
    assert book.release_held(time.monotonic(), after=0) == []  # nothing in hand yet
    book.start(0, timeout=None)
    assert book.release_held(time.monotonic(), after=60) == []  # not slow yet
    assert book.release_held(time.monotonic() + 61, after=60) == [12, 13]
    book.finish(0)
    assert not book.start(1, timeout=None)
    assert book.marks() == {11: STARTED, 12: RELEASED, 13: RELEASED}


def test_a_new_batch_replaces_the_last_one():
    book = ledger()
    book.hold([11, 12, 13])
    book.start(0, timeout=None)
    book.hold([21])
    assert book.marks() == {21: HELD}


def in_flight_ledger(size: int = 4, in_flight: int = 3) -> Ledger:
    return Ledger(multiprocessing.get_context("spawn"), size, in_flight)


def test_in_flight_claims_take_free_places_and_each_keeps_its_own_deadline():
    book = in_flight_ledger()
    assert book.hold([11, 12]) == [0, 1]
    book.start(0, timeout=None)
    book.start(1, timeout=0.01)
    assert book.hold([13]) == [2], "a new claim must not replace the attempts running"
    book.start(2, timeout=60)
    time.sleep(0.02)
    assert book.due(time.monotonic()) == [1]
    assert book.overdue(time.monotonic()) == 12
    assert book.next_deadline() > time.monotonic() + 50  # the third one's
    book.finish(1)
    book.free([1])
    assert book.marks() == {11: STARTED, 13: STARTED}
    assert book.hold([14, 15]) == [1, 3]
    with pytest.raises(ValueError, match="do not fit"):
        book.hold([16])


def test_an_async_attempt_has_a_grace_after_its_deadline_before_its_process_is_stopped():
    book = in_flight_ledger()
    book.hold([11])
    book.start(0, timeout=0.01, grace=60)
    time.sleep(0.02)
    assert book.due(time.monotonic()) == [0], "the worker cancels it at the deadline"
    assert book.overdue(time.monotonic()) is None, "the supervisor waits for the grace"
    assert book.overdue(time.monotonic() + 61) == 11


def test_in_flight_nothing_is_held_behind_a_slow_attempt():
    book = in_flight_ledger()
    book.hold([11, 12])
    book.start(0, timeout=None)
    assert book.release_held(time.monotonic() + 61, after=60) == []
    assert book.start(1, timeout=None)


def test_a_cancel_request_brings_a_running_attempts_deadline_forward():
    book = in_flight_ledger()
    book.hold([11, 12])
    book.start(0, timeout=None)
    book.start(1, timeout=None)
    assert book.request_cancel(12, time.monotonic() - 1)
    assert book.due(time.monotonic()) == [1]
    assert book.cancel_requested(1)
    assert not book.cancel_requested(0)
    assert not book.request_cancel(99, 0)
