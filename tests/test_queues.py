"""Pausing and resuming queues, and claims that never pay for another queue's backlog."""

import io
import logging
import math
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.db.notify import CHANNEL, parse_payload, queue_payload
from django_jobstate.models import Job, JobQueue
from django_jobstate.runner.wakeup import Waiter
from django_jobstate.states import State
from django_jobstate.tasksapi import task_backends
from tests import tasks
from tests.factories import JobFactory
from tests.test_runjobs import wait_for

POSTGRES = connection.vendor == "postgresql"


def backend():
    return task_backends["default"]


@pytest.mark.django_db
def test_no_claim_takes_a_paused_queues_jobs_until_it_is_resumed(caplog):
    paused = JobFactory.create_batch(3, queue_name="emails", priority=10)  # first in order
    other = JobFactory(queue_name="default")
    with caplog.at_level(logging.WARNING, logger="django_jobstate"):
        backend().pause_queue("emails", by="cli:ops")

    assert Job.objects.claim("w", limit=10) == [other]
    assert Job.objects.claim("w", queues=["emails"], limit=10) == []
    assert Job.objects.claim("w", queues=["emails", "default"], limit=10) == []
    queue = JobQueue.objects.get(name="emails")
    assert queue.paused
    assert queue.changed_by == "cli:ops"
    assert "Queue 'emails' paused by cli:ops" in caplog.text

    backend().pause_queue("emails")  # again: still paused since the first time
    assert JobQueue.objects.get(name="emails").paused_at == queue.paused_at
    backend().resume_queue("emails", by="admin:ada")
    assert not JobQueue.objects.get(name="emails").paused
    assert {job.pk for job in Job.objects.claim("w", limit=10)} == {job.pk for job in paused}
    assert "Queue 'emails' resumed by admin:ada" in caplog.text


@pytest.mark.django_db
def test_a_claim_from_several_queues_merges_their_heads_in_claim_order():
    base = timezone.now() - timedelta(seconds=10)
    a0 = JobFactory(queue_name="a", priority=0, run_after=base + timedelta(seconds=1))
    c0 = JobFactory(queue_name="c", priority=0, run_after=base + timedelta(seconds=2))
    JobFactory(queue_name="b", priority=0, run_after=base + timedelta(seconds=3))
    a1 = JobFactory(queue_name="a", priority=1, run_after=base + timedelta(seconds=4))
    b5 = JobFactory(queue_name="b", priority=5, run_after=base + timedelta(seconds=5))
    JobFactory(queue_name="d", priority=100)  # not asked for

    claimed = Job.objects.claim("w", queues=["a", "b", "c"], limit=4)

    assert [job.pk for job in claimed] == [b5.pk, a1.pk, a0.pk, c0.pk]
    assert Job.objects.queue_names() == ["b", "d"]  # those left queued


@pytest.mark.django_db
def test_queue_names_lists_the_queues_with_queued_jobs():
    for name in ["b", "a", "b", "c"]:
        JobFactory(queue_name=name)
    JobFactory.in_state(State.SUCCEEDED, queue_name="done")
    assert Job.objects.queue_names() == ["a", "b", "c"]


