"""Who is taken for lost, and who may judge: real runjobs processes, real faults.

A worker is lost only when it is silent while its judge is itself connected: an outage,
a write lock held past the window, or a task that holds the interpreter must not make a
healthy worker's attempt run twice.
"""

import fcntl
import os
import signal
import sqlite3
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from django_jobstate.db.sqlite_turns import SUFFIXES
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.dbfaults import server_ctl
from tests.factories import JobFactory
from tests.models import Execution
from tests.test_recovery import attempts, executions, wait_for, worker_pid

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SQLITE = settings.DB == "sqlite"
LOST_AFTER = settings.JOBSTATE_LOST_AFTER


def running(result) -> Job:
    return wait_for(lambda: Job.objects.filter(result_id=result.id, state=State.RUNNING).first())


def a_judge(runjobs):
    """A runjobs that has been connected for a whole window, so it may judge others at once,
    and serves another queue, so that it never runs the job under test itself."""
    judge = runjobs.start("--queue", "emails")
    wait_for(lambda: WorkerHeartbeat.objects.exists())
    time.sleep(LOST_AFTER + 1)
    return judge


def beside_a_judge(runjobs):
    """The judge above and a runjobs for the default queue, both up."""
    judge = a_judge(runjobs)
    worker = runjobs.start("--queue", "default")
    wait_for(lambda: WorkerHeartbeat.objects.count() == 2)
    return judge, worker


def a_victim_and_a_bystander(runjobs):
    """A judge, and a supervisor of two workers: one running a long attempt (the victim,
    begun: not handed back if its worker dies), the other a healthy one of 3 windows."""
    judge = a_judge(runjobs)
    supervisor = runjobs.start("--queue", "default", "--concurrency", "2")
    victim = running(tasks.sleeps_on_first_attempt.enqueue("d", 60))
    wait_for(lambda: Execution.objects.filter(label="d:1").exists())
    healthy = tasks.sleeps_on_first_attempt.enqueue("h", LOST_AFTER * 3)
    bystander = running(healthy)
    assert victim.worker_id != bystander.worker_id
    return judge, supervisor, victim, healthy, bystander


def hold_the_database_away(seconds: float) -> None:
    """PostgreSQL, MariaDB: stop the server. SQLite: hold its write lock (as a long
    bulk_enqueue does), so that every heartbeat waits."""
    if connection.vendor != "sqlite":
        server_ctl("stop")
        time.sleep(seconds)
        server_ctl("start")
        connections.close_all()  # this test's own connection died with the server
    else:
        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        holder.execute("COMMIT")
        holder.close()


def test_an_outage_longer_than_the_window_takes_no_healthy_worker_for_lost(runjobs):
    # Two hosts' worth of runjobs, each with an attempt that outlasts the outage.
    first, second = runjobs.start(), runjobs.start()
    results = [tasks.sleeps_on_first_attempt.enqueue(f"o{n}", LOST_AFTER * 3) for n in (1, 2)]
    wait_for(lambda: Execution.objects.count() == 2)
    assert len({running(result).worker_id for result in results}) == 2

    hold_the_database_away(LOST_AFTER + 2)

    wait_for(lambda: not Job.objects.live().exists(), timeout=90)
    for proc in (first, second):
        runjobs.stop(proc)
        assert proc.returncode == 0, runjobs.output(proc)
    for result in results:
        [only] = attempts(result)  # no attempt was failed as lost, so no retry ran beside it
        assert (only.state, only.return_value) == (State.SUCCEEDED, 1)
    assert executions() == ["o1:1", "o2:1"]


def test_a_task_holding_the_interpreter_is_not_taken_for_lost(runjobs):
    judge, holder = beside_a_judge(runjobs)
    # Its worker process cannot run a thread for twice the window.
    result = tasks.holds_the_interpreter.enqueue("gil", LOST_AFTER * 2)

    wait_for(lambda: tasks.holds_the_interpreter.get_result(result.id).is_finished, timeout=60)

    [only] = attempts(result)
    assert (only.state, only.return_value) == (State.SUCCEEDED, 1)
    assert executions() == ["gil:1"]
    for proc in (judge, holder):
        runjobs.stop(proc)


