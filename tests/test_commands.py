"""`prunejobs` and `jobstats`: in-process through call_command, and once each as a real process."""

import json
import re
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.management.commands.prunejobs import age
from django_jobstate.models import Job, JobQueue, WorkerHeartbeat
from django_jobstate.querysets import JobQuerySet
from django_jobstate.states import LIVE_STATES, TERMINAL_STATES, State
from django_jobstate.tasksapi import TaskResultStatus, default_task_backend
from tests.conftest import ROOT, subprocess_env
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def finished(state, days_ago, **kwargs):
    """A terminal attempt that finished `days_ago` days ago."""
    at = timezone.now() - timedelta(days=days_ago)
    return JobFactory.in_state(
        state, started_at=at - timedelta(seconds=1), finished_at=at, **kwargs
    )


def next_attempt(job, state, **kwargs):
    return JobFactory.in_state(
        state, result_id=job.result_id, attempt=job.attempt + 1, previous=job, **kwargs
    )


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def remaining():
    return set(Job.objects.values_list("pk", flat=True))


def manage(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


# prunejobs


def test_prunes_old_terminal_attempts_and_nothing_else():
    old = [finished(State.SUCCEEDED, 8), finished(State.FAILED, 30)]
    recent = finished(State.SUCCEEDED, 6)
    long_ago = timezone.now() - timedelta(days=30)
    queued = JobFactory.in_state(State.QUEUED, enqueued_at=long_ago, run_after=long_ago)
    running = JobFactory.in_state(State.RUNNING, enqueued_at=long_ago, started_at=long_ago)

    assert run("prunejobs", "--older-than", "7d") == "Deleted 2 job attempts.\n"

    assert remaining() == {recent.pk, queued.pk, running.pk}
    assert not Job.objects.filter(pk__in=[job.pk for job in old]).exists()


@pytest.mark.parametrize("live", sorted(LIVE_STATES))
def test_never_prunes_any_attempt_of_a_task_with_a_live_attempt(live):
    first = finished(State.FAILED, 30, max_attempts=3)
    second = next_attempt(first, State.FAILED, finished_at=first.finished_at + timedelta(days=1))
    third = next_attempt(second, live)
    done = finished(State.SUCCEEDED, 30)

    assert run("prunejobs", "--older-than", "1d") == "Deleted 1 job attempt.\n"

    assert remaining() == {first.pk, second.pk, third.pk}
    assert not Job.objects.filter(pk=done.pk).exists()


def test_a_task_is_pruned_whole_or_not_at_all():
    first = finished(State.FAILED, 30, max_attempts=2)
    second = next_attempt(first, State.SUCCEEDED, finished_at=timezone.now() - timedelta(days=3))

    assert run("prunejobs", "--older-than", "7d") == "Deleted 0 job attempts.\n"
    assert remaining() == {first.pk, second.pk}  # its final attempt is recent
    assert run("prunejobs", "--older-than", "2d") == "Deleted 2 job attempts.\n"
    assert remaining() == set()


def read_back(result_id):
    result = default_task_backend.get_result(str(result_id))
    value = result.return_value if result.status == TaskResultStatus.SUCCESSFUL else None
    return (result.status, result.attempts, [e.exception_class_path for e in result.errors], value)


@pytest.mark.parametrize("state", [None, *sorted(TERMINAL_STATES)])
def test_state_option_is_the_final_outcome_and_a_result_never_changes(state):
    def task(*states):
        jobs = [finished(states[0], 30, max_attempts=len(states))]
        for then in states[1:]:
            jobs.append(next_attempt(jobs[-1], then, finished_at=jobs[-1].finished_at))
        return jobs[0].result_id

    tasks = {
        "retried then succeeded": task(State.FAILED, State.SUCCEEDED),
        "retried then failed": task(State.FAILED, State.FAILED),
        "succeeded": task(State.SUCCEEDED),
        "failed": task(State.FAILED),
    }
    before = {name: read_back(result_id) for name, result_id in tasks.items()}

    run("prunejobs", "--older-than", "7d", *(["--state", state] if state else []))

    kept = {name for name, result_id in tasks.items() if Job.objects.filter(result_id=result_id)}
    assert {name: read_back(tasks[name]) for name in kept} == {name: before[name] for name in kept}
    finals = {name: before[name][0] for name in tasks}
    expected = {
        None: set(),
        State.SUCCEEDED: {n for n, s in finals.items() if s != TaskResultStatus.SUCCESSFUL},
        State.FAILED: {n for n, s in finals.items() if s != TaskResultStatus.FAILED},
    }
    assert kept == expected[state]


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_state_option_prunes_only_that_state(state):
    jobs = {s: finished(s, 30) for s in TERMINAL_STATES}

    run("prunejobs", "--older-than", "7d", "--state", state)

    assert remaining() == {job.pk for s, job in jobs.items() if s != state}


def test_dry_run_counts_and_deletes_nothing():
    jobs = [finished(State.SUCCEEDED, 30), finished(State.FAILED, 30), finished(State.FAILED, 1)]

    assert run("prunejobs", "--older-than", "7d", "--dry-run") == "Would delete 2 job attempts.\n"

    assert remaining() == {job.pk for job in jobs}


def test_deletes_in_batches_one_short_transaction_each():
    jobs = [finished(State.SUCCEEDED, 30) for _ in range(5)]

    with CaptureQueriesContext(connection) as queries:
        assert run("prunejobs", "--older-than", "7d", "--batch-size", "2") == (
            "Deleted 5 job attempts.\n"
        )

    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3
    assert remaining() == set()
    assert len(jobs) == 5


def test_a_batch_never_splits_a_task():
    def task(attempts):
        jobs = [finished(State.FAILED, 30, max_attempts=attempts)]
        for _ in range(attempts - 1):
            jobs.append(next_attempt(jobs[-1], State.FAILED, finished_at=jobs[-1].finished_at))
        return {job.pk for job in jobs}

    tasks = [task(3), task(1), task(2), task(3)]

    with CaptureQueriesContext(connection) as queries:
        assert run("prunejobs", "--older-than", "7d", "--batch-size", "2") == (
            "Deleted 9 job attempts.\n"
        )

    deleted = [
        {int(pk) for pk in re.search(r'["`]id["`] IN \(([\d, ]+)\)', q["sql"])[1].split(", ")}
        for q in queries
        if q["sql"].startswith("DELETE")
    ]
    # In result_id order; no two fit in 2 attempts, and one of 3 goes whole.
    assert sorted(deleted, key=min) == tasks
    assert remaining() == set()


def test_quiet_at_verbosity_zero():
    finished(State.SUCCEEDED, 30)

    assert run("prunejobs", "--older-than", "7d", "-v", "0") == ""
    assert remaining() == set()


def test_a_live_row_is_never_deleted_even_if_prunable_were_wrong(monkeypatch):
    queued = JobFactory.in_state(State.QUEUED)
    running = JobFactory.in_state(State.RUNNING)
    done = finished(State.SUCCEEDED, 30)
    monkeypatch.setattr(JobQuerySet, "prunable", lambda self, older_than, states=None: self.all())

    assert Job.objects.prune(timedelta(days=7)) == 1

    assert remaining() == {queued.pk, running.pk}
    assert not Job.objects.filter(pk=done.pk).exists()


def test_prunable_refuses_live_states():
    with pytest.raises(ValueError, match="Only terminal attempts"):
        Job.objects.prunable(timedelta(days=1), states=[State.QUEUED])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("3", timedelta(days=3)),
        ("1.5h", timedelta(minutes=90)),
        ("0s", timedelta(0)),
    ],
)
def test_age_units(text, expected):
    assert age(text) == expected


