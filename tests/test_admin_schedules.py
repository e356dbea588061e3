"""The schedules' admin through the Django test client: the list, Enable, Disable, Run now."""

from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.urls import reverse

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition
from django_jobstate.schedules.scheduler import Scheduler, db_now, sync
from django_jobstate.states import State

pytestmark = pytest.mark.django_db

LIST_URL = reverse("admin:django_jobstate_schedule_changelist")
NIGHTLY = Definition(
    name="nightly", task_path="tests.tasks.noop", cron="0 3 * * *", timezone="Europe/Paris"
)
POLL = Definition(name="poll", task_path="tests.tasks.noop", every=300, unique=True)


def login(client, *perms):
    user = User.objects.create_user(f"user{User.objects.count()}", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_jobstate",
            codename__in=[f"{p}_schedule" for p in perms],
        )
    )
    client.force_login(user)


def act(client, action, *names):
    data = {"action": action, "index": "0", ACTION_CHECKBOX_NAME: list(names)}
    response = client.post(LIST_URL, data, follow=True)
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def schedules():
    sync([NIGHTLY, POLL])


def test_the_list_shows_each_schedule_its_next_tick_and_its_last_job(client, schedules):
    due = Schedule.objects.get(name="poll").next_tick_at - timedelta(seconds=300)
    Schedule.objects.filter(name="poll").update(next_tick_at=due)
    Scheduler("t", {NIGHTLY.name: NIGHTLY, POLL.name: POLL}).run_once()
    login(client, "view")
    page = client.get(LIST_URL).content.decode()
    assert "0 3 * * * (Europe/Paris)" in page
    assert "every 300 s" in page
    assert "(in " in page  # the next tick, "in 4 minutes"
    job = Job.objects.get(schedule_name="poll")
    assert reverse("admin:django_jobstate_job_change", args=[job.pk]) in page
    assert "jobstate-badge jobstate-queued" in page
    assert "schedule_name=poll" in page
    # A view permission offers no action, and no page saves a schedule.
    assert 'name="action"' not in page
    detail = client.get(reverse("admin:django_jobstate_schedule_change", args=["nightly"]))
    assert detail.status_code == 200
    assert b'type="submit"' not in detail.content or b"_save" not in detail.content


def test_the_jobs_of_a_schedule_are_listed_by_its_link(client, schedules):
    from tests.test_admin import login as job_login

    now = db_now("default")
    ours = Job.objects.enqueue("tests.tasks.noop", schedule_name="poll", scheduled_for=now)
    other = Job.objects.enqueue("tests.tasks.noop", schedule_name="nightly", scheduled_for=now)
    job_login(client, "view")
    response = client.get(
        reverse("admin:django_jobstate_job_changelist"), {"schedule_name": "poll"}
    )
    shown = [job.pk for job in response.context["cl"].result_list]
    assert shown == [ours.pk]
    assert other.pk not in shown


def test_disable_and_enable_persist_and_say_what_they_changed(client, schedules):
    login(client, "view", "change")
    assert act(client, "disable", "nightly") == ["1 schedule disabled."]
    assert act(client, "disable", "nightly", "poll") == [
        "1 schedule disabled. 1 already were, or are removed."
    ]
    assert not Schedule.objects.filter(enabled=True).exists()
    sync([NIGHTLY, POLL])  # a restart of runjobs
    assert not Schedule.objects.filter(enabled=True).exists()

    Schedule.objects.filter(name="poll").update(next_tick_at=db_now("default") - timedelta(1))
    assert act(client, "enable", "poll") == ["1 schedule enabled."]
    row = Schedule.objects.get(name="poll")
    assert row.enabled
    assert row.next_tick_at > db_now("default")  # the ticks missed while disabled: none due


def test_run_now_enqueues_an_extra_job_and_leaves_the_ticks_alone(client, schedules):
    before = Schedule.objects.get(name="poll").next_tick_at
    login(client, "view", "change")
    [message] = act(client, "run_now", "poll")
    job = Job.objects.get(schedule_name="poll")
    url = reverse("admin:django_jobstate_job_change", args=[job.pk])
    assert message == f"Enqueued: <a href='{url}'>poll (job {job.pk})</a>"
    assert (job.state, job.attempt) == (State.QUEUED, 1)
    assert Schedule.objects.get(name="poll").next_tick_at == before
    # Work started by hand: the admin log says who, as Start a task's does.
    [entry] = LogEntry.objects.filter(object_id="poll")
    assert (entry.user.username, entry.get_change_message()) == (
        User.objects.get().username,
        f"Run now: job #{job.pk}.",
    )
    # A unique schedule whose last run is still live: not another one.
    [message] = act(client, "run_now", "poll")
    assert message.startswith("Not enqueued, a job with the same unique key is still live")
    assert f"poll (job {job.pk})" in message
    assert Job.objects.filter(schedule_name="poll").count() == 1


def test_the_actions_need_the_change_permission(client, schedules):
    login(client, "view")
    act(client, "disable", "nightly")
    act(client, "run_now", "nightly")
    assert Schedule.objects.get(name="nightly").enabled
    assert not Job.objects.exists()
