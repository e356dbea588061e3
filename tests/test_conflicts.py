"""Deadlocks and lock wait timeouts, made for real on MariaDB/MySQL: a write of ours that
the database ends to break one changed nothing, so it is made again, and the attempt it
belongs to is never failed for it (managers/conflicts.py)."""

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections

from django_jobstate.models import Job
from django_jobstate.states import State
from tests import tasks
from tests.factories import JobFactory
from tests.models import Execution
from tests.test_runjobs import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "mysql",
        reason="InnoDB's errors 1213 and 1205 (SQLite has no row locks; PostgreSQL's "
        "succeed_many is one UPDATE whose row order its planner picks)",
    ),
]

LOCK_WAIT = 2  # seconds: innodb_lock_wait_timeout of the connections opened meanwhile


@pytest.fixture
def short_lock_waits() -> Iterator[None]:
    """innodb_lock_wait_timeout is LOCK_WAIT for every connection opened until the end."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.innodb_lock_wait_timeout")
        [(before,)] = cursor.fetchall()
        cursor.execute(f"SET GLOBAL innodb_lock_wait_timeout = {LOCK_WAIT}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"SET GLOBAL innodb_lock_wait_timeout = {int(before)}")


@contextmanager
def holder() -> Iterator[Any]:
    """Another client's connection, in a transaction till the end of the block (rolled
    back): what it locks stays locked till then."""
    raw = connection.get_new_connection(connection.get_connection_params())
    raw.autocommit(False)
    try:
        yield raw.cursor()
    finally:
        raw.rollback()
        raw.close()


def wait_until_waiting(thread_id: int, timeout: float = 60) -> None:
    """Wait until the server's connection `thread_id` waits for a row lock."""
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                "WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = %s",
                [thread_id],
            )
            if cursor.fetchone()[0]:
                return
        assert time.monotonic() < deadline, "the write never waited for a lock"
        # InnoDB refreshes that table only once 0.1 s passed without a read of it.
        time.sleep(0.25)


def test_a_save_metadata_that_waited_past_the_lock_wait_timeout_is_made_again(
    runjobs, tmp_path, short_lock_waits
):
    """The task's save_metadata() waits on a row another client holds for longer than
    innodb_lock_wait_timeout: the write is made again, not raised into the task, and the
    attempt succeeds, once, with the metadata saved."""
    gate = tmp_path / "gate"
    result = tasks.saves_metadata_at_the_gate.enqueue(str(gate))
    proc = runjobs.start("--burst")
    wait_for(lambda: Job.objects.filter(state=State.RUNNING).exists(), timeout=60)
    job = Job.objects.get(result_id=result.id)
    with holder() as cursor:
        cursor.execute("SELECT id FROM django_jobstate_job WHERE id = %s FOR UPDATE", [job.pk])
        gate.touch()
        # Ended once by the lock wait timeout (before the fix: raised into the task, whose
        # failure then waits for the row too).
        wait_for(
            lambda: any(
                said in runjobs.output(proc)
                for said in ["a lock wait timeout", "database unavailable"]
            ),
            timeout=60,
        )
    runjobs.wait(proc, 60)
    output = runjobs.output(proc)
    [job] = Job.objects.filter(result_id=result.id)  # one attempt
    assert (job.state, job.metadata) == (State.SUCCEEDED, {"saved": True}), output
    assert list(Execution.objects.values_list("label", flat=True)) == ["saved"]
    assert "Progress.save_metadata was ended by the database to break a lock wait timeout" in output


def test_a_deadlock_victims_successes_are_written_again(caplog):
    """A worker's succeed_many() locks its two rows in order; another client holds the
    second, then asks for the first: InnoDB ends the lighter transaction (the worker's,
    which wrote nothing yet) to break the deadlock. The worker's write is made again once
    the other client is done, and both attempts succeed, once each."""
    first, second = JobFactory.create_batch(2, running=True, worker_id="w")
    written: list[object] = []
    connected = threading.Event()
    thread_id: list[int] = []

    def write() -> None:
        try:
            connection.ensure_connection()
            thread_id.append(connection.connection.thread_id())
            connected.set()
            written.append(Job.objects.succeed_many("w", [(first, "one"), (second, "two")]))
        except BaseException as exc:
            written.append(exc)
        finally:
            connections.close_all()

    with holder() as cursor:
        # Heavier than the worker's transaction, so that InnoDB picks the worker as victim.
        cursor.executemany(
            "INSERT INTO tests_execution (label) VALUES (%s)", [(f"weight-{i}",) for i in range(50)]
        )
        cursor.execute("SELECT id FROM django_jobstate_job WHERE id = %s FOR UPDATE", [second.pk])
        thread = threading.Thread(target=write)
        with caplog.at_level(logging.INFO, logger="django_jobstate"):
            thread.start()
            assert connected.wait(60)
            wait_until_waiting(thread_id[0])  # it holds `first`, waits for us
            # The deadlock: this waits for `first`, until InnoDB ends the worker's write.
            cursor.execute(
                "SELECT id FROM django_jobstate_job WHERE id = %s FOR UPDATE", [first.pk]
            )
            wait_for(lambda: "a deadlock" in caplog.text or not thread.is_alive(), timeout=60)
    thread.join(60)  # this client rolled back: the worker's write goes through
    assert written == [{first.pk, second.pk}], caplog.text
    assert "Outcomes.succeed_many was ended by the database to break a deadlock" in caplog.text
    rows = Job.objects.order_by("pk").values_list("state", "return_value")
    assert list(rows) == [(State.SUCCEEDED, "one"), (State.SUCCEEDED, "two")]