@pytest.mark.parametrize("text", ["", "7x", "-1d", "d", "7 d", "1e9", "7dd", "36501d", "9" * 400])
def test_bad_ages_are_argument_errors(text):
    with pytest.raises(CommandError, match=r"argument --older-than: .*(not an age|more than)"):
        run("prunejobs", f"--older-than={text}")  # "=": argparse reads "-1d" as an option


@pytest.mark.parametrize("state", sorted(LIVE_STATES))
def test_state_option_refuses_live_states(state):
    with pytest.raises(CommandError, match=f"argument --state: invalid choice: '{state}'"):
        run("prunejobs", "--older-than", "7d", "--state", state)


def test_older_than_is_required():
    with pytest.raises(CommandError, match="--older-than"):
        run("prunejobs")


@pytest.mark.django_db(transaction=True)
def test_prunejobs_as_a_process():
    old, recent = finished(State.FAILED, 30), finished(State.SUCCEEDED, 1)

    done = manage("prunejobs", "--older-than", "2w")

    assert done.returncode == 0, done.stderr
    assert done.stdout == "Deleted 1 job attempt.\n"
    assert remaining() == {recent.pk}
    assert old.pk not in remaining()


@pytest.mark.django_db(transaction=True)
def test_bad_older_than_exits_2_with_the_reason():
    job = finished(State.FAILED, 30)

    done = manage("prunejobs", "--older-than", "7 days")

    assert done.returncode == 2
    assert "argument --older-than: '7 days' is not an age" in done.stderr
    assert "7d" in done.stderr
    assert remaining() == {job.pk}


