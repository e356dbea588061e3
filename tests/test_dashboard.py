"""The Dashboard: its figures (known rows in, known rates, percentiles and latencies out),
its permissions, escaping, and that every query it makes reads an index."""

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobstate.history import (
    BOUNDS,
    db_now,
    failing_tasks,
    finished_figures,
    quantile,
    waiting_figures,
    window,
)
from django_jobstate.models import Job, JobQueue
from django_jobstate.states import FailureReason, State
from tests.factories import JobFactory
from tests.plans import analyze_job_table, finished_history, job_table_reads

pytestmark = pytest.mark.django_db

URL = reverse("admin:django_jobstate_job_dashboard")
LIST_URL = reverse("admin:django_jobstate_job_changelist")


def login(client: Client, *perms: str) -> User:
    user = User.objects.create_user(f"user{User.objects.count()}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=[f"{p}_job" for p in perms]))
    client.force_login(user)
    return user


def finished(
    state: str,
    *,
    ran: float,
    waited: float,
    ago: float,
    now: datetime | None = None,
    **fields: object,
) -> Job:
    """An attempt that waited `waited` s from due to started, ran `ran` s, ended `ago` s
    before `now` (default: the present)."""
    end = (now or timezone.now()) - timedelta(seconds=ago)
    started = end - timedelta(seconds=ran)
    due = started - timedelta(seconds=waited)
    fields.setdefault("enqueued_at", due - timedelta(seconds=30))  # enqueued, then due
    return JobFactory.in_state(state, started_at=started, finished_at=end, run_after=due, **fields)


def bucket(upper: float) -> int:
    return BOUNDS.index(upper)


def known_rows() -> datetime:
    """The rows the figures are checked against, each group at one moment before the
    returned one (read once: rows made one by one on a loaded machine once straddled a
    minute, and the group's bar held 15 of its 50)."""
    now = timezone.now()
    for _ in range(50):
        finished(State.SUCCEEDED, ran=0.4, waited=1.5, ago=600, now=now)
        # Enqueued after its run_after (a retry due at once): latency from enqueued_at.
        end = now - timedelta(seconds=300)
        JobFactory.in_state(
            State.SUCCEEDED,
            started_at=end - timedelta(seconds=4),
            finished_at=end,
            enqueued_at=end - timedelta(seconds=4.04),
            run_after=end - timedelta(seconds=100),
        )
    for _ in range(25):
        finished(State.FAILED, ran=0.4, waited=1.5, ago=120, now=now, task_path="tests.tasks.boom")
    for _ in range(5):  # cancelled while queued: never started, not the task's failure
        end = now - timedelta(seconds=60)
        JobFactory(
            state=State.FAILED,
            failure_reason=FailureReason.CANCELLED,
            finished_at=end,
            cancel_requested_at=end,
            enqueued_at=end - timedelta(seconds=5),
            run_after=end - timedelta(seconds=5),
        )
    for _ in range(10):
        finished(
            State.FAILED,
            ran=40,
            waited=0.004,  # SQLite counts whole milliseconds
            ago=30,
            now=now,
            queue_name="emails",
            task_path="tests.tasks.email",
            failure_reason=FailureReason.TIMEOUT,
            error_class="django_jobstate.exceptions.JobTimeout",
            error_message="ran past its timeout of 30 s",
        )
    finished(State.SUCCEEDED, ran=1, waited=1, ago=7200, now=now)  # in the day, not the hour
    return now


def test_the_hours_figures_per_queue():
    made = known_rows()
    now = db_now("default")
    start, slots = window("hour", now)
    assert (slots, now - start <= timedelta(hours=1, minutes=1)) == (60, True)
    figures = finished_figures(Job.objects.all(), start, timedelta(minutes=1))
    default, emails = figures["default"], figures["emails"]

    assert (default.succeeded, dict(default.failed)) == (100, {"error": 25, "cancelled": 5})
    assert default.failure_rate == 25 / 125  # the cancels count for nothing
    assert (emails.succeeded, dict(emails.failed), emails.failure_rate) == (0, {"timeout": 10}, 1)
    # Run times: 75 of 0.4 s, 50 of 4 s (the cancels never ran).
    assert {i: n for i, n in enumerate(default.run_time) if n} == {
        bucket(0.5): 75,
        bucket(5): 50,
    }
    assert quantile(default.run_time, 0.5) == pytest.approx(0.3 + 0.2 * 62.5 / 75)
    assert quantile(default.run_time, 0.95) == pytest.approx(3 + 2 * 43.75 / 50)
    # Pickup: 75 waited 1.5 s after run_after; 50 were enqueued 0.04 s before they started,
    # long after their run_after: the later of the two counts.
    assert {i: n for i, n in enumerate(default.pickup) if n} == {bucket(2): 75, bucket(0.05): 50}
    assert quantile(default.pickup, 0.5) == pytest.approx(1 + 12.5 / 75)
    assert {i: n for i, n in enumerate(emails.run_time) if n} == {bucket(50): 10}
    assert {i: n for i, n in enumerate(emails.pickup) if n} == {bucket(0.005): 10}
    # Per minute: each group in its minute's bar.
    bars = {slot: dict(outcomes) for slot, outcomes in default.bars.items()}
    assert sum(sum(b.values()) for b in bars.values()) == 130
    ten_minutes_ago = (made - timedelta(seconds=600) - start) // timedelta(minutes=1)
    assert bars[ten_minutes_ago] == {"succeeded": 50}

    day_start, day_slots = window("day", now)
    day = finished_figures(Job.objects.all(), day_start, timedelta(minutes=15))
    assert (day_slots, day["default"].succeeded) == (96, 101)


def test_quantile_of_no_values_and_of_the_open_bucket():
    assert quantile([0] * (len(BOUNDS) + 1), 0.5) is None
    assert quantile([0] * len(BOUNDS) + [3], 0.95) == BOUNDS[-1]


def test_waiting_jobs_and_the_oldest_per_queue_paused_ones_apart(client):
    for _ in range(3):
        JobFactory(run_after=timezone.now() - timedelta(seconds=120))
    JobFactory(run_after=timezone.now() + timedelta(hours=1))  # not due yet
    JobFactory(queue_name="bulk", run_after=timezone.now() - timedelta(seconds=50))
    JobQueue.objects.pause("bulk", by="test")
    waiting = waiting_figures(Job.objects.all())
    assert (waiting["default"][0], waiting["bulk"][0]) == (3, 1)
    assert 120 <= waiting["default"][1] < 600

    login(client, "view")
    page = client.get(URL).content.decode()
    assert '<span class="jobstate-paused">paused</span>' in page
    assert "1 (paused)" in page
    # The total counts runnable jobs only: not the paused queue's.
    total = page.split("<tfoot>")[1].split("</tfoot>")[0]
    assert "<td>3</td>" in total


def test_the_tasks_failing_most_with_their_last_error_and_a_link(client):
    known_rows()
    last = finished(
        State.FAILED,
        ran=1,
        waited=1,
        ago=5,
        task_path="tests.tasks.boom",
        error_class="builtins.ValueError",
        error_message="disk full " + "x" * 500,
    )
    start, _ = window("hour", db_now("default"))
    rows = failing_tasks(Job.objects.all(), start)
    assert [(r["task_path"], r["failed"], r["finished"]) for r in rows] == [
        ("tests.tasks.boom", 26, 26),
        ("tests.tasks.email", 10, 10),
    ]
    assert rows[0]["last_id"] == last.pk
    emails = failing_tasks(Job.objects.all(), start, queue="emails")
    assert [(r["task_path"], r["failed"], r["error_class"]) for r in emails] == [
        ("tests.tasks.email", 10, "django_jobstate.exceptions.JobTimeout")
    ]

    login(client, "view")
    page = client.get(URL).content.decode()
    link = f"{LIST_URL}?task=tests.tasks.boom&amp;state__exact=failed"
    assert link in page
    assert "builtins.ValueError: disk full xxx" in page
    assert "x" * 200 not in page  # shortened: the job's page has it whole
    assert client.get(f"{LIST_URL}?task=tests.tasks.boom&state__exact=failed").status_code == 200


def test_task_names_errors_and_queue_names_are_escaped(client):
    evil = "<script>alert(1)</script>"
    finished(
        State.FAILED,
        ran=1,
        waited=1,
        ago=5,
        queue_name=f"q{evil}",
        task_path=f"tests.tasks.{evil}",
        error_message=f'<img src=x onerror="alert(2)">{evil}',
    )
    login(client, "view")
    for url in (URL, f"{URL}?fragment=1", f"{URL}?queue=q{evil}"):
        page = client.get(url).content.decode()
        assert "<script>alert" not in page
        assert "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_view_permission_shows_it_and_the_job_list_links_to_it(client):
    login(client)
    assert client.get(URL).status_code == 403
    client.logout()
    assert client.get(URL).status_code == 302  # to the login page
    login(client, "view")
    response = client.get(URL)
    assert response.status_code == 200
    assert response.content.decode().count('<svg class="jobstate-chart"') == 3
    assert f'href="{URL}"' in client.get(LIST_URL).content.decode()


def test_the_fragment_is_the_figures_alone_for_the_refresh(client):
    known_rows()
    login(client, "view")
    page = client.get(f"{URL}?window=day&queue=emails").content.decode()
    assert 'data-refresh-url="?window=day&amp;queue=emails&amp;fragment=1"' in page
    assert "django_jobstate/dashboard.js" in page
    fragment = client.get(f"{URL}?window=day&queue=emails&fragment=1").content.decode()
    assert "<html" not in fragment
    assert "<svg" in fragment
    assert "Run time, emails" in fragment
    assert "Jobs finished per minute by outcome, emails" in fragment
    # An unknown window or queue falls back to the hour and every queue.
    fragment = client.get(f"{URL}?window=year&queue=nope&fragment=1").content.decode()
    assert "all queues" in fragment


# Flushed after: on MariaDB/MySQL, ANALYZE TABLE commits the test's transaction.
@pytest.mark.django_db(transaction=True)
def test_every_query_of_the_page_reads_an_index_over_20000_finished_rows(client):
    now = timezone.now()

    def vary(i: int) -> dict[str, Any]:
        failed = i % 7 == 0
        return {
            "state": State.FAILED if failed else State.SUCCEEDED,
            "failure_reason": FailureReason.ERROR if failed else "",
            "error_message": "boom" if failed else "",
            "return_value": None if failed else "done",
            "task_path": f"tests.tasks.t{i % 5}",
            "queue_name": ("default", "emails")[i % 2],
        }

    finished_history(24_000, every=timedelta(seconds=108), vary=vary)  # a month, every 108 s
    for _ in range(50):
        JobFactory(run_after=now - timedelta(seconds=60))
    analyze_job_table()

    login(client, "view")
    for window_name in ("hour", "day"):
        with CaptureQueriesContext(connection) as queries:
            page = client.get(f"{URL}?window={window_name}").content.decode()
        assert "tests.tasks.t0" in page
        table = re.compile(rf"\b{Job._meta.db_table}\b")  # not the queues' table
        reads = [q["sql"] for q in queries if table.search(q["sql"])]
        # What finished, run times and latencies, the failing tasks, their errors, what waits.
        assert len(reads) == 5
        for sql in reads:
            plan = job_table_reads(sql)
            assert plan, sql
            if connection.vendor == "sqlite":
                assert all(index for _, index in plan), (sql, plan)
            elif connection.vendor == "mysql":
                assert all(key and access != "ALL" for access, key in plan), (sql, plan)
            else:
                assert not any(kind == "Seq Scan" for kind, _ in plan), (sql, plan)
