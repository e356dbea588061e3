"""What enqueue() works out once per task (task_plan.py) and the prepared INSERT of a
plain job (managers/prepared.py): done once, and never stale or shared."""

import uuid

import pytest
from django.apps import apps
from django.db import connection, connections
from django.db.models.signals import post_init
from django.test import override_settings
from django.utils import timezone

from django_jobstate.backend import JobStateBackend
from django_jobstate.exceptions import InvalidPayload
from django_jobstate.models import Job
from django_jobstate.tasksapi import InvalidTask
from tests import tasks

pytestmark = pytest.mark.django_db


def test_a_task_is_checked_at_its_first_enqueue_not_at_every_one(monkeypatch):
    tasks.record.enqueue("warm")  # the task modules loaded (their tasks checked as defined)
    task = tasks.record.using(priority=7)  # a task object no enqueue has seen
    checked = []
    validate = JobStateBackend.validate_task

    def counting(self, task):
        checked.append(task)
        return validate(self, task)

    monkeypatch.setattr(JobStateBackend, "validate_task", counting)
    for n in range(3):
        task.enqueue(f"call {n}")

    assert len(checked) == 1
    assert Job.objects.filter(priority=7).count() == 3


def test_options_from_the_settings_apply_from_the_next_enqueue_after_they_change():
    tasks.record.enqueue("before")
    path = "tests.tasks.record"
    with override_settings(JOBSTATE_TASK_OPTIONS={path: {"max_attempts": 4, "timeout": 9}}):
        tasks.record.enqueue("during")
    tasks.record.enqueue("after")

    rows = dict(Job.objects.values_list("args__0", "max_attempts"))
    assert rows == {"before": 1, "during": 4, "after": 1}
    assert Job.objects.get(args__0="during").timeout == 9


def test_a_task_refused_is_refused_at_every_enqueue_not_remembered_as_good():
    task = tasks.record.using(queue_name="emails")
    task.enqueue("fine while emails is a queue")
    only_default = {"BACKEND": "django_jobstate.backend.JobStateBackend", "QUEUES": ["default"]}
    with override_settings(TASKS={"default": only_default}):
        for _ in range(2):
            with pytest.raises(InvalidTask, match="'emails' is not valid"):
                task.enqueue("refused")
    task.enqueue("fine again")

    assert Job.objects.count() == 2


def test_an_enqueued_job_is_what_reading_its_row_gives():
    for job in [
        Job.objects.enqueue("tests.tasks.record", ["a"]),
        *Job.objects.enqueue_many("tests.tasks.record", [(["b"], {}), (["c"], {})]),
        Job.objects.enqueue("tests.tasks.record", ["d"], metadata={"n": [1]}, priority=3),
        # JSON gives back a list for a tuple, a str key for an int one.
        Job.objects.enqueue("tests.tasks.record", ["e"], metadata={"n": (1,), 2: "x"}),
        *Job.objects.enqueue_many("tests.tasks.record", [(["f"], {})], metadata={3: (4,)}),
        Job.objects.enqueue("tests.tasks.record", ["g"], metadata={5: ()}, unique_key="g"),
    ]:
        row = Job.objects.get(pk=job.pk)
        for field in Job._meta.concrete_fields:
            assert getattr(job, field.attname) == getattr(row, field.attname), field.name
        assert job._state.db == row._state.db
        assert job._state.adding is False
        assert job.run_after == job.enqueued_at  # one clock reading for both


def test_metadata_that_cannot_be_stored_is_refused_with_nothing_written():
    with pytest.raises(InvalidPayload, match="Job metadata must be JSON"):
        Job.objects.enqueue_many("tests.tasks.record", [(["a"], {})], metadata={"a": object()})
    with pytest.raises(InvalidPayload, match="Job metadata must be a dict, not list"):
        Job.objects.enqueue("tests.tasks.record", ["b"], metadata=["not", "a", "dict"])

    assert not Job.objects.exists()


