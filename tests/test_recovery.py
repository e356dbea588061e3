"""Crash recovery with real processes: killed, paused and timed-out workers.

Every attempt ends, a live attempt is never run twice, and a late writer changes nothing.
"""

import os
import signal
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus
from tests import tasks
from tests.conftest import run_racers
from tests.factories import JobFactory
from tests.models import Execution
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LOST_AFTER = timedelta(seconds=settings.JOBSTATE_LOST_AFTER)


def executions():
    return sorted(Execution.objects.values_list("label", flat=True))


def attempts(result):
    return list(Job.objects.attempts_of(result.id))


def worker_pid(worker_id: str) -> int:
    """The pid of `worker_id`'s process, once its supervisor's heart registered it (a worker
    claims as soon as it starts, without waiting for that beat)."""
    rows = WorkerHeartbeat.objects.filter(worker_id=worker_id).values_list("pid", flat=True)
    return wait_for(rows.first, what=f"the heartbeat row of {worker_id}")


def test_sigkilled_runjobs_attempt_is_rescued_as_lost_and_retried_once(runjobs):
    result = tasks.sleeps_on_first_attempt.enqueue("k", 60)
    first = runjobs.start()
    wait_for(lambda: Execution.objects.filter(label="k:1").exists())

    worker_id = Job.objects.get(result_id=result.id).worker_id
    worker_pid(worker_id)  # registered
    os.killpg(first.pid, signal.SIGKILL)  # the supervisor and its worker, mid-attempt
    last_heard = WorkerHeartbeat.objects.get(worker_id=worker_id).last_seen  # no beat after
    runjobs.start()

    # However loaded the machine, the rescue must come, and never early (database clock).
    wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(result.id).is_finished)

    lost, retry = attempts(result)
    assert (lost.state, lost.failure_reason) == (State.FAILED, FailureReason.LOST)
    assert lost.error_class == "django_jobstate.exceptions.WorkerLost"
    assert lost.finished_at >= last_heard + LOST_AFTER
    assert (retry.state, retry.attempt, retry.return_value) == (State.SUCCEEDED, 2, 2)
    assert executions() == ["k:1", "k:2"]  # the body ran once per attempt


def test_paused_runjobs_is_rescued_and_its_late_success_refused(runjobs):
    """A whole runjobs paused past the window (a frozen VM, a stopped container)."""
    result = tasks.sleeps_on_first_attempt.enqueue("p", 2)
    paused = runjobs.start()
    wait_for(lambda: Execution.objects.filter(label="p:1").exists())

    os.killpg(paused.pid, signal.SIGSTOP)  # supervisor and worker: nobody beats for it
    try:
        runjobs.start()
        wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(result.id).is_finished)
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    # The resumed worker finishes its sleep, tries to record success, and is refused.
    first = Job.objects.get(result_id=result.id, attempt=1)
    wait_for(lambda: f"outcome of job {first.pk} discarded" in runjobs.output(paused))
    out = runjobs.stop(paused)

    lost, retry = attempts(result)
    assert (lost.state, lost.failure_reason, lost.return_value) == (
        State.FAILED,
        FailureReason.LOST,
        None,
    )
    assert (retry.state, retry.return_value) == (State.SUCCEEDED, 2)
    assert f"outcome of job {lost.pk} discarded" in out
    assert paused.returncode == 0


def test_killed_worker_process_is_failed_at_once_by_its_supervisor(runjobs):
    result = tasks.sleeps_on_first_attempt.enqueue("c", 60)
    supervisor = runjobs.start()
    wait_for(lambda: Execution.objects.filter(label="c:1").exists())
    job = Job.objects.get(result_id=result.id)
    child_pid = worker_pid(job.worker_id)

    os.kill(child_pid, signal.SIGKILL)
    wait_for(lambda: tasks.sleeps_on_first_attempt.get_result(result.id).is_finished)

    lost, retry = attempts(result)
    assert (lost.failure_reason, retry.state) == (FailureReason.LOST, State.SUCCEEDED)
    # Failed by the supervisor that saw it die (a rescuer's message would say "no heartbeat").
    assert "killed by SIGKILL" in lost.error_message
    assert retry.worker_id != lost.worker_id  # a new worker process replaced the dead one
    runjobs.stop(supervisor)
    assert supervisor.returncode == 0


def test_racing_rescuers_fail_each_attempt_once_and_create_one_next_attempt():
    jobs = JobFactory.create_batch(
        100,
        running=True,
        worker_id="dead-worker",
        max_attempts=2,
        started_at=timezone.now() - timedelta(hours=2),
    )

    failed_by_each = run_racers([["rescue"] for _ in range(4)])

    assert sum(failed_by_each) == len(jobs)
    assert Job.objects.filter(state=State.FAILED, failure_reason=FailureReason.LOST).count() == 100
    retries = Job.objects.filter(attempt=2)
    assert retries.count() == 100
    assert set(retries.values_list("previous_id", flat=True)) == {job.pk for job in jobs}
    assert set(retries.values_list("state", flat=True)) == {State.QUEUED}


def test_busy_loop_past_its_timeout_is_stopped_failed_and_retried(runjobs):
    result = tasks.busy_loop.enqueue("spin")

    done = runjobs.run("--burst", timeout=60)

    assert done.returncode == 0, done.stdout
    final = tasks.busy_loop.get_result(result.id)
    assert final.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in final.errors] == [
        "django_jobstate.exceptions.JobTimeout"
    ] * 2
    rows = attempts(result)
    assert [(j.attempt, j.failure_reason) for j in rows] == [
        (1, FailureReason.TIMEOUT),
        (2, FailureReason.TIMEOUT),
    ]
    for job in rows:  # stopped, not before its timeout (how long after depends on the load)
        assert job.duration >= timedelta(seconds=1)
    assert executions() == ["spin", "spin"]


def test_the_retry_waits_for_its_backoff(runjobs):
    result = tasks.fails_first_attempt.enqueue()
    worker = runjobs.start()
    wait_for(lambda: tasks.fails_first_attempt.get_result(result.id).is_finished, timeout=30)
    runjobs.stop(worker)

    failed, retry = attempts(result)
    assert retry.state == State.SUCCEEDED
    # backoff=2: the delay is jittered between 1 and 2 seconds, and nothing runs early. The
    # delay is added to a time after the failure and before the retry's enqueued_at.
    assert retry.run_after - failed.finished_at >= timedelta(seconds=1)
    assert retry.run_after - retry.enqueued_at <= timedelta(seconds=2)
    assert retry.started_at >= retry.run_after
