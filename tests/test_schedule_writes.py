"""A tick's job and the store of a definition (schedules/writes.py), in-process.

A unique task keeps its uniqueness when a schedule enqueues it (a tick, Run now). The
store of a definition racing a tick of the old one (a rolling deploy) is in
test_schedules_race.py, with real runjobs processes.
"""

import io
import logging

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.scheduler import Scheduler
from django_jobstate.schedules.writes import db_now, enqueue_tick, sync
from django_jobstate.states import State
from tests import tasks
from tests.test_scheduler import make_due

pytestmark = pytest.mark.django_db


def every(seconds=60, name="s", **options):
    return Definition(name=name, every=seconds, **options)


def tick(definition):
    """One due tick of `definition`, as a runjobs scheduler writes it."""
    s = Scheduler("test", {definition.name: definition})
    s.run_once()
    make_due(definition.name)
    s.run_once()


def live_jobs(task_path):
    return list(Job.objects.filter(task_path=task_path, finished_at=None))


@pytest.mark.parametrize("schedule_unique", [False, True])
def test_a_tick_of_a_unique_task_keeps_its_key_against_enqueue(schedule_unique, caplog):
    held = tasks.unique_record.enqueue("x")
    definition = every(
        task_path="tests.tasks.unique_record", kwargs={"label": "x"}, unique=schedule_unique
    )
    with caplog.at_level(logging.INFO, "django_jobstate.scheduler"):
        tick(definition)
    [job] = live_jobs("tests.tasks.unique_record")
    assert str(job.result_id) == held.id  # no second live job: the tick was a duplicate
    assert "tick" in caplog.text
    assert "skipped" in caplog.text
    row = Schedule.objects.get()
    assert row.skipped == 1
    assert row.next_tick_at > row.last_skipped_at  # the schedule moved on


@pytest.mark.parametrize("schedule_unique", [False, True])
def test_enqueue_of_a_unique_task_meets_the_job_of_a_tick(schedule_unique):
    definition = every(
        task_path="tests.tasks.unique_record", kwargs={"label": "x"}, unique=schedule_unique
    )
    tick(definition)
    [scheduled] = live_jobs("tests.tasks.unique_record")
    result = tasks.unique_record.enqueue(label="x")
    assert result.id == str(scheduled.result_id)
    assert len(live_jobs("tests.tasks.unique_record")) == 1


def test_a_tick_keeps_the_queued_scope_of_its_task():
    path = "tests.tasks.unique_queued_always_fails"
    held = tasks.unique_queued_always_fails.enqueue("x")
    tick(every(task_path=path, args=["x"]))
    assert [str(j.result_id) for j in live_jobs(path)] == [held.id]
    # One may run while one waits: the scope is the task's, "queued".
    [claimed] = Job.objects.claim("w")
    tick(every(task_path=path, args=["x"], name="t"))
    jobs = live_jobs(path)
    assert sorted(j.state for j in jobs) == [State.QUEUED, State.RUNNING]
    assert {j.unique_scope for j in jobs} == {"queued"}
    assert claimed.pk in {j.pk for j in jobs}


def test_a_unique_schedule_of_a_unique_task_skips_while_its_last_run_is_live():
    """The task's scope lets one wait while one runs; the schedule's unique does not."""
    path = "tests.tasks.unique_queued_always_fails"
    definition = every(task_path=path, args=["x"], unique=True)
    tick(definition)
    Job.objects.claim("w")  # its last run is running
    s = Scheduler("test", {"s": definition})
    make_due()
    s.run_once()
    assert len(live_jobs(path)) == 1
    assert Schedule.objects.get().skipped == 1


def test_run_now_keeps_the_unique_key_of_the_task():
    sync([every(task_path="tests.tasks.unique_record", kwargs={"label": "x"}, unique=True)])
    held = tasks.unique_record.enqueue("x")
    out = io.StringIO()
    call_command("schedules", "--run", "s", stdout=out)
    assert "Not enqueued: job" in out.getvalue()
    assert "with the same unique key, is still live (queued)" in out.getvalue()
    assert [str(j.result_id) for j in live_jobs("tests.tasks.unique_record")] == [held.id]


def test_a_tick_without_a_unique_task_or_schedule_writes_no_key():
    db = "default"
    with transaction.atomic():
        job = enqueue_tick(db, every(task_path="tests.tasks.noop"), db_now(db))
    assert (job.unique_key, job.unique_scope, job.deduplicated) == (None, None, False)


def test_run_now_of_a_unique_task_with_arguments_it_does_not_take_says_why():
    sync([every(task_path="tests.tasks.sync_account", kwargs={"account": 1})])
    with pytest.raises(CommandError, match=r"Schedule 's': nothing enqueued: .*do not match"):
        call_command("schedules", "--run", "s", stdout=io.StringIO())
    assert not Job.objects.exists()
