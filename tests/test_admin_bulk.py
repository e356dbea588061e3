"""Bulk Retry and Cancel: asked first with what will happen to how many jobs, then done
in chunks, each row by its own conditional write."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobstate.admin import bulk
from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from tests.factories import JobFactory
from tests.test_admin import (
    CONFIRM_TEMPLATE,
    LIST_URL,
    change_url,
    confirm,
    confirmation_form,
    login,
    messages_of,
    row,
)

pytestmark = pytest.mark.django_db


def choose(client, action: str, *jobs: Job, url: str = LIST_URL, **extra: str):
    """Choose an action from the list, as the action bar posts it: the confirmation page."""
    data = {"action": action, "index": "0", ACTION_CHECKBOX_NAME: [j.pk for j in jobs], **extra}
    response = client.post(url, data)
    assert CONFIRM_TEMPLATE in [t.name for t in response.templates], response
    return response


def summary(response) -> str:
    return response.content.decode().split('<p class="jobstate-plan">')[1].split("</p>")[0]


def retried_twice() -> Job:
    """A failed job already retried (its next attempt failed too)."""
    first = JobFactory.in_state(State.FAILED)
    JobFactory.in_state(State.FAILED, result_id=first.result_id, attempt=2, previous=first)
    return first


def test_retry_says_what_will_happen_to_how_many_jobs_before_writing_anything(client):
    login(client, "view", "change")
    failed = [JobFactory.in_state(State.FAILED) for _ in range(12)]
    already = [retried_twice() for _ in range(2)]
    succeeded = JobFactory.in_state(State.SUCCEEDED)
    before = Job.objects.count()
    page = choose(client, "retry_jobs", *failed, *already, succeeded)
    assert summary(page) == (
        "12 failed jobs will get a new attempt; 3 are skipped: 2 already retried, 1 not failed."
    )
    assert 'value="Yes, retry 12 jobs"' in page.content.decode()
    assert Job.objects.count() == before  # asking wrote nothing

    response = confirm(client, page)
    assert Job.objects.filter(previous__in=failed, state=State.QUEUED).count() == 12
    assert Job.objects.count() == before + 12
    [message] = messages_of(response)
    assert message.startswith("Queued a new attempt for 12 of 15 selected jobs: ")
    assert message.endswith("and 2 more; skipped 3 (2 already retried, 1 not failed).")


def test_cancel_says_what_will_happen_to_queued_and_running_jobs(client, settings):
    settings.JOBSTATE_CANCEL_GRACE = 30
    login(client, "view", "change")
    queued = [JobFactory.in_state(State.QUEUED) for _ in range(2)]
    running = JobFactory.in_state(State.RUNNING)
    done = JobFactory.in_state(State.SUCCEEDED)
    page = choose(client, "cancel_jobs", *queued, running, done)
    assert summary(page) == (
        "2 queued jobs will be cancelled: they will never run; 1 running job will be asked to "
        "stop, and stopped after 30 s if it has not; 1 is skipped: already finished."
    )
    assert set(Job.objects.values_list("state", flat=True)) == {
        State.QUEUED,
        State.RUNNING,
        State.SUCCEEDED,
    }
    response = confirm(client, page)
    assert messages_of(response) == [
        "Cancelled 3 of 4 selected jobs (1 running: asked to stop); skipped 1 (already finished)."
    ]
    assert Job.objects.filter(failure_reason=FailureReason.CANCELLED).count() == 2
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None


def test_nothing_to_do_offers_only_the_way_back(client):
    login(client, "view", "change")
    done = [JobFactory.in_state(State.SUCCEEDED) for _ in range(2)]
    page = choose(client, "retry_jobs", *done, url=LIST_URL + "?state__exact=succeeded")
    assert summary(page) == "0 failed jobs will get a new attempt; 2 are skipped: not failed."
    html = page.content.decode()
    assert 'value="Yes' not in html
    assert f'href="{LIST_URL}?state__exact=succeeded" class="button cancel-link"' in html


@pytest.mark.parametrize("action", ["retry_jobs", "cancel_jobs"])
def test_confirming_needs_the_change_permission(client, action):
    login(client, "view", "change")
    job = JobFactory.in_state(State.FAILED if action == "retry_jobs" else State.QUEUED)
    page = choose(client, action, job)
    before = row(job)
    login(client, "view", "delete")  # another session, without the permission
    response = confirm(client, page)
    assert CONFIRM_TEMPLATE not in [t.name for t in response.templates or []]
    assert row(job) == before
    assert Job.objects.count() == 1


def test_a_row_a_worker_moved_since_the_confirmation_is_skipped_not_overwritten(client):
    login(client, "view", "change")
    moving, staying = JobFactory.in_state(State.QUEUED), JobFactory.in_state(State.QUEUED)
    page = choose(client, "cancel_jobs", moving, staying)
    assert summary(page).startswith("2 queued jobs will be cancelled")
    # A worker claims and finishes one while the operator reads the page.
    [claimed] = Job.objects.claim("w1", limit=1)
    Job.objects.succeed(claimed, "done")
    other = staying if claimed.pk == moving.pk else moving
    before = row(claimed)

    response = confirm(client, page)
    assert messages_of(response) == [
        "Cancelled 1 of 2 selected jobs; skipped 1 (already finished)."
    ]
    assert row(claimed) == before  # succeeded, as the worker wrote it
    assert Job.objects.get(pk=other.pk).failure_reason == FailureReason.CANCELLED


def test_a_job_retried_since_the_confirmation_is_skipped_not_retried_again(client):
    login(client, "view", "change")
    failed = JobFactory.in_state(State.FAILED)
    page = choose(client, "retry_jobs", failed)
    assert summary(page) == "1 failed job will get a new attempt."
    Job.objects.retry(failed)  # another operator was quicker
    response = confirm(client, page)
    assert messages_of(response) == [
        "Queued a new attempt for 0 of 1 selected job; skipped 1 (already retried)."
    ]
    assert Job.objects.filter(result_id=failed.result_id).count() == 2


@pytest.mark.parametrize("action", ["retry_jobs", "cancel_jobs"])
def test_select_all_acts_on_every_matching_row_in_chunks(client, monkeypatch, action):
    """ "Select all" of a filtered list: every match, read CHUNK rows at a time."""
    monkeypatch.setattr(bulk, "CHUNK", 10)
    login(client, "view", "change")
    state = State.FAILED if action == "retry_jobs" else State.QUEUED
    matching = JobFactory.create_batch(
        105, queue_name="emails", **({"failed": True} if state == State.FAILED else {})
    )
    other = JobFactory.in_state(state, queue_name="default")  # not matched by the filter
    url = f"{LIST_URL}?queue_name=emails"
    page = choose(client, action, matching[0], url=url, select_across="1")
    _action_url, fields = confirmation_form(page)
    assert ("select_across", "1") in fields
    assert _action_url == url
    verb = "failed jobs will get a new attempt" if state == State.FAILED else "queued jobs will"
    assert summary(page).startswith(f"105 {verb}")

    with CaptureQueriesContext(connection) as captured:
        response = confirm(client, page)
    qn = connection.ops.quote_name
    later_chunks = [
        q["sql"]
        for q in captured
        if q["sql"].endswith("LIMIT 10") and f"{qn(Job._meta.db_table)}.{qn('id')} < " in q["sql"]
    ]
    assert len(later_chunks) == 10  # 105 rows, 10 at a time: never all at once
    [message] = messages_of(response)
    if state == State.FAILED:
        assert message.startswith("Queued a new attempt for 105 of 105 selected jobs: ")
        assert Job.objects.filter(queue_name="emails", state=State.QUEUED).count() == 105
    else:
        assert message == "Cancelled 105 of 105 selected jobs; skipped 0."
        assert Job.objects.filter(failure_reason=FailureReason.CANCELLED).count() == 105
    assert Job.objects.get(pk=other.pk).state == state  # outside the filter: untouched
    assert not Job.objects.filter(previous=other).exists()


def test_the_confirmation_page_escapes_what_tasks_and_workers_control(client):
    login(client, "view", "change")
    evil = "<script>alert(1)</script>"
    job = JobFactory.in_state(
        State.RUNNING, task_path=f"app.tasks.{evil}", worker_id=f"w{evil}", queue_name=evil
    )
    for response in [
        choose(client, "cancel_jobs", job),
        client.get(change_url(job).replace("/change/", "/cancel/")),
    ]:
        html = response.content.decode()
        assert evil not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
