"""The supervisor's monitor thread (runner/monitor.py) outlives an exception that is no
database error: ended, it would leave every later settle, rescue and cancel undone until
the supervisor restarted, while its workers' attempts stayed running."""

import logging
import threading

import pytest

from django_jobstate.runner.monitor import Monitor

pytestmark = pytest.mark.django_db(transaction=True)  # the monitor's threads connect


class Supervisor:
    """What a Monitor reads of its supervisor; `ledgers` raises on its first `fail` reads."""

    base_id = "test:monitor"
    concurrency = 1
    options: dict = {}
    workers: dict = {}

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail

    @property
    def ledgers(self) -> dict:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("a bug in the monitor's turn")
        return {}


def run(supervisor: Supervisor, *writes) -> tuple[bool, bool]:
    """Start a monitor with `writes` submitted, then a last one: whether the last write
    was made, and whether the thread was alive once it was."""
    monitor = Monitor(supervisor)
    made = threading.Event()
    for write in writes:
        monitor.submit(write)
    monitor.start()
    try:
        monitor.submit(made.set)
        return made.wait(10), monitor.is_alive()
    finally:
        monitor.finish()


def events(caplog) -> list:
    return [getattr(r, "event", None) for r in caplog.records]


def test_a_write_that_raises_a_bug_is_dropped_and_the_writes_behind_it_are_made(caplog):
    caplog.set_level(logging.ERROR, logger="django_jobstate.worker")

    made, alive = run(Supervisor(), lambda: 1 / 0)

    assert made
    assert alive
    assert events(caplog).count("supervisor.write_failed") == 1


def test_a_turn_that_raises_a_bug_is_logged_and_the_monitor_goes_on(caplog):
    caplog.set_level(logging.ERROR, logger="django_jobstate.worker")
    supervisor = Supervisor(fail=2)

    made, alive = run(supervisor)

    assert made
    assert alive
    assert "supervisor.monitor_failed" in events(caplog)
