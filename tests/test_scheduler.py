"""The scheduler's writes (scheduler.py) in-process: sync, the compare-and-set, the backstop.

The races between real runjobs processes are in test_schedules_race.py.
"""

import itertools
import logging
import math
import time
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import PRUNE_SCHEDULE, Definition
from django_jobstate.schedules.scheduler import Scheduler, db_now, sync
from django_jobstate.schedules.settings import load
from django_jobstate.states import FailureReason, State
from tests.factories import JobFactory
from tests.framework import DUMMY_BACKEND
from tests.plans import finished_history

pytestmark = pytest.mark.django_db


def every(seconds=60, name="s", **options):
    options.setdefault("task_path", "tests.tasks.noop")
    return Definition(name=name, every=seconds, **options)


def scheduler(*definitions):
    return Scheduler("test", {d.name: d for d in definitions})


def make_due(name="s", periods=1):
    """Move the row's next tick `periods` ticks back (into the past), as if time passed."""
    row = Schedule.objects.get(name=name)
    due = row.next_tick_at - timedelta(seconds=row.every * periods)
    Schedule.objects.filter(name=name).update(next_tick_at=due)
    return row, Schedule.objects.get(name=name).next_tick_at


def scheduled_jobs(name="s"):
    return list(Job.objects.filter(schedule_name=name).order_by("scheduled_for"))


def test_sync_creates_a_row_per_definition_with_its_next_tick():
    before = db_now("default")
    sync([every(60), every(3600, name="t")])
    rows = {row.name: row for row in Schedule.objects.all()}
    assert set(rows) == {"s", "t"}
    assert before < rows["s"].next_tick_at <= before + timedelta(seconds=60)
    assert rows["s"].definition_hash == every(60).hash
    assert rows["s"].task_path == "tests.tasks.noop"
    assert rows["s"].enabled


def test_sync_keeps_an_admin_disable_until_the_definition_changes():
    sync([every(60)])
    Schedule.objects.update(enabled=False)
    sync([every(60)])  # a restart
    assert not Schedule.objects.get().enabled
    sync([every(30)])  # a deploy with another definition
    row = Schedule.objects.get()
    assert (row.enabled, row.every, row.definition_hash) == (True, 30, every(30).hash)


def test_sync_stops_schedules_gone_from_the_settings_and_restarts_returning_ones():
    sync([every(60), every(60, name="t")])
    sync([every(60)])
    assert Schedule.objects.get(name="t").removed_at is not None
    sync([every(60), every(60, name="t")])
    assert Schedule.objects.get(name="t").removed_at is None


def away_from_a_minute_boundary() -> None:
    """every(60) ticks on the minute: within a second or two of one, a first run_once()
    finds its tick due already (CI on MariaDB once did)."""
    left = 60 - time.time() % 60
    if left < 3:
        time.sleep(left + 0.1)


def test_a_due_tick_is_enqueued_once_with_its_schedule_and_time():
    away_from_a_minute_boundary()
    first, second = scheduler(every(60)), scheduler(every(60))
    assert first.run_once() > 0  # synced; nothing due yet
    assert scheduled_jobs() == []
    _, due = make_due()

    assert first.run_once() == 0  # ticked: look again at once
    # The row moved on: nothing for it (0 would say it ticked; the next tick may be less
    # than a second away when the test runs just before a minute boundary).
    assert second.run_once() > 0
    [job] = scheduled_jobs()
    assert (job.scheduled_for, job.task_path, job.state, job.attempt) == (
        due,
        "tests.tasks.noop",
        State.QUEUED,
        1,
    )
    row = Schedule.objects.get()
    assert (row.last_tick_at, row.last_result_id) == (due, job.result_id)
    assert row.next_tick_at > due


def test_a_stale_read_loses_the_compare_and_set():
    """A scheduler that read a due tick, then paused while another enqueued it."""
    slow, fast = scheduler(every(60)), scheduler(every(60))
    slow.run_once()
    _, due = make_due()
    now = db_now("default")
    fast.run_once()
    slow._tick("default", every(60), due, now)  # what it would do on waking
    assert len(scheduled_jobs()) == 1


def test_an_old_definition_cannot_enqueue_once_a_new_one_is_stored():
    old, new = scheduler(every(60, kwargs={"v": 1})), scheduler(every(60, kwargs={"v": 2}))
    old.run_once()
    new.run_once()  # a rolling deploy: the new version stores its definition
    make_due()
    old.run_once()
    assert scheduled_jobs() == []
    new.run_once()
    assert [job.kwargs for job in scheduled_jobs()] == [{"v": 2}]


