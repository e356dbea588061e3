"""The in-process worker loop: claim, run, record the outcome."""

import logging
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.utils import timezone

from django_jobstate.backend import JobStateBackend
from django_jobstate.exceptions import WorkerLost
from django_jobstate.managers.queue_claim import forget_run_time_limits
from django_jobstate.models import Job
from django_jobstate.runner.wakeup import Waiter
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus, task_finished, task_started
from tests import tasks
from tests.dbfaults import end_this_connection, ends_the_connection
from tests.factories import JobFactory
from tests.framework import INVALID_TASK, LOGGER
from tests.models import Execution
from tests.tasks import always_fails, fails_once

JOB_TABLE = connection.ops.quote_name(Job._meta.db_table)  # as the ORM writes it

# Inside the test transaction, as a Django TestCase would run the worker.
pytestmark = pytest.mark.django_db


def executions() -> list[str]:
    return list(Execution.objects.order_by("pk").values_list("label", flat=True))


def in_the_past(seconds: float = 1) -> datetime:
    return timezone.now() - timedelta(seconds=seconds)


def run_until_idle() -> None:
    """Run burst workers until nothing is queued.

    One burst run should do, but on SQLite a retry due "now" can be missed for up to a
    millisecond: see test_a_task_enqueued_without_run_after_is_runnable_at_once.
    """
    deadline = time.monotonic() + 60  # a generous bound: the machine may be loaded
    while Job.objects.queued().exists():
        assert time.monotonic() < deadline, "jobs stayed queued"
        Worker(burst=True).run()


# Running and recording


def test_burst_runs_every_runnable_job_once():
    jobs = [JobFactory(args=[label]) for label in "abc"]
    worker = Worker(burst=True)

    worker.run()
    Worker(burst=True).run()  # nothing is left to run

    assert sorted(executions()) == ["a", "b", "c"]
    assert worker.jobs_done == 3
    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.worker_id) == (State.SUCCEEDED, worker.worker_id)
        assert job.return_value == job.args[0]
        assert job.finished_at is not None


def test_a_failure_is_recorded_with_its_error():
    job = JobFactory(task_path="tests.tasks.boom", args=["kaput"])

    Worker(burst=True).run()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert (job.error_class, job.error_message) == ("builtins.ValueError", "kaput")
    assert "raise ValueError(message)" in job.traceback
    assert job.finished_at is not None
    assert job.return_value is None


def test_jobs_due_later_stay_queued():
    later = JobFactory(args=["later"], run_after=timezone.now() + timedelta(hours=1))
    JobFactory(args=["now"])
    worker = Worker(burst=True)

    worker.run()

    assert (executions(), worker.jobs_done) == (["now"], 1)
    later.refresh_from_db()
    assert later.state == State.QUEUED


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        (None, ["a", "b", "c"]),
        (["emails"], ["b"]),
        (["emails", "reports"], ["b", "c"]),
    ],
)
def test_queues_limit_what_a_worker_runs(queues, expected):
    for label, queue in [("a", "default"), ("b", "emails"), ("c", "reports")]:
        JobFactory(args=[label], queue_name=queue)

    Worker(queues=queues, burst=True).run()

    assert sorted(executions()) == expected
    assert Job.objects.queued().count() == 3 - len(expected)


@pytest.mark.parametrize(("max_jobs", "ran"), [(1, 1), (2, 2), (5, 3)])
def test_max_jobs_stops_the_worker(max_jobs, ran):
    for label in "abc":
        JobFactory(args=[label])
    worker = Worker(burst=True, max_jobs=max_jobs)

    worker.run()

    assert (len(executions()), worker.jobs_done) == (ran, ran)
    assert Job.objects.queued().count() == 3 - ran