@pytest.mark.skipif(connection.features.supports_timezones, reason="a database TIME_ZONE")
def test_an_enqueued_job_has_its_times_in_the_database_time_zone():
    """A database without time zones (SQLite, MySQL) may name the zone its times are in:
    the ORM reads them back in it, and so does enqueue()'s Job."""
    wrapper = connections["default"]  # its cached_property, not the proxy's attribute
    saved = wrapper.settings_dict["TIME_ZONE"]
    wrapper.settings_dict["TIME_ZONE"] = "Europe/Paris"
    for cached in ("timezone", "timezone_name"):
        wrapper.__dict__.pop(cached, None)
    try:
        job = Job.objects.enqueue("tests.tasks.record", ["a"])
        row = Job.objects.get(pk=job.pk)
    finally:
        wrapper.settings_dict["TIME_ZONE"] = saved
        for cached in ("timezone", "timezone_name"):
            wrapper.__dict__.pop(cached, None)

    assert str(row.enqueued_at.tzinfo) == "Europe/Paris"
    assert (job.enqueued_at.isoformat(), job.run_after.isoformat()) == (
        row.enqueued_at.isoformat(),
        row.run_after.isoformat(),
    )


def test_jobs_enqueued_alike_share_no_metadata_dict():
    first = Job.objects.enqueue("tests.tasks.record", ["a"], metadata={"n": {"k": 1}})
    first.metadata["n"]["k"] = 2
    first.metadata["added"] = True
    second = Job.objects.enqueue("tests.tasks.record", ["b"], metadata={"n": {"k": 1}})
    plain = [Job.objects.enqueue("tests.tasks.record", [x]) for x in "cd"]
    plain[0].metadata["added"] = True

    assert second.metadata == {"n": {"k": 1}}
    assert plain[1].metadata == {}


def test_a_post_init_receiver_of_job_still_sees_each_enqueued_job():
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.result_id)

    tasks.record.enqueue("warm")  # a prepared INSERT made before the receiver connects
    post_init.connect(receiver, sender=Job)
    try:
        result = tasks.record.enqueue("watched")
    finally:
        post_init.disconnect(receiver, sender=Job)

    assert uuid.UUID(result.id) in seen


def test_results_of_a_task_with_metadata_share_no_dict():
    task = tasks.record.using(metadata={"n": {"k": 1}})
    first = task.enqueue("a")
    first.metadata["n"]["k"] = 2

    second = task.enqueue("b")

    assert second.metadata == {"n": {"k": 1}}
    assert task.get_result(first.id).metadata == {"n": {"k": 1}}


@pytest.mark.parametrize(
    ("options", "fast"),
    [
        ({}, True),
        ({"metadata": {"n": 1}}, False),  # the caller's dict, checked at each call
        ({"unique_key": "k"}, False),
        ({"run_after": timezone.now()}, False),
    ],
)
def test_enqueue_of_a_plain_task_takes_the_path_that_builds_no_job(monkeypatch, options, fast):
    general = []
    bulk = JobStateBackend.bulk_enqueue

    def counting(self, *args, **kwargs):
        general.append(args)
        return bulk(self, *args, **kwargs)

    monkeypatch.setattr(JobStateBackend, "bulk_enqueue", counting)
    result = tasks.record.using(**options).enqueue("x")

    assert Job.objects.get(result_id=result.id).args == ["x"]
    # MySQL 8 has no RETURNING: its plain enqueue takes the general path too.
    fast = fast and connection.features.can_return_columns_from_insert
    assert len(general) == (0 if fast else 1)


def test_a_plain_enqueue_goes_through_the_job_manager_of_the_moment(monkeypatch):
    """The backend holds no manager of its own: apps.clear_cache() (override_settings of
    INSTALLED_APPS, isolate_apps) makes Job.objects a new one, which a test may patch."""
    tasks.record.enqueue("warm")
    apps.clear_cache()
    seen = []
    enqueue_one = Job.objects.enqueue_one

    def spying(*args, **kwargs):
        seen.append(args[0])
        return enqueue_one(*args, **kwargs)

    monkeypatch.setattr(Job.objects, "enqueue_one", spying)
    tasks.record.enqueue("x")

    assert seen == [tasks.record.module_path]


def test_a_plans_prepared_insert_is_made_once_per_database(monkeypatch):
    task = tasks.record.using(priority=3)  # a plan of its own
    task.enqueue("warm")
    made = []
    prepare = Job.objects._prepared

    def counting(*args, **kwargs):
        made.append(args)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(Job.objects, "_prepared", counting)
    results = [task.enqueue(str(n)) for n in range(3)]

    assert made == []
    assert [Job.objects.get(result_id=r.id).priority for r in results] == [3, 3, 3]