# jobstats


def stats():
    return json.loads(run("jobstats", "--json"))


def heartbeat(worker_id, seconds_ago):
    at = timezone.now() - timedelta(seconds=seconds_ago)
    return WorkerHeartbeat.objects.create(
        worker_id=worker_id, host="box", pid=1234, queues=None, started_at=at, last_seen=at
    )


def test_stats_of_an_empty_database():
    assert stats() == {
        "queues": {},
        "paused_queues": [],
        "cancel_requested": 0,
        "oldest_runnable_age_seconds": None,
        "paused_due": 0,
        "held_by_limits": [],
        "held_by_queue_limits": [],
        "held_by_rates": [],
        "oldest_paused_age_seconds": None,
        "workers": [],
        "lost_workers": 0,
    }
    assert run("jobstats") == "No jobs.\n\nNo job is runnable.\n\nNo workers.\n"


def test_counts_per_queue_and_state():
    for state in [State.QUEUED, State.QUEUED, State.RUNNING, State.SUCCEEDED]:
        JobFactory.in_state(state)
    JobFactory.in_state(State.FAILED, queue_name="emails")

    assert stats()["queues"] == {
        "default": {"queued": 2, "running": 1, "succeeded": 1, "failed": 0},
        "emails": {"queued": 0, "running": 0, "succeeded": 0, "failed": 1},
    }


def test_oldest_runnable_age_ignores_jobs_not_yet_due():
    JobFactory.in_state(State.QUEUED, run_after=timezone.now() + timedelta(hours=1))
    assert stats()["oldest_runnable_age_seconds"] is None

    JobFactory.in_state(State.QUEUED, run_after=timezone.now() - timedelta(seconds=60))
    JobFactory.in_state(State.QUEUED, run_after=timezone.now() - timedelta(seconds=5))
    JobFactory.in_state(State.RUNNING, run_after=timezone.now() - timedelta(hours=5))

    assert 60 <= stats()["oldest_runnable_age_seconds"] < 70


def test_a_paused_queues_due_jobs_are_not_runnable_and_are_counted_apart():
    now = timezone.now()
    JobFactory.in_state(State.QUEUED, queue_name="emails", run_after=now - timedelta(hours=1))
    JobFactory.in_state(State.QUEUED, queue_name="emails", run_after=now - timedelta(seconds=9))
    JobFactory.in_state(State.QUEUED, queue_name="emails", run_after=now + timedelta(hours=1))
    JobFactory.in_state(State.QUEUED, run_after=now - timedelta(seconds=60))
    JobQueue.objects.pause("emails")

    result = stats()
    assert 60 <= result["oldest_runnable_age_seconds"] < 3600
    assert result["paused_due"] == 2  # not the one due in an hour
    assert result["oldest_paused_age_seconds"] >= 3600
    text = run("jobstats")
    assert "The oldest runnable job has waited 1m " in text
    assert "Paused queues hold 2 due jobs (not runnable); the oldest has waited 1h 0m." in text

    JobQueue.objects.resume("emails")
    assert stats()["oldest_runnable_age_seconds"] >= 3600
    assert (stats()["paused_due"], stats()["oldest_paused_age_seconds"]) == (0, None)


def test_workers_running_attempts_and_lost_workers():
    heartbeat("alive", 0)
    heartbeat("silent", 3600)
    JobFactory.in_state(State.RUNNING, worker_id="silent")
    JobFactory.in_state(State.RUNNING, worker_id="alive")
    JobFactory.in_state(State.RUNNING, worker_id="alive")
    JobFactory.in_state(State.RUNNING, worker_id="no-heartbeat")
    JobFactory.in_state(State.SUCCEEDED, worker_id="alive")

    result = stats()

    alive, no_heartbeat, silent = result["workers"]
    assert alive["last_seen_age_seconds"] < 3  # JOBSTATE_LOST_AFTER in the test settings
    assert alive == {
        "worker_id": "alive",
        "host": "box",
        "pid": 1234,
        "last_seen_age_seconds": alive["last_seen_age_seconds"],
        "lost": False,
        "running": 2,
    }
    assert no_heartbeat == {
        "worker_id": "no-heartbeat",
        "host": None,
        "pid": None,
        "last_seen_age_seconds": None,
        "lost": True,
        "running": 1,
    }
    assert 3600 <= silent["last_seen_age_seconds"] < 3700
    assert (silent["lost"], silent["running"]) == (True, 1)
    assert result["lost_workers"] == 2


