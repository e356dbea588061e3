"""Cancelling jobs under real `runjobs` processes: queued, running (cooperative or not),
and racing the claim."""

import json
import os
import random
import statistics
import threading
import time

import pytest
from django.db import connection, connections

from django_jobstate.exceptions import JobCancelled
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus, task_backends
from tests import tasks
from tests.factories import JobFactory
from tests.models import Execution
from tests.test_runjobs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

GRACE = 2.0
# How many running attempts each kind of cancel test stops (more, to measure: the test
# prints the time from cancel() to the attempt failed).
ROUNDS = int(os.environ.get("JOBSTATE_CANCEL_ROUNDS", "2"))


def settings_env(**values: object) -> dict[str, str]:
    return {"JOBSTATE_TEST_SETTINGS": json.dumps({f"JOBSTATE_{k}": v for k, v in values.items()})}


def backend():
    return task_backends["default"]


def started(label: str) -> bool:
    return Execution.objects.filter(label=f"{label}:started").exists()


def stop_running(task, label: str, runjobs_output) -> tuple[float, Job]:
    """Enqueue `task`, wait until its body runs, cancel it; return the seconds from the
    cancel to the attempt failed, and the attempt."""
    result = task.enqueue(label)
    wait_for(lambda: started(label))
    asked = time.monotonic()
    during = backend().cancel(result.id)
    # Asked to stop; a cooperative task may have stopped already (the test paused between
    # the cancel's commit and its read of the result, on a loaded machine).
    assert during.status in (TaskResultStatus.RUNNING, TaskResultStatus.FAILED)
    wait_for(lambda: Job.objects.get(result_id=result.id).state == State.FAILED, timeout=30)
    took = time.monotonic() - asked
    attempt = Job.objects.get(result_id=result.id)  # one attempt: never retried
    after = backend().get_result(result.id)
    assert after.status == TaskResultStatus.FAILED, runjobs_output()
    assert after.errors[-1].exception_class is JobCancelled
    assert attempt.failure_reason == FailureReason.CANCELLED
    return took, attempt


@pytest.mark.parametrize("kind", ["cooperative", "never returns"])
def test_a_running_task_is_stopped_within_the_grace_and_the_worker_carries_on(runjobs, kind):
    proc = runjobs.start("--concurrency", "1", **settings_env(CANCEL_GRACE=GRACE))
    output = lambda: runjobs.output(proc)  # noqa: E731
    task = tasks.stops_when_cancelled if kind == "cooperative" else tasks.never_returns
    times, workers = [], set()
    for n in range(ROUNDS):
        took, attempt = stop_running(task, f"{kind}-{n}", output)
        times.append(took)
        workers.add(attempt.worker_id)
        # The worker carries on: the next job runs (a replaced process, if it was stopped).
        after = tasks.record.enqueue(f"after-{kind}-{n}")
        wait_for(lambda: backend().get_result(after.id).is_finished, timeout=30)  # noqa: B023
        assert backend().get_result(after.id).status == TaskResultStatus.SUCCESSFUL
        assert Job.objects.get(result_id=after.id).worker_id in WorkerHeartbeat.objects.values_list(
            "worker_id", flat=True
        )
        if kind == "cooperative":  # stopped by itself: the same process ran the next job
            assert Job.objects.get(result_id=after.id).worker_id == attempt.worker_id
    print(
        f"\n{connection.vendor} {kind}: cancel to failed, p50 {statistics.median(times):.3f} s,"
        f" max {max(times):.3f} s over {len(times)} (grace {GRACE} s)"
    )
    assert max(times) <= GRACE + 1.0, times
    if kind == "never returns":  # stopped by force, as at a timeout: a new process each time
        assert len(workers) == ROUNDS
        assert "did not stop within JOBSTATE_CANCEL_GRACE" in output()
    else:
        assert max(times) < GRACE, "a cooperative task must stop before the grace ends"
    assert proc.poll() is None, output()


def test_a_task_that_returns_before_the_cancel_reaches_it_stays_succeeded(runjobs):
    """The request is written while the attempt runs, but the task returns first."""
    result = tasks.starts_then_sleeps.enqueue("quick", 0.5)
    # A grace far past the half-second body: on a loaded machine a process can be kept off
    # the CPU for 2 s, and then the forced stop, not the library, would decide the outcome.
    proc = runjobs.start(**settings_env(CANCEL_GRACE=30))
    # The body began (running is set at the claim: one claimed but not begun is never
    # begun once cancelled, and fails as cancelled).
    wait_for(lambda: Execution.objects.filter(label="quick:start").exists())
    backend().cancel(result.id)
    wait_for(lambda: backend().get_result(result.id).is_finished)
    row = Job.objects.get(result_id=result.id)
    assert (row.state, row.cancel_requested_at is not None) == (State.SUCCEEDED, True)
    assert sorted(Execution.objects.values_list("label", flat=True)) == [
        "quick:end",
        "quick:start",
    ]
    assert proc.poll() is None


