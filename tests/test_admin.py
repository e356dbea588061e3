"""The job admin through the Django test client: permissions, actions, races, the pages."""

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import OperationalError, connection
from django.forms.models import model_to_dict
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobstate.admin import filters as admin_filters
from django_jobstate.models import Job, JobQueue
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.conftest import keep_a_worker_writing
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

LIST_URL = reverse("admin:django_jobstate_job_changelist")
NOT_QUEUED = [State.RUNNING, State.SUCCEEDED, State.FAILED]


def change_url(job: Job) -> str:
    return reverse("admin:django_jobstate_job_change", args=[job.pk])


def delete_url(job: Job) -> str:
    return reverse("admin:django_jobstate_job_delete", args=[job.pk])


def login(client: Client, *perms: str, superuser: bool = False) -> User:
    """Log in a staff user holding `perms` ('view', 'change', 'delete' on Job)."""
    user = User.objects.create_user(
        f"user{User.objects.count()}", is_staff=True, is_superuser=superuser
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_jobstate", codename__in=[f"{p}_job" for p in perms]
        )
    )
    client.force_login(user)
    return user


CONFIRM_TEMPLATE = "admin/django_jobstate/job/confirm_action.html"


def confirmation_form(response) -> tuple[str, list[tuple[str, str]]]:
    """The confirmation page's form: where it posts, and its hidden fields."""
    assert response.status_code == 200
    assert CONFIRM_TEMPLATE in [t.name for t in response.templates]
    form = response.content.decode().split('<form method="post" action="')[1].split("</form>")[0]
    action = html.unescape(form.split('"')[0])
    fields = re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', form)
    return action, [(html.unescape(n), html.unescape(v)) for n, v in fields]


def confirm(client: Client, response):
    """Press the confirmation page's Yes: post its form as the browser would."""
    action, fields = confirmation_form(response)
    data: dict[str, list[str]] = {}
    for name, value in fields:
        data.setdefault(name, []).append(value)
    return client.post(action, data)


def run_action(client: Client, action: str, *jobs: Job, url: str = LIST_URL, **extra: str):
    """Run a list action as an operator does: choose it, then confirm it when asked."""
    data = {"action": action, "index": "0", ACTION_CHECKBOX_NAME: [j.pk for j in jobs], **extra}
    response = client.post(url, data)
    if response.status_code == 200 and CONFIRM_TEMPLATE in [t.name for t in response.templates]:
        return confirm(client, response)
    return response


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def row(job: Job) -> dict:
    """Everything stored for `job`, read back from the database."""
    return model_to_dict(Job.objects.get(pk=job.pk), fields=[f.name for f in Job._meta.fields])


# Permissions.


def test_staff_without_view_permission_sees_nothing(client):
    login(client, "delete")
    job = JobFactory.in_state(State.QUEUED)
    assert client.get(LIST_URL).status_code == 403
    assert client.get(change_url(job)).status_code == 403
    assert client.get(delete_url(job)).status_code == 403
    assert client.post(delete_url(job), {"post": "yes"}).status_code == 403
    assert run_action(client, "cancel_jobs", job).status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()
    assert "django_jobstate" not in client.get(reverse("admin:index")).content.decode()


