"""`manage.py schedules`: the list (text and --json), --sync and --run."""

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.writes import sync

pytestmark = pytest.mark.django_db

SCHEDULES = {
    "nightly": {"task": "tests.tasks.noop", "cron": "0 3 * * *", "timezone": "Europe/Paris"},
    "poll": {"task": "tests.tasks.noop", "every": 300, "unique": True},
}
TASKS = {
    "default": {
        "BACKEND": "django_jobstate.backend.JobStateBackend",
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {"SCHEDULES": SCHEDULES},
    }
}


def schedules(*args):
    out = io.StringIO()
    call_command("schedules", *args, stdout=out)
    return out.getvalue()


def test_nothing_stored_says_so():
    assert "No schedules stored" in schedules()


@override_settings(TASKS=TASKS)
def test_sync_stores_the_settings_and_the_list_shows_them():
    text = schedules("--sync")
    assert "nightly  [enabled]  tests.tasks.noop  0 3 * * * (Europe/Paris)" in text
    assert "poll  [enabled]  tests.tasks.noop  every 300 s" in text
    assert "next tick: " in text
    assert "(in " in text
    assert "last tick: never" in text
    rows = json.loads(schedules("--json"))
    assert [r["name"] for r in rows] == ["nightly", "poll"]
    assert rows[0]["cron"] == "0 3 * * *"
    assert rows[0]["timezone"] == "Europe/Paris"
    assert rows[1]["every"] == 300
    assert rows[1]["unique"] is True


@override_settings(TASKS=TASKS)
def test_run_enqueues_a_job_now_and_refuses_an_unknown_name():
    schedules("--sync")
    before = Schedule.objects.get(name="poll").next_tick_at
    assert schedules("--run", "poll").startswith("Enqueued job ")
    job = Job.objects.get(schedule_name="poll")
    assert Schedule.objects.get(name="poll").next_tick_at == before
    assert "still live" in schedules("--run", "poll")  # unique: not a second one
    assert Job.objects.filter(schedule_name="poll").count() == 1
    assert job.scheduled_for is not None
    with pytest.raises(CommandError, match="No schedule 'nope'; the schedules are: nightly, poll"):
        schedules("--run", "nope")


@override_settings(
    TASKS={"default": {**TASKS["default"], "OPTIONS": {"SCHEDULES": {"x": {"task": "a.b"}}}}}
)
def test_sync_refuses_invalid_definitions_saying_why():
    with pytest.raises(CommandError, match="exactly one of"):
        schedules("--sync")


@override_settings(TASKS=TASKS)
def test_the_list_shows_the_settings_schedules_before_the_first_sync():
    text = schedules()
    assert "nightly  [not stored yet]  tests.tasks.noop  0 3 * * * (Europe/Paris)" in text
    assert "poll  [not stored yet]  tests.tasks.noop  every 300 s" in text
    assert "next tick: once stored (by runjobs when it starts, or schedules --sync)" in text
    rows = json.loads(schedules("--json"))
    assert [(r["name"], r["stored"], r["next_tick"]) for r in rows] == [
        ("nightly", False, None),
        ("poll", False, None),
    ]
    schedules("--sync")
    assert [r["stored"] for r in json.loads(schedules("--json"))] == [True, True]


@override_settings(TASKS=TASKS)
def test_a_stored_schedule_and_one_not_stored_yet_are_listed_in_order():
    sync([Definition(name="old", task_path="tests.tasks.noop", every=60)])  # another release's
    text = schedules()
    names = [line.split()[0] for line in text.splitlines() if not line.startswith(" ")]
    assert names == ["nightly", "old", "poll"]
    assert "old  [enabled]" in text


@override_settings(TASKS=TASKS)
def test_the_list_shows_each_schedules_origin_and_a_name_both_define():
    from django_jobstate.schedules import edits

    edits.add(Definition(name="poll", task_path="tests.tasks.noop", every=60, kwargs={"v": 1}))
    edits.add(Definition(name="adhoc", task_path="tests.tasks.noop", cron="*/5 * * * *"))
    err = io.StringIO()
    call_command("schedules", "--sync", stdout=io.StringIO(), stderr=err)
    assert "Schedule 'poll' of the settings is not stored" in err.getvalue()
    text = schedules()
    assert "adhoc  [enabled]  tests.tasks.noop  */5 * * * * (UTC)  (from the admin)" in text
    assert (
        "nightly  [enabled]  tests.tasks.noop  0 3 * * * (Europe/Paris)  (from the settings)"
        in (text)
    )
    assert "poll  [enabled]  tests.tasks.noop  every 60 s  (from the admin)" in text
    assert "poll  [not scheduled]  tests.tasks.noop  every 300 s  (from the settings)" in text
    assert "a schedule made in the admin has its name (E018)" in text
    rows = json.loads(schedules("--json"))
    assert [(r["name"], r["origin"]) for r in rows] == [
        ("adhoc", "admin"),
        ("nightly", "settings"),
        ("poll", "admin"),
        ("poll", "settings"),
    ]
    assert Schedule.objects.get(name="poll").kwargs == {"v": 1}  # the admin's, untouched