def test_a_task_holding_the_interpreter_is_stopped_at_its_timeout(runjobs):
    result = tasks.holds_the_interpreter_past_its_timeout.enqueue("t")

    done = runjobs.run("--burst", timeout=60)

    assert done.returncode == 0, done.stdout
    timed_out, retry = attempts(result)
    assert (timed_out.failure_reason, retry.state) == (FailureReason.TIMEOUT, State.SUCCEEDED)
    assert "ran past its timeout" in timed_out.error_message
    # Its body would have held the interpreter for 30 seconds: it was stopped, not waited on.
    assert timed_out.duration.total_seconds() < 20
    assert executions() == ["t:1", "t:2"]


def test_a_paused_worker_process_of_a_live_supervisor_is_not_taken_for_lost(runjobs):
    judge, supervisor = beside_a_judge(runjobs)
    result = tasks.sleeps_on_first_attempt.enqueue("s", 1)
    child = worker_pid(running(result).worker_id)

    os.kill(child, signal.SIGSTOP)  # a slow attempt, as far as anyone can tell
    time.sleep(LOST_AFTER * 2)
    os.kill(child, signal.SIGCONT)

    wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(result.id).is_finished)
    [only] = attempts(result)
    assert only.state == State.SUCCEEDED
    for proc in (judge, supervisor):
        runjobs.stop(proc)


def test_two_runjobs_given_the_same_worker_id_never_share_a_worker_name(runjobs):
    one = runjobs.start("--worker-id", "web")
    first = tasks.sleeps_on_first_attempt.enqueue("a", 60)
    victim = running(first)
    other = runjobs.start("--worker-id", "web")
    second = tasks.sleeps_on_first_attempt.enqueue("b", 3)
    bystander = running(second)
    assert victim.worker_id != bystander.worker_id
    assert {victim.worker_id[:4], bystander.worker_id[:4]} == {"web:"}

    # One host's worker dies: its supervisor fails its attempts, and only its own.
    os.kill(worker_pid(victim.worker_id), signal.SIGKILL)

    wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(second.id).is_finished)
    [only] = attempts(second)
    assert (only.state, only.return_value) == (State.SUCCEEDED, 1)
    lost = Job.objects.get(pk=victim.pk)
    assert (lost.state, lost.failure_reason) == (State.FAILED, FailureReason.LOST)
    assert "killed by SIGKILL" in lost.error_message
    for proc in (one, other):
        runjobs.stop(proc)


@pytest.mark.skipif(SQLITE, reason="SQLite: an atomic body holds the one write lock")
def test_an_atomic_task_of_a_worker_taken_for_lost_rolls_its_writes_back(runjobs):
    zombie = runjobs.start()
    result = tasks.writes_atomically.enqueue("z", LOST_AFTER * 2)
    first = running(result)
    time.sleep(0.5)  # inside its body: its row is written, not committed

    os.killpg(zombie.pid, signal.SIGSTOP)  # past the window, mid-body
    try:
        runjobs.start()
        wait_for(lambda: tasks.writes_atomically.get_result(result.id).is_finished)
    finally:
        os.killpg(zombie.pid, signal.SIGCONT)
    wait_for(lambda: f"outcome of job {first.pk} discarded" in runjobs.output(zombie))

    lost, retry = attempts(result)
    assert (lost.state, lost.failure_reason) == (State.FAILED, FailureReason.LOST)
    assert (retry.state, retry.return_value) == (State.SUCCEEDED, 2)
    assert executions() == ["z:2"]  # the zombie's write rolled back with its refused success