def test_a_disabled_schedule_does_not_tick():
    s = scheduler(every(60))
    s.run_once()
    make_due()
    Schedule.objects.update(enabled=False)
    s.run_once()
    assert scheduled_jobs() == []


def test_a_unique_schedule_skips_a_tick_while_its_last_run_is_live_and_records_it():
    s = scheduler(every(60, unique=True))
    s.run_once()
    make_due()
    s.run_once()
    make_due()
    s.run_once()  # the first job is still queued
    [job] = scheduled_jobs()
    row = Schedule.objects.get()
    assert row.skipped == 1
    assert row.last_skipped_at == row.next_tick_at - timedelta(seconds=60) or row.last_skipped_at
    assert row.last_result_id == job.result_id

    Job.objects.filter(pk=job.pk).delete()  # the run is over (pruned, say)
    make_due()
    s.run_once()
    assert len(scheduled_jobs()) == 1  # a new one


def test_catch_up_after_an_outage_follows_the_policy_and_counts_the_misses(caplog):
    latest, every_tick = every(1), every(1, name="a", catch_up="all")
    s = scheduler(latest, every_tick)
    # The rows, not a first run_once(): on a loaded machine a second can pass between its
    # sync and its read of the due rows, and it enqueued a tick before the outage began.
    sync([latest, every_tick])
    make_due("s", periods=6)
    make_due("a", periods=6)
    # One pass: it ticks both rows. Not until a pass ticks nothing: with ticks a second
    # apart, a loaded machine's next pass found the tick after the outage due, and
    # enqueued it as it should.
    with caplog.at_level(logging.WARNING, "django_jobstate.scheduler"):
        assert s.run_once() == 0
    assert len(scheduled_jobs("s")) == 1
    assert Schedule.objects.get(name="s").missed >= 5
    assert "tick(s) before" in caplog.text
    ticks = [job.scheduled_for for job in scheduled_jobs("a")]
    assert len(ticks) >= 6
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
    assert Schedule.objects.get(name="a").missed == 0


def test_the_task_options_ride_on_the_scheduled_job():
    s = scheduler(every(60, task_path="tests.tasks.with_options", queue_name="reports"))
    s.run_once()
    make_due()
    s.run_once()
    [job] = scheduled_jobs()
    assert (job.max_attempts, job.backoff, job.timeout, job.queue_name) == (3, 2, 5, "reports")


def test_a_tick_whose_task_cannot_be_loaded_is_not_lost(caplog):
    s = scheduler(every(60, task_path="tests.tasks.not_a_task"))
    s.run_once()
    _, due = make_due()
    with caplog.at_level(logging.ERROR, "django_jobstate.scheduler"):
        s.run_once()
    assert "could not enqueue its tick" in caplog.text
    assert "not a Task" in caplog.text
    assert Schedule.objects.get().next_tick_at == due  # rolled back: still due


def test_a_retry_keeps_the_tick_and_the_backstop_refuses_a_second_first_attempt():
    s = scheduler(every(60, task_path="tests.tasks.always_fails"))
    s.run_once()
    make_due()
    s.run_once()
    [job] = scheduled_jobs()
    [claimed] = Job.objects.claim("w")
    Job.objects.fail(claimed, FailureReason.ERROR, error_class="builtins.ValueError")
    retry = Job.objects.get(result_id=job.result_id, attempt=2)
    assert (retry.schedule_name, retry.scheduled_for) == ("s", job.scheduled_for)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(schedule_name="s", scheduled_for=job.scheduled_for)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(schedule_name="s")  # a tick without its time


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's clock is this machine's")
@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits
def test_hundreds_of_schedules_cost_one_indexed_query_per_wake_up():
    definitions = [every(60, name=f"s{i}") for i in range(500)]
    s = scheduler(*definitions)
    s.run_once()
    # None due in the wake-up measured: ticks fall on the minute, and a slow machine
    # crossed one between the two wake-ups (all 500 then ticked: 607 queries).
    Schedule.objects.update(next_tick_at=timezone.now() + timedelta(hours=1))
    analyze = "ANALYZE" if connection.vendor == "postgresql" else "ANALYZE TABLE"
    with connection.cursor() as cursor:
        cursor.execute(f"{analyze} {Schedule._meta.db_table}")
        if connection.vendor == "mysql":
            cursor.fetchall()  # its report
    with CaptureQueriesContext(connection) as queries:
        s.run_once()
    assert len(queries) == 1
    explain = (
        "EXPLAIN (FORMAT JSON)" if connection.vendor == "postgresql" else "EXPLAIN FORMAT=JSON"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"{explain} {queries[0]['sql']}")
        plan = cursor.fetchone()[0]  # JSON, parsed on PostgreSQL, text on MariaDB
    assert "jobstate_schedule_due" in str(plan), plan


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's planner has no statistics")
@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits
def test_the_prune_finds_old_attempts_by_their_index():
    finished_history(20_000, every=timedelta(seconds=1))  # none of it a week old
    mysql = connection.vendor == "mysql"
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {'TABLE ' if mysql else ''}{Job._meta.db_table}")
        if mysql:
            cursor.fetchall()  # its report
    query = Job.objects.prunable(timedelta(days=7)).order_by("result_id", "attempt")[:1001]
    sql, params = query.values_list("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {'FORMAT=JSON' if mysql else '(FORMAT JSON)'} {sql}", params)
        plan = cursor.fetchone()[0]  # JSON, parsed on PostgreSQL, text on MariaDB
    assert "jobstate_job_by_finished" in str(plan), plan