def test_higher_priority_first_then_earlier_run_after():
    for label, priority, age in [
        ("low", -5, 30),
        ("normal", 0, 20),
        ("high-later", 10, 1),
        ("high-earlier", 10, 2),
    ]:
        JobFactory(args=[label], priority=priority, run_after=in_the_past(age))

    Worker(burst=True).run()

    assert executions() == ["high-earlier", "high-later", "normal", "low"]


# Rows that must not run, results that cannot be stored


@pytest.mark.parametrize(
    ("task_path", "args", "message"),
    [
        ("tests.tasks.not_a_task", [], "'tests.tasks.not_a_task' is a function, not a Task"),
        ("os.system", ["true"], "'os.system' is a builtin_function_or_method, not a Task"),
        ("tests.no_such_module.job", [], "Cannot import the task 'tests.no_such_module.job'"),
        ("tests.tasks.no_such_task", [], "Cannot import the task 'tests.tasks.no_such_task'"),
    ],
    ids=["plain-function", "builtin", "no-module", "no-attribute"],
)
def test_a_row_that_is_not_a_task_fails_without_running_anything(task_path, args, message):
    job = JobFactory(task_path=task_path, args=args)
    worker = Worker(burst=True)

    worker.run()  # returns: the worker did not crash

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_class == INVALID_TASK  # not_a_task's would differ
    assert message in job.error_message
    assert worker.jobs_done == 1


@pytest.mark.parametrize(
    ("task_path", "message"),
    [
        ("tests.tasks.returns_set", "Object of type set is not JSON serializable"),
        ("tests.tasks.returns_nan", "Out of range float values are not JSON compliant: nan"),
    ],
)
def test_a_return_value_that_is_not_json_fails_the_attempt(task_path, message):
    job = JobFactory(task_path=task_path, args=[])
    worker = Worker(burst=True)

    worker.run()  # returns: the worker did not crash

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_class == "django_jobstate.exceptions.InvalidPayload"
    assert f"return value must be JSON: {message}" in job.error_message
    assert job.return_value is None
    assert worker.jobs_done == 1


# Context, fencing, retries, signals


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_context_attempt_is_the_job_attempt(attempt):
    job = None  # attempts 1 .. attempt-1 failed, the last one is queued
    for n in range(1, attempt + 1):
        link = {} if job is None else {"result_id": job.result_id, "previous": job}
        state = State.FAILED if n < attempt else State.QUEUED
        job = JobFactory.in_state(
            state, attempt=n, task_path="tests.tasks.attempt_number", args=[], **link
        )

    Worker(burst=True).run()

    job.refresh_from_db()
    assert (job.state, job.return_value) == (State.SUCCEEDED, attempt)


@pytest.mark.parametrize("task_path", ["tests.tasks.record", "tests.tasks.boom"])
def test_a_late_outcome_of_a_lost_attempt_is_refused(caplog, task_path):
    JobFactory(task_path=task_path)
    [stale] = Job.objects.claim("w1")
    Job.objects.fail(Job.objects.get(pk=stale.pk), FailureReason.LOST, error_message="lost")

    with caplog.at_level(logging.WARNING, logger="django_jobstate.worker"):
        Worker(worker_id="w1").run_attempt(stale)

    row = Job.objects.get()
    assert (row.state, row.failure_reason, row.error_message) == ("failed", "lost", "lost")
    assert (row.return_value, row.error_class) == (None, "")
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"outcome of job {stale.pk} discarded" in warning.getMessage()
    assert "another writer got there first" in warning.getMessage()


def test_a_task_that_always_fails_is_tried_max_attempts_times():
    result = always_fails.using(run_after=in_the_past()).enqueue("x")

    run_until_idle()

    attempts = list(Job.objects.attempts_of(result.id))
    assert [(a.attempt, a.state) for a in attempts] == [(n, State.FAILED) for n in (1, 2, 3)]
    assert [a.previous for a in attempts] == [None, attempts[0], attempts[1]]
    assert executions() == ["x"] * 3
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 3
    assert result.worker_ids == [a.worker_id for a in attempts]


