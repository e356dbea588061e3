"""runjobs --in-flight under database faults: one attempt's deadline is kept while the
worker's loop waits on the database, and its neighbours run on."""

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from django_jobstate.models import Job
from django_jobstate.runner.attempts import ASYNC_GRACE
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.test_runjobs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KILLED = "stopping the worker process"


@contextmanager
def job_table_locked() -> Iterator[None]:
    """Hold the job table from another connection, as a migration does: PostgreSQL's
    ACCESS EXCLUSIVE lock (no read, no write), MariaDB's/MySQL's LOCK TABLES ... WRITE
    (no read, no write), SQLite's write lock (no write)."""
    if connection.vendor == "postgresql":
        lock = connection.get_new_connection(connection.get_connection_params())
        lock.autocommit = True
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE django_jobstate_job IN ACCESS EXCLUSIVE MODE")
    elif connection.vendor == "mysql":
        lock = connection.get_new_connection(connection.get_connection_params())
        lock.query("LOCK TABLES django_jobstate_job WRITE")
        try:
            yield
        finally:
            lock.query("UNLOCK TABLES")
            lock.close()
        return
    else:
        lock = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        lock.execute("ROLLBACK")
        lock.close()


def test_an_async_deadline_is_kept_while_the_worker_waits_on_a_locked_job_table(runjobs, tmp_path):
    """The worker's loop waits on the locked table (it writes its neighbours' outcomes),
    and the event loop cancels the late attempt at its deadline all the same: the process
    is not killed, and the neighbours' first attempts succeed once the lock is gone."""
    gate, started, cancelled = tmp_path / "gate", tmp_path / "started", tmp_path / "cancelled"
    late = tasks.async_overruns_and_says_so.enqueue(str(started), str(cancelled))
    neighbours = [tasks.async_waits_for_file.enqueue(str(gate)) for _ in range(2)]
    neighbours += [tasks.waits_for_file.enqueue(str(gate)) for _ in range(2)]
    proc = runjobs.start("--in-flight", "8")
    wait_for(lambda: started.exists() and Job.objects.running().count() == 5, timeout=60)
    with job_table_locked():
        gate.touch()  # the neighbours return: their outcomes wait for the table
        wait_for(lambda: cancelled.exists() or KILLED in runjobs.output(proc), timeout=60)
        assert cancelled.exists(), runjobs.output(proc)
        # Past the deadline's grace, the lock still held: nothing may kill the process.
        time.sleep(ASYNC_GRACE + 1)
    wait_for(lambda: not Job.objects.running().exists(), timeout=60)
    output = runjobs.stop(proc)
    assert KILLED not in output
    attempt = Job.objects.get(result_id=late.id)
    assert attempt.failure_reason == FailureReason.TIMEOUT, output
    for result in neighbours:
        [job] = Job.objects.filter(result_id=result.id)
        assert job.state == State.SUCCEEDED, output
    assert proc.returncode == 0