@override_settings(JOBSTATE_RETENTION={"succeeded": "1h", "failed": "30d"})
def test_retention_is_a_built_in_hourly_schedule_that_prunes():
    definitions, errors = load()
    assert errors == []
    prune = definitions[PRUNE_SCHEDULE]
    assert (prune.task_path, prune.every, prune.kwargs) == (
        "django_jobstate.tasks.prune_jobs",
        3600,
        {"succeeded": "1h", "failed": "30d"},
    )
    old = timezone.now() - timedelta(hours=2)
    gone = JobFactory(succeeded=True, finished_at=old, started_at=old)
    kept = [
        JobFactory(succeeded=True),
        JobFactory(failed=True, finished_at=old, started_at=old),
    ]
    from django_jobstate.tasks import prune_jobs

    assert prune_jobs.call(**prune.kwargs) == {"succeeded": 1, "failed": 0}
    assert not Job.objects.filter(pk=gone.pk).exists()
    assert Job.objects.filter(pk__in=[k.pk for k in kept]).count() == 2


TASKS = {
    "default": {
        "BACKEND": "django_jobstate.backend.JobStateBackend",
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {"SCHEDULES": {}},
    }
}


def checks_of(schedules, **settings):
    tasks = {"default": {**TASKS["default"], "OPTIONS": {"SCHEDULES": schedules}}}
    with override_settings(TASKS=tasks, **settings):
        return [(m.id, m.msg) for m in run_checks() if m.id.startswith("django_jobstate.E0")]


def test_system_checks_name_each_bad_schedule():
    found = checks_of(
        {
            "ok": {"task": "tests.tasks.noop", "cron": "*/5 * * * *", "timezone": "Europe/Paris"},
            "bad-cron": {"task": "tests.tasks.noop", "cron": "*/5 * * *"},
            "bad-zone": {"task": "tests.tasks.noop", "every": 5, "timezone": "Europe/Pariss"},
            "not-a-task": {"task": "tests.tasks.not_a_task", "every": 5},
            "nowhere": {"task": "os.path.join", "every": 5},
        }
    )
    ids = sorted(i for i, _ in found)
    assert ids == [
        "django_jobstate.E010",
        "django_jobstate.E011",
        "django_jobstate.E012",
        "django_jobstate.E012",
    ]
    text = "\n".join(msg for _, msg in found)
    assert "'bad-cron'" in text
    assert "Europe/Pariss" in text
    assert "'tests.tasks.not_a_task' is a function, not a Task" in text
    assert "'nowhere'" in text


def test_system_checks_refuse_arguments_that_do_not_bind_to_the_task():
    [(check_id, msg)] = checks_of(
        {"typo": {"task": "tests.tasks.record", "every": 5, "kwargs": {"lable": "x"}}}
    )
    assert check_id == "django_jobstate.E012"
    assert "Schedule 'typo': its args and kwargs do not match record()" in msg
    assert "missing a required argument: 'label'" in msg


def test_system_checks_refuse_a_bad_retention():
    [(check_id, msg)] = checks_of({}, JOBSTATE_RETENTION={"succeeded": "soon"})
    assert check_id == "django_jobstate.E010"
    assert "JOBSTATE_RETENTION['succeeded']" in msg
    [(check_id, msg)] = checks_of({}, JOBSTATE_RETENTION={"queued": "7d"})
    assert "keys succeeded and/or failed" in msg


def test_a_scheduler_without_schedules_still_marks_the_removed_ones():
    sync([every(60)])
    assert scheduler().run_once() > 0
    assert Schedule.objects.get().removed_at is not None


