"""The database itself refuses rows that break the state rules."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_jobstate.models import Job
from django_jobstate.states import State
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def refused(**fields):
    """Assert that updating a fresh job with `fields` is refused by a constraint."""
    job = JobFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    assert job.state == State.QUEUED


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"state": "paused"}, id="made-up state"),
        pytest.param({"state": State.SUCCEEDED, "worker_id": "w"}, id="terminal without times"),
        pytest.param(
            {"state": State.FAILED, "worker_id": "w", "started_at": timezone.now()},
            id="failed without finish time",
        ),
        pytest.param(
            {
                "state": State.FAILED,
                "worker_id": "w",
                "started_at": timezone.now(),
                "finished_at": timezone.now(),
            },
            id="failed without a reason",
        ),
        pytest.param(
            {"state": State.RUNNING, "started_at": timezone.now()}, id="running, no worker"
        ),
        pytest.param({"started_at": timezone.now()}, id="queued but started"),
        pytest.param({"worker_id": "w"}, id="queued with a worker"),
        pytest.param({"failure_reason": "error"}, id="queued with a failure reason"),
        pytest.param({"failure_reason": "gremlins"}, id="made-up failure reason"),
        pytest.param({"priority": 101}, id="priority too high"),
        pytest.param({"priority": -101}, id="priority too low"),
        pytest.param({"attempt": 0}, id="attempt zero"),
    ],
)
def test_database_refuses_rows_that_break_the_rules(fields):
    refused(**fields)


def test_raw_sql_insert_of_unknown_state_is_refused():
    table = Job._meta.db_table
    now = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (result_id, attempt, task_path, args, kwargs, backend, "
            "queue_name, priority, run_after, max_attempts, backoff, state, enqueued_at, "
            "failure_reason, error_class, error_message, traceback) VALUES "
            "(%s, 1, 't.t', '[]', '{}', 'default', 'default', 0, %s, 1, 0, 'limbo', %s, "
            "'', '', '', '')",
            [uuid.uuid4().hex, now, now],
        )
    assert not Job.objects.exists()


def test_one_row_per_attempt_number():
    first = JobFactory(failed=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(failed=True, result_id=first.result_id, attempt=1)


def test_at_most_one_live_attempt_per_task():
    first = JobFactory(running=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(result_id=first.result_id, attempt=2)
    # Once the first attempt is terminal, the next one may exist.
    Job.objects.filter(pk=first.pk).update(
        state=State.FAILED, finished_at=timezone.now(), failure_reason="error"
    )
    JobFactory(result_id=first.result_id, attempt=2, previous=first)


@pytest.mark.parametrize("state", list(State))
def test_factory_builds_valid_rows_in_every_state(state):
    job = JobFactory.in_state(state)
    job.refresh_from_db()
    assert job.state == state
    assert job.is_terminal == (state in {State.SUCCEEDED, State.FAILED})