# Found by the torture run's network partition: a worker host cut off between its failed
# attempt's UPDATE and its COMMIT keeps that row locked until its transaction ends (for a
# host that never comes back, until PostgreSQL notices the dead connection). A rescuer
# that waits for the lock stops beating (one thread does both), and the other lost
# attempts wait with it.
@pytest.mark.skipif(SQLITE, reason="row locks: SQLite has one write lock, no row locks")
def test_a_row_locked_by_a_cut_off_worker_does_not_stop_the_judge(runjobs):
    old = timezone.now() - timedelta(seconds=LOST_AFTER * 3)
    locked, other = (
        JobFactory(running=True, worker_id=f"cut-off-{n}", started_at=old) for n in (1, 2)
    )
    holder = connection.get_new_connection(connection.get_connection_params())
    try:
        with holder.cursor() as cursor:  # a transaction whose COMMIT never comes
            cursor.execute(
                f"SELECT 1 FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [locked.pk]
            )
        judge = a_judge(runjobs)
        time.sleep(LOST_AFTER)
        beats = WorkerHeartbeat.objects.annotate(age=Now() - F("last_seen"))
        ages = [row.age.total_seconds() for row in beats]
        other.refresh_from_db()
    finally:
        holder.rollback()
        holder.close()
    assert ages
    assert max(ages) < LOST_AFTER / 2, runjobs.output(judge)
    assert (other.state, other.failure_reason) == (State.FAILED, FailureReason.LOST)
    wait_for(lambda: Job.objects.get(pk=locked.pk).state == State.FAILED)  # once unlocked


# Found by the torture run: a worker killed in a limited body, and the next job of its key
# locked FOR UPDATE by another connection. Its supervisor's settle waited on that lock, and
# the supervisor beat from the same thread: its healthy workers fell silent, and their
# attempts were failed as lost and run again.
@pytest.mark.skipif(SQLITE, reason="row locks: SQLite has one write lock, no row locks")
def test_a_settle_that_waits_on_a_row_lock_does_not_silence_the_supervisor(runjobs):
    judge, supervisor, victim, healthy, bystander = a_victim_and_a_bystander(runjobs)
    holder = connection.get_new_connection(connection.get_connection_params())
    try:
        with holder.cursor() as cursor:  # the row its supervisor must fail as lost
            cursor.execute(
                f"SELECT 1 FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [victim.pk]
            )
        os.kill(worker_pid(victim.worker_id), signal.SIGKILL)
        time.sleep(LOST_AFTER * 1.5)  # its settle waits on the lock all along
        beats = WorkerHeartbeat.objects.annotate(age=Now() - F("last_seen"))
        ages = {row.worker_id: row.age.total_seconds() for row in beats}
    finally:
        holder.rollback()
        holder.close()

    # Forgotten as lost by the judge, the row would be gone.
    assert ages.get(bystander.worker_id, LOST_AFTER) < LOST_AFTER / 2, runjobs.output(supervisor)
    wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(healthy.id).is_finished)
    [only] = attempts(healthy)  # never taken for lost, so never run twice
    assert (only.state, only.return_value) == (State.SUCCEEDED, 1)
    # By its supervisor, once unlocked (it vouched for the worker meanwhile).
    lost = wait_for(lambda: Job.objects.filter(pk=victim.pk, state=State.FAILED).first())
    assert lost.failure_reason == FailureReason.LOST
    wait_for(lambda: not WorkerHeartbeat.objects.filter(worker_id=victim.worker_id).exists())
    for proc in (judge, supervisor):
        runjobs.stop(proc)


# Found by a MariaDB torture run: a host cut off while one supervisor had been killed and
# another was frozen whole, its worker inside a transaction. The third supervisor's settle
# of a worker of its own waited on that transaction's lock, and its rescues came after its
# settles in the same thread: no one judged the cut-off host until the link came back.
@pytest.mark.skipif(SQLITE, reason="row locks: SQLite has one write lock, no row locks")
def test_a_judge_whose_settle_waits_on_a_row_lock_still_rescues_others(runjobs):
    judge = runjobs.start("--queue", "default", "--concurrency", "2")
    doomed = runjobs.start("--queue", "emails")
    wait_for(lambda: WorkerHeartbeat.objects.count() == 3)
    time.sleep(LOST_AFTER + 1)  # the judge has been connected for a window
    victim = running(tasks.sleeps_on_first_attempt.enqueue("d", 60))
    stranded = tasks.sleeps_on_first_attempt.using(queue_name="emails").enqueue("s", 60)
    orphan = running(stranded)
    wait_for(lambda: Execution.objects.filter(label__in=["d:1", "s:1"]).count() == 2)
    holder = connection.get_new_connection(connection.get_connection_params())
    try:
        with holder.cursor() as cursor:  # the row the judge's supervisor must fail as lost
            cursor.execute(
                f"SELECT 1 FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [victim.pk]
            )
        os.kill(worker_pid(victim.worker_id), signal.SIGKILL)  # its settle waits on the lock
        os.killpg(doomed.pid, signal.SIGKILL)  # the supervisor and its worker, mid-attempt
        # Held until the rescue is seen: behind the settle, none could come meanwhile.
        rescued = Job.objects.filter(pk=orphan.pk, state=State.FAILED)
        lost = wait_for(rescued.first, what="the rescue, the lock held", timeout=30)
        settled = Job.objects.filter(pk=victim.pk, state=State.FAILED).exists()
    finally:
        holder.rollback()
        holder.close()

    assert lost.failure_reason == FailureReason.LOST, lost.error_message
    assert not settled  # its settle was still waiting
    wait_for(lambda: Job.objects.filter(pk=victim.pk, state=State.FAILED).exists())
    runjobs.stop(judge)