def test_a_task_that_fails_once_succeeds_on_its_second_attempt():
    result = fails_once.using(run_after=in_the_past()).enqueue("x")

    run_until_idle()

    assert [a.state for a in Job.objects.attempts_of(result.id)] == [
        State.FAILED,
        State.SUCCEEDED,
    ]
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        "x",
        2,
    )
    assert len(result.errors) == 1


def test_a_retry_starts_from_the_stored_payload_not_what_the_attempt_changed_in_place():
    """The next attempt is written from the failed row, not from the objects its body was
    given: before, a list argument appended to was retried with the append, and metadata
    changed in place into something JSON cannot store made the retry raise TypeError out
    of the worker (its process exited, the failure was lost)."""
    result = tasks.changes_its_payload_in_place.using(
        run_after=in_the_past(), metadata={"kept": 1}
    ).enqueue(["given"])

    run_until_idle()

    first, second = Job.objects.attempts_of(result.id)
    assert (first.state, first.failure_reason, first.error_class) == (
        State.FAILED,
        FailureReason.ERROR,
        "builtins.ValueError",
    )
    assert (second.args, second.metadata) == ([["given"]], {"kept": 1})
    assert (second.state, second.return_value) == (State.SUCCEEDED, ["given", "changed"])


@pytest.mark.parametrize(
    ("task_path", "final"),
    [
        ("tests.tasks.record", TaskResultStatus.SUCCESSFUL),
        ("tests.tasks.boom", TaskResultStatus.FAILED),
    ],
)
def test_task_started_then_task_finished_are_sent(task_path, final):
    job = JobFactory(task_path=task_path)
    received = []

    def receiver(signal, sender, task_result, **kwargs):
        received.append((signal, sender, task_result.id, task_result.status))

    task_started.connect(receiver)
    task_finished.connect(receiver)
    try:
        Worker(burst=True).run()
    finally:
        task_started.disconnect(receiver)
        task_finished.disconnect(receiver)

    assert received == [
        (task_started, JobStateBackend, str(job.result_id), TaskResultStatus.RUNNING),
        (task_finished, JobStateBackend, str(job.result_id), final),
    ]


@pytest.mark.django_db(transaction=True)  # with --in-flight, the bodies run in threads
@pytest.mark.parametrize("in_flight", [1, 4])
def test_a_task_finished_receiver_that_raises_does_not_stop_the_worker(caplog, in_flight):
    jobs = [JobFactory(args=[label]) for label in "ab"] + [JobFactory(task_path="tests.tasks.boom")]

    def receiver(sender, task_result, **kwargs):
        raise RuntimeError("a receiver's bug")

    task_finished.connect(receiver)
    try:
        with caplog.at_level(logging.ERROR, logger="django_jobstate.worker"):
            Worker(burst=True, in_flight=in_flight).run()
    finally:
        task_finished.disconnect(receiver)

    states = [Job.objects.get(pk=job.pk).state for job in jobs]
    assert states == [State.SUCCEEDED, State.SUCCEEDED, State.FAILED]
    assert sorted(executions()) == ["a", "b"]
    raised = [r for r in caplog.records if "task_finished receiver raised" in r.getMessage()]
    assert len(raised) == 3
    assert all(r.exc_info[0] is RuntimeError for r in raised)


def test_a_batch_skips_attempts_failed_while_the_worker_was_not_heard_from(settings):
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 0.01
    slow = JobFactory(task_path="tests.tasks.sleep_then_record", args=["a", 0.1], priority=2)
    JobFactory(args=["b"], priority=1)
    JobFactory(args=["c"], priority=0)
    batch = Job.objects.claim("w", limit=3)
    assert batch[0].pk == slow.pk
    # While "w" was paused, a rescuer failed its other attempts as lost.
    for job in batch[1:]:
        Job.objects.fail_running("w", FailureReason.LOST, RuntimeError("lost"), pk=job.pk)

    Worker(worker_id="w")._run_batch(batch)

    assert executions() == ["a"]  # b and c were not started by a worker that lost them
    assert [j.state for j in Job.objects.order_by("-priority")] == [
        State.SUCCEEDED,
        State.FAILED,
        State.FAILED,
    ]


