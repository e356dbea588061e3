"""Tick computation and the definitions' parsing (schedules.py): no database."""

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_jobstate.schedules.definitions import (
    ALL_LIMIT,
    Definition,
    ScheduleError,
    parse,
    relative,
)

PARIS, NEW_YORK = ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")


def cron(expression, zone="UTC", **options):
    return Definition(
        name="s", task_path="tests.tasks.noop", cron=expression, timezone=zone, **options
    )


def every(seconds, **options):
    return Definition(name="s", task_path="tests.tasks.noop", every=seconds, **options)


def ticks(definition, start, count):
    found = []
    for _ in range(count):
        start = definition.next_tick(start)
        found.append(start)
    return found


def at(zone, *fields, fold=0):
    return datetime(*fields, tzinfo=zone, fold=fold)


def utc(*fields):
    return datetime(*fields, tzinfo=UTC)


# Daylight-saving changes of 2026: Europe/Paris on March 29 (02:00 -> 03:00) and October 25
# (03:00 -> 02:00); America/New_York on March 8 (02:00 -> 03:00) and November 1 (02:00 ->
# 01:00). Debian cron's rules, which cronsim follows: a job at a fixed time runs once on
# both days (a time that does not exist runs when the clock jumps; a time that repeats runs
# at its first pass); a job with a wildcard minute or hour runs by elapsed time.
@pytest.mark.parametrize(
    ("zone", "expression", "start", "expected"),
    [
        # Spring forward: 02:30 does not exist: it runs at 03:00, then at 02:30 again.
        (PARIS, "30 2 * * *", at(PARIS, 2026, 3, 28, 12), [
            at(PARIS, 2026, 3, 29, 3, 0), at(PARIS, 2026, 3, 30, 2, 30)]),
        (NEW_YORK, "30 2 * * *", at(NEW_YORK, 2026, 3, 7, 12), [
            at(NEW_YORK, 2026, 3, 8, 3, 0), at(NEW_YORK, 2026, 3, 9, 2, 30)]),
        # Fall back: 02:30 (Paris) and 01:30 (New York) happen twice: one run, the first.
        (PARIS, "30 2 * * *", at(PARIS, 2026, 10, 24, 12), [
            at(PARIS, 2026, 10, 25, 2, 30, fold=0), at(PARIS, 2026, 10, 26, 2, 30)]),
        (NEW_YORK, "30 1 * * *", at(NEW_YORK, 2026, 10, 31, 12), [
            at(NEW_YORK, 2026, 11, 1, 1, 30, fold=0), at(NEW_YORK, 2026, 11, 2, 1, 30)]),
        # Started inside the repeated hour's second pass: the next day, not back in time.
        (NEW_YORK, "30 1 * * *", at(NEW_YORK, 2026, 11, 1, 1, 10, fold=1), [
            at(NEW_YORK, 2026, 11, 2, 1, 30), at(NEW_YORK, 2026, 11, 3, 1, 30)]),
        # A wildcard hour: every 30 minutes of real time, through both passes of 01:xx.
        (NEW_YORK, "*/30 * * * *", at(NEW_YORK, 2026, 11, 1, 0, 50), [
            at(NEW_YORK, 2026, 11, 1, 1, 0, fold=0), at(NEW_YORK, 2026, 11, 1, 1, 30, fold=0),
            at(NEW_YORK, 2026, 11, 1, 1, 0, fold=1), at(NEW_YORK, 2026, 11, 1, 1, 30, fold=1),
            at(NEW_YORK, 2026, 11, 1, 2, 0)]),
        (PARIS, "0 * * * *", at(PARIS, 2026, 3, 29, 0, 30), [
            at(PARIS, 2026, 3, 29, 1, 0), at(PARIS, 2026, 3, 29, 3, 0),
            at(PARIS, 2026, 3, 29, 4, 0)]),
    ],
)  # fmt: skip
def test_next_tick_across_daylight_saving_changes(zone, expression, start, expected):
    found = ticks(cron(expression, str(zone)), start.astimezone(UTC), len(expected))
    assert found == [t.astimezone(UTC) for t in expected]
    assert all(t.tzinfo is UTC for t in found)


def test_next_tick_is_strictly_after_and_uses_cron_extensions():
    last_friday = cron("0 9 * * 5L")  # the last Friday of the month
    assert ticks(last_friday, utc(2026, 1, 1), 2) == [utc(2026, 1, 30, 9), utc(2026, 2, 27, 9)]
    second_monday = cron("0 9 * * MON#2")
    assert ticks(second_monday, utc(2026, 1, 1), 1) == [utc(2026, 1, 12, 9)]
    assert cron("* * * * *").next_tick(utc(2026, 1, 1, 0, 1)) == utc(2026, 1, 1, 0, 2)


def test_every_is_anchored_to_the_epoch_whoever_computes_it():
    definition = every(7)
    a = definition.next_tick(utc(2026, 1, 1, 0, 0, 0, 1))
    b = definition.next_tick(utc(2026, 1, 1, 0, 0, 3, 999_999))
    assert a == b
    assert (a - utc(1970, 1, 1)).total_seconds() % 7 == 0
    assert definition.next_tick(a) == a + timedelta(seconds=7)
    assert every(1.5).next_tick(utc(2026, 1, 1)) == utc(2026, 1, 1, 0, 0, 1, 500_000)


START = utc(2026, 1, 1, 12)


