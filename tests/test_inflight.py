"""Several attempts at once in one worker process (runjobs --in-flight), under real
`runjobs` processes: each attempt runs once, deadlines and cancels stop what they can, a
stop finishes what is in flight."""

import signal
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from django_jobstate.exceptions import JobCancelled, JobTimeout
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus
from tests import tasks
from tests.dbfaults import NO_SERVER_CTL, no_server_ctl, server_ctl
from tests.factories import JobFactory
from tests.models import Execution
from tests.test_cancel import GRACE, backend, settings_env, stop_running
from tests.test_runjobs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def most_at_once(prefix: str) -> int:
    """How many attempts whose label starts with `prefix` ran at once, by the order in
    which their start and end rows were written."""
    running = most = 0
    for label in (
        Execution.objects.filter(label__startswith=prefix)
        .order_by("pk")
        .values_list("label", flat=True)
    ):
        running += 1 if label.endswith(":start") else -1
        most = max(most, running)
    return most


def each_ran_once(prefix: str, n: int) -> None:
    labels = list(
        Execution.objects.filter(label__startswith=prefix).values_list("label", flat=True)
    )
    expected = [f"{prefix}{i}:{edge}" for i in range(n) for edge in ("start", "end")]
    assert sorted(labels) == sorted(expected)


def test_many_attempts_run_at_once_in_each_process_and_each_runs_once(runjobs):
    for i in range(30):
        tasks.async_waits.enqueue(f"a{i}", 0.3)
        tasks.sync_waits.enqueue(f"s{i}", 0.3)
    done = runjobs.run("--concurrency", "2", "--in-flight", "10", "--burst", timeout=120)
    assert done.returncode == 0, done.stdout
    assert Job.objects.count() == 60, "an attempt failed and was retried"
    assert set(Job.objects.values_list("state", flat=True)) == {State.SUCCEEDED}
    each_ran_once("a", 30)
    each_ran_once("s", 30)
    # Async tasks share one event loop per process; sync ones run on threads.
    assert most_at_once("a") > 2
    assert most_at_once("s") > 2


def test_an_async_attempt_past_its_timeout_is_cancelled_and_its_neighbours_run_on(runjobs):
    late = tasks.async_sleeps_past_its_timeout.enqueue("late")
    neighbours = [tasks.sync_waits.enqueue(f"n{i}", 3) for i in range(3)]
    proc = runjobs.start("--in-flight", "8")
    wait_for(lambda: backend().get_result(late.id).is_finished, timeout=30)
    wait_for(lambda: all(backend().get_result(r.id).is_finished for r in neighbours), timeout=30)
    output = runjobs.stop(proc)
    attempt = Job.objects.get(result_id=late.id)
    assert attempt.failure_reason == FailureReason.TIMEOUT, output
    assert backend().get_result(late.id).errors[-1].exception_class is JobTimeout
    # Cancelled on the event loop: the process ran on, and its neighbours' first attempts
    # succeeded.
    assert "stopping the worker process" not in output
    assert all(backend().get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in neighbours)
    assert Job.objects.filter(result_id__in=[r.id for r in neighbours], attempt=1).count() == 3
    assert Job.objects.count() == 4
    assert not Execution.objects.filter(label="late:end").exists()


@pytest.mark.parametrize(
    "overrun",
    [tasks.async_holds_the_loop, tasks.sync_sleeps_past_its_timeout],
    ids=["async", "sync"],
)
def test_an_attempt_that_cannot_be_stopped_ends_its_process_and_its_neighbours_are_retried(
    runjobs, overrun
):
    """A thread cannot be stopped, nor an async task that holds the event loop: the
    supervisor ends the process at the deadline (plus the async grace), as it does with one
    attempt at a time; the attempts running beside it fail as lost and run again."""
    late = overrun.enqueue("late")
    proc = runjobs.start("--in-flight", "8")
    wait_for(lambda: Execution.objects.filter(label="late:start").exists())
    neighbours = [tasks.sync_waits.enqueue(f"n{i}", 5) for i in range(3)]
    wait_for(lambda: Execution.objects.filter(label__endswith=":start").count() == 4)
    wait_for(lambda: all(backend().get_result(r.id).is_finished for r in neighbours), timeout=60)
    output = runjobs.stop(proc)
    assert "stopping the worker process" in output
    assert Job.objects.get(result_id=late.id).failure_reason == FailureReason.TIMEOUT, output
    for result in neighbours:
        assert backend().get_result(result.id).status == TaskResultStatus.SUCCESSFUL
        first, second = Job.objects.filter(result_id=result.id).order_by("attempt")
        assert first.failure_reason == FailureReason.LOST
        assert second.state == State.SUCCEEDED
    assert proc.returncode == 0


@pytest.mark.parametrize("kind", ["cooperative", "never returns"])
def test_a_cancelled_async_attempt_stops_within_the_grace_and_the_others_run_on(runjobs, kind):
    proc = runjobs.start("--in-flight", "4", **settings_env(CANCEL_GRACE=GRACE))
    neighbour = tasks.sync_waits.enqueue("n0", 4)
    task = tasks.async_stops_when_cancelled if kind == "cooperative" else tasks.async_never_returns
    took, attempt = stop_running(task, kind, lambda: runjobs.output(proc))
    assert took <= GRACE + 1.0
    wait_for(lambda: backend().get_result(neighbour.id).is_finished, timeout=30)
    output = runjobs.stop(proc)
    assert backend().get_result(neighbour.id).status == TaskResultStatus.SUCCESSFUL
    assert Job.objects.get(result_id=neighbour.id).attempt == 1, "its process was stopped"
    assert "stopping the worker process" not in output
    assert backend().get_result(attempt.result_id).errors[-1].exception_class is JobCancelled