def test_anonymous_user_is_sent_to_the_login_page(client):
    response = client.get(LIST_URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_nobody_can_add_a_job(client):
    login(client, superuser=True)
    assert client.get(reverse("admin:django_jobstate_job_add")).status_code == 403
    response = client.post(reverse("admin:django_jobstate_job_add"), {"task_path": "x"})
    assert response.status_code == 403
    assert not Job.objects.exists()
    assert reverse("admin:django_jobstate_job_add") not in client.get(LIST_URL).content.decode()


@pytest.mark.parametrize("state", list(State))
def test_job_page_is_read_only_for_a_superuser(client, state):
    login(client, superuser=True)
    job = JobFactory.in_state(state)
    response = client.get(change_url(job))
    assert response.context["adminform"].form.fields == {}  # every field read-only
    html = response.content.decode()
    assert 'name="_save"' not in html
    assert 'name="_continue"' not in html
    assert 'class="closelink"' in html
    assert 'class="deletelink"' not in html  # a job is never deleted from the admin


@pytest.mark.parametrize("state", list(State))
def test_hand_crafted_post_to_the_change_url_is_refused(client, state):
    login(client, superuser=True)
    job = JobFactory.in_state(state)
    before = row(job)
    data = {
        "state": State.SUCCEEDED,
        "task_path": "tests.tasks.boom",
        "args": '["evil"]',
        "attempt": "9",
        "queue_name": "other",
        "priority": "99",
        "run_after": "2000-01-01 00:00:00",
        "_save": "Save",
    }
    assert client.post(change_url(job), data).status_code == 403
    assert row(job) == before


@pytest.mark.parametrize("state", list(State))
def test_hand_crafted_post_to_the_delete_url_is_refused(client, state):
    login(client, superuser=True)
    job = JobFactory.in_state(state)
    before = row(job)
    assert client.get(delete_url(job)).status_code == 403
    assert client.post(delete_url(job), {"post": "yes"}).status_code == 403
    assert row(job) == before


def cancel_url(job: Job) -> str:
    return reverse("admin:django_jobstate_job_cancel", args=[job.pk])


def test_a_live_job_is_cancelled_from_its_page_with_the_change_permission(client):
    queued, running = JobFactory.in_state(State.QUEUED), JobFactory.in_state(State.RUNNING)
    for perms in [("view",), ("view", "delete")]:  # delete no longer stops work
        login(client, *perms)
        assert client.post(cancel_url(queued)).status_code == 403
        assert client.post(cancel_url(queued), {"confirm": "yes"}).status_code == 403
        assert client.get(cancel_url(queued)).status_code == 403
        assert cancel_url(queued) not in client.get(change_url(queued)).content.decode()
    assert Job.objects.get(pk=queued.pk).state == State.QUEUED

    user = login(client, "view", "change")
    page = client.get(change_url(queued)).content.decode()
    assert f'<a href="{cancel_url(queued)}" class="button jobstate-cancel-button">' in page
    assert "Cancel: it will never run" in page
    asked = client.get(cancel_url(queued))  # the button: a page that asks first
    said = f"Job #{queued.pk} is queued: it will fail as cancelled and never run."
    assert said in asked.content.decode()
    assert client.post(cancel_url(queued)).status_code == 200  # unconfirmed: asks again
    assert Job.objects.get(pk=queued.pk).state == State.QUEUED
    response = confirm(client, asked)
    assert "it will never run" in messages_of(response)[0]
    cancelled = Job.objects.get(pk=queued.pk)
    assert (cancelled.state, cancelled.failure_reason) == (State.FAILED, "cancelled")
    html_page = client.get(change_url(queued)).content.decode()
    assert f"by {user.username}" in html_page  # who asked, from the admin's log
    assert cancel_url(queued) not in html_page

    assert "Cancel: ask it to stop" in client.get(change_url(running)).content.decode()
    asked = client.get(cancel_url(running))
    text = asked.content.decode()
    assert f"Job #{running.pk} is running on worker factory-worker: it will be asked to stop" in (
        text
    )
    assert Job.objects.get(pk=running.pk).cancel_requested_at is None  # asking wrote nothing
    response = confirm(client, asked)
    assert "asked to stop" in messages_of(response)[0]
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    assert "cancel requested" in client.get(LIST_URL).content.decode()  # the list's badge
    assert LogEntry.objects.filter(user=user).count() == 2

    done = JobFactory.in_state(State.SUCCEEDED)
    assert cancel_url(done) not in client.get(change_url(done)).content.decode()
    page = client.get(cancel_url(done)).content.decode()
    assert "has finished: there is nothing to cancel" in page
    assert 'value="Yes' not in page
    response = client.post(cancel_url(done), {"confirm": "yes"}, follow=True)
    assert "already finished" in messages_of(response)[0]


def test_view_permission_offers_no_actions_and_refuses_posted_ones(client):
    login(client, "view")
    failed, queued = JobFactory.in_state(State.FAILED), JobFactory.in_state(State.QUEUED)
    response = client.get(LIST_URL)
    assert response.status_code == 200
    assert response.context["action_form"] is None
    for action, job in [
        ("retry_jobs", failed),
        ("run_now", queued),
        ("cancel_jobs", queued),
        ("delete_selected", queued),
    ]:  # and the Cancel button's URL
        assert client.post(cancel_url(job)).status_code == 403
        before = row(job)
        run_action(client, action, job)
        assert row(job) == before
    assert Job.objects.count() == 2


def test_actions_follow_the_change_and_delete_permissions(client):
    def offered() -> set[str]:
        form = client.get(LIST_URL).context["action_form"]
        return {name for name, _label in form.fields["action"].choices if name} if form else set()

    login(client, "view", "change")
    assert offered() == {"retry_jobs", "retry_jobs_cancelled_too", "run_now", "cancel_jobs"}
    login(client, "view", "delete")
    assert offered() == set()  # never the stock bulk delete, nor a cancel: it stops work
    login(client, superuser=True)
    assert offered() == {"retry_jobs", "retry_jobs_cancelled_too", "run_now", "cancel_jobs"}


def test_delete_permission_alone_cannot_cancel(client):
    login(client, "view", "delete")
    job = JobFactory.in_state(State.QUEUED)
    before = row(job)
    run_action(client, "cancel_jobs", job)
    run_action(client, "cancel_jobs", job, confirm="yes")
    assert row(job) == before


def test_delete_permission_alone_cannot_retry(client):
    login(client, "view", "delete")
    job = JobFactory.in_state(State.FAILED)
    run_action(client, "retry_jobs", job)
    assert Job.objects.count() == 1


# Actions, and actions racing a worker.


def test_retry_creates_the_next_attempt_and_leaves_the_failed_one(client):
    user = login(client, "view", "change")
    failed = JobFactory.in_state(State.FAILED, max_attempts=3)
    succeeded = JobFactory.in_state(State.SUCCEEDED)
    before = row(failed)
    response = run_action(client, "retry_jobs", failed, succeeded)
    assert response.status_code == 302
    new = Job.objects.get(previous=failed)
    assert messages_of(response) == [
        f'Queued a new attempt for 1 of 2 selected jobs: <a href="{change_url(new)}">'
        f"job #{new.pk}</a> (attempt 2); skipped 1 (not failed)."
    ]
    assert row(failed) == before
    assert (new.state, new.attempt, new.result_id) == (State.QUEUED, 2, failed.result_id)
    assert LogEntry.objects.get(user=user).object_id == str(new.pk)


def test_retry_skips_a_job_already_retried_by_someone_else(client):
    login(client, "view", "change")
    failed = JobFactory.in_state(State.FAILED)
    response = client.get(LIST_URL)  # the operator's list ...
    assert failed in response.context["cl"].result_list
    Job.objects.retry(failed)  # ... while another operator retries it first
    response = run_action(client, "retry_jobs", failed)
    assert messages_of(response) == [
        "Queued a new attempt for 0 of 1 selected job; skipped 1 (already retried)."
    ]
    assert Job.objects.filter(result_id=failed.result_id).count() == 2


def test_retry_of_an_older_attempt_is_skipped(client):
    login(client, "view", "change")
    first = JobFactory.in_state(State.FAILED)
    JobFactory.in_state(State.FAILED, result_id=first.result_id, attempt=2, previous=first)
    response = run_action(client, "retry_jobs", first)
    assert "skipped 1" in messages_of(response)[0]
    assert Job.objects.filter(result_id=first.result_id).count() == 2


def cancelled_jobs() -> tuple[Job, Job]:
    """A task cancelled while queued, and one cancelled while it ran, by the real writes."""
    queued = JobFactory.in_state(State.QUEUED)
    running = JobFactory.in_state(State.RUNNING)
    Job.objects.cancel(queued)
    Job.objects.cancel(running)  # asked to stop; it stops, and fails as cancelled
    Job.objects.fail(Job.objects.get(pk=running.pk), FailureReason.INTERRUPTED)
    queued, running = Job.objects.get(pk=queued.pk), Job.objects.get(pk=running.pk)
    assert [queued.failure_reason, running.failure_reason] == ["cancelled", "cancelled"]
    return queued, running


def test_bulk_retry_never_resurrects_a_cancel_and_says_so(client):
    login(client, "view", "change")
    cancelled = cancelled_jobs()
    failed = JobFactory.in_state(State.FAILED)
    response = run_action(client, "retry_jobs", *cancelled, failed)
    new = Job.objects.get(previous=failed)
    assert not Job.objects.filter(previous__in=cancelled).exists()
    links = ", ".join(f'<a href="{change_url(j)}">job #{j.pk}</a>' for j in reversed(cancelled))
    assert messages_of(response) == [
        f'Queued a new attempt for 1 of 3 selected jobs: <a href="{change_url(new)}">'
        f"job #{new.pk}</a> (attempt 2); skipped 2 (cancelled: this action never retries "
        "a cancel).",
        f"Not retried, as they were cancelled: {links}. To run a cancelled job again, use the "
        "Retry button of its page, or the action \u201cRetry the selected failed jobs, "
        "cancelled ones included\u201d.",
    ]


def test_a_cancel_is_retried_when_the_operator_asks_for_cancelled_ones(client):
    login(client, "view", "change")
    cancelled = cancelled_jobs()
    response = run_action(client, "retry_jobs_cancelled_too", *cancelled)
    assert "Queued a new attempt for 2 of 2 selected jobs" in messages_of(response)[0]
    for job in cancelled:
        assert Job.objects.get(previous=job).state == State.QUEUED


def test_a_cancelled_jobs_page_still_offers_retry(client):
    login(client, "view", "change")
    queued, _running = cancelled_jobs()
    page = client.get(change_url(queued)).content.decode()
    assert f'action="{retry_url(queued)}"' in page
    client.post(retry_url(queued))
    assert Job.objects.get(previous=queued).state == State.QUEUED


def failed_unique_job_and_its_newer_duplicate() -> tuple[Job, Job]:
    tasks.unique_record.enqueue("a")
    [job] = Job.objects.claim("w")
    Job.objects.fail(job, Job.FailureReason.ERROR)
    tasks.unique_record.enqueue("a")
    return job, Job.objects.get(state=State.QUEUED)


def test_retry_skips_a_job_whose_unique_key_another_job_holds(client):
    login(client, "view", "change")
    failed, newer = failed_unique_job_and_its_newer_duplicate()
    response = run_action(client, "retry_jobs", failed)
    assert messages_of(response) == [
        "Queued a new attempt for 0 of 1 selected job; skipped 1 (another job holds the unique "
        "key).",
        f'Not retried, as another job holds the unique key: <a href="{change_url(failed)}">'
        f'job #{failed.pk}</a>: <a href="{change_url(newer)}">job #{newer.pk}</a> with the '
        f"same unique key is queued.",
    ]
    assert Job.objects.count() == 2


def test_retry_button_says_which_job_holds_the_unique_key(client):
    login(client, "view", "change")
    failed, newer = failed_unique_job_and_its_newer_duplicate()
    response = client.post(retry_url(failed))
    assert messages_of(response) == [
        f'Job #{failed.pk} was not retried: <a href="{change_url(newer)}">job #{newer.pk}</a> '
        f"with the same unique key is queued."
    ]
    assert Job.objects.count() == 2


def test_job_page_shows_the_unique_key_and_links_to_every_job_with_it(client):
    login(client, "view")
    failed, newer = failed_unique_job_and_its_newer_duplicate()
    tasks.record.enqueue("not unique")
    page = client.get(change_url(newer)).content.decode()
    assert f"<code>{newer.unique_key[:12]}…</code> (Live: at most one queued or running)" in page
    listed = client.get(LIST_URL, {"unique_key": newer.unique_key}).context["cl"].result_list
    assert sorted(job.pk for job in listed) == [failed.pk, newer.pk]


def test_run_now_moves_only_queued_jobs_and_keeps_due_ones_in_place(client):
    login(client, "view", "change")
    later = JobFactory.in_state(State.QUEUED, run_after=timezone.now() + timedelta(hours=1))
    due_at = timezone.now() - timedelta(hours=1)
    due = JobFactory.in_state(State.QUEUED, run_after=due_at)
    running = JobFactory.in_state(State.RUNNING)
    before = row(running)
    response = run_action(client, "run_now", later, due, running)
    assert messages_of(response) == [
        "Set 2 of 3 selected jobs to run now; skipped 1 (no longer queued)."
    ]
    later.refresh_from_db()
    due.refresh_from_db()
    assert later.run_after <= timezone.now()
    assert due.run_after == due_at
    assert row(running) == before
    assert [job.pk for job in Job.objects.claim("w", limit=5)] == [due.pk, later.pk]


def test_run_now_skips_a_job_claimed_after_the_list_was_shown(client):
    login(client, "view", "change")
    job = JobFactory.in_state(State.QUEUED, run_after=timezone.now() - timedelta(seconds=1))
    assert job in client.get(LIST_URL).context["cl"].result_list
    [claimed] = Job.objects.claim("w1")
    before = row(claimed)
    response = run_action(client, "run_now", job)
    assert messages_of(response) == [
        "Set 0 of 1 selected job to run now; skipped 1 (no longer queued)."
    ]
    assert row(job) == before


def test_cancel_fails_queued_jobs_asks_running_ones_to_stop_and_skips_finished_ones(client):
    user = login(client, "view", "change")
    queued, running = JobFactory.in_state(State.QUEUED), JobFactory.in_state(State.RUNNING)
    finished = [JobFactory.in_state(state) for state in (State.SUCCEEDED, State.FAILED)]
    before = [row(job) for job in finished]
    response = run_action(client, "cancel_jobs", queued, running, *finished)
    assert messages_of(response) == [
        "Cancelled 2 of 4 selected jobs (1 running: asked to stop); skipped 2 (already finished)."
    ]
    cancelled = Job.objects.get(pk=queued.pk)
    assert (cancelled.state, cancelled.failure_reason) == (State.FAILED, "cancelled")
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    assert [row(job) for job in finished] == before
    logged = LogEntry.objects.filter(user=user).values_list("object_id", flat=True)
    assert sorted(logged) == sorted([str(queued.pk), str(running.pk)])


def test_cancel_of_a_job_claimed_after_the_list_was_shown_asks_it_to_stop(client):
    login(client, "view", "change")
    job = JobFactory.in_state(State.QUEUED)
    assert job in client.get(LIST_URL + "?state__exact=queued").context["cl"].result_list
    assert [claimed.pk for claimed in Job.objects.claim("w1")] == [job.pk]
    response = run_action(client, "cancel_jobs", job, url=LIST_URL + "?state__exact=queued")
    assert messages_of(response) == [
        "Cancelled 1 of 1 selected job (1 running: asked to stop); skipped 0."
    ]
    job.refresh_from_db()
    assert (job.state, job.worker_id) == (State.RUNNING, "w1")
    assert job.cancel_requested_at is not None


def test_cancel_of_a_job_claimed_during_the_action_asks_it_to_stop(client, monkeypatch):
    """The worker wins between the action's read and the conditional write."""
    login(client, "view", "change")
    job = JobFactory.in_state(State.QUEUED)
    cancel = Job.objects.cancel

    def claim_first(job_to_cancel):
        Job.objects.claim("w1")
        return cancel(job_to_cancel)

    monkeypatch.setattr(Job.objects, "cancel", claim_first)
    run_action(client, "cancel_jobs", job)
    job.refresh_from_db()
    assert (job.state, job.cancel_requested_at is not None) == (State.RUNNING, True)


def test_cancel_skips_a_job_already_cancelled(client):
    login(client, "view", "change")
    gone, kept = JobFactory.in_state(State.QUEUED), JobFactory.in_state(State.QUEUED)
    Job.objects.cancel(gone)
    response = run_action(client, "cancel_jobs", gone, kept)
    assert messages_of(response) == [
        "Cancelled 1 of 2 selected jobs; skipped 1 (already finished)."
    ]
    assert set(Job.objects.values_list("failure_reason", flat=True)) == {"cancelled"}


def test_actions_on_all_matching_jobs_count_what_they_selected(client):
    login(client, "view", "change")
    queued = JobFactory.create_batch(3)
    JobFactory.in_state(State.SUCCEEDED)
    response = run_action(client, "cancel_jobs", queued[0], select_across="1")
    assert messages_of(response) == [
        "Cancelled 3 of 4 selected jobs; skipped 1 (already finished)."
    ]


# The list.


def test_list_shows_the_operators_columns(client):
    login(client, "view")
    job = JobFactory.in_state(
        State.FAILED, attempt=2, max_attempts=5, queue_name="emails", priority=7, worker_id="w-9"
    )
    job.finished_at = job.started_at + timedelta(seconds=75)
    job.save()
    html = client.get(LIST_URL).content.decode()
    for text in [
        '<span title="tests.tasks.record">record</span>',
        '<span class="jobstate-badge jobstate-failed">Failed</span>',
        "emails",
        "2/5",
        "1 min 15 s",
        "w-9",
        'class="jobstate-count jobstate-failed"',
        "django_jobstate/admin.css",
    ]:
        assert text in html


def test_duration_of_a_running_job_is_so_far(client):
    login(client, "view")
    JobFactory.in_state(State.RUNNING, started_at=timezone.now() - timedelta(seconds=5))
    assert " s so far" in client.get(LIST_URL).content.decode()


def state_counts(response) -> dict[str, tuple[str, bool]]:
    return {r["state"]: (r["count"], r["selected"]) for r in response.context["state_counts"]}


def test_counts_per_state_follow_every_filter_but_the_state_filter(client):
    login(client, "view")
    for state, n in [(State.QUEUED, 3), (State.RUNNING, 1), (State.FAILED, 2)]:
        JobFactory.create_batch(n, **({} if state == State.QUEUED else {state: True}))
    JobFactory.in_state(State.FAILED, queue_name="emails")
    assert state_counts(client.get(LIST_URL)) == {
        "all": ("7", True),
        "queued": ("3", False),
        "running": ("1", False),
        "succeeded": ("0", False),
        "failed": ("3", False),
    }
    response = client.get(LIST_URL, {"state__exact": "failed", "queue_name": "default"})
    assert len(response.context["cl"].result_list) == 2
    assert state_counts(response) == {
        "all": ("6", False),
        "queued": ("3", False),
        "running": ("1", False),
        "succeeded": ("0", False),
        "failed": ("2", True),
    }


def test_no_count_reads_the_whole_table(client, monkeypatch):
    monkeypatch.setattr(admin_filters, "SCAN_LIMIT", 3)
    login(client, "view")
    JobFactory.create_batch(5)
    JobFactory.in_state(State.FAILED)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(LIST_URL)
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts
    assert all("LIMIT 4" in sql for sql in counts), counts
    assert not [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper()]
    html = response.content.decode()
    assert "3+ jobs" in html
    assert state_counts(response)["queued"] == ("3+", False)
    assert state_counts(response)["all"] == ("4+", True)
    assert "3+ results" in client.get(LIST_URL, {"q": "record"}).content.decode()


def test_search_by_id_result_id_task_path_and_worker(client):
    login(client, "view")
    record = JobFactory.in_state(State.RUNNING, worker_id="host-1")
    email = JobFactory.in_state(State.QUEUED, task_path="tests.tasks.email")

    def found(term: str) -> set[int]:
        return {job.pk for job in client.get(LIST_URL, {"q": term}).context["cl"].result_list}

    assert found(str(email.pk)) == {email.pk}
    assert found(f" {email.pk} ") == {email.pk}
    assert found(str(record.result_id)) == {record.pk}
    assert found(str(record.result_id).upper()) == {record.pk}
    assert found("tasks.email") == {email.pk}
    assert found("host-1") == {record.pk}
    assert found("nothing-like-this") == set()


@pytest.mark.parametrize(
    "term",
    [
        pytest.param("\u00b2", id="superscript-two"),
        pytest.param("\u0661\u0662", id="arabic-indic-digits"),
        pytest.param("9" * 30, id="beyond-bigint"),
        pytest.param(str(2**63), id="bigint-max-plus-one"),
    ],
)
def test_search_for_digits_that_are_not_a_job_id_answers_without_an_error(client, term):
    # str.isdigit() is true for each; int() refuses the first, the database the last two.
    login(client, "view")
    job = JobFactory.in_state(State.QUEUED, task_path=f"tests.tasks.record{term}")
    JobFactory.in_state(State.QUEUED)

    response = client.get(LIST_URL, {"q": term})

    assert response.status_code == 200
    # Not an id, so a part of a task path: the one job whose path holds it.
    assert [j.pk for j in response.context["cl"].result_list] == [job.pk]


def test_filters_by_queue_task_and_retries(client):
    login(client, "view")
    first = JobFactory.in_state(State.FAILED, queue_name="emails")
    second = JobFactory.in_state(State.QUEUED, result_id=first.result_id, attempt=2, previous=first)
    single = JobFactory.in_state(State.SUCCEEDED, task_path="tests.tasks.email")

    def listed(**params: str) -> set[int]:
        return {job.pk for job in client.get(LIST_URL, params).context["cl"].result_list}

    assert listed(retried="yes") == {first.pk, second.pk}
    assert listed(retried="no") == {single.pk}
    assert listed(queue_name="emails") == {first.pk}
    assert listed(task="tests.tasks.email") == {single.pk}
    html = client.get(LIST_URL).content.decode()
    assert "?queue_name=emails" in html
    assert "?task=tests.tasks.email" in html


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def date_choices(client, **params: str) -> list[tuple[str, str]]:
    navigation = client.get(LIST_URL, params).context["date_navigation"]
    return [(choice["title"], choice.get("link", "")) for choice in navigation["choices"]]


def test_date_navigation_offers_the_calendar_between_the_first_and_last_job(client):
    login(client, "view")
    JobFactory.in_state(State.QUEUED, enqueued_at=at(2024, 3, 3, 12))
    JobFactory.in_state(State.QUEUED, enqueued_at=at(2024, 3, 5, 23))
    days = date_choices(client)
    assert [title for title, _link in days] == ["March 3", "March 4", "March 5"]
    assert "enqueued_at__day=4" in days[1][1]

    JobFactory.in_state(State.QUEUED, enqueued_at=at(2024, 5, 1))
    assert [title for title, _link in date_choices(client)] == [
        "March 2024",
        "April 2024",
        "May 2024",
    ]
    JobFactory.in_state(State.QUEUED, enqueued_at=at(2022, 12, 31))
    assert [title for title, _link in date_choices(client)] == ["2022", "2023", "2024"]
    assert [title for title, _link in date_choices(client, enqueued_at__year="2024")] == [
        "March 2024",
        "April 2024",
        "May 2024",
    ]
    assert [
        title
        for title, _link in date_choices(client, enqueued_at__year="2024", enqueued_at__month="3")
    ] == ["March 3", "March 4", "March 5"]
    response = client.get(
        LIST_URL, {"enqueued_at__year": "2024", "enqueued_at__month": "3", "enqueued_at__day": "5"}
    )
    assert [job.enqueued_at for job in response.context["cl"].result_list] == [at(2024, 3, 5, 23)]
    assert 'class="toplinks"' in response.content.decode()


def test_queue_filter_offers_recent_queues_and_the_chosen_one(client, monkeypatch):
    monkeypatch.setattr(admin_filters, "SCAN_LIMIT", 1)
    login(client, "view")
    old = JobFactory.in_state(State.QUEUED, queue_name="reports")
    JobFactory.in_state(State.QUEUED, queue_name="emails")

    def queues(**params: str) -> list[str]:
        spec = next(
            spec
            for spec in client.get(LIST_URL, params).context["cl"].filter_specs
            if getattr(spec, "parameter_name", "") == "queue_name"
        )
        return [value for value, _label in spec.lookup_choices]

    assert queues() == ["emails"]
    assert queues(queue_name="reports") == ["emails", "reports"]
    assert [
        job.pk for job in client.get(LIST_URL, {"queue_name": "reports"}).context["cl"].result_list
    ] == [old.pk]


def test_date_navigation_of_an_empty_list(client):
    login(client, "view")
    assert date_choices(client) == []


# The job page.


def test_job_page_shows_payloads_traceback_and_every_attempt(client):
    login(client, "view")
    first = JobFactory.in_state(State.FAILED, max_attempts=3)
    second = JobFactory.in_state(
        State.FAILED,
        args=["a", 1],
        kwargs={"to": "ü@example.com"},
        result_id=first.result_id,
        attempt=2,
        previous=first,
        max_attempts=3,
        worker_id="w-2",
        error_class="builtins.KeyError",
        error_message="'missing'",
        traceback="Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'missing'\n",
    )
    third = JobFactory.in_state(State.QUEUED, result_id=first.result_id, attempt=3, previous=second)
    JobFactory.in_state(State.FAILED)  # another task: not in the history
    response = client.get(change_url(second))
    html = response.content.decode()
    assert '<pre class="jobstate-pre">[\n  &quot;a&quot;,\n  1\n]</pre>' in html
    assert "&quot;to&quot;: &quot;ü@example.com&quot;" in html
    assert 'class="fieldset-heading">Error</h2>' in html
    assert '<pre class="jobstate-pre jobstate-traceback">Traceback' in html
    assert "KeyError: &#x27;missing&#x27;" in html
    assert [a.pk for a in response.context["attempts"]] == [first.pk, second.pk, third.pk]
    history = html.split("Attempts of this task")[1].split("</table>")[0]
    assert f'href="{change_url(first)}"' in history
    assert f'href="{change_url(third)}"' in history
    assert f'href="{change_url(second)}"' not in history  # this page
    assert "builtins.KeyError" in history
    assert "w-2" in history


def test_succeeded_job_page_shows_the_return_value_and_no_error_section(client):
    login(client, "view")
    job = JobFactory.in_state(State.SUCCEEDED, return_value={"sent": 3})
    html = client.get(change_url(job)).content.decode()
    assert "&quot;sent&quot;: 3" in html
    assert "jobstate-traceback" not in html
    assert 'class="fieldset-heading">Error</h2>' not in html


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_cancel_button_beside_a_running_worker_never_fails(client, runjobs):
    """The cancel view reads the job, then writes it: on SQLite that must wait for the
    worker's commits, not fail with "database is locked" (a 500)."""
    login(client, "view", "change")
    keep_a_worker_writing(runjobs)
    jobs = [tasks.email.enqueue(f"user{i}@example.com") for i in range(50)]  # not run
    failures = []
    for result in jobs:
        job = Job.objects.get(result_id=result.id)
        try:
            response = client.post(cancel_url(job), {"confirm": "yes"})
        except OperationalError as exc:
            failures.append(str(exc))
        else:
            assert response.status_code == 302
    busy = Job.objects.filter(task_path__endswith="sleep_then_record", state=State.QUEUED)

    assert busy.exists(), "the worker finished before the cancels did: no contention"
    assert failures == [], f"{len(failures)} of {len(jobs)} cancels failed: {failures[0]}"
    emails = Job.objects.filter(queue_name="emails")
    assert set(emails.values_list("failure_reason", flat=True)) == {"cancelled"}


# Saying plainly what happened: retries by hand, why an attempt failed.


def retry_url(job: Job) -> str:
    return reverse("admin:django_jobstate_job_retry", args=[job.pk])


def test_a_retry_by_hand_of_a_task_that_used_every_attempt_reads_2_of_2(client):
    login(client, "view", "change")
    spent = JobFactory.in_state(State.FAILED, max_attempts=1)
    spare = JobFactory.in_state(State.FAILED, max_attempts=3, failure_reason="interrupted")
    run_action(client, "retry_jobs", spent, spare)
    new, other = Job.objects.get(previous=spent), Job.objects.get(previous=spare)
    assert (new.attempt, new.max_attempts) == (2, 2)  # one more attempt, never "2/1"
    assert (other.attempt, other.max_attempts) == (2, 3)  # attempts left: unchanged
    html = client.get(LIST_URL).content.decode()
    assert "2/1" not in html
    assert "2/2" in html
    page = client.get(change_url(new)).content.decode()
    assert "retried by hand by user0" in page
    history = page.split("Attempts of this task")[1].split("</table>")[0]
    assert "retried by hand by user0" in history
    assert "enqueued" in history


def test_automatic_retries_and_hand_backs_say_how_they_were_queued(client):
    login(client, "view")
    first = JobFactory.in_state(State.FAILED, max_attempts=3)
    second = JobFactory.in_state(
        State.FAILED,
        result_id=first.result_id,
        attempt=2,
        previous=first,
        max_attempts=3,
        failure_reason="released",
        error_class="django_jobstate.exceptions.WorkerLost",
    )
    third = JobFactory.in_state(
        State.QUEUED, result_id=first.result_id, attempt=3, previous=second, max_attempts=4
    )
    history = client.get(change_url(third)).content.decode().split("Attempts of this task")[1]
    assert "automatic retry" in history
    assert "attempt 2 never started" in history
    assert "released (never started)" in history


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"error_class": "builtins.ValueError"}, "error: ValueError"),
        ({"error_class": "app.errors.Oops.Nested"}, "error: Nested"),
        ({"failure_reason": "timeout", "error_class": "x.JobTimeout"}, "timeout"),
        ({"failure_reason": "lost", "error_class": "x.WorkerLost"}, "lost"),
        ({"failure_reason": "interrupted"}, "interrupted"),
        ({"failure_reason": "released", "error_class": "x.WorkerLost"}, "released (never started)"),
    ],
)
def test_list_says_why_each_attempt_failed(client, fields, shown):
    login(client, "view")
    JobFactory.in_state(State.FAILED, **fields)
    JobFactory.in_state(State.SUCCEEDED)
    response = client.get(LIST_URL)
    cells = [
        cell.split(">", 1)[1].split("</td>")[0]
        for cell in response.content.decode().split('<td class="field-failure"')[1:]
    ]
    assert len(cells) == 2
    assert cells[0] == "-"  # the succeeded job (the list is newest first)
    assert f">{shown}</span>" in cells[1]