@pytest.mark.parametrize("lateness", [math.inf, 6.4e10])
def test_one_schedule_that_raises_never_stops_the_others(caplog, lateness):
    """A definition the checks would refuse (load() refuses it too, so only a Definition
    built by hand has it): now - max_lateness overflows."""
    if lateness == math.inf and connection.vendor == "mysql":
        pytest.skip("MySQL's DOUBLE column stores no infinity")
    s = scheduler(every(60, name="forever", max_lateness=lateness), every(60))
    s.run_once()
    make_due("forever")
    make_due("s")
    with caplog.at_level(logging.ERROR, "django_jobstate.scheduler"):
        while s.run_once() == 0:
            pass
    assert len(scheduled_jobs("s")) == 1
    assert scheduled_jobs("forever") == []
    assert "schedule forever failed at its tick" in caplog.text
    assert "OverflowError" in caplog.text


def test_a_tick_enqueued_already_is_skipped_and_the_schedule_moves_on(caplog):
    """A rolling deploy whose store raced the old release's tick pointed the row back at
    that tick: the backstop index refuses it, and the schedule must not stay there."""
    # Hourly: the tick after `due` stays ahead of the clock (a minute's could pass meanwhile).
    s = scheduler(every(3600, catch_up="all", max_lateness=3 * 3600))
    s.run_once()
    _, due = make_due()
    s.run_once()
    [job] = scheduled_jobs()
    # Back before that tick: the one before is due, and then that one again.
    Schedule.objects.update(next_tick_at=due - timedelta(seconds=3600))
    with caplog.at_level(logging.INFO, "django_jobstate.scheduler"):
        s.run_once()
    assert f"tick {due.isoformat()} was enqueued already (job {job.pk}); moving on" in caplog.text
    assert "could not enqueue" not in caplog.text
    assert Schedule.objects.get().next_tick_at > due
    ticks = [j.scheduled_for for j in scheduled_jobs()]
    assert ticks == [due - timedelta(seconds=3600), due]  # the one not enqueued yet was


def test_system_checks_refuse_numbers_out_of_range():
    found = checks_of(
        {
            "forever": {"task": "tests.tasks.noop", "every": 5, "max_lateness": math.inf},
            "millennia": {"task": "tests.tasks.noop", "every": 5, "max_lateness": 6.4e10},
            "often": {"task": "tests.tasks.noop", "every": math.nan},
        }
    )
    assert [i for i, _ in found] == ["django_jobstate.E010"] * 3
    text = "\n".join(msg for _, msg in found)
    assert "'forever'" in text
    assert "not inf" in text
    assert '"max_lateness" must be a number of seconds from 1 to a year' in text
    assert "'often'" in text
    assert '"every" must be' in text


def test_system_checks_name_an_unknown_option_and_the_close_one():
    tasks = {"default": {**TASKS["default"], "OPTIONS": {"SCHEDULE": {}, "LISTEN": 1}}}
    with override_settings(TASKS=tasks):
        found = [(m.id, m.msg, m.hint) for m in run_checks() if m.id == "django_jobstate.E014"]
    [(_, schedule, hint), (_, listen, _)] = sorted(found, key=lambda m: "LISTEN" in m[1])
    assert schedule == (
        "TASKS['default'][\"OPTIONS\"] has the unknown key 'SCHEDULE' (did you mean "
        "'SCHEDULES'?); the keys of 'default''s OPTIONS are: SCHEDULES, QUEUE_LIMITS."
    )
    assert "did you mean" not in listen
    assert "'LISTEN'" in listen
    assert "keeps the stored schedules" in hint


def test_the_options_of_another_backend_are_its_own():
    tasks = {
        **TASKS,
        "other": {
            "BACKEND": DUMMY_BACKEND,
            "OPTIONS": {"SCHEDULE": {}},
        },
    }
    with override_settings(TASKS=tasks):
        assert not [m for m in run_checks() if m.id == "django_jobstate.E014"]


def test_settings_with_errors_never_mark_stored_schedules_removed(caplog):
    sync([every(60)])
    Schedule.objects.update(enabled=False)  # an admin's disable, kept while misread
    tasks = {"default": {**TASKS["default"], "OPTIONS": {"SCHEDULE": {"s": {}}}}}
    with override_settings(TASKS=tasks), caplog.at_level(logging.ERROR):
        Scheduler("test").run_once()
    row = Schedule.objects.get()
    assert (row.removed_at, row.enabled) == (None, False)
    assert "unknown key 'SCHEDULE'" in caplog.text