def test_while_draining_a_backlog_a_worker_claims_from_its_last_batch(monkeypatch):
    """...and from the head again when nothing is left after its key, or after RESCAN_AFTER."""

    def job(label, priority=0):
        return JobFactory(task_path="tests.tasks.record", args=[label], priority=priority)

    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 3600)
    old = [job(f"old{n}") for n in range(3)]
    worker = Worker(worker_id="w")  # its first batches take one job each
    assert worker.claim() == old[:1]
    urgent = job("urgent", priority=10)
    assert worker.claim() == old[1:2], "claimed from the head, not from its key"
    assert worker.claim() == old[2:3]
    assert worker.claim() == [urgent], "nothing after its key, yet it did not look at the head"

    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 0)
    later = job("later")
    worker = Worker(worker_id="w2")
    assert worker.claim() == [later]
    urgent = job("urgent", priority=10)
    job("last")
    assert worker.claim() == [urgent], "not claimed from the head after RESCAN_AFTER"


def listening_worker(**options) -> Worker:
    """A Worker as run() makes it, with a Waiter that hears notifications (close it)."""
    worker = Worker(worker_id="w", **options)
    worker._average_duration = 0.001  # batches of 50: a few jobs do not fill one
    worker._waiter = Waiter(threading.Event(), queues=None)
    worker._waiter.start()
    return worker


