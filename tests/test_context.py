"""Job metadata: set at enqueue, saved by the running task (fenced), copied to retries,
read back through get_result() and the admin."""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobstate.backend import JobStateBackend
from django_jobstate.exceptions import InvalidPayload, LostRace, WorkerLost
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.task_results import JobStateTaskResult
from django_jobstate.tasksapi import InvalidTask
from tests import tasks
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def run_all() -> None:
    while Job.objects.queued().exists():
        Worker(burst=True).run()


def test_metadata_given_per_call_is_stored_and_read_back():
    result = tasks.record.using(metadata={"requested_by": 7}, priority=3).enqueue("a")
    job = Job.objects.get(result_id=result.id)

    assert (job.metadata, job.priority) == ({"requested_by": 7}, 3)
    assert isinstance(result, JobStateTaskResult)
    assert result.metadata == {"requested_by": 7}
    assert JobStateBackend("default", {}).get_result(result.id).metadata == {"requested_by": 7}


def test_without_metadata_a_job_has_an_empty_dict():
    result = tasks.record.enqueue("a")
    assert Job.objects.get(result_id=result.id).metadata == {}
    assert result.metadata == {}


def test_bulk_enqueue_gives_every_job_the_task_metadata():
    task = tasks.record.using(metadata={"batch": "x"})
    results = JobStateBackend("default", {}).bulk_enqueue(task, [(["a"], {}), (["b"], {})])
    assert [r.metadata for r in results] == [{"batch": "x"}] * 2
    assert list(Job.objects.values_list("metadata", flat=True)) == [{"batch": "x"}] * 2


@pytest.mark.parametrize("bad", ["text", ["a list"], {"when": object()}])
def test_metadata_that_is_not_a_json_object_is_refused_at_using(bad):
    with pytest.raises(InvalidTask, match=r"metadata of task 'tests\.tasks\.record'"):
        tasks.record.using(metadata=bad)


def test_progress_saved_by_the_task_is_stored_and_read_by_get_result():
    result = tasks.reports_progress.using(metadata={"owner": "ana"}).enqueue(3)
    run_all()

    result.refresh()
    expected = {"owner": "ana", "seen": [1], "progress": "3 of 3"}
    assert result.metadata == expected
    assert result.return_value == expected
    assert Job.objects.get(result_id=result.id).metadata == expected


def test_a_retry_starts_from_the_metadata_its_previous_attempt_saved():
    result = tasks.reports_progress.enqueue(2, fail_first=True)
    run_all()

    first, second = Job.objects.attempts_of(result.id)
    assert (first.state, second.state) == (State.FAILED, State.SUCCEEDED)
    assert first.metadata == {"seen": [1], "progress": "2 of 2"}
    # The second attempt saw what the first saved, and added to it.
    assert second.metadata == {"seen": [1, 2], "progress": "2 of 2"}
    assert JobStateBackend("default", {}).get_result(result.id).metadata == second.metadata


def test_save_metadata_of_an_attempt_no_longer_this_workers_changes_nothing():
    job = JobFactory(task_path="tests.tasks.record", metadata={"progress": "0"}, max_attempts=2)
    [claimed] = Job.objects.claim("zombie")
    Job.objects.fail_running("zombie", FailureReason.LOST, WorkerLost("taken for lost"))
    retry = Job.objects.get(result_id=job.result_id, attempt=2)

    with pytest.raises(LostRace, match="no longer running for worker zombie"):
        Job.objects.save_metadata(claimed, {"progress": "late"})

    assert Job.objects.get(pk=job.pk).metadata == {"progress": "0"}
    assert retry.metadata == {"progress": "0"}  # copied to the retry, untouched since


def test_save_metadata_refuses_what_json_cannot_store():
    JobFactory(task_path="tests.tasks.record")
    [claimed] = Job.objects.claim("w1")
    with pytest.raises(InvalidPayload, match="Job metadata must be JSON"):
        Job.objects.save_metadata(claimed, {"at": object()})
    with pytest.raises(InvalidPayload, match="must be a dict"):
        Job.objects.save_metadata(claimed, ["no"])  # type: ignore[arg-type]


def test_the_admin_shows_the_metadata(client):
    client.force_login(User.objects.create_superuser("admin"))
    job = JobFactory(metadata={"progress": "42 of 100 rows"})
    html = client.get(reverse("admin:django_jobstate_job_change", args=[job.pk])).content
    assert "42 of 100 rows" in html.decode()


def test_an_enqueue_without_metadata_or_trace_sends_neither_column():
    with CaptureQueriesContext(connection) as queries:
        tasks.record.enqueue("plain")
        tasks.record.using(metadata={"k": 1}).enqueue("with")
    plain, given = [q["sql"] for q in queries if "INSERT" in q["sql"]]
    assert "metadata" not in plain  # the database's default, {}
    assert "trace_context" not in plain
    assert "metadata" in given
