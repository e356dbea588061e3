"""A rate per task (limits/rates.py, managers/rate_claim.py), in one process: what the
claim takes of a rate-limited task, that other jobs of its queue flow meanwhile, what the
database refuses, the option's checks, and what jobstats and the admin say."""

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobstate.backend import JobStateBackend
from django_jobstate.db.clock import Now
from django_jobstate.limits.concurrency import Hold
from django_jobstate.managers.queue_claim import forget_run_time_limits
from django_jobstate.managers.rate_claim import forget_rated_tasks
from django_jobstate.models import Job, JobQueue, TaskRate
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import InvalidTask, task
from tests.limit_tasks import five_a_minute, five_a_second, rated_one_per_customer, unlimited

pytestmark = pytest.mark.django_db(transaction=True)

backend = JobStateBackend("default", {"QUEUES": ["default", "reports"]})
RATED = "tests.limit_tasks.five_a_second"


@pytest.fixture(autouse=True)
def fresh_rates():
    forget_rated_tasks()
    forget_run_time_limits()
    yield
    forget_rated_tasks()
    forget_run_time_limits()


def claimed(worker: str = "w", limit: int = 50) -> dict[str, int]:
    found: dict[str, int] = {}
    for job in Job.objects.claim(worker, queues=["default"], limit=limit):
        found[job.task_name] = found.get(job.task_name, 0) + 1
    return found


def test_a_rate_limited_task_waits_for_its_rate_and_others_flow():
    backend.bulk_enqueue(five_a_second, [((str(i),), {}) for i in range(12)])
    backend.bulk_enqueue(unlimited, [((str(i),), {}) for i in range(3)])
    job = Job.objects.filter(task_path=RATED).first()
    assert (job.hold, job.rate_limit) == (Hold.RATE, "5/s")
    # A full bucket holds one second's worth; the other task's jobs all start.
    start = time.monotonic()
    assert claimed() == {"five_a_second": 5, "unlimited": 3}
    # The bucket is empty, whoever asks: only what refilled meanwhile (a loaded machine
    # took 0.6 s between the two claims: three more tokens).
    again = claimed("w2")
    assert set(again) <= {"five_a_second"}, again
    assert again.get("five_a_second", 0) <= int((time.monotonic() - start) * 5), again
    bucket = TaskRate.objects.get(task_path=RATED)
    assert (bucket.rate, bucket.tokens < 1) == ("5/s", True)
    backend.bulk_enqueue(unlimited, [(("late",), {})])
    late = claimed("w3")
    assert late["unlimited"] == 1  # never delayed by the held ones
    # Beside it, only what refilled since the first claim (CI's load: 0.2 s is a token).
    rated = again.get("five_a_second", 0) + late.get("five_a_second", 0)
    assert rated <= int((time.monotonic() - start) * 5), late


def test_a_spent_bucket_refills_at_the_rate():
    backend.bulk_enqueue(five_a_second, [((str(i),), {}) for i in range(20)])
    assert claimed() == {"five_a_second": 5}
    # As if 0.45 s had passed by the database's clock: two more tokens (5 a second), and
    # one per 0.2 s that really passes before the claim reads the clock (a loaded machine).
    start = time.monotonic()
    TaskRate.objects.filter(pk=RATED).update(tokens=0.0, tokens_at=Now() - timedelta(seconds=0.45))
    forget_rated_tasks()  # this process had noted when its next token was due
    taken = claimed().get("five_a_second", 0)
    assert 2 <= taken <= int((0.45 + time.monotonic() - start) * 5), taken


def test_the_claim_of_tasks_without_a_rate_is_one_statement():
    backend.bulk_enqueue(unlimited, [((str(i),), {}) for i in range(3)])
    Job.objects.claim("w", queues=["default"], limit=1)  # looks for rated rows (cached)
    with CaptureQueriesContext(connection) as queries:
        Job.objects.claim("w", queues=["default"], limit=1)
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    # As before: MariaDB/MySQL's claim locks the heads, moves them, reads them back.
    assert len(statements) == (3 if connection.vendor == "mysql" else 1), statements