def claim_when_heard(worker: Worker, seconds: float = 10) -> list[Job]:
    """The worker's first claim that takes something, once a notification arrived."""
    deadline = time.monotonic() + seconds
    while not (jobs := worker.claim()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return jobs


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_under_continuous_load_a_worker_claims_from_its_last_job_less_a_margin(monkeypatch):
    """A claim that took what there was leaves a key: the last job's, less LIVE_MARGIN of
    run_after (jobs of transactions that committed late); what sorts before that and was
    not announced waits for the rescan. Under an old snapshot, a claim from the head walks
    every claimed row's index entry (issue 28's vacuum pressure)."""
    from django_jobstate.runner.claims import LIVE_MARGIN

    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 3600)
    worker = listening_worker()
    try:
        first = [JobFactory(args=[f"j{n}"]) for n in range(2)]
        assert worker.claim() == first
        last = Job.objects.get(pk=first[-1].pk).run_after
        assert worker._from_key == (0, last - LIVE_MARGIN, 0)
        within = JobFactory(args=["within"], run_after=last - LIVE_MARGIN / 2)
        before = JobFactory(args=["before"], run_after=last - LIVE_MARGIN * 2)
        assert worker.claim() == [within], "the margin did not find a job committed late"
        assert worker.claim() == [], "it looked from the head, not from its key"
        assert worker._from_key is not None, "a claim from its key that found nothing dropped it"
        assert 0 < worker.look_again_in(time.monotonic()) <= worker.poll_interval
        worker._rescan_at = time.monotonic() - 1  # its rescan is due
        assert worker.look_again_in(time.monotonic()) == 0, "an idle worker would sleep past it"
        assert worker.claim() == [before]
        worker._rescan_at = time.monotonic() - 1
        assert worker.claim() == []
        # Kept: every job enqueued since is announced with its run_after.
        assert worker._from_key is not None, "a look from the head that found nothing dropped it"
        old = last - LIVE_MARGIN * 3  # a run_after given in the past: before the key
        tasks.record.using(run_after=old).enqueue("announced")
        assert [j.args for j in claim_when_heard(worker)] == [["announced"]], "left to the rescan"
    finally:
        worker._waiter.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a key needs NOTIFY: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_connection_ended_after_a_claim_does_not_end_the_worker(monkeypatch):
    """A claim that took what there was reads whether its queues have limits (to keep a
    key), once its cached answer is stale. The server ending the connection there (a
    restart, a failover) must not end the worker: its process died, and the attempts it
    had just claimed were failed as lost (a torture run's outage)."""
    monkeypatch.setattr("django_jobstate.managers.queue_claim.LIMITS_TTL", 0)  # always read
    forget_run_time_limits()
    reads = 0

    def end_at_the_second_read(execute, sql, params, many, context):
        nonlocal reads
        if sql.startswith('SELECT "django_jobstate_jobqueue"'):
            reads += 1
            if reads == 2:  # the claim's own read went through; this is the one after it
                end_this_connection()
        return execute(sql, params, many, context)

    worker = listening_worker()
    try:
        claimed = [JobFactory(args=["a"]), JobFactory(args=["b"])]
        with connection.execute_wrapper(end_at_the_second_read):
            assert worker.claim() == claimed
        assert reads == 2
        assert worker._from_key is None, "a key kept without knowing the queues' limits"
        assert worker.claim() == []  # connected again
    finally:
        worker._waiter.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_with_a_key_looks_again_at_its_poll_interval():
    """A look from the head that found nothing keeps the key, and nothing is left before
    it that a notification would not announce: no rescan a second while idle."""
    worker = listening_worker(poll_interval=30)
    try:
        JobFactory(args=["j"])
        assert len(worker.claim()) == 1
        assert worker._from_key is not None
        worker._rescan_at = time.monotonic() - 1  # its rescan is due
        assert worker.claim() == []
        assert worker._from_key is not None
        assert worker.look_again_in(time.monotonic()) > 25, "it would look from the head again"
    finally:
        worker._waiter.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_worker_of_a_limited_queue_claims_its_backlog_from_the_head(monkeypatch):
    """A limited queue's jobs wait for a free place in the place they kept, and nothing
    announces the place freed: a key past them would leave them to the rescan."""
    from django_jobstate.managers.queue_claim import forget_run_time_limits
    from django_jobstate.models import JobQueue

    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 3600)
    JobQueue.objects.set_limits("default", concurrency=1, by="test")
    forget_run_time_limits()
    worker = listening_worker()
    try:
        backlog = [JobFactory(args=[f"old{n}"], run_after=in_the_past(60)) for n in range(2)]
        other = JobFactory(args=["another queue's, new"], queue_name="reports")
        assert worker.claim() == [backlog[0], other]
        assert worker._from_key is None, "a key past the limited queue's backlog"
        Job.objects.filter(pk=backlog[0].pk).update(
            state=State.SUCCEEDED, finished_at=timezone.now()
        )
        assert worker.claim() == backlog[1:], "the place freed, and its job waited on"
    finally:
        worker._waiter.close()
        forget_run_time_limits()


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_hears_nothing_claims_from_the_head_after_a_claim_that_took_all():
    """Without notifications (SQLite, MariaDB) nothing would announce a job of a higher
    priority enqueued since: the next claim looks from the head, as it always did."""
    worker = Worker(worker_id="w")
    worker._average_duration = 0.001
    worker._waiter = Waiter(threading.Event(), queues=None, inbox=None)
    worker._waiter.hears = lambda: False  # as on SQLite and MariaDB
    JobFactory(args=["j"])
    assert len(worker.claim()) == 1
    assert worker._from_key is None
    urgent = JobFactory(args=["urgent"], priority=10)
    assert worker.claim() == [urgent]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_step_released_before_a_live_key_is_claimed_at_once(monkeypatch):
    """A step whose upstream finished keeps its place from its enqueue: before the key of
    a worker under continuous load. The release's notification says so."""
    from tests import workflow_tasks as wt

    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 3600)
    upstream = wt.step_value.enqueue(1)
    waiting = wt.step_value.using(depends_on=[upstream.id]).enqueue(2)
    old = timezone.now() - timedelta(seconds=10)  # enqueued long before: beyond the margin
    Job.objects.filter(result_id=waiting.id).update(run_after=old, enqueued_at=old)
    worker = listening_worker()
    try:
        [claimed] = worker.claim()
        assert worker._from_key > (0, old, 0), "the held step does not sort before the key"
        worker._run_batch([claimed])  # the upstream succeeds: its dependent is released
        worker.flusher.write()
        released = [str(j.result_id) for j in claim_when_heard(worker)]
        assert released == [str(waiting.id)], "it waited for the rescan"
    finally:
        worker._waiter.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_worker_of_every_queue_claims_a_queue_it_hears_of_from_its_key(monkeypatch):
    """Not from the head: at a low load the queues are empty whenever it looks from the
    head, and under an old snapshot both the look for queues and the claim from the head
    walk every claimed row's index entry."""
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 3600)
    worker = listening_worker()
    try:
        tasks.record.enqueue("first")
        assert [j.args for j in worker.claim()] == [["first"]]
        assert worker._queue_names == ["default"]
        tasks.record.using(queue_name="reports").enqueue("another queue's")
        with CaptureQueriesContext(connection) as queries:
            assert [j.args for j in claim_when_heard(worker)] == [["another queue's"]]
        sql = [q["sql"] for q in queries]
        assert not any("WITH RECURSIVE" in q for q in sql), "it looked for queues from the head"
        claims = [q for q in sql if "WITH picked" in q]
        assert claims
        assert all(">= (" in q for q in claims), "it claimed from the head"
    finally:
        worker._waiter.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_flight", [1, 4])
