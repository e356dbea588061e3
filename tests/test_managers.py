"""The conditional writes: each move is checked, and a write that lost the race changes nothing."""

import collections
import contextlib
import itertools
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.db.notify import CHANNEL, queue_payload
from django_jobstate.exceptions import LostRace
from django_jobstate.managers import CancelOutcome, claim_key
from django_jobstate.models import Job, JobQueue
from django_jobstate.states import (
    ONLY_AS,
    TRANSITIONS,
    FailureReason,
    InvalidTransition,
    State,
)
from tests import tasks
from tests.conftest import ROOT, skewed_env, subprocess_env
from tests.dbfaults import ends_the_connection
from tests.factories import JobFactory
from tests.models import Execution

pytestmark = pytest.mark.django_db

WRITES = {
    State.SUCCEEDED: lambda job: Job.objects.succeed(job, "ok"),
    State.FAILED: lambda job: Job.objects.fail(job, FailureReason.ERROR, error_message="x"),
}


def snapshot(job):
    return Job.objects.filter(pk=job.pk).values().get()


@pytest.mark.parametrize(("current", "new"), list(itertools.product(State, WRITES)))
def test_outcome_writes_follow_the_table(current, new):
    job = JobFactory.in_state(current)
    before = snapshot(job)
    if new in TRANSITIONS[current] and (current, new) not in ONLY_AS:  # queued: cancel only
        WRITES[new](job)
        assert Job.objects.get(pk=job.pk).state == new
        assert job.state == new
        assert job.finished_at is not None
    else:
        with pytest.raises(InvalidTransition):
            WRITES[new](job)
        assert snapshot(job) == before


@pytest.mark.parametrize("current", list(State))
def test_only_a_queued_job_can_be_claimed(current):
    job = JobFactory.in_state(current)
    before = snapshot(job)
    claimed = Job.objects.claim("w1")
    if current == State.QUEUED:
        assert [j.pk for j in claimed] == [job.pk]
        assert (claimed[0].state, claimed[0].worker_id) == (State.RUNNING, "w1")
        assert claimed[0].started_at is not None
    else:
        assert claimed == []
        assert snapshot(job) == before


@pytest.mark.parametrize("new", list(WRITES))
@pytest.mark.parametrize("moved_to", [State.SUCCEEDED, State.FAILED])
def test_write_that_expects_the_wrong_state_changes_nothing(new, moved_to):
    job = JobFactory(running=True)
    stale = Job.objects.get(pk=job.pk)
    WRITES[moved_to](job)  # another writer gets there first
    before = snapshot(job)
    with pytest.raises(LostRace, match="another writer got there first"):
        WRITES[new](stale)
    assert snapshot(job) == before
    assert not Job.objects.filter(result_id=job.result_id, attempt=2).exists()


def test_write_for_another_workers_attempt_changes_nothing():
    job = JobFactory(running=True, worker_id="w1")
    impostor = Job.objects.get(pk=job.pk)
    impostor.worker_id = "w2"
    with pytest.raises(LostRace, match="for worker w2"):
        Job.objects.succeed(impostor, "mine")
    assert snapshot(job)["state"] == State.RUNNING


def test_claim_takes_priority_then_age_and_respects_limit_queues_and_run_after():
    now = timezone.now()
    old_low = JobFactory(priority=0, run_after=now - timedelta(minutes=5))
    new_low = JobFactory(priority=0, run_after=now - timedelta(minutes=1))
    high = JobFactory(priority=50)
    JobFactory(priority=100, run_after=now + timedelta(hours=1))  # not yet runnable
    other_queue = JobFactory(priority=90, queue_name="emails")

    assert Job.objects.claim("w", queues=["default"], limit=2) == [high, old_low]
    assert Job.objects.claim("w", queues=["default"], limit=5) == [new_low]
    assert Job.objects.claim("w", queues=[]) == []
    assert Job.objects.claim("w") == [other_queue]
    assert Job.objects.claim("w") == []
    assert Job.objects.queued().count() == 1