def test_a_worker_does_not_ask_again_before_a_token_is_due():
    # Five a minute: five_a_second's next token came within the 0.2 s a loaded CI took
    # between the two claims, and the worker rightly asked again.
    backend.bulk_enqueue(five_a_minute, [((str(i),), {}) for i in range(8)])
    backend.bulk_enqueue(unlimited, [(("a",), {})])
    assert claimed() == {"five_a_minute": 1, "unlimited": 1}  # a bucket of one, 12 s a token
    with CaptureQueriesContext(connection) as queries:
        assert claimed() == {}
    # No transaction for the spent bucket: the claim of the other jobs only, which finds
    # none (on MariaDB/MySQL, its first statement, which locks the heads, finds none).
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    assert len(statements) == 1, statements


def test_an_all_queues_worker_finds_queues_where_only_rated_jobs_wait():
    backend.enqueue(five_a_second.using(queue_name="default"), ("a",), {})
    assert "default" in Job.objects.queue_names()


def test_a_concurrency_key_and_a_rate_hold_together():
    first = backend.enqueue(rated_one_per_customer, (1, "a"), {})
    second = backend.enqueue(rated_one_per_customer, (1, "b"), {})
    rows = {r.result_id.hex: r for r in Job.objects.all()}
    one, two = rows[first.id.replace("-", "")], rows[second.id.replace("-", "")]
    assert (one.hold, one.concurrency_slot) == (Hold.RATE, 1)  # a slot, then the rate
    assert (two.hold, two.concurrency_slot) == (Hold.LIMIT, None)
    jobs = Job.objects.claim("w", limit=10)
    assert [j.pk for j in jobs] == [one.pk]
    assert jobs[0].hold is None
    Job.objects.succeed(jobs[0], "done")
    two.refresh_from_db()
    assert (two.hold, two.concurrency_slot) == (Hold.RATE, 1)  # its slot, then its rate


def test_a_retry_waits_for_the_rate_again():
    backend.enqueue(rated_one_per_customer, (2, "x"), {"fail": True})
    [job] = Job.objects.claim("w", limit=10)
    Job.objects.fail(job, FailureReason.ERROR)  # max_attempts 2: retried
    retry = Job.objects.get(result_id=job.result_id, attempt=2)
    assert (retry.hold, retry.rate_limit, retry.concurrency_slot) == (Hold.RATE, "2/s", 1)


@pytest.mark.parametrize(
    "values",
    [
        {"hold": None},  # claimable by the claim of unlimited jobs: past the rate
        {"rate_limit": None},  # held by a rate it does not have
    ],
)
def test_the_database_refuses_a_rated_row_out_of_its_rate(values):
    backend.enqueue(five_a_second, ("a",), {})
    job = Job.objects.get(task_path=RATED)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(**values)


def plain(label: str) -> None:
    """Made a task only by the tests below (a task function must be at module level)."""


@pytest.mark.parametrize("rate", ["10/x", "0/s", "ten a second", 10, "1/s/s"])
def test_a_bad_rate_limit_is_refused_naming_the_task(rate):
    with pytest.raises(InvalidTask, match=r"rate_limit of task .*plain.*A rate is a positive"):
        task(rate_limit=rate)(plain)


def test_a_rate_limit_through_the_settings():
    options = {"tests.limit_tasks.unlimited": {"rate_limit": "1/m"}}
    with override_settings(JOBSTATE_TASK_OPTIONS=options):
        backend.enqueue(unlimited, ("a",), {})
        backend.enqueue(unlimited, ("b",), {})
        assert claimed() == {"unlimited": 1}
        assert claimed() == {}
    bad = {"tests.limit_tasks.unlimited": {"rate_limit": "fast"}}
    with override_settings(JOBSTATE_TASK_OPTIONS=bad), pytest.raises(Exception, match="rate"):
        backend.enqueue(unlimited, ("c",), {})


