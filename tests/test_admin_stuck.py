"""The job admin tells a stuck attempt from a running one, and a run from a hand-back."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.runner.stuck import Concern, why_stuck
from django_jobstate.states import FailureReason, State
from tests.factories import JobFactory
from tests.test_admin import LIST_URL, change_url, login

pytestmark = pytest.mark.django_db

AGO = timedelta(seconds=120)


@pytest.fixture(autouse=True)
def _production_intervals(settings):
    """The defaults, not the tests' quarter-second beats: a worker is silent after 15 s,
    so a loaded machine's slow request cannot make a fresh heartbeat look silent."""
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 5.0
    settings.JOBSTATE_LOST_AFTER = 30.0


def beat(worker_id: str, seconds_ago: float) -> None:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    WorkerHeartbeat.objects.create(
        worker_id=worker_id, host="box", pid=1, queues=None, started_at=at, last_seen=at
    )


def running(worker_id: str, **fields) -> Job:
    return JobFactory.in_state(
        State.RUNNING, worker_id=worker_id, started_at=timezone.now() - AGO, **fields
    )


def list_row(html: str, job: Job) -> str:
    """The <tr> of `job` in the job list."""
    [row] = [r for r in html.split("<tr")[1:] if f'href="{change_url(job)}"' in r]
    return row.split("</tr>")[0]


def marks(html: str) -> list[str]:
    return re.findall(r'<span class="jobstate-stuck [^"]*" title="[^"]*">([^<]*)</span>', html)


def test_list_marks_attempts_whose_worker_is_silent_or_never_beat(client):
    login(client, "view")
    beat("alive", 0)
    beat("silent", 60)
    healthy, silent, unseen = running("alive"), running("silent"), running("gone")
    just_claimed = JobFactory.in_state(State.RUNNING, worker_id="new")  # no beat yet: fine
    html = client.get(LIST_URL).content.decode()

    assert marks(list_row(html, healthy)) == []
    assert marks(list_row(html, just_claimed)) == []
    [mark] = marks(list_row(html, silent))
    assert re.fullmatch(r"worker silent since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(1 min 0\d s\)", mark)
    [mark] = marks(list_row(html, unseen))
    assert mark.startswith("no heartbeat from its worker (running 2 min")
    assert "JOBSTATE_LOST_AFTER" in list_row(html, silent)  # the tooltip says what comes next


def test_list_marks_a_cancel_past_its_grace_and_an_attempt_past_its_timeout(client):
    login(client, "view")
    beat("alive", 0)
    now = timezone.now()
    with override_settings(JOBSTATE_CANCEL_GRACE=30):
        overdue = running("alive", cancel_requested_at=now - timedelta(seconds=45))
        within = running("alive", cancel_requested_at=now - timedelta(seconds=5))
        late = running("alive", timeout=60)
        html = client.get(LIST_URL).content.decode()

    [mark] = marks(list_row(html, overdue))
    assert mark.startswith("cancel requested 4")
    assert mark.endswith("ago, past its grace (30.0 s)")
    assert 'class="jobstate-cancel"' not in list_row(html, overdue)  # the mark replaces it
    assert marks(list_row(html, within)) == []
    assert "cancel requested 5" in list_row(html, within)  # the plain note, as before
    [mark] = marks(list_row(html, late))
    assert mark.startswith("running past its timeout (1 min 00 s) by 1 min")


def test_a_finished_attempt_is_never_marked(client):
    login(client, "view")
    old = timezone.now() - AGO
    job = JobFactory.in_state(State.FAILED, worker_id="gone", started_at=old, timeout=1)
    assert why_stuck(job) == []
    assert marks(client.get(LIST_URL).content.decode()) == []


def test_job_page_marks_a_stuck_attempt(client):
    login(client, "view")
    beat("silent", 60)
    job = running("silent", timeout=10)
    html = client.get(change_url(job)).content.decode()
    found = marks(html)
    assert [m.split(" (")[0].split(" since")[0] for m in found] == [
        "worker silent",
        "running past its timeout",
    ]
    assert {mark.concern for mark in why_stuck(job)} == {Concern.SILENT, Concern.PAST_TIMEOUT}


def test_list_reads_the_marks_and_hand_backs_in_a_constant_number_of_queries(client):
    login(client, "view")

    def tasks(n: int) -> None:
        for i in range(n):
            released = JobFactory.in_state(
                State.FAILED, failure_reason=FailureReason.RELEASED, worker_id=f"w{i}"
            )
            running(f"w{i}", result_id=released.result_id, attempt=2, previous=released)
            if i % 2:
                beat(f"w{i}", 60)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(LIST_URL)
        assert response.status_code == 200
        return len(captured)

    tasks(1)
    few = queries()
    tasks(60)  # 122 rows: a full page of 100
    many = queries()
    html = client.get(LIST_URL).content.decode()
    assert html.count("(1 handed back)") == 50
    assert html.count("worker silent since") + html.count("no heartbeat from its") == 50
    assert few == many, f"{few} queries for 2 rows, {many} for a page of 100"


def hand_back_twice_then_claim() -> Job:
    """A task of max_attempts=1 whose first two attempts were handed back unstarted."""
    JobFactory.in_state(State.QUEUED, max_attempts=1)
    for _ in range(2):
        [claimed] = Job.objects.claim("w")
        assert Job.objects.release("w", [claimed.pk]) == 1
    [claimed] = Job.objects.claim("w")
    assert (claimed.attempt, claimed.max_attempts) == (3, 3)
    return claimed


def test_handed_back_attempts_are_counted_apart_from_runs(client):
    login(client, "view")
    job = hand_back_twice_then_claim()
    html = client.get(LIST_URL).content.decode()
    assert "3/3" not in html
    assert "1/1 (2 handed back)" in list_row(html, job)
    assert html.count("1/1 (handed back)") == 2

    page = client.get(change_url(job)).content.decode()
    assert "3/3" not in page
    history = page.split("Attempts of this task")[1].split("</table>")[0]
    assert "<strong>1/1 (2 handed back)</strong>" in history
    assert history.count("1/1 (handed back)</a>") == 2


def test_a_failed_run_after_hand_backs_says_which_run_failed(client):
    login(client, "view", "change")
    job = hand_back_twice_then_claim()
    Job.objects.fail(job, FailureReason.ERROR, error_class="builtins.ValueError")
    page = client.get(change_url(job)).content.decode()
    assert (
        "Attempt 1 of 1 failed (error: ValueError; 2 earlier attempts were handed back "
        "unstarted); no further attempt is queued."
    ) in page