def test_claim_from_a_key_skips_what_claim_order_puts_before_it():
    now = timezone.now()
    first, second, third = (JobFactory(run_after=now - timedelta(minutes=m)) for m in (3, 2, 1))
    high = JobFactory(priority=10)

    assert Job.objects.claim("w", limit=9, from_key=claim_key(second)) == [second, third]
    assert Job.objects.claim("w", limit=9, from_key=claim_key(second)) == []
    assert Job.objects.claim("w", limit=9) == [high, first]


def test_a_claimed_job_is_its_row_as_the_orm_reads_it():
    JobFactory(args=[1, {"a": [2]}], kwargs={"k": "v"}, metadata={"m": 1})
    JobFactory(args=[], kwargs={}, metadata={})  # read without decoding (claim._json_value)
    JobFactory(args=[], kwargs={}, metadata={})

    claimed = Job.objects.claim("w", limit=3)

    for job in claimed:
        read = Job.objects.get(pk=job.pk)
        assert {k: v for k, v in vars(job).items() if k != "_state"} == {
            k: v for k, v in vars(read).items() if k != "_state"
        }
        assert (job._state.adding, job._state.db) == (False, read._state.db)
    assert claimed[1].kwargs is not claimed[2].kwargs  # each its own
    claimed[0].save(update_fields=["metadata"])  # an instance the ORM can write


def test_a_post_init_receiver_of_job_sees_each_claimed_job():
    jobs = [JobFactory(), JobFactory()]
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_init.connect(receiver, sender=Job)
    try:
        claimed = Job.objects.claim("w", limit=2)
    finally:
        post_init.disconnect(receiver, sender=Job)

    assert sorted(seen) == sorted(j.pk for j in jobs) == sorted(j.pk for j in claimed)


@pytest.mark.parametrize(("worker_id", "limit"), [("", 1), ("w", 0), ("w", -3)])
def test_claim_rejects_bad_arguments(worker_id, limit):
    JobFactory()
    with pytest.raises(ValueError, match="claim"):
        Job.objects.claim(worker_id, limit=limit)
    assert Job.objects.queued().count() == 1


def test_fail_creates_the_next_attempt_in_the_same_transaction():
    job = JobFactory(running=True, max_attempts=3, backoff=10)
    before = timezone.now()
    retry = Job.objects.fail(job, FailureReason.ERROR, error_class="builtins.ValueError")
    assert retry is not None
    assert (retry.state, retry.attempt, retry.previous_id) == (State.QUEUED, 2, job.pk)
    assert retry.result_id == job.result_id
    # Backoff for the second attempt: 10 s, jittered down to no less than half.
    earliest, latest = before + timedelta(seconds=5), timezone.now() + timedelta(seconds=10)
    assert earliest <= retry.run_after <= latest
    assert Job.objects.get(pk=job.pk).state == State.FAILED


def test_last_attempt_fails_for_good():
    job = JobFactory(running=True, attempt=2, max_attempts=2)
    assert Job.objects.fail(job, FailureReason.ERROR) is None
    assert Job.objects.filter(result_id=job.result_id).count() == 1


def test_a_failed_attempt_is_retried_once():
    job = JobFactory(failed=True)
    retry = Job.objects.retry(job)
    assert retry.attempt == 2
    with pytest.raises(LostRace, match="already has a next attempt"):
        Job.objects.retry(job)
    assert Job.objects.filter(result_id=job.result_id).count() == 2
    with pytest.raises(LostRace, match="Only a failed attempt"):
        Job.objects.retry(retry)


def test_a_retried_unique_attempt_whose_key_another_task_holds_now_is_already_retried():
    """Found by the state machine (tests/test_stateful.py): the second retry of an attempt
    whose next attempt failed too, while a newer task holds the key. The INSERT breaks both
    the one-row-per-attempt and the unique key constraints; which one the database names is
    its choice (SQLite: the key's), but what the caller must hear is that it was retried."""
    first = JobFactory(failed=True, unique_key="k", unique_scope="live")
    second = Job.objects.retry(first)
    assert Job.objects.cancel(second) == CancelOutcome.CANCELLED
    holder = JobFactory(unique_key="k", unique_scope="live")  # another task, queued
    with pytest.raises(LostRace, match=f"Job {first.pk} already has a next attempt"):
        Job.objects.retry(first)
    assert Job.objects.filter(unique_key="k").count() == 3
    assert Job.objects.get(pk=holder.pk).state == State.QUEUED


