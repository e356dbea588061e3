"""No console page's cost grows with history: over 20,000 finished attempts, every query
that the Schedules list, the Queues page, a job's page (its attempts) and Start a task
make of the job table reads it by an index, as EXPLAIN shows on each database. (The job
list's filters, the Workers page and the Dashboard have theirs beside their own tests.)"""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.scheduler import Scheduler, sync
from django_jobstate.states import State
from tests.factories import JobFactory
from tests.plans import analyze_job_table, finished_history, job_table_reads

# MariaDB/MySQL transactions: ANALYZE TABLE commits.
pytestmark = pytest.mark.django_db(transaction=True)

POLL = Definition(name="poll-feeds", task_path="tests.tasks.noop", every=300)


def full_walks(reads: set[tuple[str, str | None]]) -> set[tuple[str, str | None]]:
    """The reads that walk the whole table (or a whole index of it): each one's cost is
    the history's size. SQLite may walk a partial index (only live rows are in it)."""
    if connection.vendor == "sqlite":
        return {(how, index) for how, index in reads if how == "SCAN" and index is None}
    bad = {"ALL", "index"} if connection.vendor == "mysql" else {"Seq Scan"}
    return {(how, index) for how, index in reads if how in bad}


def job_queries(fetch) -> list[str]:
    """The SQL of each query that `fetch()` makes of the job table."""
    with CaptureQueriesContext(connection) as captured:
        response = fetch()
    assert response.status_code in (200, 302), response
    table = connection.ops.quote_name(Job._meta.db_table)
    return [q["sql"] for q in captured if table in q["sql"] and "SAVEPOINT" not in q["sql"]]


def assert_indexed(queries: list[str]) -> None:
    assert queries
    for sql in queries:
        if not sql.lstrip().upper().startswith("SELECT"):
            continue  # the writes of Start a task: by primary key or new rows
        reads = job_table_reads(sql)
        assert reads, sql
        assert not full_walks(reads), (reads, sql)


@pytest.fixture
def history(client):
    finished_history()
    client.force_login(User.objects.create_superuser("operator"))
    return client


def test_the_schedules_list_finds_each_last_job_by_an_index(history):
    sync([POLL])
    due = Schedule.objects.get(name="poll-feeds").next_tick_at - timedelta(seconds=300)
    Schedule.objects.filter(name="poll-feeds").update(next_tick_at=due)
    Scheduler("t", {POLL.name: POLL}).run_once()  # its last job
    analyze_job_table()
    url = reverse("admin:django_jobstate_schedule_changelist")
    queries = job_queries(lambda: history.get(url))
    assert_indexed(queries)
    assert b"all its jobs" in history.get(url).content


def test_the_queues_page_counts_each_queue_by_an_index(history):
    JobFactory.in_state(State.QUEUED, queue_name="default")
    JobFactory.in_state(State.RUNNING, queue_name="default", worker_id="w:1")
    analyze_job_table()
    queries = job_queries(lambda: history.get(reverse("admin:django_jobstate_jobqueue_changelist")))
    assert_indexed(queries)


def test_a_jobs_page_reads_its_attempts_by_an_index(history):
    second = Job.objects.retry(JobFactory.in_state(State.FAILED, max_attempts=3))
    analyze_job_table()
    url = reverse("admin:django_jobstate_job_change", args=[second.pk])
    assert_indexed(job_queries(lambda: history.get(url)))


def test_start_a_task_reads_the_job_it_started_by_an_index(history):
    analyze_job_table()
    url = reverse("admin:django_jobstate_job_start")
    data = {"task": "tests.tasks.record", "args": '["x"]', "kwargs": "{}", "queue": ""}
    queries = job_queries(lambda: history.post(url, {**data, "priority": "", "run_after": ""}))
    assert_indexed(queries)
