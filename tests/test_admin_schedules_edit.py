"""Schedules made in the admin, through the Django test client: add, edit, delete, the
form's errors, permissions, the admin log, escaping; and the settings' rows left alone."""

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules import edits
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.model import Origin
from django_jobstate.schedules.scheduler import Scheduler, db_now, sync

pytestmark = pytest.mark.django_db

ADD_URL = reverse("admin:django_jobstate_schedule_add")
LIST_URL = reverse("admin:django_jobstate_schedule_changelist")
NIGHTLY = Definition(name="nightly", task_path="tests.tasks.noop", cron="0 3 * * *")
FORM = {
    "name": "poll",
    "task_path": "tests.tasks.record",
    "cron": "",
    "every": "300",
    "timezone": "",
    "args": "[]",
    "kwargs": '{"label": "polled"}',
    "queue_name": "",
    "priority": "0",
    "catch_up": "latest",
    "max_lateness": "3600",
    "enabled": "on",
}


def change_url(name):
    return reverse("admin:django_jobstate_schedule_change", args=[name])


def login(client, *perms):
    user = User.objects.create_user(f"user{User.objects.count()}", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_jobstate",
            codename__in=[f"{p}_schedule" for p in perms],
        )
    )
    client.force_login(user)
    return user


def add(client, **changes):
    return client.post(ADD_URL, {**FORM, **changes})


def errors(response):
    form = response.context["adminform"].form
    return {field: " ".join(messages) for field, messages in form.errors.items()}


def test_add_stores_an_admin_row_from_its_first_tick_after_now(client):
    user = login(client, "view", "add", "change")
    before = db_now("default")
    response = add(client)
    assert response.status_code == 302, errors(response)
    row = Schedule.objects.get(name="poll")
    assert row.origin == Origin.ADMIN
    assert (row.task_path, row.every, row.kwargs, row.backend) == (
        "tests.tasks.record",
        300,
        {"label": "polled"},
        "default",
    )
    assert row.queue_name == "default"
    assert row.timezone == "UTC"  # the TIME_ZONE setting's
    assert before < row.next_tick_at <= before + timedelta(seconds=300)
    assert row.definition_hash == edits.token(Definition.from_row(row))
    entry = LogEntry.objects.get(object_id="poll")
    assert (entry.user, entry.action_flag) == (user, ADDITION)

    # It ticks as any schedule does: made due, a scheduler enqueues its job.
    Schedule.objects.filter(name="poll").update(next_tick_at=before - timedelta(seconds=1))
    Scheduler("t", {}).run_once()
    job = Job.objects.get(schedule_name="poll")
    assert (job.task_path, job.kwargs) == ("tests.tasks.record", {"label": "polled"})


@pytest.mark.parametrize(
    ("changes", "field", "text"),
    [
        ({"task_path": "tests.tasks.not_a_task"}, "task_path", "is a function, not a Task"),
        ({"task_path": "nowhere.tasks.f"}, "task_path", "not a task module of this project"),
        ({"every": "", "cron": "*/5 * * *"}, "cron", "needs five fields"),
        ({"every": "0.5"}, "every", '"every" must be a number of seconds from 1 to a year'),
        ({"cron": "0 3 * * *"}, "__all__", 'needs exactly one of "cron" and "every"'),
        ({"every": ""}, "__all__", 'needs exactly one of "cron" and "every"'),
        ({"timezone": "Europe/Pariss"}, "timezone", "unknown time zone 'Europe/Pariss'"),
        ({"kwargs": "{"}, "kwargs", "Enter a valid JSON"),
        ({"kwargs": "[1]"}, "kwargs", "must be a JSON object"),
        ({"args": '{"a": 1}'}, "args", "must be a JSON list"),
        ({"kwargs": '{"lable": "x"}'}, "args", "do not match record()"),
        ({"args": '["a", "b"]', "kwargs": "{}"}, "args", "do not match record()"),
        ({"queue_name": "nowhere"}, "queue_name", "queue 'nowhere' is not one of its QUEUES"),
        ({"priority": "101"}, "priority", "from -100 to 100"),
        ({"max_lateness": "0"}, "max_lateness", '"max_lateness" must be a number'),
        ({"name": ""}, "name", "required"),
        ({"name": "jobstate.prune"}, "name", "The settings define a schedule named"),
    ],
)
def test_the_form_says_what_is_wrong_beside_its_field(client, changes, field, text):
    login(client, "view", "add")
    response = add(client, **changes)
    assert response.status_code == 200
    found = errors(response)
    assert text in found.get(field, ""), found
    assert not Schedule.objects.exists()


