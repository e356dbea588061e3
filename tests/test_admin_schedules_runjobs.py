"""Schedules made in the admin under real `runjobs` supervisors: picked up without a
restart (NOTIFY on PostgreSQL, the next wake-up elsewhere; the latency is printed), and an
edit while supervisors race, one of them stopped in the middle of a tick of the old
definition: each tick once, the old definition's never after the edit, the new one's
never before it."""

import itertools
from dataclasses import replace
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Count
from django.urls import reverse

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules import edits
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.scheduler import MAX_SLEEP, db_now
from tests.test_schedules_race import STOP_BEFORE_TICK, stop_all, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECOND = timedelta(seconds=1)
FORM = {
    "name": "heartbeat",
    "task_path": "tests.tasks.noop",
    "cron": "",
    "every": "1",
    "timezone": "",
    "args": "[]",
    "kwargs": '{"v": "first"}',
    "queue_name": "",
    "priority": "0",
    "catch_up": "latest",
    "max_lateness": "3600",
    "enabled": "on",
}


def jobs(**filters):
    found = Job.objects.filter(schedule_name="heartbeat", attempt=1, **filters)
    return list(found.order_by("scheduled_for"))


def test_a_schedule_added_edited_and_disabled_in_the_admin_reaches_a_running_runjobs(
    runjobs, client
):
    client.force_login(User.objects.create_superuser("admin"))
    proc = runjobs.start("--concurrency", "1")
    wait_for(lambda: "no schedules in the settings" in runjobs.output(proc))
    wait_for(lambda: "Worker" in runjobs.output(proc) and "started" in runjobs.output(proc))

    added = db_now("default")
    response = client.post(reverse("admin:django_jobstate_schedule_add"), FORM)
    assert response.status_code == 302
    first = wait_for(jobs, timeout=MAX_SLEEP + 60)[0]
    picked_up = (first.enqueued_at - added).total_seconds()

    edited = db_now("default")
    url = reverse("admin:django_jobstate_schedule_change", args=["heartbeat"])
    response = client.post(url, {**FORM, "every": "2", "kwargs": '{"v": "second"}'})
    assert response.status_code == 302
    [second, *_] = wait_for(lambda: jobs(kwargs={"v": "second"}), timeout=MAX_SLEEP + 60)
    assert second.scheduled_for > edited  # never a tick of the new definition before it
    assert all(j.enqueued_at < second.enqueued_at for j in jobs(kwargs={"v": "first"}))
    changed = (second.enqueued_at - edited).total_seconds()

    client.post(
        reverse("admin:django_jobstate_schedule_changelist"),
        {"action": "disable", "index": "0", ACTION_CHECKBOX_NAME: ["heartbeat"]},
    )
    disabled = db_now("default")
    wait_for(lambda: jobs(enqueued_at__gt=disabled) or db_now("default") > disabled + 3 * SECOND)
    out = runjobs.stop(proc)
    assert proc.returncode == 0, out
    assert jobs(enqueued_at__gt=disabled) == []  # disabled: no tick after it
    assert "could not enqueue its tick" not in out
    print(
        f"\n{connection.vendor}: a schedule added in the admin enqueued its first job "
        f"{picked_up:.2f} s after the add (every 1 s); an edit (every 2 s) its first "
        f"{changed:.2f} s after it"
    )


def test_an_admin_edit_while_supervisors_race_never_enqueues_a_tick_twice_early_or_stale(
    runjobs, tmp_path
):
    """Every 1 s ("old"), then every 2 s ("new"), catch_up="all": were a stale supervisor
    to enqueue a tick of the old definition after the edit, or the new one early, the
    ticks would mix; were a tick enqueued twice, the table would say so."""
    old = Definition(name="heartbeat", task_path="tests.tasks.noop", every=1, catch_up="all")
    old = replace(old, kwargs={"v": "old"})
    edits.add(old)
    procs = [runjobs.start("--concurrency", "1") for _ in range(3)]
    wait_for(lambda: len(jobs()) >= 3)
    # One more, whose scheduler waits between reading a due tick (of the old definition)
    # and its compare-and-set, until the gate opens after the edit.
    gate = tmp_path / "tick"
    paused = runjobs.start(
        "--concurrency", "1", "-v", "2", **STOP_BEFORE_TICK, JOBSTATE_TEST_TICK_GATE=str(gate)
    )
    procs.append(paused)
    wait_for(lambda: "Stopping before the compare-and-set" in runjobs.output(paused))

    before = db_now("default")
    edits.edit(Schedule.objects.get(name="heartbeat"), replace(old, every=2, kwargs={"v": "new"}))
    after = db_now("default")
    gate.touch()  # it goes on with the old definition in hand
    wait_for(lambda: "taken by another scheduler" in runjobs.output(paused))
    wait_for(lambda: len(jobs(kwargs={"v": "new"})) >= 4)
    outputs = stop_all(runjobs, procs)

    duplicates = (
        Job.objects.filter(schedule_name="heartbeat", attempt=1)
        .values("scheduled_for")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert list(duplicates) == []
    ordered = sorted(jobs(), key=lambda j: j.scheduled_for)
    versions = [j.kwargs["v"] for j in ordered]
    assert versions == sorted(versions, key=["old", "new"].index)  # old, then new only
    olds = [j for j in ordered if j.kwargs["v"] == "old"]
    news = [j for j in ordered if j.kwargs["v"] == "new"]
    assert all(j.enqueued_at <= after for j in olds)  # none of the old after the edit
    assert news[0].scheduled_for > before  # the new one never early
    assert all(j.scheduled_for.timestamp() % 2 == 0 for j in news)
    gaps = [
        (a, b) for a, b in itertools.pairwise(olds) if b.scheduled_for - a.scheduled_for != SECOND
    ]
    gaps += [
        (a, b)
        for a, b in itertools.pairwise(news)
        if b.scheduled_for - a.scheduled_for != 2 * SECOND
    ]
    assert gaps == []
    assert all(j.enqueued_at >= j.scheduled_for for j in ordered)
    assert not any("could not enqueue its tick" in out for out in outputs)
    assert "Stopping before the compare-and-set of heartbeat" in outputs[-1]
    print(f"\n{connection.vendor}: {len(olds)} old ticks, {len(news)} new, 0 duplicates")