@pytest.mark.skipif(not POSTGRES, reason="PostgreSQL's index pages")
@pytest.mark.django_db
def test_a_claim_from_one_queue_reads_no_other_queues_backlog():
    """Claim order used to put every queue in one index range: a claim for "emails"
    walked the queued rows of the other queues before it. Now each queue is its own."""
    Job.objects.enqueue_many("tests.tasks.record", [(("x",), {})] * 20_000, priority=50)
    JobFactory(queue_name="emails")

    with CaptureQueriesContext(connection) as queries:
        assert len(Job.objects.claim("w", queues=["emails"])) == 1
    [sql] = [q["sql"] for q in queries if "UPDATE" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        [[plan]] = cursor.fetchone()
    nodes, pages = [plan["Plan"]], 0
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node.get("Index Name") == "jobstate_job_runnable":
            pages += node["Shared Hit Blocks"] + node["Shared Read Blocks"]
    # The 20,000 other rows take ~100 pages of the index; a walk of this queue's range
    # takes a few, more under a loaded CI (17 seen: hint bits, a concurrent autovacuum).
    assert pages < 40


@pytest.mark.skipif(not POSTGRES, reason="LISTEN/NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_an_enqueue_wakes_only_the_workers_of_its_queue():
    stopping = threading.Event()
    emails, every = Waiter(stopping, queues=["emails"]), Waiter(stopping)
    try:
        for waiter in (emails, every):
            waiter._listen()
        record = Job.objects.get(result_id=tasks.record.enqueue("default queue").id)
        started = time.monotonic()
        emails.wait(0.5)
        assert time.monotonic() - started >= 0.45  # slept through another queue's job
        every.wait(5)
        assert every.payloads == [queue_payload("default", 0, record.run_after)]
        run_after = timezone.now() - timedelta(minutes=5)  # a notification says it is due
        email = tasks.email.using(priority=3, run_after=run_after).enqueue("ada@example.com")
        emails.wait(5)
        [payload] = emails.payloads
        assert payload == queue_payload("emails", 3, run_after)
        assert Job.objects.get(result_id=email.id).run_after == run_after
    finally:
        emails.close()
        every.close()
    assert CHANNEL == "django_jobstate"


@pytest.mark.skipif(not POSTGRES, reason="LISTEN/NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_busy_worker_hears_of_a_job_that_sorts_before_its_claim_key():
    stopping = threading.Event()
    waiter = Waiter(stopping, queues=["default", "emails"])
    try:
        waiter.start()
        assert not waiter.ahead(0)  # nothing enqueued
        tasks.record.enqueue("same priority")
        tasks.record.using(priority=-5).enqueue("lower")
        tasks.record.using(queue_name="reports", priority=50).enqueue("another queue's")
        time.sleep(0.2)
        assert not waiter.ahead(0)  # none of those sorts before a key of priority 0
        tasks.email.using(priority=1).enqueue("ada@example.com")
        time.sleep(0.2)
        assert waiter.ahead(0)
        assert not waiter.ahead(0)  # read once
        tasks.record.enqueue("a queue it had not seen")
        time.sleep(0.2)
        assert waiter.ahead(0, queues=["emails"])
    finally:
        waiter.close()


def test_payloads_name_the_queue_priority_and_run_after():
    at = datetime(2026, 12, 3, 14, 0, 5, 900_000, tzinfo=UTC)
    assert queue_payload("emails", -3, at) == "emails -3@1796306405"  # seconds, rounded down
    assert parse_payload(queue_payload("emails", -3, at)) == ("emails", -3, 1796306405)
    assert parse_payload(queue_payload("with space", 2)) == ("with space", 2, -math.inf)
    assert parse_payload(queue_payload("resumed")) == ("resumed", 101, -math.inf)
    # Unknown (a NOTIFY by hand, the mark of version 0.18): any queue, first.
    for unknown in ("garbage", "emails 4+", "emails x@1"):
        assert parse_payload(unknown) == ("", 101, -math.inf)


def db_now():
    """The time by the clock the claim writes started_at with, read after a commit."""
    if not POSTGRES:
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        return cursor.fetchone()[0]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_pause_while_four_workers_drain_stops_that_queue_only_and_survives_a_restart(runjobs):
    sleepy = tasks.sleep_then_record
    # Jobs long enough that "emails" still has some after the restart; few enough that
    # the claims and writes, not the sleeps, stay cheap (CI's time).
    backend().bulk_enqueue(sleepy, [((f"d{n}", 0.05), {}) for n in range(600)])
    backend().bulk_enqueue(
        sleepy.using(queue_name="emails"), [((f"e{n}", 0.05), {}) for n in range(600)]
    )
    proc = runjobs.start("--concurrency", "4")
    default = Job.objects.filter(queue_name="default")
    wait_for(lambda: default.filter(state=State.SUCCEEDED).count() >= 50, timeout=60)

    backend().pause_queue("default", by="test")
    paused_at = db_now()  # after the pause committed
    time.sleep(1.5)
    assert not default.filter(started_at__gt=paused_at).exists()
    emails = Job.objects.filter(queue_name="emails")
    assert emails.filter(started_at__gt=paused_at).exists(), "the other queue stopped too"
    assert not default.filter(state=State.RUNNING).exists()  # the ones in hand finished

    # A restart while paused: still paused.
    runjobs.stop(proc, signal.SIGTERM)
    proc = runjobs.start("--concurrency", "4")
    restarted_at = db_now()
    wait_for(lambda: emails.filter(started_at__gt=restarted_at).exists(), timeout=60)
    assert not default.filter(started_at__gt=paused_at).exists()
    left = default.filter(state=State.QUEUED).count()
    assert left > 0

    backend().resume_queue("default", by="test")
    wait_for(lambda: not Job.objects.live().exists(), timeout=120)
    assert default.filter(state=State.SUCCEEDED).count() == 600
    assert proc.poll() is None


# Which names a pause may name.


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["pause", "resume"])
def test_a_queue_nobody_knows_is_refused_with_the_known_ones(action):
    JobFactory(queue_name="imports")  # no alias lists it, but a job waits in it
    known = "Known queues: default, emails, imports, reports."
    with pytest.raises(CommandError, match=f"No queue is named 'emials'.*{known}"):
        call_command("jobqueues", action, "emials", stdout=io.StringIO())
    with pytest.raises(ValueError, match=f"No queue is named 'emials'.*{known}"):
        getattr(backend(), f"{action}_queue")("emials")
    assert not JobQueue.objects.exists()  # nothing written


@pytest.mark.django_db
def test_a_queue_removed_from_the_settings_stays_pausable_and_resumable():
    job = JobFactory(queue_name="imports")  # queued before "imports" left TASKS' QUEUES
    backend().pause_queue("imports")
    Job.objects.cancel(job)  # its last job is gone: only the pause remains of it
    out = io.StringIO()
    call_command("jobqueues", "resume", "imports", stdout=out)
    assert out.getvalue() == "Queue 'imports' resumed.\n"
    assert not JobQueue.objects.get(name="imports").paused


@pytest.mark.django_db
def test_an_alias_that_lists_no_queues_accepts_any_name():
    tasks = {"default": {"BACKEND": "django_jobstate.backend.JobStateBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks):
        backend().pause_queue("anything")
    assert JobQueue.objects.get(name="anything").paused
