"""Periodic jobs under hostile settings and rows, with real `runjobs` processes.

One schedule that cannot tick (a value the checks refuse, run with --skip-checks; a row
no definition could have written) must never stop the others, retention included; a
settings mistake must never lose the stored schedules' state; a tick keeps its task's
uniqueness.
"""

from datetime import UTC, datetime

import pytest

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.writes import sync
from tests import tasks
from tests.test_schedules_race import env, ticks_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_infinite_max_lateness_under_skip_checks_stops_no_other_schedule(runjobs):
    # Every 1.5 s and every 1 s: "forever", stuck at its first tick, would sort first.
    schedules = {
        "fast": {"task": "tests.tasks.noop", "every": 1.5},
        "forever": {"task": "tests.tasks.noop", "every": 1, "max_lateness": float("inf")},
    }
    refused = runjobs.run(**env(schedules))
    assert refused.returncode != 0
    assert "'forever'" in refused.stdout
    assert '"max_lateness" must be a number of seconds from 1 to a year' in refused.stdout

    proc = runjobs.start("--skip-checks", "--concurrency", "1", **env(schedules))
    wait_for(lambda: len(ticks_of("fast")) >= 4)
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out
    assert "not scheduled: Schedule 'forever'" in out
    assert "OverflowError" not in out
    assert ticks_of("forever") == []


def test_a_row_that_cannot_tick_stops_no_other_schedule(runjobs):
    schedules = {
        "fast": {"task": "tests.tasks.noop", "every": 1},
        "nightly": {
            "task": "tests.tasks.noop",
            "cron": "0 3 * * *",
            "timezone": "America/New_York",
        },
    }
    proc = runjobs.start("--concurrency", "1", **env(schedules))
    wait_for(lambda: len(ticks_of("fast")) >= 2)
    # Due since the year 1: its ticks cannot be computed (year 0 in New York's time).
    Schedule.objects.filter(name="nightly").update(next_tick_at=datetime(1, 1, 1, tzinfo=UTC))
    ticked = len(ticks_of("fast"))
    wait_for(lambda: len(ticks_of("fast")) >= ticked + 3)  # the others go on
    wait_for(lambda: "schedule nightly failed at its tick" in runjobs.output(proc))
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out
    assert "OverflowError" in out
    assert ticks_of("nightly") == []


def test_an_unknown_options_key_keeps_the_stored_schedules(runjobs):
    sync([Definition(name="fast", task_path="tests.tasks.noop", every=1.0)])
    Schedule.objects.update(enabled=False)  # an operator's disable, to keep
    tasks_setting = env({"fast": {"task": "tests.tasks.noop", "every": 1}})
    misspelt = tasks_setting["JOBSTATE_TEST_SETTINGS"].replace('"SCHEDULES"', '"SCHEDULE"')

    refused = runjobs.run(JOBSTATE_TEST_SETTINGS=misspelt)
    assert refused.returncode != 0
    assert "unknown key 'SCHEDULE' (did you mean 'SCHEDULES'?)" in refused.stdout

    proc = runjobs.start("--skip-checks", "--concurrency", "1", JOBSTATE_TEST_SETTINGS=misspelt)
    wait_for(lambda: "kept as they are" in runjobs.output(proc))
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out
    row = Schedule.objects.get()
    assert (row.removed_at, row.enabled) == (None, False)


def test_a_tick_of_a_unique_task_adds_no_second_live_job(runjobs):
    held = tasks.unique_record.enqueue("x")  # queued: no worker serves "default" below
    schedules = {
        "u": {
            "task": "tests.tasks.unique_record",
            "kwargs": {"label": "x"},
            "every": 1,
            "unique": True,
        }
    }
    proc = runjobs.start("--queue", "emails", "--concurrency", "1", **env(schedules))
    wait_for(lambda: Schedule.objects.filter(name="u", skipped__gte=3).exists())
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out
    live = Job.objects.filter(task_path="tests.tasks.unique_record", finished_at=None)
    assert [str(j.result_id) for j in live] == [held.id]
    assert "is still queued" in out