# Found by the torture run (SQLite): a worker SIGSTOPped after taking its turn at SQLite's
# write lock and before taking the lock. Every transaction waited for the turn, every
# statement in autocommit went on: the judge's beats (one UPDATE each) landed, while the
# supervisor of a worker just killed waited to forget the killed one's row (a transaction,
# as registering a worker is on Django 5.2: tests/test_sqlite_turns.py), and beat for
# nobody meanwhile. The judge took the supervisor's healthy workers for lost.
@pytest.mark.skipif(not SQLITE, reason="SQLite's turns at its write lock")
def test_a_turn_held_by_a_stopped_writer_does_not_silence_a_supervisor(runjobs):
    judge, supervisor, victim, healthy, bystander = a_victim_and_a_bystander(runjobs)

    os.kill(worker_pid(victim.worker_id), signal.SIGKILL)
    wait_for(lambda: Job.objects.filter(pk=victim.pk, state=State.FAILED).exists())
    # Settled: SETTLE_AGAIN_AFTER later its supervisor looks again, then forgets its row.
    # The turn taken meanwhile, as a stopped writer holds it past the judge's window:
    turn = os.open(str(connection.settings_dict["NAME"]) + SUFFIXES["turn"], os.O_RDWR)
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)
        time.sleep(LOST_AFTER * 1.5)
        beats = WorkerHeartbeat.objects.annotate(age=Now() - F("last_seen"))
        ages = {row.worker_id: row.age.total_seconds() for row in beats}
    finally:
        os.close(turn)

    assert victim.worker_id not in ages, ages  # forgotten, the turn held
    assert ages[bystander.worker_id] < LOST_AFTER / 2, (ages, runjobs.output(supervisor))
    wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(healthy.id).is_finished)
    [only] = attempts(healthy)  # never taken for lost, so never run twice
    assert (only.state, only.return_value) == (State.SUCCEEDED, 1)
    for proc in (judge, supervisor):
        runjobs.stop(proc)


# Found by the torture run once the beats had a thread of their own: a worker stopped at
# its deadline while the job table was locked. Its supervisor's settle waited for the
# lock, no beat came for the ended worker, and a judge elsewhere (beating on) took its
# attempt for lost. Its supervisor vouches for it until it has settled it.
@pytest.mark.skipif(SQLITE, reason="SQLite: its write lock holds every beat too")
def test_a_worker_stopped_at_its_deadline_during_a_job_table_lock_fails_as_timed_out(runjobs):
    from tests.test_inflight_faults import KILLED, job_table_locked

    judge, supervisor = beside_a_judge(runjobs)
    result = tasks.sync_sleeps_past_its_timeout.enqueue("t")
    attempt = running(result)
    wait_for(lambda: Execution.objects.exists())  # its body began: the deadline is a second away
    with job_table_locked():
        wait_for(lambda: KILLED in runjobs.output(supervisor))
        time.sleep(LOST_AFTER * 2)  # its settle waits on the lock; the judge beats on

    failed = wait_for(lambda: Job.objects.filter(pk=attempt.pk, state=State.FAILED).first())
    assert failed.failure_reason == FailureReason.TIMEOUT, runjobs.output(judge)
    wait_for(lambda: not WorkerHeartbeat.objects.filter(worker_id=attempt.worker_id).exists())
    for proc in (judge, supervisor):
        runjobs.stop(proc)