def test_filter_by_failure_reason_reads_failed_attempts_only(client):
    login(client, "view")
    timeout = JobFactory.in_state(State.FAILED, failure_reason="timeout")
    JobFactory.in_state(State.FAILED)
    JobFactory.in_state(State.QUEUED)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(LIST_URL, {"failure_reason": "timeout"})
    assert [job.pk for job in response.context["cl"].result_list] == [timeout.pk]
    qn = connection.ops.quote_name
    listing = [q["sql"] for q in queries if f"{qn('failure_reason')} = " in q["sql"]]
    assert listing
    state = qn("state")
    assert all(f"{state} = 'failed'" in sql or f"{state} = %s" in sql for sql in listing)
    html = response.content.decode()
    assert "?failure_reason=released" in html
    assert "released (never started)" in html
    assert state_counts(response)["failed"] == ("1", False)


# The Retry button of a failed job's page.


def test_retry_button_is_on_the_page_of_a_tasks_newest_failed_attempt_only(client):
    first = JobFactory.in_state(State.FAILED, max_attempts=2)
    last = JobFactory.in_state(
        State.FAILED, result_id=first.result_id, attempt=2, previous=first, max_attempts=2
    )
    others = [JobFactory.in_state(state) for state in [State.QUEUED, *NOT_QUEUED[:2]]]
    login(client, "view")
    assert retry_url(last) not in client.get(change_url(last)).content.decode()

    login(client, "view", "change")
    html = client.get(change_url(last)).content.decode()
    form = html.split(f'action="{retry_url(last)}"')[1].split("</form>")[0]
    assert "csrfmiddlewaretoken" in form
    assert "Retry: queue attempt 3" in form
    assert "Attempt 2 of 2 failed (error: ValueError)" in html
    older = client.get(change_url(first)).content.decode()
    assert "/retry/" not in older
    assert f'href="{change_url(last)}"' in older.split("Retry is not offered")[1]
    for job in others:
        assert "/retry/" not in client.get(change_url(job)).content.decode()


