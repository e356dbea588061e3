"""Concurrency limits: slots per task or key, handed out at enqueue and at finish, and
refused by the database when over the limit (limits.py, managers/limits.py)."""

import io
import threading

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.backend import JobStateBackend
from django_jobstate.exceptions import WorkerLost
from django_jobstate.limits.concurrency import Hold, concurrency_key
from django_jobstate.models import Job
from django_jobstate.runner.stuck import Concern, stuck, why_stuck
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import InvalidTask, task
from tests.limit_tasks import (
    one_per_customer,
    three_at_once,
    two_per_customer,
    unique_one_per_customer,
    unlimited,
)
from tests.plans import analyze_job_table, finished_history, job_table_reads
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

backend = JobStateBackend("default", {})


def row(result):
    return Job.objects.filter(result_id=result.id).order_by("attempt").last()


def slots(*results):
    """Each task's newest attempt: its slot, or "held"."""
    return [
        "held" if job.hold == Hold.LIMIT else job.concurrency_slot
        for job in (row(r) for r in results)
    ]


def claim_all(worker="w"):
    return Job.objects.claim(worker, limit=100)


# The options


def plain(customer: int, note: str = "") -> None:
    """Made a task only by the tests below (a task function must be at module level)."""


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency of task .* must be a whole number from 1"),
        ({"concurrency": 1.5}, "must be a whole number"),
        ({"concurrency": True}, "must be a whole number"),
        ({"concurrency": 1, "concurrency_key": ["client"]}, r"names 'client', which is not a"),
        ({"concurrency": 1, "concurrency_key": "customer"}, "must be a non-empty list"),
        ({"concurrency_key": ["customer"]}, "needs concurrency=N too"),
    ],
)
def test_bad_options_are_refused_at_import(options, message):
    with pytest.raises(InvalidTask, match=message):
        task(**options)(plain)


def test_bad_options_in_the_setting_are_check_errors():
    path = "tests.limit_tasks.unlimited"
    with override_settings(
        JOBSTATE_TASK_OPTIONS={path: {"concurrency": 1, "concurrency_key": ["nope"]}}
    ):
        errors = [m.msg for m in run_checks() if m.id == "django_jobstate.E015"]
    assert any("names 'nope', which is not a parameter" in e for e in errors), errors


def test_the_setting_limits_a_task_you_do_not_own():
    options = {"concurrency": 1, "concurrency_key": ["label"]}
    with override_settings(JOBSTATE_TASK_OPTIONS={"tests.limit_tasks.unlimited": options}):
        results = [unlimited.enqueue(label) for label in ("a", "a", "b")]
    assert slots(*results) == [1, "held", 1]


def test_the_key_is_the_task_and_the_named_arguments_with_defaults():
    key = concurrency_key(one_per_customer, [1, "a"], {})
    assert key == concurrency_key(one_per_customer, [], {"customer": 1, "label": "b"})
    assert key != concurrency_key(one_per_customer, [2, "a"], {})
    assert concurrency_key(three_at_once, ["a"], {}) == concurrency_key(three_at_once, ["b"], {})


# Enqueue and finish


def test_an_enqueue_takes_the_lowest_free_slot_or_is_held():
    first = one_per_customer.enqueue(1, "a")
    second = one_per_customer.enqueue(1, "b")
    other = one_per_customer.enqueue(2, "c")
    assert slots(first, second, other) == [1, "held", 1]
    assert {str(j.result_id) for j in claim_all()} == {first.id, other.id}  # never the held one
    assert not Job.objects.runnable().exists()


def test_a_finish_hands_the_slot_to_the_oldest_held_job_of_the_key():
    results = [one_per_customer.enqueue(1, str(i)) for i in range(3)]
    [job] = claim_all()
    Job.objects.succeed(job, "0")
    assert slots(*results) == [1, 1, "held"]
    [job] = claim_all()
    assert str(job.result_id) == results[1].id
    Job.objects.fail(job, FailureReason.ERROR)
    assert slots(*results) == [1, 1, 1]


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the file, not a row")
def test_a_success_handing_its_slot_to_a_locked_row_holds_back_no_other_success():
    """A worker's batch: a limited job's success hands its slot to the next held job of its
    key, which an application transaction holds FOR UPDATE, so it waits; the unlimited
    success beside it is written at once (a torture run saw it wait 6 s behind the lock)."""
    limited, held = (one_per_customer.enqueue(1, label) for label in ("first", "held"))
    free = unlimited.enqueue("free")
    jobs = {str(job.result_id): job for job in claim_all()}
    outcomes = [(jobs[limited.id], "one"), (jobs[free.id], "free")]
    written: list[object] = []

    def succeed() -> None:
        try:
            written.append(Job.objects.succeed_many("w", outcomes))
        finally:
            connection.close()

    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=row(held).pk).get()
        thread = threading.Thread(target=succeed)
        thread.start()
        try:
            wait_for(lambda: row(free).state == State.SUCCEEDED, "the unlimited success", 10)
            assert row(limited).state == State.RUNNING  # still waiting for the held row
        finally:
            transaction.set_rollback(True)  # nothing written here: the lock goes
    thread.join(60)
    assert written == [{jobs[limited.id].pk, jobs[free.id].pk}]
    assert slots(limited, held, free) == [1, 1, None]


