"""The admin's "Start a task" page through the Django test client: its permission, the
checks it shares with `manage.py enqueue`, the admin log, escaping."""

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from django_jobstate.models import Job
from django_jobstate.states import State

pytestmark = pytest.mark.django_db

LIST_URL = reverse("admin:django_jobstate_job_changelist")
START_URL = reverse("admin:django_jobstate_job_start")


def login(client: Client, *codenames: str, superuser: bool = False) -> User:
    user = User.objects.create_user("operator", is_staff=True, is_superuser=superuser)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return user


def post(client: Client, **fields: str):
    data = {"task": "tests.tasks.record", "args": "[]", "kwargs": "{}", "queue": ""}
    return client.post(START_URL, {**data, "priority": "", "run_after": "", **fields})


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_the_permission_exists_and_only_its_holders_see_the_button_and_the_page(client):
    assert Permission.objects.get(codename="enqueue_task").name == "Can start any task by hand"
    login(client, "view_job", "change_job", "delete_job")
    assert START_URL.encode() not in client.get(LIST_URL).content
    assert client.get(START_URL).status_code == 403
    assert post(client, args='["x"]').status_code == 403
    assert not Job.objects.exists()


@pytest.mark.parametrize("superuser", [False, True])
def test_a_holder_sees_the_button_and_every_task_with_its_parameters(client, superuser):
    login(client, *([] if superuser else ["view_job", "enqueue_task"]), superuser=superuser)
    listing = client.get(LIST_URL).content.decode()
    assert f'href="{START_URL}"' in listing
    page = client.get(START_URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<option value="tests.tasks.record">tests.tasks.record(label: str)</option>' in html
    assert "tests.tasks.attempt_number()</option>" in html  # no `context`
    assert "tests.tasks.not_a_task" not in html


def test_starting_a_task_writes_the_job_the_log_entry_and_links_to_it(client):
    user = login(client, "view_job", "enqueue_task")
    response = post(
        client, args='["by hand"]', queue="reports", priority="5", run_after="2030-01-01T00:00Z"
    )
    job = Job.objects.get()
    assert (job.task_path, job.args, job.queue_name, job.priority) == (
        "tests.tasks.record",
        ["by hand"],
        "reports",
        5,
    )
    assert job.state == State.QUEUED
    url = reverse("admin:django_jobstate_job_change", args=[job.pk])
    assert response.status_code == 302
    assert response.url == url
    [message] = messages_of(response)
    assert message == (
        f'Started tests.tasks.record: <a href="{url}">job #{job.pk}</a> '
        f"(result id {job.result_id})."
    )
    entry = LogEntry.objects.get()
    assert (entry.user, entry.action_flag, entry.object_id) == (user, ADDITION, str(job.pk))
    assert entry.get_change_message() == (
        'Started tests.tasks.record by hand with args ["by hand"] and kwargs {} (queue '
        "'reports', priority 5, run after 2030-01-01T00:00:00+00:00)."
    )
    page = client.get(url).content.decode()
    assert "started by hand by operator" in page


def test_without_the_view_permission_the_form_comes_back_with_the_message(client):
    login(client, "enqueue_task")
    response = post(client, args='["x"]')
    assert response.url == START_URL
    assert messages_of(response)[0].startswith("Started tests.tasks.record: ")


@pytest.mark.parametrize(
    ("fields", "field", "said"),
    [
        ({"args": "[1,"}, "args", "The arguments are not valid JSON"),
        ({"args": "{}"}, "args", "The arguments must be a JSON list"),
        ({"args": '["x"]', "kwargs": "[]"}, "kwargs", "must be a JSON object"),
        ({"args": "[]"}, "args", "The arguments do not fit record(label: str)"),
        ({"args": '["x"]', "queue": "nowhere"}, "queue", "Queue &#x27;nowhere&#x27; is not valid"),
        ({"args": '["x"]', "priority": "101"}, "priority", "priority must be a whole number"),
        ({"args": '["x"]', "priority": "high"}, "priority", "Enter a whole number."),
        ({"args": '["x"]', "run_after": "30"}, "run_after", "has no unit"),
        ({"task": "os.system"}, "task", "Select a valid choice."),
        ({"task": ""}, "task", "This field is required."),
    ],
)
def test_bad_input_comes_back_on_its_field_and_nothing_is_started(client, fields, field, said):
    login(client, "view_job", "enqueue_task")
    response = post(client, **fields)
    assert response.status_code == 200
    assert response.context["form"].errors.keys() == {field}
    assert said in response.content.decode()
    assert "Nothing was started" in response.content.decode()
    assert not Job.objects.exists()
    assert not LogEntry.objects.exists()


def test_what_the_operator_typed_is_escaped_on_the_way_back(client):
    login(client, "view_job", "enqueue_task")
    html = post(client, args='["<script>alert(1)</script>"', queue="<b>q</b>").content.decode()
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>q</b>" not in html
    # Stored, and shown on the job's page and in its history, escaped too.
    post(client, args='["<img src=x onerror=alert(1)>"]')
    job = Job.objects.get()
    for url in [
        reverse("admin:django_jobstate_job_change", args=[job.pk]),
        reverse("admin:django_jobstate_job_history", args=[job.pk]),
    ]:
        page = client.get(url).content.decode()
        assert "<img src=x" not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_unique_tasks_live_job_is_linked_not_duplicated_and_not_logged(client):
    login(client, "view_job", "enqueue_task")
    post(client, task="tests.tasks.unique_record", args='["k"]')
    response = post(client, task="tests.tasks.unique_record", args='["k"]')
    job = Job.objects.get()
    assert response.url == reverse("admin:django_jobstate_job_change", args=[job.pk])
    assert messages_of(response)[-1].startswith(
        "Nothing new was started: tests.tasks.unique_record is unique, and a live job holds "
        "the key: <a href="
    )
    assert LogEntry.objects.count() == 1
    refused = post(client, task="tests.tasks.unique_or_raise", args='["k"]')
    assert refused.status_code == 302
    again = post(client, task="tests.tasks.unique_or_raise", args='["k"]')
    assert again.status_code == 200
    assert again.context["form"].errors.keys() == {"__all__"}