def test_table_for_people():
    JobFactory.in_state(State.QUEUED, run_after=timezone.now() - timedelta(minutes=3))
    JobFactory.in_state(State.FAILED, queue_name="emails")
    heartbeat("alive", 0)
    heartbeat("silent", 7200)

    lines = run("jobstats").splitlines()

    assert lines[:3] == [
        "queue    queued  running  succeeded  failed",
        "default       1        0          0       0",
        "emails        0        0          0       1",
    ]
    assert lines[4].startswith("The oldest runnable job has waited 3m ")
    assert lines[6].split() == ["worker", "host", "pid", "last", "seen", "running", "status"]
    assert lines[7].split()[:3] == ["alive", "box", "1234"]
    assert lines[7].split()[-2:] == ["0", "ok"]
    assert lines[8].split()[3:] == ["2h", "0m", "ago", "0", "LOST"]
    assert lines[10] == "Lost workers: 1"


@pytest.mark.django_db(transaction=True)
def test_jobstats_json_as_a_process():
    JobFactory.in_state(State.QUEUED, queue_name="reports")
    heartbeat("silent", 3600)

    done = manage("jobstats", "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["queues"] == {"reports": {"queued": 1, "running": 0, "succeeded": 0, "failed": 0}}
    assert result["oldest_runnable_age_seconds"] >= 1
    assert [(w["worker_id"], w["lost"]) for w in result["workers"]] == [("silent", True)]
    assert result["lost_workers"] == 1


def test_jobstats_marks_paused_queues_and_running_attempts_asked_to_stop():
    JobFactory.in_state(State.QUEUED, queue_name="emails")
    JobFactory.in_state(State.QUEUED)
    Job.objects.cancel(JobFactory.in_state(State.RUNNING))
    JobQueue.objects.pause("emails")
    JobQueue.objects.pause("quiet")

    assert (stats()["paused_queues"], stats()["cancel_requested"]) == (["emails", "quiet"], 1)
    lines = run("jobstats").splitlines()
    assert lines[1].split() == ["default", "1", "1", "0", "0"]
    assert lines[2].split() == ["emails", "1", "0", "0", "0", "PAUSED"]
    assert lines[3] == "Paused queues without jobs: quiet."
    assert lines[4] == "Running attempts asked to stop: 1."


# jobqueues and canceljob


def test_jobqueues_pauses_lists_and_resumes_saying_who():
    JobFactory.create_batch(2, queue_name="emails")
    assert run("jobqueues", "pause", "emails", "--by", "ops") == (
        "Queue 'emails' paused: no worker claims its jobs.\n"
    )
    assert JobQueue.objects.get(name="emails").changed_by == "ops"
    assert Job.objects.claim("w", queues=["emails"]) == []
    listed = json.loads(run("jobqueues", "list", "--json"))
    assert [q["name"] for q in listed] == ["default", "emails", "reports"]  # all of TASKS'
    listed = listed[1]
    assert (listed["name"], listed["paused"], listed["queued"]) == ("emails", True, 2)
    assert listed["changed_by"] == "ops"
    lines = run("jobqueues", "list").splitlines()
    header = ["queue", "status", "queued", "running", "limits", "changed", "by"]
    assert lines[0].split() == header
    assert lines[1].split() == ["default", "running", "0", "0", "-", "-"]
    assert lines[2].split()[:3] == ["emails", "PAUSED", "since"]

    assert run("jobqueues", "resume", "emails") == "Queue 'emails' resumed.\n"
    assert JobQueue.objects.get(name="emails").changed_by.startswith("cli:")
    assert len(Job.objects.claim("w", queues=["emails"], limit=5)) == 2
    with pytest.raises(CommandError, match="1 to 100 characters"):
        run("jobqueues", "pause", "x" * 101)


def test_canceljob_cancels_queued_and_running_tasks_and_names_unknown_ids():
    queued, running = JobFactory(), JobFactory.in_state(State.RUNNING)
    done = JobFactory.in_state(State.SUCCEEDED)
    out = run("canceljob", str(queued.result_id), str(running.result_id), str(done.result_id))
    assert out.splitlines() == [
        f"{queued.result_id}: cancelled: it was queued and will never run",
        f"{running.result_id}: running: asked to stop (stopped after JOBSTATE_CANCEL_GRACE)",
        f"{done.result_id}: already finished: nothing to cancel",
    ]
    assert Job.objects.get(pk=queued.pk).failure_reason == "cancelled"
    with pytest.raises(CommandError, match="No task has the id nope"):
        run("canceljob", "nope")
