"""Periodic jobs across real `runjobs` supervisors: one job per tick, whatever happens.

Five supervisors schedule the same definitions; some are killed, one is paused for ten
ticks, PostgreSQL or MariaDB restarts (and a minute of the cron schedule turns meanwhile), one clock
is 90 s ahead, two disagree on the definition.
The Job table must hold exactly one first attempt per (schedule, tick) and no gap that the
catch-up policy does not explain. The figures (ticks, duplicates, lateness) are printed.
"""

import itertools
import json
import os
import signal
import statistics
import subprocess
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.models import Count

from django_jobstate.models import Job, Schedule
from tests.conftest import ROOT, skewed_env
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

POSTGRES = connection.vendor == "postgresql"
SECOND = timedelta(seconds=1)
# "fast" catches up every tick it missed (a restart, a pause of all of them): no gap at all.
SCHEDULES = {
    "fast": {"task": "tests.tasks.noop", "every": 1, "catch_up": "all", "kwargs": {"v": "a"}},
    "minute": {"task": "tests.tasks.noop", "cron": "* * * * *", "timezone": "Europe/Paris"},
}


STOP_BEFORE_TICK = {
    "PYTHONPATH": str(ROOT / "tests" / "stale_tick"),
    "JOBSTATE_TEST_STOP_BEFORE_TICK": "1",
}


def env(schedules=SCHEDULES, **extra):
    tasks = {"default": {**settings.TASKS["default"], "OPTIONS": {"SCHEDULES": schedules}}}
    return {"JOBSTATE_TEST_SETTINGS": json.dumps({"TASKS": tasks}), **extra}


def ticks_of(name):
    return list(
        Job.objects.filter(schedule_name=name, attempt=1)
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
    )


def check_ticks(outputs, *, every=SECOND):
    """Assert one first attempt per tick and no gap in "fast"; return the figures."""
    duplicates = list(
        Job.objects.filter(schedule_name__isnull=False, attempt=1)
        .values("schedule_name", "scheduled_for")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert duplicates == []
    fast = ticks_of("fast")
    gaps = [(a, b) for a, b in itertools.pairwise(fast) if b - a != every]
    assert gaps == [], "ticks of 'fast' missing"
    minute = ticks_of("minute")
    assert all(t.second == 0 and t.microsecond == 0 for t in minute)
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(minute))
    # The backstop index never had to refuse a tick: the compare-and-set did it all.
    assert not any("could not enqueue its tick" in out for out in outputs)
    late = sorted(
        (j.enqueued_at - j.scheduled_for).total_seconds()
        for j in Job.objects.filter(schedule_name="fast", attempt=1).only(
            "enqueued_at", "scheduled_for"
        )
    )
    assert late[0] >= 0, "a tick was enqueued before its time by the database clock"
    figures = {
        "ticks": len(fast) + len(minute),
        "duplicates": len(duplicates),
        "lateness p50 (s)": round(statistics.median(late), 3),
        "lateness max (s)": round(late[-1], 3),
        "missed": sum(Schedule.objects.values_list("missed", flat=True)),
    }
    print(f"\n{connection.vendor}: {figures}")
    return figures


def start_five(runjobs, **extra):
    procs = [runjobs.start("--concurrency", "1", **env(**extra)) for _ in range(5)]
    wait_for(lambda: len(ticks_of("fast")) >= 3)
    return procs


def stop_all(runjobs, procs):
    outputs = []
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            outputs.append(runjobs.stop(proc))
            assert proc.returncode == 0, outputs[-1]
        else:
            outputs.append(runjobs.output(proc))
    return outputs


def run_for(seconds):
    time.sleep(seconds)


def test_five_supervisors_enqueue_each_tick_once(runjobs):
    procs = start_five(runjobs)
    # Five ticks of "fast" after the first three (or JOBSTATE_TEST_SCHEDULE_SECONDS of them,
    # for a longer run by hand). The minute tick of the cron schedule is awaited in the test
    # with faults below, which lasts that long anyway (and races these five as long).
    length = int(os.environ.get("JOBSTATE_TEST_SCHEDULE_SECONDS", 5))
    wait_for(lambda: len(ticks_of("fast")) >= 3 + length, timeout=length + 60)
    outputs = stop_all(runjobs, procs)
    figures = check_ticks(outputs)
    assert figures["ticks"] >= 3 + length
    assert figures["missed"] == 0


