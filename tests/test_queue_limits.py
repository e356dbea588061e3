"""Limits of a queue (queue_limits.py, managers/queue_claim.py), in one process: what the
claim takes from a limited queue, the settings against a run-time change, the command,
and that the claim of an unlimited queue stays one statement."""

import io
import json
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.backend import JobStateBackend
from django_jobstate.limits.queues import burst, parse_rate
from django_jobstate.managers import queue_claim, rate_claim
from django_jobstate.managers.queue_claim import forget_run_time_limits
from django_jobstate.models import Job, JobQueue
from django_jobstate.states import State
from tests.limit_tasks import unlimited

pytestmark = pytest.mark.django_db(transaction=True)

backend = JobStateBackend("default", {"QUEUES": ["default", "emails", "reports"]})
TASKS = {
    "default": {
        "BACKEND": "django_jobstate.backend.JobStateBackend",
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {"QUEUE_LIMITS": {"reports": {"concurrency": 2}}},
    }
}


@pytest.fixture(autouse=True)
def fresh_limits():
    forget_run_time_limits()
    yield
    forget_run_time_limits()


def enqueue(queue: str, n: int) -> None:
    backend.bulk_enqueue(unlimited.using(queue_name=queue), [((str(i),), {}) for i in range(n)])


def claimed(worker: str = "w", limit: int = 50) -> dict[str, int]:
    found: dict[str, int] = {}
    for job in Job.objects.claim(worker, queues=["emails", "reports"], limit=limit):
        found[job.queue_name] = found.get(job.queue_name, 0) + 1
    return found


@override_settings(TASKS=TASKS)
def test_the_settings_limit_caps_the_claim_and_other_queues_run():
    enqueue("reports", 5)
    enqueue("emails", 3)
    assert claimed() == {"reports": 2, "emails": 3}
    assert claimed("w2") == {}  # two running: the limit, whoever asks
    done = Job.objects.filter(queue_name="reports", state=State.RUNNING).first()
    Job.objects.filter(pk=done.pk).update(state=State.SUCCEEDED, finished_at=done.started_at)
    assert claimed("w3") == {"reports": 1}


@override_settings(TASKS=TASKS)
def test_a_run_time_limit_wins_over_the_settings_until_cleared():
    enqueue("reports", 6)
    JobQueue.objects.set_limits("reports", concurrency=1, by="test")
    forget_run_time_limits()
    assert claimed() == {"reports": 1}
    JobQueue.objects.set_limits("reports", concurrency=None, by="test")  # lifted
    forget_run_time_limits()
    assert claimed() == {"reports": 5}
    JobQueue.objects.set_limits("reports", clear=True, by="test")
    assert JobQueue.objects.get(name="reports").limits.source == "settings"


def test_a_run_time_limit_holds_before_workers_reread_the_rows():
    """The claim of unlimited queues leaves out a queue whose row sets a limit at once,
    even in a process that has not read the rows since."""
    enqueue("reports", 4)
    assert claimed(limit=1) == {"reports": 1}  # the rows are read: none limited
    JobQueue.objects.set_limits("reports", concurrency=1, by="test")
    assert claimed() == {}  # cached as unlimited: left out, not over the limit
    forget_run_time_limits()
    assert claimed() == {}  # one running already


def test_a_rate_spends_tokens():
    enqueue("reports", 10)
    JobQueue.objects.set_limits("reports", rate="3/s", by="test")
    forget_run_time_limits()
    start = time.monotonic()
    assert claimed() == {"reports": 3}  # a full bucket: one second's worth
    again = claimed().get("reports", 0)
    # None but the tokens that came back since, at 3 a second (at CI's load a third of a
    # second can pass between the two claims: seen).
    assert again <= (time.monotonic() - start) * 3
    row = JobQueue.objects.get(name="reports")
    assert row.tokens is not None
    assert row.tokens < 1


def test_the_claim_of_unlimited_queues_is_one_statement(monkeypatch):
    # The caches last a second: at CI's load the two claims can be further apart.
    monkeypatch.setattr(queue_claim, "LIMITS_TTL", 600.0)
    monkeypatch.setattr(rate_claim, "RATES_TTL", 600.0)
    # An earlier test's entries would keep their own second, and expire between the claims.
    forget_run_time_limits()
    rate_claim.forget_rated_tasks()
    enqueue("emails", 3)
    try:
        Job.objects.claim("w", queues=["emails"], limit=1)  # reads the rows (cached)
        with CaptureQueriesContext(connection) as queries:
            Job.objects.claim("w", queues=["emails"], limit=1)
    finally:  # no later test may find these caches
        forget_run_time_limits()
        rate_claim.forget_rated_tasks()
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    # As before: MariaDB/MySQL's claim locks the heads, moves them, reads them back.
    assert len(statements) == (3 if connection.vendor == "mysql" else 1), statements