def test_a_per_task_limit_and_bulk_enqueue():
    results = backend.bulk_enqueue(three_at_once, [((str(i),), {}) for i in range(5)])
    assert slots(*results) == [1, 2, 3, "held", "held"]
    jobs = claim_all()
    assert len(jobs) == 3
    assert Job.objects.succeed_many("w", [(jobs[0], None), (jobs[2], None)]) == {
        jobs[0].pk,
        jobs[2].pk,
    }
    assert slots(*results)[3:] == [1, 3]


def test_a_bulk_enqueue_over_keys_holds_per_key():
    calls = [((c, str(i)), {}) for i in range(3) for c in (1, 2)]
    results = backend.bulk_enqueue(two_per_customer, calls)
    assert slots(*results) == [1, 1, 2, 2, "held", "held"]


def test_a_unique_limited_task_deduplicates_then_limits():
    first = unique_one_per_customer.enqueue(1, "a")
    again = unique_one_per_customer.enqueue(1, "a")  # the same call: nothing written
    other = unique_one_per_customer.enqueue(1, "b")
    assert again.id == first.id
    assert Job.objects.count() == 2
    assert slots(first, other) == [1, "held"]
    results = backend.bulk_enqueue(
        unique_one_per_customer, [((2, "c"), {}), ((2, "c"), {}), ((1, "b"), {})]
    )
    assert [r.id for r in results][1:] == [results[0].id, other.id]
    assert slots(results[0]) == [1]


def test_unlimited_rows_in_a_batch_write_as_before():
    limited, free = three_at_once.enqueue("a"), unlimited.enqueue("b")
    jobs = claim_all()
    assert Job.objects.succeed_many("w", [(j, None) for j in jobs]) == {j.pk for j in jobs}
    assert {row(r).state for r in (limited, free)} == {State.SUCCEEDED}


def test_a_retry_enters_through_the_gate():
    first = two_per_customer.enqueue(1, "a")
    others = [two_per_customer.enqueue(1, x) for x in "bc"]
    job = next(j for j in claim_all() if str(j.result_id) == first.id)
    Job.objects.fail(job, FailureReason.ERROR)  # max_attempts 2: retried
    retry = row(first)
    assert retry.attempt == 2
    # The freed slot went to the oldest held job; the retry waits behind it.
    assert slots(*others) == [2, 1]
    assert retry.hold == Hold.LIMIT


def test_a_rescue_frees_the_slot_and_a_cancel_of_a_held_job_takes_none():
    results = [one_per_customer.enqueue(1, x) for x in "abc"]
    [job] = claim_all()
    backend.cancel(results[1].id)  # held: cancelled in place
    assert row(results[1]).state == State.FAILED
    assert slots(results[2]) == ["held"]
    Job.objects.fail_running(job.worker_id, FailureReason.LOST, WorkerLost("gone"))
    assert slots(results[2]) == [1]


def test_the_sweep_releases_held_jobs_of_keys_with_a_free_slot_only():
    full = [two_per_customer.enqueue(1, x) for x in "abc"]  # two run, one waits
    free = [two_per_customer.enqueue(2, x) for x in "abc"]
    # As if a crash had left key 2 with a slot free and its jobs held (no code path does).
    Job.objects.filter(result_id=free[1].id).update(hold=Hold.LIMIT, concurrency_slot=None)
    assert slots(*free) == [1, "held", "held"]
    assert Job.objects.release_held() == 1
    assert slots(*free) == [1, 2, "held"]
    assert slots(*full) == [1, 2, "held"]
    assert Job.objects.release_held() == 0


# The database refuses over-concurrency by itself