def old_failure() -> Job:
    """A failed first attempt of a task that allows a second, finished 30 days ago."""
    at = timezone.now() - timedelta(days=30)
    return JobFactory(failed=True, max_attempts=2, started_at=at, finished_at=at)


def test_retrying_an_attempt_pruned_meanwhile_is_a_lost_race():
    job = old_failure()
    assert Job.objects.prune(timedelta(days=7)) == 1

    with pytest.raises(LostRace, match=rf"Job {job.pk} was deleted \(pruned\) before"):
        Job.objects.retry(job)  # `job` as read before the prune, like the admin's action

    assert not Job.objects.exists()


def race_retry_and_prune(failed: Job, first: str | None = None) -> str:
    """Retry `failed` and prune in two threads, each with its own connection; say what won.

    `first` ("retry" or "prune") holds that side's transaction open, its writes made, until
    the other side has begun: the overlap a loaded machine makes rare. Without it, a random
    delay decides which side starts first, and the retry's transaction stays open a while
    after its INSERT.
    """
    barrier, errors = threading.Barrier(2), []
    retry_first = random.random() < 0.5 if first is None else first == "retry"

    def retry() -> None:
        try:
            connection.ensure_connection()  # this thread's own, connected before the race
            with transaction.atomic():
                if not retry_first:
                    barrier.wait(timeout=10)
                    time.sleep(random.uniform(0, 0.01) if first is None else 0)
                Job.objects.retry(failed)
                if retry_first:
                    barrier.wait(timeout=10)
                # Commits while the prune runs, or not; held open when it must go first.
                time.sleep(random.uniform(0, 0.01) if first is None else 0.2)
        except LostRace:
            pass  # its predecessor was pruned first: a clean refusal
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def prune() -> None:
        try:
            connection.ensure_connection()
            if first == "prune":
                with transaction.atomic():  # its deletes stay uncommitted while the retry runs
                    Job.objects.prune(timedelta(days=7))
                    barrier.wait(timeout=10)
                    time.sleep(0.2)
                return
            barrier.wait(timeout=10)
            time.sleep(random.uniform(0, 0.003))
            Job.objects.prune(timedelta(days=7))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=retry), threading.Thread(target=prune)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if errors:
        return f"error: {errors[0]!r}"
    rows = list(Job.objects.filter(result_id=failed.result_id).values_list("pk", "previous"))
    if rows == []:
        return "pruned, retry refused"
    head, *later = sorted(rows)
    if head == (failed.pk, None) and [previous for _, previous in later] == [failed.pk]:
        return "retried, prune skipped it"
    return f"broken: {rows}"


RETRY_PRUNE_OUTCOMES = {"retry": "retried, prune skipped it", "prune": "pruned, retry refused"}


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite runs one writer at a time: a retry and a prune cannot overlap",
)
@pytest.mark.django_db(transaction=True)  # each thread commits on its own connection
@pytest.mark.parametrize("first", ["retry", "prune"])
def test_a_retry_and_a_prune_that_overlap_keep_the_side_that_went_first(first):
    for _round in range(3):
        assert race_retry_and_prune(old_failure(), first) == RETRY_PRUNE_OUTCOMES[first]


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite runs one writer at a time: a retry and a prune cannot overlap",
)
@pytest.mark.django_db(transaction=True)
def test_a_retry_racing_a_prune_never_survives_its_deleted_predecessor():
    # Either side may win (a loaded machine can let one win every round: the test above
    # makes each order happen); no round may leave a retry without its predecessor.
    outcomes = collections.Counter(race_retry_and_prune(old_failure()) for _ in range(100))
    assert set(outcomes) <= set(RETRY_PRUNE_OUTCOMES.values()), outcomes