@pytest.mark.parametrize(
    ("catch_up", "late", "enqueued", "missed"),
    [
        ("latest", 0.5, [0], 0),  # on time: that tick
        ("latest", 3.5, [3], 3),  # four due: the latest only
        ("all", 3.5, [0, 1, 2, 3], 0),
        ("none", 0.5, [0], 0),
        ("none", 3.5, [], 4),  # it would be catching up: none
        ("latest", 20.5, [20], 20),  # max_lateness 10: the ticks before 10.5 are too late
        ("all", 20.5, [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], 11),
        ("none", 20.5, [], 21),
    ],
)
def test_catch_up_policies(catch_up, late, enqueued, missed):
    definition = every(1, catch_up=catch_up, max_lateness=10)
    plan = definition.plan(START, START + timedelta(seconds=late))
    assert plan.enqueue == [START + timedelta(seconds=s) for s in enqueued]
    assert plan.missed == missed
    assert plan.next_tick_at == START + timedelta(seconds=int(late) + 1)


def test_catch_up_all_enqueues_at_most_a_batch_and_goes_on_from_there():
    plan = every(1, catch_up="all").plan(START, START + timedelta(seconds=500))
    assert len(plan.enqueue) == ALL_LIMIT
    assert plan.next_tick_at == START + timedelta(seconds=ALL_LIMIT)  # due at once, again


def test_not_due_yet_enqueues_nothing():
    plan = every(60).plan(START, START - timedelta(seconds=1))
    assert (plan.enqueue, plan.missed, plan.next_tick_at) == ([], 0, START)


def test_the_hash_changes_with_the_definition():
    assert every(60).hash == every(60).hash
    assert every(60).hash != every(60, kwargs={"a": 1}).hash
    assert every(60).hash != every(60, enabled=False).hash


def define(raw, queues=("default",)):
    return parse("s", raw, alias="default", queues=list(queues), time_zone="Europe/Paris")


def test_parse_fills_in_the_defaults():
    definition = define({"task": "tests.tasks.noop", "cron": "0 3 * * *"})
    assert (definition.timezone, definition.queue_name, definition.catch_up) == (
        "Europe/Paris",
        "default",
        "latest",
    )
    assert define({"task": "tests.tasks.noop", "every": 5}, queues=["a", "b"]).queue_name == "a"


@pytest.mark.parametrize(
    ("raw", "kind", "says"),
    [
        ("0 * * * *", "definition", "must be a dict"),
        ({"task": "tests.tasks.noop"}, "definition", 'exactly one of "cron" and "every"'),
        ({"task": "x.y", "cron": "* * *", "every": 1}, "definition", "exactly one"),
        ({"task": "x.y", "cron": "61 * * * *"}, "definition", "invalid cron expression"),
        ({"task": "x.y", "cron": "0 0 * * * *"}, "definition", "five fields"),
        ({"task": "x.y", "cron": "0 0 30 2 *"}, "definition", "invalid cron expression"),
        ({"task": "x.y", "every": 0.5}, "definition", "from 1 to a year"),
        ({"task": "x.y", "every": True}, "definition", "from 1 to a year"),
        ({"task": "x.y", "every": 5, "timezone": "Mars/Olympus"}, "timezone", "Mars/Olympus"),
        ({"task": "x.y", "every": 5, "catch_up": "some"}, "definition", "latest, all, none"),
        ({"task": "x.y", "every": 5, "queue": "nope"}, "definition", "not one of its QUEUES"),
        ({"task": "x.y", "every": 5, "priority": 101}, "definition", "-100 to 100"),
        ({"task": "x.y", "every": 5, "priority": 1.5}, "definition", "not 1.5"),
        ({"task": "x.y", "every": math.inf}, "definition", "from 1 to a year"),
        ({"task": "x.y", "every": math.nan}, "definition", "from 1 to a year"),
        # Past a year (or infinite), now - max_lateness would overflow at every tick.
        ({"task": "x.y", "every": 5, "max_lateness": math.inf}, "definition", "not inf"),
        ({"task": "x.y", "every": 5, "max_lateness": 6.4e10}, "definition", "1 to a year"),
        ({"task": "x.y", "every": 5, "max_lateness": math.nan}, "definition", "not nan"),
        ({"task": "x.y", "every": 5, "max_lateness": 0.5}, "definition", "1 to a year"),
        ({"task": "x.y", "every": 5, "kwargs": {"a": {1, 2}}}, "definition", "not JSON"),
        ({"task": "x.y", "every": 5, "unique": "yes"}, "definition", '"unique" must be'),
        ({"task": "x.y", "every": 5, "when": 1}, "definition", "unknown key(s) when"),
        ({"task": "noop", "every": 5}, "definition", "dotted path"),
    ],
)
def test_parse_refuses_bad_definitions_saying_why(raw, kind, says):
    with pytest.raises(ScheduleError) as caught:
        define(raw)
    assert caught.value.kind == kind
    assert says in str(caught.value)
    assert "Schedule 's' of TASKS['default']" in str(caught.value) or kind == "definition"


def test_relative_times_for_people():
    assert relative(START + timedelta(minutes=4), START) == "in 4\xa0minutes"
    assert relative(START + timedelta(seconds=35), START) == "in 35 s"
    assert relative(START - timedelta(hours=2), START) == "2\xa0hours ago"
    assert relative(None, START) == "never"
