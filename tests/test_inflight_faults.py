"""runjobs --in-flight under database faults: one attempt's deadline is kept while the
worker's loop waits on the database, and its neighbours run on."""

import os
import signal
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
from tests.models import Execution
from tests.test_runjobs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KILLED = "stopping the worker process"


@contextmanager
def job_table_locked(reads: bool = True) -> Iterator[None]:
    """Hold the job table from another connection, as a migration does: PostgreSQL's
    ACCESS EXCLUSIVE lock (no read, no write), MariaDB's/MySQL's LOCK TABLES ... WRITE
    (no read, no write), SQLite's write lock (no write). Not `reads`: writes wait, and
    reads (a plain SELECT) go on."""
    if connection.vendor == "postgresql":
        lock = connection.get_new_connection(connection.get_connection_params())
        lock.autocommit = True
        lock.execute("BEGIN")
        mode = "ACCESS EXCLUSIVE" if reads else "EXCLUSIVE"
        lock.execute(f"LOCK TABLE django_jobstate_job IN {mode} MODE")
    elif connection.vendor == "mysql":
        lock = connection.get_new_connection(connection.get_connection_params())
        lock.query(f"LOCK TABLES django_jobstate_job {'WRITE' if reads else 'READ'}")
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


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL's claim is one statement, which commits by itself: elsewhere a claim "
    "is a transaction, whose COMMIT a killed worker never sends (and SQLite's ends with "
    "its process)",
)
def test_a_claim_left_waiting_by_a_killed_worker_never_commits(runjobs):
    """A worker killed while its claim waits on a locked job table (a migration's lock)
    had its claim commit once the lock was gone, for a worker its supervisor had already
    settled: the job was failed as lost without having run. The server now ends a gone
    client's statement (receivers.CLIENT_CHECK_MS), so the claim never commits."""
    from datetime import timedelta

    from django.utils import timezone

    from django_jobstate.models import WorkerHeartbeat

    proc = runjobs.start("--concurrency", "1")
    wait_for(lambda: WorkerHeartbeat.objects.exclude(supervisor="").exists(), timeout=60)
    due = timezone.now() + timedelta(seconds=1)
    result = tasks.noop.using(run_after=due).enqueue()
    killed: list[str] = []
    began = None

    def the_one_worker_alive():
        alive = WorkerHeartbeat.objects.exclude(supervisor="").exclude(worker_id__in=killed)
        rows = list(alive.values_list("worker_id", "pid"))
        return rows[0] if len(rows) == 1 else None

    try:
        with job_table_locked(reads=False):  # writes wait, reads go on
            # A claim that began before the job was due finds nothing: its worker is
            # killed, and the next one's claim waits, until one began after. Then the
            # supervisor is stopped, so that no new worker's claim takes the job first.
            while began is None or began < due:
                began = wait_for(lambda after=began: newest_waiting_claim(after), timeout=30)
                worker_id, pid = wait_for(the_one_worker_alive, timeout=30)
                if began >= due:
                    os.kill(proc.pid, signal.SIGSTOP)
                os.kill(pid, signal.SIGKILL)
                killed.append(worker_id)
            time.sleep(2.5)  # longer than the server takes to see its client gone
        time.sleep(0.5)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    wait_for(lambda: Job.objects.filter(result_id=result.id, state=State.SUCCEEDED), timeout=60)
    output = runjobs.stop(proc)
    attempts = Job.objects.filter(result_id=result.id)
    assert not attempts.filter(worker_id__in=killed).exists(), output
    assert not attempts.filter(failure_reason=FailureReason.LOST).exists(), output


def test_a_worker_killed_as_runjobs_stops_leaves_none_of_its_rows(runjobs):
    """A killed worker is settled, looked at again SETTLE_AGAIN_AFTER later (for a claim
    it left waiting), and then its heartbeat row goes. Killed while runjobs stops, with its
    settle waiting on the job table's lock until the monitor was told to finish, that
    second look was dropped with the row: left behind, it stood for a worker long gone."""
    from django_jobstate.models import WorkerHeartbeat
    from tests.conftest import catches
    from tests.test_recovery import worker_pid

    result = tasks.sleeps_on_first_attempt.enqueue("k", 60)
    proc = runjobs.start("--concurrency", "1")
    wait_for(lambda: Execution.objects.filter(label="k:1").exists(), timeout=60)
    job = Job.objects.get(result_id=result.id)
    worker_id = job.worker_id
    pid = worker_pid(worker_id)
    wait_for(lambda: catches(proc.pid, signal.SIGTERM), timeout=60)
    with job_table_locked(reads=False):  # its settle waits
        proc.send_signal(signal.SIGTERM)  # stopping: the worker finishes its job in hand
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)  # ...but is killed: no worker left, the monitor finishes
        time.sleep(1.0)  # well within JOBSTATE_LOST_AFTER, which finish() waits at most
    runjobs.wait(proc, 30)
    output = runjobs.output(proc)
    assert proc.returncode == 0, output
    job.refresh_from_db()
    assert job.failure_reason == FailureReason.LOST, output
    assert not WorkerHeartbeat.objects.filter(worker_id=worker_id).exists(), output


def newest_waiting_claim(after):
    """When the newest claim waiting on a lock began, if after `after`; else None."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT MAX(query_start) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            ["%WITH picked AS MATERIALIZED%"],
        )
        began = cursor.fetchone()[0]
    return None if began is None or (after is not None and began <= after) else began