def test_cancel_fails_a_queued_attempt_as_cancelled_and_keeps_it():
    queued = JobFactory(max_attempts=3)
    assert Job.objects.cancel(queued) == CancelOutcome.CANCELLED
    row = Job.objects.get(pk=queued.pk)
    assert (row.state, row.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
    assert (row.started_at, row.worker_id) == (None, None)  # never started
    assert row.finished_at is not None
    assert row.cancel_requested_at is not None
    assert row.error_class == "django_jobstate.exceptions.JobCancelled"
    assert Job.objects.filter(result_id=queued.result_id).count() == 1  # never retried


@pytest.mark.skipif(connection.vendor != "postgresql", reason="ends a PostgreSQL backend")
@pytest.mark.django_db(transaction=True)
def test_a_cancel_cut_off_after_its_update_changed_nothing_and_can_be_made_again():
    queued = JobFactory()
    # The server goes away after the UPDATE, before the cancel has read the row back: the
    # caller gets the error, and the row and `queued` both still say queued.
    ends = ends_the_connection("after", 'UPDATE "django_jobstate_job"', FailureReason.CANCELLED)
    with connection.execute_wrapper(ends), pytest.raises(OperationalError):
        Job.objects.cancel(queued)
    assert queued.state == Job.objects.get(pk=queued.pk).state == State.QUEUED

    assert Job.objects.cancel(queued) == CancelOutcome.CANCELLED


def test_cancel_asks_a_running_attempt_to_stop_and_leaves_a_finished_one():
    running, done = JobFactory(running=True), JobFactory.in_state(State.SUCCEEDED)
    before = snapshot(done)
    assert Job.objects.cancel(running) == CancelOutcome.REQUESTED
    row = Job.objects.get(pk=running.pk)
    assert (row.state, row.failure_reason) == (State.RUNNING, "")
    first_request = row.cancel_requested_at
    assert first_request is not None
    assert Job.objects.cancel(row) == CancelOutcome.REQUESTED  # again: the first time stays
    assert Job.objects.get(pk=running.pk).cancel_requested_at == first_request
    assert Job.objects.cancel(done) == CancelOutcome.FINISHED
    assert snapshot(done) == before


def test_a_cancel_that_loses_to_a_claim_asks_the_claimed_attempt_to_stop():
    job = JobFactory()
    stale = Job.objects.get(pk=job.pk)
    [claimed] = Job.objects.claim("w")  # the claim wins the race
    assert Job.objects.cancel(stale) == CancelOutcome.REQUESTED
    row = Job.objects.get(pk=claimed.pk)
    assert (row.state, row.worker_id) == (State.RUNNING, "w")
    assert row.cancel_requested_at is not None


@pytest.mark.parametrize(
    "reason",
    [FailureReason.ERROR, FailureReason.TIMEOUT, FailureReason.LOST, FailureReason.RELEASED],
)
def test_whatever_ends_a_cancelled_running_attempt_it_fails_as_cancelled_and_is_not_retried(
    reason,
):
    job = JobFactory(running=True, max_attempts=5)
    stale = Job.objects.get(pk=job.pk)  # read before the request, as a worker holds it
    Job.objects.cancel(job)
    assert Job.objects.fail(stale, reason, error_message="x") is None  # no next attempt
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
    assert Job.objects.filter(result_id=job.result_id).count() == 1


def test_a_cancelled_running_attempt_that_returns_succeeds():
    job = JobFactory(running=True)
    stale = Job.objects.get(pk=job.pk)
    Job.objects.cancel(job)
    assert Job.objects.succeed_many(job.worker_id, [(stale, "done")]) == {job.pk}
    assert Job.objects.get(pk=job.pk).state == State.SUCCEEDED


def test_cancel_task_cancels_a_waiting_retry():
    failed = JobFactory.in_state(State.FAILED, max_attempts=3)
    retry = Job.objects.retry(failed, delay=600)
    assert Job.objects.cancel_task(failed.result_id) == CancelOutcome.CANCELLED
    row = Job.objects.get(pk=retry.pk)
    assert (row.state, row.failure_reason) == (State.FAILED, FailureReason.CANCELLED)
    assert Job.objects.cancel_task(failed.result_id) == CancelOutcome.FINISHED
    with pytest.raises(Job.DoesNotExist):
        Job.objects.cancel_task(uuid.uuid4())


@pytest.mark.parametrize(
    "values",
    [
        {"state": State.FAILED, "failure_reason": FailureReason.ERROR},  # not as cancelled
        {"state": State.FAILED, "failure_reason": FailureReason.CANCELLED},  # no request
        {"cancel_requested_at": timezone.now()},  # a queued row has no request
    ],
)
def test_the_database_refuses_what_a_cancel_may_not_write(values):
    job = JobFactory()
    values = {"finished_at": timezone.now(), **values}
    if values.get("state") != State.FAILED:
        values.pop("finished_at")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(**values)


def explained_claim(**claim) -> list[dict]:
    """Claim one job; return the nodes of its plan, as EXPLAIN ANALYZE ran it again."""
    with CaptureQueriesContext(connection) as queries:
        assert len(Job.objects.claim("w", **claim)) == 1
    [sql] = [query["sql"] for query in queries if "UPDATE" in query["sql"]]  # not queue_names()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        [[plan]] = cursor.fetchone()
    nodes, found = [plan["Plan"]], []
    while nodes:
        found.append(node := nodes.pop())
        nodes.extend(node.get("Plans", []))
    return found


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's dead index entries")
def test_a_claim_from_a_key_does_not_walk_the_index_entries_of_claimed_rows():
    """Until VACUUM, the runnable index keeps an entry for every row claimed since; they
    sit at the head of claim order, so a claim from the head walks them all."""
    Job.objects.enqueue_many("tests.tasks.record", [(("x",), {})] * 12_000)
    claimed = []
    while batch := Job.objects.claim("w", limit=1000):
        claimed.extend(batch)
    # After the key in claim order whatever the clock did: same run_after, higher ids.
    JobFactory.create_batch(3, run_after=claimed[-1].run_after)
    # Both claims walk the runnable index, whatever statistics the tests before this one
    # left the planner (in CI it once took another path: 0 pages of the index, no premise).
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")

    def index_pages(**claim):
        return sum(
            node["Shared Hit Blocks"] + node["Shared Read Blocks"]
            for node in explained_claim(**claim)
            if node.get("Index Name") == "jobstate_job_runnable"
        )

    assert index_pages(from_key=claim_key(claimed[-1])) < 10
    # The test's premise: from the head, the 12,000 dead entries take ~60 pages. Unless the
    # planner took another index for that claim (seen under a loaded CI): nothing to compare.
    head = index_pages()
    assert head == 0 or head > 30, head


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_statistics_taken_on_an_empty_queue_do_not_mislead_the_claim():
    """ANALYZE while nothing is queued; then a backlog: the candidates must still come from
    the runnable index, in order, and the update must find each by its id."""
    Job.objects.enqueue_many("tests.tasks.record", [(("x",), {})] * 2_000)
    while batch := Job.objects.claim("w", limit=1000):
        Job.objects.succeed_many("w", [(job, None) for job in batch])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    Job.objects.enqueue_many("tests.tasks.record", [(("x",), {})] * 5_000)

    scans = {
        (node["Node Type"], node.get("Index Name"), node.get("Alias"))
        for node in explained_claim(limit=1)
        if "Scan" in node["Node Type"]
        and node["Node Type"] != "CTE Scan"
        and node.get("Alias") != JobQueue._meta.db_table  # the pause test, once per claim
    }
    table = Job._meta.db_table
    assert scans == {
        ("Index Scan", "jobstate_job_runnable", f"{table}_1"),  # the candidates
        ("Index Scan", f"{table}_pkey", table),  # the update
    }


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_a_batch_of_successes_finds_its_rows_by_id_whatever_the_statistics():
    """ANALYZE a fresh backlog (no row has a worker yet), claim a batch, write its
    successes: the planner took the worker's rows for one and, on a table of thousands of
    rows, read all of it for each batch rather than its id index (3.5 ms against 1.6 at
    10,000 rows)."""
    Job.objects.enqueue_many("tests.tasks.record", [(("x",), {})] * 10_000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    batch = Job.objects.claim("w", limit=50)
    with CaptureQueriesContext(connection) as queries:
        assert len(Job.objects.succeed_many("w", [(job, None) for job in batch])) == 50
    [sql] = [query["sql"] for query in queries if "UPDATE" in query["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        [[plan]] = cursor.fetchone()
    nodes, scans = [plan["Plan"]], set()
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if "Scan" in node["Node Type"] and node.get("Relation Name") == Job._meta.db_table:
            scans.add((node["Node Type"], node.get("Index Name")))
    assert scans == {("Index Scan", f"{Job._meta.db_table}_pkey")}


def test_enqueue_sends_only_what_differs_from_the_database_defaults():
    with CaptureQueriesContext(connection) as queries:
        plain = Job.objects.enqueue("tests.tasks.record", ["x"])
    [insert] = [q["sql"] for q in queries if "INSERT" in q["sql"]]
    columns = insert.partition(" VALUES ")[0]
    assert "traceback" not in columns
    assert "priority" not in columns
    other = Job.objects.enqueue(
        "tests.tasks.record", [], {"a": 1}, priority=5, queue_name="q", max_attempts=3, backoff=2
    )

    rows = Job.objects.in_bulk([plain.pk, other.pk])
    for job in (plain, other):
        row = rows[job.pk]
        for field in Job._meta.concrete_fields:
            assert getattr(row, field.attname) == getattr(job, field.attname), field.name
    assert (rows[plain.pk].state, rows[plain.pk].attempt, rows[plain.pk].priority) == (
        "queued",
        1,
        0,
    )
    assert (rows[other.pk].priority, rows[other.pk].queue_name, rows[other.pk].backoff) == (
        5,
        "q",
        2,
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("write", "wakes"),
    [
        ("enqueue", True),
        ("enqueue_many", True),
        ("enqueue, rolled back", False),
        ("retry due now", True),
        ("retry due later", False),
    ],
)
def test_writes_that_make_a_job_runnable_now_wake_listening_workers(write, wakes):
    failed = JobFactory.in_state(State.FAILED, max_attempts=2)
    listener = connection.get_new_connection(connection.get_connection_params())
    listener.autocommit = True
    listener.execute(f'LISTEN "{CHANNEL}"')
    try:
        if write == "enqueue":
            Job.objects.enqueue("tests.tasks.record", ["x"])
        elif write == "enqueue_many":  # on PostgreSQL's pipelined path: once per statement
            [job, *_] = Job.objects.enqueue_many(
                "tests.tasks.record", [(["x"], {})] * 3, priority=7
            )
        elif write == "enqueue, rolled back":
            with contextlib.suppress(ZeroDivisionError), transaction.atomic():
                Job.objects.enqueue("tests.tasks.record", ["x"])
                1 / 0  # noqa: B018
        else:
            later = timezone.now() + timedelta(minutes=1) if write.endswith("later") else None
            Job.objects.retry(failed, run_after=later)
        woken = list(listener.notifies(timeout=1, stop_after=1))
    finally:
        listener.close()
    assert bool(woken) is wakes
    if write == "enqueue_many":
        assert woken[0].payload == queue_payload("default", 7, job.run_after)


def test_result_ids_are_time_ordered_uuids():
    first = Job.objects.enqueue("tests.tasks.record", ["x"])
    time.sleep(0.002)  # the order is by millisecond
    later = Job.objects.enqueue_many("tests.tasks.record", [(["y"], {})] * 50)

    assert {job.result_id.version for job in [first, *later]} == {7}
    assert {job.result_id.variant for job in [first, *later]} == {uuid.RFC_4122}
    assert all(first.result_id < job.result_id for job in later)
    assert [job.result_id for job in later] == sorted(job.result_id for job in later)
    assert len({job.result_id for job in later}) == 50


# Clocks. On PostgreSQL every time the claim compares comes from the database clock, so a
# process whose clock is off changes nothing; the tests skew a real subprocess's clock
# (tests/clock_skew/sitecustomize.py). SQLite is one machine with one clock (the app's):
# there, only the unskewed case applies.
SKEWS = [0] + ([-3600, 3600] if connection.vendor == "postgresql" else [])

ENQUEUE = """
import json
from django_jobstate.tasksapi import task_backends
from tests import tasks
one = tasks.record.enqueue("one")
many = task_backends["default"].bulk_enqueue(tasks.record, [(["two"], {}), (["three"], {})])
print(json.dumps([[r.id, r.enqueued_at.isoformat()] for r in [one, *many]]))
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("skew", SKEWS)
def test_a_retry_waits_its_backoff_whatever_the_worker_clock(runjobs, skew):
    tasks.fails_with_a_long_backoff.enqueue("retried later")

    done = runjobs.run("--burst", **skewed_env(skew))

    assert done.returncode == 0, done.stdout
    first, retry = Job.objects.order_by("attempt")
    assert (first.state, retry.state) == (State.FAILED, State.QUEUED)  # not run at once
    wait = (retry.run_after - first.finished_at).total_seconds()
    assert 300 - 1 <= wait <= 600 + 1  # backoff 600, jittered to half of it at least
    assert abs((retry.enqueued_at - first.finished_at).total_seconds()) < 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("skew", SKEWS)
def test_a_job_enqueued_by_a_process_with_any_clock_runs_at_once(runjobs, skew):
    enqueuer = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", ENQUEUE],
        cwd=ROOT,
        env=subprocess_env(**skewed_env(skew)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert enqueuer.returncode == 0, enqueuer.stderr
    printed = json.loads(enqueuer.stdout.splitlines()[-1])  # after shell's own output
    returned = {id: datetime.fromisoformat(at) for id, at in printed}
    stored = {str(job.result_id): job for job in Job.objects.all()}

    # The TaskResults carry the times stored, and those are the database's "now".
    assert returned == {id: job.enqueued_at for id, job in stored.items()}
    for job in stored.values():
        assert job.run_after == job.enqueued_at
        assert abs(job.enqueued_at - timezone.now()) < timedelta(seconds=30)
    done = runjobs.run("--burst")
    assert done.returncode == 0, done.stdout
    assert sorted(Execution.objects.values_list("label", flat=True)) == ["one", "three", "two"]


def test_enqueue_returns_the_times_it_stored():
    explicit = timezone.now() + timedelta(hours=1)
    jobs = [
        Job.objects.enqueue("tests.tasks.record", ["x"]),
        *Job.objects.enqueue_many("tests.tasks.record", [(["y"], {})] * 2),
        Job.objects.enqueue("tests.tasks.record", ["z"], run_after=explicit),
    ]
    stored = Job.objects.in_bulk([job.pk for job in jobs])

    for job in jobs:
        assert (job.run_after, job.enqueued_at) == (
            stored[job.pk].run_after,
            stored[job.pk].enqueued_at,
        )
    assert jobs[-1].run_after == explicit  # an explicit run_after stays as given


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", ["claim", "succeed_many"])
def test_a_write_that_waited_for_sqlites_lock_stamps_a_time_after_the_wait(write):
    """SQLite: the clock is read once the write lock is held, not before waiting for it."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock; PostgreSQL reads its own clock")
    job = JobFactory(run_after=timezone.now() - timedelta(minutes=1))
    if write == "succeed_many":
        [job] = Job.objects.claim("w1")
    holding, released = threading.Event(), []

    def hold_the_write_lock():  # a thread: Django gives it a connection of its own
        try:
            with transaction.atomic(), connection.cursor() as cursor:  # BEGIN IMMEDIATE
                cursor.execute("UPDATE django_jobstate_jobqueue SET name = name")
                holding.set()
                time.sleep(1)
                released.append(timezone.now())
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_write_lock)
    holder.start()
    assert holding.wait(10)
    if write == "claim":
        [claimed] = Job.objects.claim("w1")
        stamped = claimed.started_at
    else:
        assert Job.objects.succeed_many("w1", [(job, "ok")]) == {job.pk}
        stamped = Job.objects.get(pk=job.pk).finished_at
    holder.join()
    assert stamped >= released[0]


def test_succeed_many_writes_each_return_value_as_given():
    """A batch's return values reach their rows unchanged, whatever JSON they hold: quotes,
    backslashes, braces and commas (PostgreSQL takes them as an array literal), a JSON null
    and the string "null", non-ASCII text."""
    values = [
        None,
        "null",
        'a "quoted", {braced} \\ value',
        {"nested": [1, 2.5, {"x": None}], "é": "ü\n"},
        [],
        "",
        12345678901234,
    ]
    jobs = [JobFactory(running=True) for _ in values]
    written = Job.objects.succeed_many("factory-worker", list(zip(jobs, values, strict=True)))
    assert written == {job.pk for job in jobs}
    for job, value in zip(jobs, values, strict=True):
        row = Job.objects.get(pk=job.pk)
        assert (row.state, row.return_value) == (State.SUCCEEDED, value)