def stopped(proc):
    """Whether `proc` is stopped (SIGSTOP): state T in /proc."""
    with open(f"/proc/{proc.pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"


def test_five_supervisors_enqueue_each_tick_once_through_kills_a_pause_and_a_restart(runjobs):
    procs = start_five(runjobs)
    # One more, that stops itself between reading a due tick and writing it.
    paused = runjobs.start("--concurrency", "1", "-v", "2", **env(**STOP_BEFORE_TICK))
    procs.append(paused)
    wait_for(lambda: stopped(paused), timeout=30)
    os.killpg(procs[0].pid, signal.SIGKILL)  # the supervisor and its worker, at once
    procs.append(runjobs.start("--concurrency", "1", **env()))
    run_for(10)  # ten ticks go by without it
    os.killpg(paused.pid, signal.SIGCONT)
    wait_for(lambda: "taken by another scheduler" in runjobs.output(paused))  # it lost
    os.killpg(procs[2].pid, signal.SIGKILL)
    if POSTGRES and os.environ.get("JOBSTATE_PG_CTL"):
        subprocess.run([os.environ["JOBSTATE_PG_CTL"], "restart", "-m", "fast", "-w"], check=True)
        connections.close_all()
    elif connection.vendor == "mysql" and os.environ.get("JOBSTATE_MYSQL_CTL"):
        subprocess.run([os.environ["JOBSTATE_MYSQL_CTL"], "restart"], check=True)
        connections.close_all()
    after_faults = len(ticks_of("fast"))
    wait_for(lambda: len(ticks_of("fast")) >= after_faults + 3)  # the ticks go on
    # And a minute tick of the cron schedule came, once (at most a minute after the start,
    # whenever that was: the faults above took about half of it).
    wait_for(lambda: ticks_of("minute"), timeout=75)
    outputs = stop_all(runjobs, procs)
    figures = check_ticks(outputs)  # and none was lost nor doubled meanwhile
    assert len(ticks_of("minute")) >= 1
    assert figures["missed"] == 0
    assert "Stopping before the compare-and-set" in outputs[5]


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite is one machine with one clock")
def test_a_supervisor_whose_clock_is_90_s_ahead_neither_ticks_early_nor_twice(runjobs):
    schedules = {"fast": SCHEDULES["fast"]}
    skewed = runjobs.start("--concurrency", "1", **env(schedules, **skewed_env(90)))
    wait_for(lambda: len(ticks_of("fast")) >= 3)
    normal = runjobs.start("--concurrency", "1", **env(schedules))
    run_for(6)  # its start, then a few ticks that both of them could take
    outputs = stop_all(runjobs, [skewed, normal])
    check_ticks(outputs)  # lateness >= 0 by the database clock, no duplicate, no gap
    first = Job.objects.filter(schedule_name="fast").order_by("scheduled_for").first()
    # Never early; and not 90 s late either (30 s: a loaded CI machine delays a tick).
    assert first.scheduled_for <= first.enqueued_at < first.scheduled_for + 30 * SECOND


def test_two_definitions_of_one_schedule_never_enqueue_two_jobs_for_one_tick(runjobs):
    """A rolling deploy: each version stores its definition when it starts; only the stored
    one enqueues. Every 2 s and every 3 s: were both to enqueue, their ticks would mix."""
    old = {"fast": {"task": "tests.tasks.noop", "every": 2, "kwargs": {"v": "old"}}}
    new = {"fast": {"task": "tests.tasks.noop", "every": 3, "kwargs": {"v": "new"}}}
    procs = [runjobs.start("--concurrency", "1", **env(old))]
    wait_for(lambda: len(ticks_of("fast")) >= 2)
    procs.append(runjobs.start("--concurrency", "1", **env(new)))
    wait_for(lambda: Job.objects.filter(kwargs={"v": "new"}).count() >= 2)
    run_for(2)  # with the 3 s or more above: the old one had two ticks or more to take
    os.killpg(procs[0].pid, signal.SIGKILL)  # the old version restarts, and stores its own
    procs.append(runjobs.start("--concurrency", "1", **env(old)))
    wait_for(lambda: Job.objects.filter(kwargs={"v": "old"}, id__gt=last_new_id()).count() >= 2)
    run_for(3)  # with the 2 s or more above: the new one had a tick or more to take
    outputs = stop_all(runjobs, procs)

    jobs = list(Job.objects.filter(schedule_name="fast").order_by("scheduled_for"))
    versions = [job.kwargs["v"] for job in jobs]
    changes = sum(a != b for a, b in itertools.pairwise(versions))
    assert changes == 2, versions  # old, then new, then old: never both at once
    for job in jobs:
        seconds = (job.scheduled_for - job.scheduled_for.replace(second=0, microsecond=0)).seconds
        assert seconds % (2 if job.kwargs["v"] == "old" else 3) == 0
    assert len({job.scheduled_for for job in jobs}) == len(jobs)
    assert not any("could not enqueue its tick" in out for out in outputs)
    assert all(j.enqueued_at >= j.scheduled_for for j in jobs)
    assert Job.objects.filter(schedule_name="fast").values("scheduled_for").distinct().count() == (
        Job.objects.filter(schedule_name="fast", attempt=1).count()
    )


def test_a_deploy_whose_store_races_a_tick_of_the_old_release_moves_on(runjobs, tmp_path):
    """The new release reads the row, pauses, the old release ticks twice meanwhile: the
    new definition must not start at a tick already enqueued (the backstop index would
    refuse it at every try, and nothing would be enqueued for up to max_lateness)."""
    # catch_up="all": the new release would retry the tick enqueued for up to max_lateness.
    fast = {"task": "tests.tasks.noop", "every": 2, "catch_up": "all"}
    old = {"fast": {**fast, "kwargs": {"v": "old"}}}
    new = {"fast": {**fast, "kwargs": {"v": "new"}}}
    gate = tmp_path / "store"
    pause = {
        "PYTHONPATH": str(ROOT / "tests" / "stale_tick"),
        "JOBSTATE_TEST_PAUSE_BEFORE_STORE": str(gate),
    }
    procs = [runjobs.start("--concurrency", "1", **env(old))]
    wait_for(lambda: len(ticks_of("fast")) >= 2)
    procs.append(runjobs.start("--concurrency", "1", **env(new, **pause)))
    wait_for(lambda: "Pausing before the store" in runjobs.output(procs[1]))
    ticked = len(ticks_of("fast"))
    wait_for(lambda: len(ticks_of("fast")) >= ticked + 2)  # by the old release
    gate.touch()
    wait_for(lambda: Job.objects.filter(kwargs={"v": "new"}).count() >= 2)
    outputs = stop_all(runjobs, procs)

    assert not any("could not enqueue its tick" in out for out in outputs)
    jobs = list(Job.objects.filter(schedule_name="fast").order_by("scheduled_for"))
    assert len({job.scheduled_for for job in jobs}) == len(jobs)
    versions = [job.kwargs["v"] for job in jobs]
    assert versions == sorted(versions, key=["old", "new"].index)  # old, then new only
    gaps = [
        (a, b)
        for a, b in itertools.pairwise(jobs)
        if b.scheduled_for - a.scheduled_for != 2 * SECOND
    ]
    assert gaps == []  # not a tick lost across the deploy


def last_new_id():
    return Job.objects.filter(kwargs={"v": "new"}).order_by("-id").values_list("id", flat=True)[0]


def test_no_schedules_and_burst_runs_enqueue_no_tick(runjobs):
    quiet = runjobs.start("--no-schedules", **env())
    wait_for(lambda: "Worker" in runjobs.output(quiet) and "started" in runjobs.output(quiet))
    assert runjobs.run("--burst", **env()).returncode == 0
    run_for(3)  # three ticks of "fast", were anything scheduling
    out = runjobs.stop(quiet)
    assert quiet.returncode == 0, out
    assert not Schedule.objects.exists()
    assert not Job.objects.exists()
    assert "schedules fast" not in out