def test_retry_button_queues_the_next_attempt_and_opens_its_page(client):
    user = login(client, "view", "change")
    failed = JobFactory.in_state(State.FAILED, max_attempts=2, attempt=2)
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(user)
    assert csrf_client.post(retry_url(failed)).status_code == 403  # no CSRF token
    assert Job.objects.count() == 1
    assert csrf_client.get(retry_url(failed)).status_code == 405  # POST only
    page = csrf_client.get(change_url(failed))
    token = page.content.decode().split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]

    response = csrf_client.post(retry_url(failed), {"csrfmiddlewaretoken": token})

    new = Job.objects.get(previous=failed)
    assert (new.state, new.attempt, new.max_attempts) == (State.QUEUED, 3, 3)
    assert response.status_code == 302
    assert response["Location"] == change_url(new)
    assert messages_of(response) == [
        f'Retried as attempt 3 (<a href="{change_url(new)}">job #{new.pk}</a>): queued to run now.'
    ]
    assert LogEntry.objects.get(user=user).object_id == str(new.pk)
    shown = csrf_client.get(response["Location"]).content.decode()
    assert f"job #{new.pk}</a>): queued to run now." in shown


def test_retry_button_needs_the_change_permission(client):
    login(client, "view")
    failed = JobFactory.in_state(State.FAILED)
    assert client.post(retry_url(failed)).status_code == 403
    assert Job.objects.count() == 1