def test_a_busy_worker_does_not_connect_again_for_each_claim(monkeypatch, in_flight):
    """With Django's default CONN_MAX_AGE=0 too: a new connection is a new server process
    on PostgreSQL, which costs more than a claim of a few jobs (issue 28)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    tasks.record.get_backend().bulk_enqueue(tasks.record, [([f"j{n}"], {}) for n in range(40)])
    opened = []

    def count(sender, connection, **kwargs):
        if connection.alias == "default" and threading.current_thread() is threading.main_thread():
            opened.append(connection)

    connection_created.connect(count)
    try:
        Worker(burst=True, max_batch=4, in_flight=in_flight).run()
    finally:
        connection_created.disconnect(count)
    assert len(executions()) == 40
    assert len(opened) <= 1, f"{len(opened)} connections for at least 10 claims"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_draining_worker_claims_a_job_that_sorts_before_its_key_at_once(monkeypatch):
    monkeypatch.setattr("django_jobstate.runner.claims.RESCAN_AFTER", 3600)
    tasks.record.get_backend().bulk_enqueue(tasks.record, [([f"old{n}"], {}) for n in range(3)])
    worker = Worker(worker_id="w")
    worker._waiter = Waiter(threading.Event(), queues=None)
    worker._waiter.start()
    try:
        assert [j.args for j in worker.claim()] == [["old0"]]
        tasks.record.using(priority=10).enqueue("urgent")  # wakes listeners at its commit
        time.sleep(0.2)
        assert [j.args for j in worker.claim()] == [["urgent"]], "it waited for the rescan"
    finally:
        worker._waiter.close()


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("nul", "before\\x00after"),
        ("surrogate", "lone \\ud800 surrogate"),
        ("unprintable", "<str() of the error failed>"),
    ],
)
def test_an_error_that_cannot_be_stored_as_it_is_is_stored_escaped(kind, message):
    from tests.tasks import raises, record

    failing, behind = raises.enqueue(kind), record.enqueue("behind")

    Worker(burst=True).run()

    job = Job.objects.get(result_id=failing.id)
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_message == message
    assert job.error_class.startswith("tests.tasks.") or job.error_class == "builtins.ValueError"
    assert "Traceback" in job.traceback
    assert Job.objects.get(result_id=behind.id).state == State.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_an_atomic_task_commits_its_writes_with_its_success_and_rolls_them_back_on_error():
    from tests.tasks import writes_atomically, writes_then_fails

    ok, bad = writes_atomically.enqueue("ok", 0), writes_then_fails.enqueue("bad")

    Worker(burst=True).run()

    assert writes_atomically.get_result(ok.id).return_value == 1
    failed = Job.objects.get(result_id=bad.id)
    assert (failed.state, failed.error_message) == (State.FAILED, "bad failed after writing")
    assert executions() == ["ok:1"]


@pytest.mark.skipif(connection.vendor == "sqlite", reason="ends a server connection")
@pytest.mark.django_db(transaction=True)
def test_losing_the_database_before_the_body_starts_is_not_the_tasks_error():
    from tests.tasks import record

    first = JobFactory.in_state(State.FAILED, task_path=record.module_path, args=["again"])
    retry = Job.objects.retry(first)
    [claimed] = Job.objects.claim("w", limit=1)
    assert claimed.pk == retry.pk
    # The server ends this process's connection (a restart, a failover) just before the
    # worker reads the earlier attempts, which it does before the body of a retry starts.
    end_this_connection()

    Worker(worker_id="w").run_attempt(claimed)

    claimed.refresh_from_db()
    assert (claimed.state, claimed.return_value) == (State.SUCCEEDED, "again")
    assert executions() == ["again"]


@pytest.mark.skipif(connection.vendor == "sqlite", reason="ends a server connection")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failure_whose_transaction_loses_the_database_is_written_again_from_the_start(when):
    # The failure and its retry are one transaction; the server goes away in it, before
    # the retry's INSERT or before the COMMIT. Nothing was written: the worker writes the
    # failure again, from the row's state (running), not from its rolled-back copy.
    first = fails_once.enqueue("x")
    [claimed] = Job.objects.claim("w", limit=1)

    with connection.execute_wrapper(ends_the_connection(when, f"INSERT INTO {JOB_TABLE}")):
        Worker(worker_id="w").run_attempt(claimed)

    attempts = list(Job.objects.attempts_of(first.id))
    assert [(a.attempt, a.state) for a in attempts] == [(1, State.FAILED), (2, State.QUEUED)]
    assert attempts[1].previous_id == attempts[0].pk


@pytest.mark.skipif(connection.vendor == "sqlite", reason="ends a server connection")
@pytest.mark.django_db(transaction=True)
def test_an_atomic_task_whose_commit_loses_the_database_fails_and_is_retried():
    from tests.tasks import writes_atomically

    first = writes_atomically.enqueue("x", 0)
    [claimed] = Job.objects.claim("w", limit=1)

    # The server goes away after the success is written (and read back) in the body's
    # transaction, which rolls back with the body's writes: the attempt failed, and is
    # retried.
    ends = ends_the_connection("after", f"UPDATE {JOB_TABLE}", State.SUCCEEDED, then=1)
    with connection.execute_wrapper(ends):
        Worker(worker_id="w").run_attempt(claimed)

    attempts = list(Job.objects.attempts_of(first.id))
    assert [(a.attempt, a.state) for a in attempts] == [(1, State.FAILED), (2, State.QUEUED)]
    assert attempts[0].error_class == "django.db.utils.OperationalError"
    assert executions() == []


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="PostgreSQL's idle_in_transaction_session_timeout and MariaDB's "
    "idle_transaction_timeout (SQLite has one writer at a time)",
)
@pytest.mark.django_db(transaction=True)
def test_a_writer_silent_inside_its_outcome_write_lets_go_of_the_row(settings, caplog):
    # A host cut off (or dead) after its failure's UPDATE, before its COMMIT: the server
    # ends that transaction after half of LOST_AFTER (here 1 s), so that a rescuer,
    # which skips locked rows, can fail the attempt long before TCP would give up.
    if connection.vendor == "mysql" and not connection.mysql_is_mariadb:
        pytest.skip("MySQL 8 has no timeout for a transaction left idle")
    settings.JOBSTATE_LOST_AFTER = 2.0
    first = always_fails.enqueue("x")
    [claimed] = Job.objects.claim("w", limit=1)
    silent, silence = threading.Event(), 10.0

    def goes_silent(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith(f"UPDATE {JOB_TABLE}") and not silent.is_set():
            silent.set()
            time.sleep(silence)
        return result

    def writer() -> None:
        with connection.execute_wrapper(goes_silent):
            Worker(worker_id="w").run_attempt(claimed)
        connection.close()

    thread = threading.Thread(target=writer)
    with caplog.at_level(logging.WARNING, logger="django_jobstate.worker"):
        thread.start()
        assert silent.wait(30)
        deadline = time.monotonic() + silence / 2
        rescued = 0
        while not rescued:  # as the rescue does: lock the row, or skip it
            assert time.monotonic() < deadline, "the silent writer still holds the row"
            time.sleep(0.1)
            rescued = Job.objects._fail_each(
                Job.objects.running().filter(pk=claimed.pk),
                FailureReason.LOST,
                WorkerLost("its worker sent no heartbeat"),
                skip_locked=True,
            )
        thread.join(60)

    attempts = list(Job.objects.attempts_of(first.id))
    assert [(a.attempt, a.state, a.failure_reason) for a in attempts] == [
        (1, State.FAILED, FailureReason.LOST),
        (2, State.QUEUED, ""),
    ]
    assert f"outcome of job {claimed.pk} discarded" in caplog.text


def test_a_failure_is_logged_with_its_class_message_reason_and_traceback(caplog):
    from tests.tasks import boom

    boom.enqueue("why it failed")

    with caplog.at_level(logging.INFO):
        Worker(burst=True).run()

    [ours] = [r for r in caplog.records if r.name == "django_jobstate.worker" and r.exc_info]
    assert "failed (error)" in ours.getMessage()
    assert "builtins.ValueError: why it failed" in ours.getMessage()
    # Django's own line, from task_finished, carries the traceback too (admin e-mails).
    [django] = [r for r in caplog.records if r.name == LOGGER and "FAILED" in r.getMessage()]
    assert django.exc_info[0] is ValueError


def test_a_worker_run_inside_a_callers_transaction_does_not_wait_on_its_own_heartbeat(caplog):
    """As a Django TestCase runs it: the worker registers inside the test's transaction,
    where its watchdog thread's connection cannot see the row. A beat from that thread
    would wait for the transaction, and the worker waits for the thread at its end: they
    hung each other for good on PostgreSQL and MariaDB (30 s on SQLite, its busy timeout)
    once a run outlasted a heartbeat interval. A helper thread breaks such a wait after
    20 s, so that the test fails instead of hanging."""
    tasks.sleep_then_record.enqueue("slow", 1.0)  # four heartbeat intervals of the tests
    done = threading.Event()

    def break_waits() -> None:
        if done.wait(20):
            return
        try:
            with connections["default"].cursor() as cursor:  # this thread's own connection
                if connection.vendor == "postgresql":
                    cursor.execute(
                        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                elif connection.vendor == "mysql":
                    cursor.execute(
                        "SELECT id FROM information_schema.PROCESSLIST "
                        "WHERE STATE LIKE '%lock%' AND id <> CONNECTION_ID()"
                    )
                    for (pid,) in cursor.fetchall():
                        cursor.execute(f"KILL QUERY {int(pid)}")
        finally:
            connections.close_all()

    breaker = threading.Thread(target=break_waits, daemon=True)
    breaker.start()
    with caplog.at_level(logging.WARNING, logger="django_jobstate"):
        Worker(burst=True).run()
    done.set()
    breaker.join()
    assert Execution.objects.filter(label="slow").count() == 1
    assert "cannot heartbeat" not in caplog.text