@override_settings(
    TASKS={
        "default": {
            "BACKEND": "django_jobstate.backend.JobStateBackend",
            "OPTIONS": {"SCHEDULES": {"nightly": {"task": "tests.tasks.noop", "every": 60}}},
        }
    }
)
def test_a_name_of_the_settings_or_of_another_schedule_is_refused(client):
    login(client, "view", "add")
    assert (
        "The settings define a schedule named 'nightly'"
        in errors(add(client, name="nightly"))["name"]
    )
    assert add(client).status_code == 302
    assert errors(add(client))["name"] == "A schedule named 'poll' exists already."
    Schedule.objects.filter(name="poll").update(
        origin=Origin.SETTINGS, removed_at=db_now("default")
    )
    assert "delete it first to reuse its name" in errors(add(client))["name"]


def test_a_name_another_operator_adds_meanwhile_is_a_clear_error_not_a_500(client, monkeypatch):
    """Two operators add "poll" at the same moment: both forms were valid; the second
    save finds the name taken (its primary key) and says so, nothing else written."""
    login(client, "view", "add", "change")
    stored = edits.add

    def theirs_first(definition):  # the other operator's row commits between clean and save
        stored(replace(definition, kwargs={"label": "theirs"}))
        return stored(definition)

    monkeypatch.setattr(edits, "add", theirs_first)
    response = client.post(ADD_URL, FORM, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert shown == [
        "A schedule named 'poll' was added by someone else while this form was saved: yours "
        "was not added. Edit theirs, or add yours under another name."
    ], shown
    assert Schedule.objects.get(name="poll").kwargs == {"label": "theirs"}
    assert not LogEntry.objects.filter(action_flag=ADDITION).exists()


def test_an_edit_changes_the_hash_and_next_tick_conditionally_and_is_logged(client):
    user = login(client, "view", "add", "change")
    add(client)
    row = Schedule.objects.get(name="poll")
    before = db_now("default")
    response = client.post(change_url("poll"), {**FORM, "every": "", "cron": "0 3 * * *"})
    after = db_now("default")
    assert response.status_code == 302, errors(response)
    edited = Schedule.objects.get(name="poll")
    assert (edited.cron, edited.every) == ("0 3 * * *", None)
    assert edited.definition_hash != row.definition_hash
    # From the first tick after the edit's clock, which this test's two readings bracket
    # (the old next tick is no bound: at 02:55-03:00 UTC every 300 s made it 03:00 itself).
    ticks = {Definition.from_row(edited).next_tick(now) for now in (before, after)}
    assert edited.next_tick_at in ticks
    assert edited.next_tick_at.hour == 3
    entry = LogEntry.objects.filter(object_id="poll", action_flag=CHANGE).get()
    assert entry.user == user
    assert "Cron" in entry.get_change_message()
    assert "Every" in entry.get_change_message()

    # The name is the key of its jobs: read-only once made.
    page = client.get(change_url("poll")).content.decode()
    assert 'name="name"' not in page
    assert 'name="cron"' in page


def test_an_edit_never_starts_at_a_tick_already_enqueued():
    d = Definition(name="fast", task_path="tests.tasks.noop", every=60)
    row = edits.add(d)
    now = db_now("default")
    # The last tick enqueued is later than now (a clock step back: SQLite's is the machine's).
    Schedule.objects.filter(name="fast").update(last_tick_at=now + timedelta(minutes=5))
    row = Schedule.objects.get(name="fast")
    edited = edits.edit(row, Definition(name="fast", task_path="tests.tasks.noop", every=30))
    assert edited.next_tick_at > now + timedelta(minutes=5)


def test_a_tick_of_the_old_definition_read_before_an_edit_is_not_enqueued_after_it():
    old = Definition(name="fast", task_path="tests.tasks.noop", every=60, kwargs={"v": "old"})
    edits.add(old)
    due = db_now("default") - timedelta(seconds=1)
    Schedule.objects.filter(name="fast").update(next_tick_at=due)
    scheduler = Scheduler("t", {})
    [(_, read_due, token, definition)], now = scheduler._earliest("default")
    assert (definition.kwargs, read_due) == ({"v": "old"}, due)

    edits.edit(Schedule.objects.get(name="fast"), replace(old, kwargs={"v": "new"}))
    scheduler._tick("default", definition, read_due, now, token)  # it wakes: stale
    assert not Job.objects.exists()
    # Even were the new next tick the tick it read: the hash differs.
    Schedule.objects.filter(name="fast").update(next_tick_at=due)
    scheduler._tick("default", definition, read_due, now, token)
    assert not Job.objects.exists()
    scheduler.run_once()  # reads the row afresh: the new definition
    assert [j.kwargs for j in Job.objects.all()] == [{"v": "new"}]


def test_an_edit_made_again_over_a_row_that_ticked_meanwhile():
    d = Definition(name="fast", task_path="tests.tasks.noop", every=60)
    edits.add(d)
    stale = Schedule.objects.get(name="fast")
    # Meanwhile a tick was enqueued (its time later than now: a clock that stepped back).
    later = db_now("default") + timedelta(minutes=10)
    Schedule.objects.filter(name="fast").update(
        next_tick_at=later + timedelta(minutes=1), last_tick_at=later
    )
    edited = edits.edit(stale, replace(d, every=120))
    assert edited.every == 120
    assert edited.next_tick_at > later  # read again: after the tick enqueued meanwhile


def test_delete_removes_an_admin_row_and_is_logged_but_never_a_live_settings_one(client):
    sync([NIGHTLY])
    user = login(client, "view", "add", "change", "delete")
    add(client)
    delete = reverse("admin:django_jobstate_schedule_delete", args=["poll"])
    assert client.post(delete, {"post": "yes"}).status_code == 302
    assert not Schedule.objects.filter(name="poll").exists()
    entry = LogEntry.objects.get(object_id="poll", action_flag=DELETION)
    assert entry.user == user
    nightly = reverse("admin:django_jobstate_schedule_delete", args=["nightly"])
    assert client.post(nightly, {"post": "yes"}).status_code == 403
    assert Schedule.objects.filter(name="nightly").exists()


def test_the_settings_rows_stay_read_only_and_the_admins_are_never_synced_over(client):
    sync([NIGHTLY])
    login(client, "view", "add", "change", "delete")
    page = client.get(change_url("nightly")).content.decode()
    assert 'name="_save"' not in page
    assert 'name="cron"' not in page
    assert "0 3 * * *" in page
    response = client.post(change_url("nightly"), {**FORM, "name": "nightly"})
    assert response.status_code == 403
    assert Schedule.objects.get(name="nightly").every is None

    add(client)
    row = Schedule.objects.get(name="poll")
    sync([NIGHTLY])  # the settings lack "poll": an admin row is never marked removed
    assert Schedule.objects.get(name="poll").removed_at is None
    clash = Definition(name="poll", task_path="tests.tasks.noop", every=5)
    assert sync([NIGHTLY, clash]) == ["poll"]  # the settings' one is not stored
    kept = Schedule.objects.get(name="poll")
    assert (kept.origin, kept.definition_hash, kept.every) == ("admin", row.definition_hash, 300)


@override_settings(
    TASKS={
        "default": {
            "BACKEND": "django_jobstate.backend.JobStateBackend",
            "OPTIONS": {"SCHEDULES": {"poll": {"task": "tests.tasks.noop", "every": 60}}},
        }
    }
)
def test_a_settings_schedule_named_as_an_admin_one_is_reported_by_check_e018():
    edits.add(Definition(name="poll", task_path="tests.tasks.noop", every=300))
    found = [m for m in run_checks(databases=["default"]) if m.id == "django_jobstate.E018"]
    [message] = found
    assert "Schedule 'poll' of the settings is not scheduled" in message.msg
    assert "delete the admin's schedule" in message.hint
    assert not [m for m in run_checks() if m.id == "django_jobstate.E018"]  # database only


def test_enable_and_disable_are_logged_for_both_origins(client):
    sync([NIGHTLY])
    user = login(client, "view", "add", "change")
    add(client)
    data = {"action": "disable", "index": "0", ACTION_CHECKBOX_NAME: ["nightly", "poll"]}
    client.post(LIST_URL, data)
    assert not Schedule.objects.filter(enabled=True).exists()
    client.post(LIST_URL, {**data, "action": "enable"})
    assert Schedule.objects.filter(enabled=True).count() == 2
    messages = sorted(
        (e.object_id, e.change_message)
        for e in LogEntry.objects.filter(action_flag=CHANGE, user=user)
    )
    assert messages == [
        ("nightly", "Disabled."),
        ("nightly", "Enabled."),
        ("poll", "Disabled."),
        ("poll", "Enabled."),
    ]


def test_permissions_derive_from_djangos(client):
    login(client, "view")
    assert client.get(ADD_URL).status_code == 403
    assert add(client).status_code == 403
    edits.add(Definition(name="poll", task_path="tests.tasks.noop", every=300))
    page = client.get(change_url("poll")).content.decode()
    assert 'name="_save"' not in page
    assert client.post(change_url("poll"), {**FORM, "every": "60"}).status_code == 403
    login(client, "view", "change")
    delete = reverse("admin:django_jobstate_schedule_delete", args=["poll"])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert Schedule.objects.get(name="poll").every == 300


def test_names_and_arguments_are_escaped(client):
    login(client, "view", "add", "change")
    evil = "<script>alert(1)</script>"
    response = add(client, name=evil, kwargs=json.dumps({"label": evil}))
    assert response.status_code == 302, errors(response)
    for url in (LIST_URL, change_url(evil)):
        page = client.get(url).content.decode()
        assert evil not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    bad = add(client, name="x", task_path=evil).content.decode()
    assert evil not in bad
    assert "&lt;script&gt;" in bad


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_each_write_notifies_the_supervisors_when_it_commits():
    from django_jobstate.db.notify import SCHEDULES_CHANNEL
    from django_jobstate.runner.wakeup import listen

    listener = listen("default", SCHEDULES_CHANNEL)
    try:
        d = Definition(name="poll", task_path="tests.tasks.noop", every=300)
        row = edits.add(d)
        edits.edit(row, replace(d, every=60))
        edits.set_enabled(Schedule.objects.get(name="poll"), False)
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=3)]
        assert heard == ["poll", "poll", "poll"]
    finally:
        listener.close()


@pytest.mark.django_db(transaction=True)
def test_migration_0013_gives_the_rows_stored_before_it_the_settings_origin():
    from django.core.management import call_command

    call_command("migrate", "django_jobstate", "0012", verbosity=0)
    try:
        with connection.cursor() as cursor:  # a row that sync() stored before 0013
            cursor.execute(
                "INSERT INTO django_jobstate_schedule (name, task_path, cron, every, timezone, "
                "args, kwargs, backend, queue_name, priority, "
                + connection.ops.quote_name("unique")
                + ", catch_up, max_lateness, definition_hash, enabled, next_tick_at, skipped, "
                "missed) VALUES ('old', 'tests.tasks.noop', '', 60, 'UTC', '[]', '{}', 'default', "
                "'default', 0, %s, 'latest', 3600, 'x', %s, %s, 0, 0)",
                [False, True, db_now("default")],
            )
    finally:
        call_command("migrate", "django_jobstate", verbosity=0)
    assert Schedule.objects.get(name="old").origin == Origin.SETTINGS