def test_retry_button_says_why_it_did_not_retry(client):
    login(client, "view", "change")
    first = JobFactory.in_state(State.FAILED, max_attempts=3)
    second = JobFactory.in_state(
        State.FAILED, result_id=first.result_id, attempt=2, previous=first, max_attempts=3
    )
    third = JobFactory.in_state(
        State.QUEUED, result_id=first.result_id, attempt=3, previous=second, max_attempts=3
    )
    lone = JobFactory.in_state(State.SUCCEEDED)

    def refusal(job: Job) -> str:
        response = client.post(retry_url(job))
        assert response.status_code == 302
        assert response["Location"] == change_url(job)
        return messages_of(response)[-1]  # the earlier ones, never shown, are still stored

    link = f'<a href="{change_url(third)}">job #{third.pk}</a>'
    assert refusal(second) == f"Job #{second.pk} was not retried: attempt 3 ({link}) is queued."
    assert refusal(first) == f"Job #{first.pk} was not retried: attempt 3 ({link}) is queued."
    Job.objects.claim("w1")
    Job.objects.succeed(Job.objects.get(pk=third.pk), None)
    assert refusal(second) == (
        f"Job #{second.pk} was not retried: it was already retried as attempt 3 ({link}), "
        f"which succeeded."
    )
    link2 = f'<a href="{change_url(second)}">job #{second.pk}</a>'
    assert refusal(first) == (
        f"Job #{first.pk} was not retried: it was already retried as attempt 2 ({link2}), "
        f"which failed; the newest is attempt 3 ({link}), which succeeded."
    )
    assert (
        refusal(lone) == f"Job #{lone.pk} was not retried: it succeeded; only a failure is retried."
    )
    assert Job.objects.count() == 4


