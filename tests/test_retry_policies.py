"""Retry policies through real `runjobs --burst` runs: retry_on, Snooze, DoNotRetry, the
snooze cap, a Retry-After the exception carries, and JOBSTATE_TASK_OPTIONS' retry_on."""

import itertools
import json

import pytest
from django.test import override_settings

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus
from tests import retry_tasks, tasks
from tests.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def attempts(result_id: str) -> list[Job]:
    return list(Job.objects.attempts_of(result_id))


def runs(label: str) -> int:
    return Execution.objects.filter(label=label).count()


def drain(runjobs, **env: str) -> str:
    done = runjobs.run("--burst", timeout=120, **env)
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_a_task_that_snoozes_twice_then_succeeds(runjobs):
    result = retry_tasks.snoozes_twice.enqueue("s", 0.2)

    out = drain(runjobs)

    rows = attempts(result.id)
    assert [(a.attempt, a.state, a.failure_reason) for a in rows] == [
        (1, State.FAILED, FailureReason.SNOOZED),
        (2, State.FAILED, FailureReason.SNOOZED),
        (3, State.SUCCEEDED, ""),
    ]
    # Each next attempt is linked to the snoozed one, after the delay it asked for.
    for snoozed, after in itertools.pairwise(rows):
        assert after.previous_id == snoozed.pk
        assert (after.run_after - after.enqueued_at).total_seconds() == pytest.approx(0.2, abs=0.1)
    # max_attempts is 1: snoozes do not use attempts up (each adds one, as a hand-back).
    assert [a.max_attempts for a in rows] == [1, 2, 3]
    final = retry_tasks.snoozes_twice.get_result(result.id)
    assert final.status == TaskResultStatus.SUCCESSFUL
    assert final.return_value == 3
    assert final.errors == []  # a snooze is no error of the task
    assert runs("s") == 3
    assert "snoozed" in out


def test_a_snoozed_task_is_ready_while_it_waits(runjobs):
    result = retry_tasks.snoozes_twice.enqueue("w", 3600)

    drain(runjobs)  # the snoozed attempt is due in an hour: the burst run leaves it

    assert retry_tasks.snoozes_twice.get_result(result.id).status == TaskResultStatus.READY
    assert [a.state for a in attempts(result.id)] == [State.FAILED, State.QUEUED]


def test_snoozing_past_max_snoozes_fails_for_good(runjobs):
    result = retry_tasks.snoozes_forever.enqueue("f")

    drain(runjobs)

    rows = attempts(result.id)
    assert [a.failure_reason for a in rows] == [FailureReason.SNOOZED] * 2 + [FailureReason.ERROR]
    last = rows[-1]
    assert last.error_class == "django_jobstate.exceptions.SnoozeLimitReached"
    assert "snoozed 2 times, its max_snoozes" in last.error_message
    final = retry_tasks.snoozes_forever.get_result(result.id)
    assert final.status == TaskResultStatus.FAILED
    assert len(final.errors) == 1
    assert runs("f") == 3


def test_an_atomic_task_snoozes_with_its_writes_rolled_back(runjobs):
    result = retry_tasks.snoozes_atomically.enqueue("a")

    drain(runjobs)

    assert retry_tasks.snoozes_atomically.get_result(result.id).return_value == 2
    assert list(Execution.objects.values_list("label", flat=True)) == ["a-2"]


def test_retry_on_retries_only_the_exceptions_it_names(runjobs):
    other = retry_tasks.retries_on_connection_errors.enqueue("v", "value")
    named = retry_tasks.retries_on_connection_errors.enqueue("c", "connection")

    drain(runjobs)

    assert [a.state for a in attempts(other.id)] == [State.FAILED]  # at once, of 5
    assert runs("v") == 1
    assert [a.attempt for a in attempts(named.id)] == [1, 2, 3, 4, 5]
    assert runs("c") == 5
    for result in (other, named):
        failed = tasks.retries_on_connection_errors.get_result(result.id)
        assert failed.status == TaskResultStatus.FAILED


def test_do_not_retry_fails_for_good_with_its_message_and_cause(runjobs):
    result = retry_tasks.gives_up.enqueue("x")

    drain(runjobs)

    [only] = attempts(result.id)  # max_attempts is 5
    assert (only.state, only.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert only.error_class == "django_jobstate.exceptions.DoNotRetry"
    assert only.error_message == "'x' will never be a number"
    assert "invalid literal for int()" in only.traceback  # the cause
    assert runs("x") == 1


def test_a_retry_after_the_exception_carries_replaces_the_backoff(runjobs):
    result = retry_tasks.rate_limited_once.enqueue("r", 0.5)

    drain(runjobs)  # the backoff of an hour would leave the retry queued

    first, second = attempts(result.id)
    assert first.error_class == "tests.retry_tasks.RateLimited"
    waited = (second.run_after - second.enqueued_at).total_seconds()
    assert waited == pytest.approx(0.5, abs=0.25)  # as asked: no jitter on a server's word
    assert retry_tasks.rate_limited_once.get_result(result.id).return_value == "r"


def test_retry_on_from_jobstate_task_options(runjobs):
    options = {"tests.tasks.always_fails": {"retry_on": ["builtins.ConnectionError"]}}
    with override_settings(JOBSTATE_TASK_OPTIONS=options):
        result = tasks.always_fails.enqueue("o")  # max_attempts=3, raises ValueError

    drain(runjobs, JOBSTATE_TEST_SETTINGS=json.dumps({"JOBSTATE_TASK_OPTIONS": options}))

    assert [a.state for a in attempts(result.id)] == [State.FAILED]
    assert runs("o") == 1