def test_rates_are_parsed_with_clear_errors():
    assert parse_rate("10/s") == (10, 1)
    assert parse_rate("100/m") == (100, 60)
    assert burst("1000/h") == 1
    assert burst("20/s") == 20
    with pytest.raises(ValueError, match="such as"):
        parse_rate("10 per second")


def test_jobqueues_limit_sets_lists_and_clears():
    out = io.StringIO()
    call_command(
        "jobqueues", "limit", "reports", "--concurrency", "3", "--rate", "20/s", stdout=out
    )
    assert "at most 3 running, rate 20/s" in out.getvalue()
    out = io.StringIO()
    call_command("jobqueues", "list", "--json", stdout=out)
    row = {q["name"]: q for q in json.loads(out.getvalue())}["reports"]
    assert (row["concurrency"], row["rate"], row["limits_from"]) == (3, "20/s", "run time")
    call_command("jobqueues", "limit", "reports", "--clear", stdout=io.StringIO())
    assert not JobQueue.objects.get(name="reports").limits.limited
    with pytest.raises(CommandError, match="such as"):
        call_command("jobqueues", "limit", "reports", "--rate", "fast")
    with pytest.raises(CommandError, match="whole number"):
        call_command("jobqueues", "limit", "reports", "--concurrency", "0")


def test_jobstats_and_the_job_page_say_the_queue_limit_holds_a_job(admin_client):
    enqueue("reports", 3)
    JobQueue.objects.set_limits("reports", concurrency=1, by="test")
    forget_run_time_limits()
    assert claimed() == {"reports": 1}
    out = io.StringIO()
    call_command("jobstats", stdout=out)
    assert "Queue reports is limited (at most 1 running, from the run time)" in out.getvalue()
    out = io.StringIO()
    call_command("jobstats", "--json", stdout=out)
    (held,) = json.loads(out.getvalue())["held_by_queue_limits"]
    assert (held["queue"], held["running"], held["due"]) == ("reports", 1, 2)
    waiting = Job.objects.filter(state=State.QUEUED).first()
    page = admin_client.get(reverse("admin:django_jobstate_job_change", args=[waiting.pk]))
    assert "waits for its queue&#x27;s limit (1 running)" in page.content.decode()


def test_the_queues_page_shows_and_changes_the_limits(admin_client):
    JobQueue.objects.set_limits("reports", concurrency=2, rate="20/s", by="test")
    page = admin_client.get(reverse("admin:django_jobstate_jobqueue_changelist"))
    assert "at most 2 running, rate 20/s (set here)" in page.content.decode()
    url = reverse("admin:django_jobstate_jobqueue_change", args=["reports"])
    answer = admin_client.post(url, {"concurrency_limit": "5", "rate_limit": "100/m"})
    assert answer.status_code == 302, answer.content.decode()[:3000]
    queue = JobQueue.objects.get(name="reports")
    assert (queue.concurrency, queue.rate, queue.changed_by) == (5, "100/m", "admin:admin")
    answer = admin_client.post(url, {"concurrency_limit": "", "rate_limit": "lots"})
    assert "such as" in answer.content.decode()
    admin_client.post(url, {"concurrency_limit": "", "rate_limit": "", "use_settings": "on"})
    assert JobQueue.objects.get(name="reports").limits_set_at is None


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"reports": {"concurrency": 0}}, "whole number from 1"),
        ({"reports": {"rate": "fast"}}, "such as"),
        ({"reports": {"burst": 3}}, '"concurrency" and/or "rate"'),
        ({"nowhere": {"concurrency": 1}}, "not one of its QUEUES"),
    ],
)
def test_bad_queue_limits_are_check_errors(limits, message):
    from django.core.checks import run_checks

    tasks = {"default": {**TASKS["default"], "OPTIONS": {"QUEUE_LIMITS": limits}}}
    with override_settings(TASKS=tasks):
        errors = [e for e in run_checks() if e.id == "django_jobstate.E019"]
    (error,) = errors
    assert message in error.msg


@override_settings(TASKS=TASKS)
def test_good_queue_limits_pass_the_checks():
    from django.core.checks import run_checks

    assert not [e for e in run_checks() if e.id in ("django_jobstate.E019", "django_jobstate.E014")]
