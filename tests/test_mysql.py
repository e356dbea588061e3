"""MariaDB/MySQL only: what migration 0009 and managers/mysql.py give InnoDB in place of
PostgreSQL's partial indexes and RETURNING (the behaviour itself is tested everywhere)."""

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_jobstate.managers.mysql import CLAIM_ORDER
from django_jobstate.models import Job
from django_jobstate.states import State
from tests.factories import JobFactory

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL's own forms"),
]


def explain(sql: str, params: list) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN FORMAT=JSON {sql}", params)
        return json.loads(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits
def test_the_claim_walks_the_claim_order_index_and_sorts_nothing():
    """InnoDB locks every row a locking read walks: the claim's SELECT must read the head
    of one queue in claim order, not scan and sort."""
    Job.objects.enqueue_many("tests.tasks.record", [(("x",), {})] * 500)
    Job.objects.enqueue_many("tests.tasks.record", [(("y",), {})] * 500, queue_name="emails")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE django_jobstate_job")
    captured = []
    execute = connection.cursor().__class__.execute

    def capture(self, sql, params=None):
        if "FOR UPDATE SKIP LOCKED" in sql:
            captured.append((sql, list(params)))
        return execute(self, sql, params)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection.cursor().__class__, "execute", capture)
        assert len(Job.objects.claim("w", queues=["default"], limit=10)) == 10
    [(sql, params)] = captured
    plan = json.dumps(explain(sql.replace("FOR UPDATE SKIP LOCKED", ""), params))
    assert f'"key": "{CLAIM_ORDER}"' in plan
    assert "filesort" not in plan


def test_the_claim_reads_back_exactly_the_rows_it_moved_in_claim_order():
    low = JobFactory(priority=-5)
    high = JobFactory(priority=5)
    older = JobFactory(run_after=timezone.now() - timedelta(minutes=5))
    later = JobFactory(run_after=timezone.now() + timedelta(minutes=5))  # not due

    claimed = Job.objects.claim("w", limit=10)

    assert [job.pk for job in claimed] == [high.pk, older.pk, low.pk]
    assert all(job.state == State.RUNNING and job.worker_id == "w" for job in claimed)
    assert Job.objects.get(pk=later.pk).state == State.QUEUED


@pytest.mark.parametrize(
    "index",
    [
        "jobstate_job_one_live_attempt",  # a second live attempt of one task
        "jobstate_job_unique_live",  # a second live job with one unique key
        "jobstate_job_one_job_per_tick",  # a second first attempt of one tick
    ],
)
def test_the_database_refuses_what_the_partial_unique_constraints_refuse(index):
    tick = timezone.now().replace(microsecond=0)
    first = JobFactory(unique_key="k", unique_scope="live", schedule_name="s", scheduled_for=tick)
    twin = {
        "jobstate_job_one_live_attempt": {"result_id": first.result_id, "attempt": 2},
        "jobstate_job_unique_live": {"unique_key": "k", "unique_scope": "live"},
        "jobstate_job_one_job_per_tick": {"schedule_name": "s", "scheduled_for": tick},
    }[index]
    with pytest.raises(IntegrityError, match=index), transaction.atomic():
        JobFactory(**twin)


def test_a_finished_attempt_frees_what_it_held():
    first = JobFactory(unique_key="k", unique_scope="live", running=True)
    Job.objects.succeed(first, "done")  # its virtual columns go back to NULL

    JobFactory(result_id=first.result_id, attempt=2, unique_key="k", unique_scope="live")
    JobFactory(unique_key="other", unique_scope="live")


def test_times_are_utc_with_microseconds_whatever_the_session_time_zone():
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+05:00'")
    try:
        before = timezone.now()
        job = Job.objects.enqueue("tests.tasks.record", ["x"])
        [claimed] = Job.objects.claim("w")
        after = timezone.now()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = DEFAULT")
    stored = Job.objects.get(pk=job.pk)
    slack = timedelta(seconds=5)  # the server's clock, read by this process
    for moment in (stored.enqueued_at, stored.run_after, claimed.started_at):
        assert before - slack <= moment <= after + slack
    assert {stored.enqueued_at.microsecond, claimed.started_at.microsecond} != {0}


@pytest.mark.django_db(transaction=True)
def test_migration_0009_goes_back_and_forth():
    def indexes() -> set[str]:
        with connection.cursor() as cursor:
            return set(connection.introspection.get_constraints(cursor, Job._meta.db_table))

    applied = indexes()
    for _ in range(2):
        call_command("migrate", "django_jobstate", "0008", verbosity=0)
        assert CLAIM_ORDER not in indexes()
        call_command("migrate", "django_jobstate", verbosity=0)
        assert indexes() == applied


@pytest.mark.django_db(transaction=True)
def test_no_index_repeats_the_primary_key_and_migration_0019_goes_back_and_forth():
    def twins() -> set[str]:  # indexes on `id` alone, the primary key aside
        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(cursor, Job._meta.db_table)
        return {
            name
            for name, c in found.items()
            if c["index"] and not c["primary_key"] and c["columns"] == ["id"]
        }

    assert twins() == set()
    call_command("migrate", "django_jobstate", "0018", verbosity=0)
    assert twins() == {"jobstate_job_succeeded", "jobstate_job_failed"}
    call_command("migrate", "django_jobstate", verbosity=0)
    assert twins() == set()
