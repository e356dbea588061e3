"""The job list's "stuck" filters: one per reason, judged by the database clock in the
list's own query, from indexes (never a scan of history)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.models import Job, JobQueue
from django_jobstate.runner.stuck import Concern, why_stuck
from django_jobstate.states import State
from tests.factories import JobFactory
from tests.plans import analyze_job_table, finished_history, job_table_reads
from tests.test_admin import LIST_URL, login
from tests.test_admin_stuck import beat, list_row, marks, running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _production_intervals(settings):
    """Silent after 15 s: a slow request on a loaded machine cannot make a fresh beat
    look silent. A cancel's grace of 30 s."""
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 5.0
    settings.JOBSTATE_LOST_AFTER = 30.0
    settings.JOBSTATE_CANCEL_GRACE = 30.0


def every_kind_of_job() -> dict[str, Job]:
    """One job per reason to be stuck, and healthy ones beside them that look alike."""
    now = timezone.now()
    beat("alive", 0)
    beat("silent", 60)
    JobQueue.objects.pause("emails", by="test")
    JobQueue.objects.resume("reports", by="test")  # a row, but not paused
    return {
        "healthy": running("alive", timeout=600),
        "silent": running("silent"),
        "unseen": running("gone"),
        "just_claimed": JobFactory.in_state(State.RUNNING, worker_id="new"),
        "cancel_overdue": running("alive", cancel_requested_at=now - timedelta(seconds=45)),
        "cancel_within": running("alive", cancel_requested_at=now - timedelta(seconds=5)),
        "past_timeout": running("alive", timeout=60),
        "fractional_timeout": running("alive", timeout=119.5),  # 120 s ago: past it
        "paused": JobFactory.in_state(State.QUEUED, queue_name="emails"),
        "paused_later": JobFactory.in_state(
            State.QUEUED, queue_name="emails", run_after=now + timedelta(hours=1)
        ),
        "resumed": JobFactory.in_state(State.QUEUED, queue_name="reports"),
        "queued": JobFactory.in_state(State.QUEUED),
        "finished_in_paused": JobFactory.in_state(State.FAILED, queue_name="emails"),
        "running_in_paused": running("alive", queue_name="emails"),
    }


EXPECTED = {
    Concern.SILENT: {"silent", "unseen"},
    Concern.CANCEL_OVERDUE: {"cancel_overdue"},
    Concern.PAST_TIMEOUT: {"past_timeout", "fractional_timeout"},
    Concern.QUEUE_PAUSED: {"paused", "paused_later"},
}


@pytest.mark.parametrize("concern", list(EXPECTED))
def test_each_stuck_filter_lists_exactly_the_jobs_marked_so(client, concern):
    login(client, "view")
    jobs = every_kind_of_job()
    response = client.get(LIST_URL, {"stuck": concern.value})
    listed = {job.pk for job in response.context["cl"].result_list}
    assert listed == {jobs[name].pk for name in EXPECTED[concern]}
    concerns = {concern, Concern.UNSEEN} if concern == Concern.SILENT else {concern}
    for job in Job.objects.filter(pk__in=listed):
        assert concerns & {mark.concern for mark in why_stuck(job)}
    for name, job in jobs.items():  # and the marks agree with the filters
        if name not in EXPECTED[concern]:
            assert not concerns & {mark.concern for mark in why_stuck(job)}, name


def test_the_filter_offers_each_reason_by_name(client):
    login(client, "view")
    html = client.get(LIST_URL).content.decode()
    for value, label in [
        ("silent", "Stuck: worker silent"),
        ("cancel_overdue", "Stuck: cancel past grace"),
        ("past_timeout", "Stuck: past timeout"),
        ("queue_paused", "Stuck: queue paused"),
    ]:
        assert f'href="?stuck={value}"' in html
        assert label in html
    assert client.get(LIST_URL, {"stuck": "<nonsense>"}).status_code == 200


def test_list_marks_the_queued_jobs_of_a_paused_queue(client):
    login(client, "view")
    jobs = every_kind_of_job()
    html = client.get(LIST_URL).content.decode()
    for name in ["paused", "paused_later"]:
        [mark] = marks(list_row(html, jobs[name]))
        assert mark.startswith("waiting on a paused queue (paused ")
        assert "jobqueues resume" in list_row(html, jobs[name])  # the tooltip: what to do
    for name in ["resumed", "queued", "finished_in_paused", "running_in_paused"]:
        assert not [m for m in marks(list_row(html, jobs[name])) if "paused" in m], name
    JobQueue.objects.resume("emails")
    assert "waiting on a paused queue" not in client.get(LIST_URL).content.decode()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's planner has no statistics")
@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits
def test_the_stuck_filters_read_live_rows_from_indexes_never_history(client):
    finished_history()
    every_kind_of_job()
    login(client, "view")
    mysql = connection.vendor == "mysql"
    analyze_job_table()

    for concern, names in EXPECTED.items():
        with CaptureQueriesContext(connection) as captured:
            response = client.get(LIST_URL, {"stuck": concern.value})
        assert len(response.context["cl"].result_list) == len(names)
        quoted = connection.ops.quote_name("state")
        # The list's own queries: those that filter on the stuck condition's state.
        filtered = [q["sql"] for q in captured if quoted in q["sql"] and "WHERE" in q["sql"]]
        assert filtered
        for sql in filtered:
            reads = job_table_reads(sql)
            # MariaDB/MySQL have no partial index: the claim order's (state first, 0009).
            scans = {"ALL", "index"} if mysql else {"Seq Scan"}
            assert not {how for how, _key in reads} & scans, (concern, reads, sql)