def test_jobstats_and_the_job_page_say_the_rate_holds_a_job(admin_client):
    backend.bulk_enqueue(five_a_second, [((str(i),), {}) for i in range(7)])
    claimed()
    out = io.StringIO()
    call_command("jobstats", stdout=out)
    assert (
        "2 due jobs of tests.limit_tasks.five_a_second start at its rate limit (5/s"
        in out.getvalue()
    )
    out = io.StringIO()
    call_command("jobstats", "--json", stdout=out)
    assert json.loads(out.getvalue())["held_by_rates"] == [{"task": RATED, "rate": "5/s", "due": 2}]
    held = Job.objects.filter(task_path=RATED, state=State.QUEUED).first()
    page = admin_client.get(reverse("admin:django_jobstate_job_change", args=[held.pk]))
    assert "starts at its rate (5/s)" in page.content.decode()


def test_in_a_limited_queue_both_limits_hold():
    queued = five_a_second.using(queue_name="reports")
    backend.bulk_enqueue(queued, [((str(i),), {}) for i in range(6)])
    JobQueue.objects.set_limits("reports", concurrency=2, by="test")
    forget_run_time_limits()
    jobs = Job.objects.claim("w", queues=["reports"], limit=50)
    assert [job.task_name for job in jobs] == ["five_a_second"] * 2  # the queue's limit
    assert Job.objects.claim("w2", queues=["reports"], limit=50) == []


def test_a_waiting_rated_job_can_be_cancelled_and_a_later_one_waits_apart():
    backend.enqueue(five_a_second, ("a",), {})
    job = Job.objects.get(task_path=RATED)
    Job.objects.cancel(job)
    job.refresh_from_db()
    assert (job.state, job.hold) == (State.FAILED, None)
    later = five_a_second.using(run_after=timezone.now() + timedelta(hours=1))
    backend.enqueue(later, ("b",), {})
    assert claimed() == {}  # not due: nothing started, no token spent
    assert not TaskRate.objects.filter(tokens__isnull=False).exists()


@pytest.mark.parametrize("task", [five_a_second, rated_one_per_customer])
def test_a_rated_job_that_depends_on_another_waits_for_it_then_for_its_rate(task):
    """Its dependencies first (workflows), then its slot if it has a key, then its rate."""
    upstream = unlimited.enqueue("up")
    args = ("down",) if task is five_a_second else (7, "down")
    down = task.using(depends_on=[upstream.id]).enqueue(*args)
    row = Job.objects.get(result_id=down.id)
    assert (row.hold, row.pending_deps, row.concurrency_slot) == (Hold.DEPS, 1, None)
    [up] = Job.objects.claim("w", limit=10)  # the rated job is not claimable yet
    assert up.result_id.hex == upstream.id.replace("-", "")
    Job.objects.succeed(up, "done")
    row.refresh_from_db()
    assert (row.hold, row.pending_deps) == (Hold.RATE, 0)  # released to its rate
    assert row.concurrency_slot == (None if task is five_a_second else 1)
    forget_rated_tasks()  # a worker reads which tasks wait for a rate once a second
    [taken] = Job.objects.claim("w", limit=10)  # by its rate's claim
    assert taken.pk == row.pk


def test_a_rated_job_whose_dependency_already_succeeded_waits_for_its_rate_only():
    upstream = unlimited.enqueue("up")
    [up] = Job.objects.claim("w", limit=10)
    Job.objects.succeed(up, "done")
    down = five_a_second.using(depends_on=[upstream.id]).enqueue("down")
    row = Job.objects.get(result_id=down.id)
    assert (row.hold, row.pending_deps, row.rate_limit) == (Hold.RATE, 0, "5/s")