def test_retry_button_that_loses_a_race_says_who_won(client, monkeypatch):
    login(client, "view", "change")
    failed = JobFactory.in_state(State.FAILED)
    retry = Job.objects.retry

    def another_operator_first(job, **kwargs):
        retry(job)
        return retry(job, **kwargs)

    monkeypatch.setattr(Job.objects, "retry", another_operator_first)
    response = client.post(retry_url(failed))
    new = Job.objects.get(previous=failed)
    assert messages_of(response) == [
        f"Job #{failed.pk} was not retried: attempt 2 "
        f'(<a href="{change_url(new)}">job #{new.pk}</a>) is queued.'
    ]


# After a retry from the list: show the new attempts.


def test_retry_action_of_one_job_opens_its_new_attempt(client):
    login(client, "view", "change")
    failed = JobFactory.in_state(State.FAILED)
    response = run_action(client, "retry_jobs", failed, url=LIST_URL + "?state__exact=failed")
    new = Job.objects.get(previous=failed)
    assert response["Location"] == change_url(new)
    assert messages_of(response) == [
        "Queued a new attempt for 1 of 1 selected job: "
        f'<a href="{change_url(new)}">job #{new.pk}</a> (attempt 2); skipped 0.'
    ]


def test_retry_action_of_several_jobs_lists_their_tasks_without_the_state_filter(client):
    login(client, "view", "change")
    failed = [JobFactory.in_state(State.FAILED) for _ in range(3)]
    JobFactory.in_state(State.FAILED)  # not selected
    response = run_action(client, "retry_jobs", *failed, url=LIST_URL + "?state__exact=failed")
    new = [Job.objects.get(previous=job) for job in failed]
    assert response.status_code == 302
    assert "state__exact" not in response["Location"]
    [message] = messages_of(response)
    assert message.startswith("Queued a new attempt for 3 of 3 selected jobs: ")
    for job in new:
        assert f'<a href="{change_url(job)}">job #{job.pk}</a> (attempt 2)' in message
    listed = client.get(response["Location"]).context["cl"].result_list
    assert {job.pk for job in listed} == {job.pk for job in failed + new}