def test_the_database_refuses_a_second_holder_of_a_slot():
    one_per_customer.enqueue(1, "a")
    held = row(one_per_customer.enqueue(1, "b"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=held.pk).update(hold=None, concurrency_slot=1)


@pytest.mark.parametrize(
    "values",
    [
        {"hold": None, "concurrency_slot": 2},  # above the limit
        {"hold": None, "concurrency_slot": None},  # running: neither held nor holding a slot
        {"hold": None, "concurrency_slot": None, "state": State.QUEUED},  # queued: neither
        {"hold": Hold.LIMIT, "concurrency_slot": 1},  # both
        {"concurrency_limit": None},
    ],
)
def test_the_database_refuses_rows_that_break_the_slot_rules(values):
    job = row(one_per_customer.enqueue(1, "a"))
    if values == {"hold": None, "concurrency_slot": None}:  # on a running row
        job = claim_all()[0]  # a running row must hold a slot
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(**values)


# Reports


def test_jobstats_says_held_jobs_wait_for_a_slot():
    one_per_customer.enqueue(1, "a")
    one_per_customer.enqueue(1, "b")
    out = io.StringIO()
    call_command("jobstats", stdout=out)
    assert (
        "1 jobs of tests.limit_tasks.one_per_customer wait for a slot of its concurrency "
        "limit (1 at once)" in out.getvalue()
    )
    stats = Job.objects.stats(3.0)
    assert stats["held_by_limits"] == [
        {"task": "tests.limit_tasks.one_per_customer", "limit": 1, "held": 1}
    ]


def test_the_admin_says_a_held_job_waits_for_a_slot_not_that_it_is_stuck(admin_client):
    one_per_customer.enqueue(1, "a")
    held = row(one_per_customer.enqueue(1, "b"))
    response = admin_client.get(reverse("admin:django_jobstate_job_changelist"))
    assert "waits for a slot (limit 1)" in response.content.decode()
    page = admin_client.get(reverse("admin:django_jobstate_job_change", args=[held.pk]))
    assert "waits for a slot (limit 1)" in page.content.decode()
    assert why_stuck(held) == []
    assert not Job.objects.filter(stuck(Concern.QUEUE_PAUSED)).exists()


def test_handing_out_slots_reads_indexes_never_the_history():
    finished_history(5000)
    one_per_customer.enqueue(1, "a")
    for x in "bcd":
        one_per_customer.enqueue(1, x)  # held
    key = row(one_per_customer.enqueue(2, "e")).concurrency_key
    # The history is of the same keys (slots are kept on finished rows).
    Job.objects.filter(state=State.SUCCEEDED).update(
        concurrency_key=key, concurrency_limit=1, concurrency_slot=1
    )
    held = Job.objects.filter(concurrency_key=key, state=State.QUEUED)
    held.update(hold=Hold.LIMIT, concurrency_slot=None)  # as if a crash left it held
    analyze_job_table()
    with CaptureQueriesContext(connection) as captured:
        assert Job.objects.release_held() == 1
    # No walk of the table (SQLite: a SCAN without an index) or of a whole index (MySQL).
    table = connection.ops.quote_name(Job._meta.db_table)
    reads = [q["sql"] for q in captured if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))]
    reads = [sql for sql in reads if table in sql]  # not the key's lock
    assert reads
    for sql in reads:
        found = job_table_reads(sql)
        assert found, sql
        walks = {(how, None) for how, _index in found if how in ("ALL", "index", "Seq Scan")}
        walks |= {read for read in found if read == ("SCAN", None)}
        assert not walks, (found, sql)


def enqueue_and_close():
    one_per_customer.enqueue(5, "elsewhere")
    connection.close()


def enqueue_after_an_older_snapshot() -> None:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        Job.objects.exists()  # the snapshot is taken here
        other = threading.Thread(target=enqueue_and_close)
        other.start()
        other.join(30)
        one_per_customer.enqueue(5, "here")


def test_repeatable_read_says_what_to_do():
    """A caller's transaction whose snapshot is older than the slot's holder: the database
    refuses the second holder, and the error says what to do."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serializes writers: no snapshot can miss a holder")
    with pytest.raises(IntegrityError, match="Retry the whole transaction"):
        enqueue_after_an_older_snapshot()
    assert Job.objects.count() == 1


def lock_waits() -> int:
    """Statements of this database waiting for a concurrency key's lock now."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        else:  # a locking read that waits has no row in innodb_trx on MariaDB: its statement
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID != "
                "CONNECTION_ID() AND DB = DATABASE() AND INFO LIKE %s",
                ["%jobstate_concurrencylock%"],
            )
        return cursor.fetchone()[0]


def test_a_cancel_of_a_held_job_waits_for_the_key_before_its_row():
    """Whoever hands out a key's slots writes held rows under the key's lock; a cancel of a
    held row takes the lock first too, so the two never wait for each other in a cycle."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks; its writers hold the write lock from BEGIN")
    held = row(one_per_customer.enqueue(3, "a"))
    behind = row(one_per_customer.enqueue(3, "b"))
    # Free the slot behind the key's back, as a crash would (no code path does): the
    # hand-out below gives it to `held`, the head, as the cancel of `held` begins.
    Job.objects.filter(pk=held.pk).update(concurrency_slot=None, hold=Hold.LIMIT)
    held.refresh_from_db()
    locked, go, errors = threading.Event(), threading.Event(), []

    def hand_out() -> None:
        try:
            with transaction.atomic():
                Job.objects._lock_key("default", held.concurrency_key)
                locked.set()
                go.wait(30)
                Job.objects._release_slots("default", [held.concurrency_key])
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    def cancel() -> None:
        try:
            Job.objects.cancel(held)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hand_out), threading.Thread(target=cancel)]
    threads[0].start()
    locked.wait(30)
    threads[1].start()
    wait_for(lambda: lock_waits() or errors, "the cancel to wait for the key")
    assert errors == []
    go.set()
    for thread in threads:
        thread.join(60)
    assert errors == []
    held.refresh_from_db()
    assert (held.state, held.failure_reason, held.hold) == (
        State.FAILED,
        FailureReason.CANCELLED,
        None,
    )
    behind.refresh_from_db()
    assert (behind.hold, behind.concurrency_slot) == (None, 1)  # the slot went on to it