def test_a_stop_finishes_every_attempt_in_flight(runjobs):
    for i in range(6):
        tasks.async_waits.enqueue(f"a{i}", 1.5)
        tasks.sync_waits.enqueue(f"s{i}", 1.5)
    proc = runjobs.start("--in-flight", "12")
    wait_for(lambda: Execution.objects.filter(label__endswith=":start").count() == 12)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 0, runjobs.output(proc)
    assert set(Job.objects.values_list("state", flat=True)) == {State.SUCCEEDED}
    assert Job.objects.count() == 12
    each_ran_once("a", 6)
    each_ran_once("s", 6)


def test_an_async_task_saves_its_progress_from_the_event_loop(runjobs):
    result = tasks.async_reports_progress.enqueue(3)
    done = runjobs.run("--in-flight", "4", "--burst")
    assert done.returncode == 0, done.stdout
    assert backend().get_result(result.id).status == TaskResultStatus.SUCCESSFUL, done.stdout
    assert Job.objects.get(result_id=result.id).metadata == {"done": 3}


def test_quick_jobs_through_a_small_limit_each_run_once():
    """Outcomes wait to be written together, keeping their places in the ledger until then
    (a batch and the attempts in flight): however many quick jobs finish meanwhile, the
    worker writes them before they outgrow it."""
    backend().bulk_enqueue(tasks.record, [((f"q{i}",), {}) for i in range(300)])
    worker = Worker(in_flight=2, max_batch=4, burst=True)
    worker.run()
    assert worker.jobs_done == 300
    assert Job.objects.filter(state=State.SUCCEEDED).count() == 300
    assert Execution.objects.count() == 300


@pytest.mark.skipif(no_server_ctl(), reason=NO_SERVER_CTL)
def test_async_and_sync_attempts_reconnect_after_a_database_server_restart(runjobs):
    """The connections of the worker's threads (and of the one the event loop's ORM calls
    run on) died with the server: the attempts after the restart open new ones."""
    worker = runjobs.start("--in-flight", "4")
    before = [tasks.async_waits.enqueue(f"b{i}", 0.01) for i in range(4)]
    before += [tasks.sync_waits.enqueue(f"c{i}", 0.01) for i in range(4)]
    wait_for(lambda: all(backend().get_result(r.id).is_finished for r in before))

    server_ctl("restart")
    connections.close_all()  # this test's own connection died with the server

    # A dead connection would fail every attempt of these (three each).
    after = [tasks.async_waits.enqueue(f"a{i}", 0.01) for i in range(6)]
    after += [tasks.sync_waits.enqueue(f"s{i}", 0.01) for i in range(6)]
    wait_for(lambda: all(backend().get_result(r.id).is_finished for r in after), timeout=60)
    out = runjobs.stop(worker)
    for result in after:
        assert backend().get_result(result.id).status == TaskResultStatus.SUCCESSFUL, out


def test_hundreds_of_claimed_jobs_not_to_be_run_leave_the_worker_and_its_neighbours_up(runjobs):
    """Jobs whose outcome is known at the claim (a task this release does not have, a row
    whose arguments cannot be passed) take no place among the attempts in flight, and are
    claimed one batch after another; each waits in the ledger until it is written, and
    the ledger must never overflow, which would end the process and its healthy attempts."""
    start = timezone.now() - timedelta(seconds=60)
    order = iter(range(1000))

    def row(**fields):  # claimed in the order they are made
        return JobFactory(run_after=start + timedelta(milliseconds=next(order)), **fields)

    def healthy(i):
        path = "tests.tasks.sync_waits" if i % 2 else "tests.tasks.async_waits"
        return row(task_path=path, args=[f"h{i}", 1.0], max_attempts=3)

    def not_to_be_run(i):
        if i % 2:
            return row(task_path="tests.tasks.added_in_a_newer_release", args=[])
        return row(task_path="tests.tasks.record", args={"label": "not a list"})

    good = [healthy(0), healthy(1)]
    bad = [not_to_be_run(i) for i in range(150)]
    good.append(healthy(2))
    bad += [not_to_be_run(i) for i in range(150, 300)]
    good += [healthy(i) for i in range(3, 6)]

    done = runjobs.run("--in-flight", "4", "--burst", timeout=120)
    assert done.returncode == 0, done.stdout
    assert "do not fit" not in done.stdout
    assert "killed by" not in done.stdout
    assert "exited" not in done.stdout
    rows = Job.objects.filter(pk__in=[job.pk for job in good])
    assert set(rows.values_list("state", "attempt")) == {(State.SUCCEEDED, 1)}, done.stdout
    assert Job.objects.count() == 306, "an attempt failed and was retried"
    assert Job.objects.values("worker_id").distinct().count() == 1, "the process was replaced"
    labels = sorted(Execution.objects.values_list("label", flat=True))
    assert labels == sorted(f"h{i}:{edge}" for i in range(6) for edge in ("start", "end"))
    failed = Job.objects.filter(pk__in=[job.pk for job in bad])
    assert set(failed.values_list("state", "failure_reason")) == {
        (State.FAILED, FailureReason.ERROR)
    }
    assert failed.filter(error_message__contains="has no 'added_in_a_newer_release'").count() == 150
    assert failed.filter(error_message__contains="must be a JSON array").count() == 150
