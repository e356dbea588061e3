"""`manage.py runjobs` as a real process: stop gracefully, stop at once, bad arguments,
logging, queues. Where the database is the subject (a server restart, routing):
test_runjobs_db.py."""

import json
import os
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.conf import settings

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus
from tests import tasks
from tests.framework import DUMMY_BACKEND
from tests.models import Execution
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_queue_option_runs_only_those_queues(runjobs):
    mail = tasks.email.enqueue("ada@example.com")
    other = tasks.record.enqueue("default queue")

    assert runjobs.run("--burst", "--queue", "emails").returncode == 0

    assert tasks.email.get_result(mail.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.record.get_result(other.id).status == TaskResultStatus.READY


def test_max_jobs_replaces_the_worker_process_after_that_many(runjobs):
    for n in range(5):
        tasks.record.enqueue(f"job {n}")

    assert runjobs.run("--burst", "--max-jobs", "2").returncode == 0

    assert Execution.objects.count() == 5
    per_worker = Counter(Job.objects.values_list("worker_id", flat=True))
    assert sorted(per_worker.values()) == [1, 2, 2]


def send(proc, signum, to_group):
    """Signal the runjobs process, or its whole process group as Ctrl-C in a terminal does."""
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)


@pytest.mark.parametrize("to_group", [False, True], ids=["process", "group"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_jobs_in_hand_then_exits(runjobs, signum, to_group):
    slow = [tasks.sleep_then_record.enqueue(f"slow {n}", 1.5) for n in range(2)]
    proc = runjobs.start("--poll-interval", "0.05", "--concurrency", "2")
    wait_for(lambda: Job.objects.running().count() == 2)
    tasks.record.enqueue("must wait for the next worker")

    send(proc, signum, to_group)
    proc.wait(timeout=90)  # a safety net: 30 s was outlasted at load 12 in CI

    assert proc.returncode == 0, runjobs.output(proc)
    for result in slow:
        assert tasks.sleep_then_record.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert sorted(Execution.objects.values_list("label", flat=True)) == ["slow 0", "slow 1"]
    assert Job.objects.queued().count() == 1


@pytest.mark.parametrize("to_group", [False, True], ids=["process", "group"])
def test_a_second_signal_stops_at_once_and_fails_the_attempts_as_interrupted(runjobs, to_group):
    never = [tasks.starts_then_sleeps.enqueue(f"never {n}", 300) for n in range(2)]
    proc = runjobs.start("--poll-interval", "0.05", "--concurrency", "2")
    # Both bodies began: an attempt claimed but not begun is handed back, not interrupted.
    wait_for(lambda: Execution.objects.count() == 2)

    send(proc, signal.SIGINT, to_group)
    # Two signals sent together may arrive as one: send the second once the first is seen.
    wait_for(lambda: "SIGINT received: finishing" in runjobs.output(proc))
    send(proc, signal.SIGINT, to_group)
    # Not the 300 s of the jobs in hand (30 s was not enough for the rest at load 12 in
    # CI, on MariaDB: the attempts' writes and two interpreters' exits).
    proc.wait(timeout=90)

    # Not 0: a supervisor (systemd, Kubernetes, CI) must see that it did not stop cleanly.
    assert proc.returncode == 128 + signal.SIGINT, runjobs.output(proc)
    for result in never:
        job = Job.objects.get(result_id=result.id)
        assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.INTERRUPTED)
        assert job.error_class == "django_jobstate.exceptions.WorkerInterrupted"
    assert not Job.objects.running().exists()
    assert sorted(Execution.objects.values_list("label", flat=True)) == [
        "never 0:start",
        "never 1:start",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-jobs", "0"], "must be at least 1"),
        (["--max-jobs", "many"], "is not a whole number"),
        (["--poll-interval", "-1"], "must be a positive number of seconds"),
        (["--poll-interval", "soon"], "is not a number of seconds"),
        (["--poll-interval", "1e10"], "must be at most 86400 seconds (a day), not 1e10"),
        (["--queue", ""], "a queue name cannot be empty"),
        (["--concurrency", "0"], "must be at least 1"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(runjobs, args, message):
    tasks.record.enqueue("untouched")
    done = runjobs.run(*args)
    assert done.returncode == 2
    assert message in done.stdout
    assert Job.objects.queued().count() == 1


def test_settings_out_of_range_cannot_crash_a_worker(runjobs):
    """Checks skipped, every wait and delay far too long: get_settings() clamps them.

    Unclamped, the watchdog's wait overflows, and so does the retry's run_after (the
    worker dies, then the supervisor, leaving the attempt running).
    """
    job = Job.objects.enqueue("tests.tasks.boom", max_attempts=2, backoff=1e12)  # as if old
    huge = {
        "JOBSTATE_POLL_INTERVAL": 1e10,
        "JOBSTATE_HEARTBEAT_INTERVAL": 1e10,
        "JOBSTATE_LOST_AFTER": 1e12,
        "JOBSTATE_MAX_BACKOFF": 1e12,
    }

    done = runjobs.run("--burst", "--skip-checks", JOBSTATE_TEST_SETTINGS=json.dumps(huge))

    assert done.returncode == 0, done.stdout
    assert "Overflow" not in done.stdout, done.stdout
    assert "stopped after 1 jobs" in done.stdout, done.stdout
    first, retry = Job.objects.filter(result_id=job.result_id).order_by("attempt")
    assert (first.state, first.failure_reason, retry.state) == ("failed", "error", "queued")
    assert retry.run_after - first.finished_at <= timedelta(days=365)  # the clamped cap


@pytest.mark.parametrize(("verbosity", "shows_jobs"), [("0", False), ("1", True), ("2", True)])
def test_verbosity_sets_how_much_is_logged(runjobs, verbosity, shows_jobs):
    tasks.record.enqueue("quiet")
    tasks.boom.enqueue("loud")

    out = runjobs.run("--burst", "-v", verbosity).stdout

    assert ("tests.tasks.record attempt 1/1 succeeded" in out) is shows_jobs
    assert ("Worker " in out and " started on all queues" in out) is shows_jobs
    assert "tests.tasks.boom attempt 1/1 failed" in out  # failures are warnings: always shown


def test_without_any_logging_setting_runjobs_still_says_what_it_does(runjobs):
    tasks.record.enqueue("said")
    tasks.boom.enqueue("why")
    no_logging = json.dumps({"LOGGING": {}})  # a fresh startproject's

    out = runjobs.run("--burst", JOBSTATE_TEST_SETTINGS=no_logging).stdout
    tasks.record.enqueue("in detail")
    debug = runjobs.run("--burst", "-v", "2", JOBSTATE_TEST_SETTINGS=no_logging).stdout

    assert " started on all queues" in out
    assert "tests.tasks.record attempt 1/1 succeeded" in out
    # A failure says what failed, how, and where: the class, the message and the traceback.
    assert "tests.tasks.boom attempt 1/1 failed (error)" in out
    assert "builtins.ValueError: why" in out
    assert "raise ValueError(message)" in out
    assert out.count("attempt 1/1 succeeded") == 1  # one handler: no line twice
    assert "claimed" in debug


def test_runjobs_before_migrate_says_so_and_exits_non_zero(runjobs, tmp_path):
    empty = {
        "DATABASES": {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(tmp_path / "new.sqlite3"),
            }
        }
    }

    done = runjobs.run("--burst", JOBSTATE_TEST_SETTINGS=json.dumps(empty), timeout=60)

    assert done.returncode == 1
    assert "run `python manage.py migrate` first" in done.stdout
    assert "Traceback" not in done.stdout


def test_runjobs_refuses_to_start_when_no_tasks_alias_uses_this_backend(runjobs):
    tasks.record.enqueue("not for a foreign backend")
    foreign = {"TASKS": {"default": {"BACKEND": DUMMY_BACKEND}}}

    # Checks skipped: they would stop it first, as tests.tasks cannot import under that
    # backend (E016: it refuses the task options).
    done = runjobs.run(
        "--burst", "--skip-checks", JOBSTATE_TEST_SETTINGS=json.dumps(foreign), timeout=60
    )

    assert done.returncode == 1
    assert "No TASKS alias uses django_jobstate.backend.JobStateBackend" in done.stdout
    assert Job.objects.get().state == State.QUEUED  # not claimed and failed


def test_a_queue_no_configuration_knows_is_named_with_the_known_ones(runjobs):
    done = runjobs.run("--burst", "--queue", "emials")

    assert done.returncode == 0
    assert "--queue emials: no TASKS alias lists that queue (known: default, emails, reports)" in (
        done.stdout
    )


def test_a_burst_run_waits_for_a_retry_due_soon(runjobs):
    result = tasks.fails_first_attempt.enqueue()  # its retry waits 1 to 2 s

    done = runjobs.run("--burst")

    assert done.returncode == 0, done.stdout
    assert tasks.fails_first_attempt.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_an_async_task_runs_as_a_sync_one_does(runjobs):
    ok = tasks.async_fails_once.enqueue("a")
    late = tasks.async_overruns.enqueue("late")
    done = runjobs.run("--burst")

    assert done.returncode == 0, done.stdout
    result = tasks.async_fails_once.get_result(ok.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    # Retried (takes_context saw the attempt), its return value normalized as Django does.
    assert result.return_value == {"attempt": 2, "data": "bytes as text"}
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert len(result.worker_ids) == 2
    stopped = tasks.async_overruns.get_result(late.id)
    assert stopped.status == TaskResultStatus.FAILED
    assert Job.objects.get(result_id=late.id).failure_reason == FailureReason.TIMEOUT
    assert sorted(Execution.objects.values_list("label", flat=True)) == ["a:1", "a:2", "late"]


def test_a_sigterm_while_a_worker_is_being_started_stops_that_worker_too(runjobs):
    # The supervisor's first worker waits for the fork server to set Django up (made slow
    # here): a SIGTERM that comes meanwhile must reach it too, or runjobs never exits.
    slow = {"INSTALLED_APPS": [*settings.INSTALLED_APPS, "tests.slow_import"]}
    proc = runjobs.start(
        "--concurrency", "2",
        JOBSTATE_TEST_SETTINGS=json.dumps(slow),
        JOBSTATE_TEST_SLOW_IMPORT="2",
    )  # fmt: skip
    wait_for(lambda: "started 2 worker(s)" in runjobs.output(proc), timeout=60)
    time.sleep(0.3)  # in the first worker's start, which waits for the fork server
    proc.send_signal(signal.SIGTERM)
    runjobs.wait(proc, 30)
    assert proc.returncode == 0, runjobs.output(proc)