def test_cancelled_queued_jobs_and_waiting_retries_never_run(runjobs):
    queued = tasks.record_with_retries.enqueue("never", 0)
    failed = JobFactory.in_state(State.FAILED, max_attempts=2, args=["retried"])
    Job.objects.retry(failed)  # due at once
    for result_id in (queued.id, str(failed.result_id)):
        assert backend().cancel(result_id).status == TaskResultStatus.FAILED

    assert runjobs.run("--burst").returncode == 0
    assert not Execution.objects.exists()  # neither body ran
    for result_id in (queued.id, failed.result_id):
        newest = Job.objects.attempts_of(result_id).last()
        assert (newest.state, newest.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
        assert (newest.started_at, newest.worker_id) == (None, None)
        assert backend().get_result(str(result_id)).errors[-1].exception_class is JobCancelled


def test_cancel_racing_the_claim_each_job_ran_or_was_cancelled(runjobs):
    """A process cancels jobs at random while two workers claim and run them: each job ran
    (its body wrote a row) or was cancelled, never both, never neither, never retried."""
    # Jobs of 20 ms, cancelled from the last to be claimed back: the canceller and the
    # workers walk towards each other, so they meet at the claims' frontier however fast
    # either goes (walking in claim order, a loaded machine's canceller never overtook
    # the workers, and every cancel came too late).
    jobs = 400
    results = backend().bulk_enqueue(
        tasks.record_with_retries, [((f"r{n}", 0.02), {}) for n in range(jobs)]
    )
    runjobs.start("--concurrency", "2", **settings_env(CANCEL_GRACE=0.5))
    wait_for(Execution.objects.exists)
    rng = random.Random(os.getpid())
    never_cancelled = set()
    for result in reversed(results):
        if rng.random() < 0.5:
            backend().cancel(result.id)
            time.sleep(rng.uniform(0, 0.004))
        else:
            never_cancelled.add(result.id)
    wait_for(lambda: not Job.objects.live().exists(), timeout=120)

    ran = set(Execution.objects.values_list("label", flat=True))
    outcomes = {"cancelled before it started": 0, "cancelled while running": 0, "ran": 0}
    for result in results:
        # One attempt, or more if the supervisor handed some back unstarted (released,
        # then queued again): a cancelled or failed one is never retried.
        *earlier, attempt = Job.objects.attempts_of(result.id)
        assert {a.failure_reason for a in earlier} <= {FailureReason.RELEASED}
        label = attempt.args[0]
        if attempt.state == State.SUCCEEDED:
            assert label in ran
            never_cancelled.discard(result.id)
            outcomes["ran"] += 1
            continue
        assert attempt.failure_reason == FailureReason.CANCELLED, attempt.error_message
        if attempt.started_at is None or label not in ran:
            assert label not in ran
            outcomes["cancelled before it started"] += 1
        else:
            outcomes["cancelled while running"] += 1
    assert len(ran) == Execution.objects.count()  # no body ran twice
    print(f"\n{connection.vendor}: {outcomes}")
    assert outcomes["cancelled before it started"] > 0, outcomes
    assert not never_cancelled, outcomes  # every job never cancelled ran


def test_a_burst_run_exits_though_a_paused_queue_has_jobs(runjobs):
    tasks.record.enqueue("paused")
    tasks.email.enqueue("ada@example.com")
    backend().pause_queue("default")
    assert runjobs.run("--burst", timeout=30).returncode == 0
    assert backend().get_result(Job.objects.get(queue_name="default").result_id.hex)
    assert Job.objects.get(queue_name="default").state == State.QUEUED
    assert Job.objects.get(queue_name="emails").state == State.SUCCEEDED


def test_a_worker_run_in_process_passes_the_request_to_a_cooperative_task():
    """No supervisor: the worker's watchdog thread reads requests at its heartbeats."""
    from django_jobstate.runner.worker import Worker

    result = tasks.stops_when_cancelled.enqueue("in-process")
    worker = Worker(burst=True)

    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: started("in-process"))
        backend().cancel(result.id)
        thread.join(timeout=GRACE + 10)
        assert not thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=30)
    attempt = Job.objects.get(result_id=result.id)
    assert (attempt.state, attempt.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
    assert attempt.error_class == "django_jobstate.exceptions.JobCancelled"