def test_retry_action_of_many_jobs_shows_the_list_without_the_state_filter(client, monkeypatch):
    from django_jobstate.admin import retry as admin_retry

    monkeypatch.setattr(admin_retry, "MAX_LISTED", 2)
    login(client, "view", "change")
    failed = [JobFactory.in_state(State.FAILED, queue_name="emails") for _ in range(3)]
    response = run_action(
        client, "retry_jobs", *failed, url=LIST_URL + "?state__exact=failed&queue_name=emails"
    )
    assert response["Location"] == LIST_URL + "?queue_name=emails"
    listed = client.get(response["Location"]).context["cl"].result_list
    assert len([job for job in listed if job.state == State.QUEUED]) == 3


# The Queues page.

QUEUES_URL = reverse("admin:django_jobstate_jobqueue_changelist")


def test_the_queues_page_lists_every_known_queue_and_pauses_and_resumes_them(client):
    JobFactory.create_batch(2, queue_name="emails")
    JobFactory(queue_name="imports")  # not in TASKS' QUEUES: known from its job
    user = login(client, superuser=True)
    html = client.get(QUEUES_URL).content.decode()
    for name in ["default", "emails", "reports", "imports"]:
        assert f">{name}<" in html

    data = {"action": "pause", "index": "0", ACTION_CHECKBOX_NAME: ["emails"]}
    response = client.post(QUEUES_URL, data, follow=True)
    assert messages_of(response) == ["Paused 1 queue: emails."]
    assert "paused since" in response.content.decode()
    queue = JobQueue.objects.get(name="emails")
    assert queue.paused
    assert queue.changed_by == f"admin:{user.username}"
    assert Job.objects.claim("w", queues=["emails"]) == []
    assert LogEntry.objects.get(user=user).change_message == "Paused"

    data["action"] = "resume"
    client.post(QUEUES_URL, data)
    assert not JobQueue.objects.get(name="emails").paused
    assert len(Job.objects.claim("w", queues=["emails"], limit=5)) == 2


def test_pausing_a_queue_needs_the_change_permission(client):
    user = User.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_jobqueue"))
    client.force_login(user)
    JobQueue.objects.create(name="emails")
    data = {"action": "pause", "index": "0", ACTION_CHECKBOX_NAME: ["emails"]}
    client.post(QUEUES_URL, data)
    assert not JobQueue.objects.get(name="emails").paused
