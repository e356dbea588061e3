"""Retry policies (retries.py): the decision after a task raised, Snooze's and the
options' checks, the writes they lead to, and how results and ImmediateBackend show them."""

import json
import math
import re
from datetime import timedelta

import pytest
from django.test import override_settings

from django_jobstate.exceptions import DoNotRetry, Snooze, SnoozeLimitReached
from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from django_jobstate.task_options import JobStateTask, with_settings
from django_jobstate.task_options.retries import decide, retry_after
from django_jobstate.task_results import to_task_result
from django_jobstate.tasksapi import InvalidTask, TaskResultStatus, task, task_finished
from tests import retry_tasks, tasks
from tests.factories import JobFactory
from tests.test_task_options import errors

ERROR, SNOOZED, TIMEOUT = FailureReason.ERROR, FailureReason.SNOOZED, FailureReason.TIMEOUT


def a_function() -> None:
    """A module-level function to decorate in the checks' tests."""


def policy(**options: object) -> JobStateTask:
    return JobStateTask(func=a_function, **options)


class Throttled(Exception):
    retry_after = 30  # a class's own delay: every Throttled waits that long


@pytest.mark.parametrize(
    ("task_", "error", "reason", "snoozes", "expected"),
    [
        # (reason, retried, delay) of the failed attempt's record
        (policy(), ValueError(), ERROR, 0, (ERROR, True, None)),
        (policy(retry_on=(OSError,)), ConnectionRefusedError(), ERROR, 0, (ERROR, True, None)),
        (policy(retry_on=(OSError,)), ValueError(), ERROR, 0, (ERROR, False, None)),
        (policy(retry_on=()), ValueError(), ERROR, 0, (ERROR, False, None)),
        # A timeout or a lost worker is not the task's exception: retried, as before.
        (policy(retry_on=(OSError,)), ValueError(), TIMEOUT, 0, (TIMEOUT, True, None)),
        (policy(), DoNotRetry("no"), ERROR, 0, (ERROR, False, None)),
        (policy(retry_on=(DoNotRetry.__base__,)), DoNotRetry(), ERROR, 0, (ERROR, False, None)),
        (policy(), Snooze(5), ERROR, 0, (SNOOZED, True, 5.0)),
        (policy(retry_on=(OSError,)), Snooze(5), ERROR, 19, (SNOOZED, True, 5.0)),
        (policy(max_snoozes=0), Snooze(5), ERROR, 0, (ERROR, False, None)),
        (policy(), Throttled(), ERROR, 0, (ERROR, True, 30.0)),
        (None, Snooze(1), ERROR, 0, (SNOOZED, True, 1.0)),  # a task that cannot load
        (None, ValueError(), ERROR, 0, (ERROR, True, None)),
    ],
)
def test_what_follows_an_attempt(task_, error, reason, snoozes, expected):
    decided = decide(task_, error, reason, lambda: snoozes)

    assert (decided.reason, decided.retry, decided.delay) == expected


def test_a_snooze_past_max_snoozes_fails_with_a_clear_error():
    snooze = Snooze(60)

    decided = decide(policy(max_snoozes=3), snooze, ERROR, lambda: 3)

    assert isinstance(decided.error, SnoozeLimitReached)
    assert decided.error.__cause__ is snooze
    assert str(decided.error) == (
        "The task snoozed 3 times, its max_snoozes, and then asked again (the task asked to "
        "run again in 60 seconds): it failed for good. Raise max_snoozes if it must wait longer."
    )


def test_snoozes_are_counted_only_on_a_snooze():
    def count() -> int:
        raise AssertionError("read without a snooze")

    assert decide(policy(), ValueError(), ERROR, count).retry


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (0.5, 0.5),
        (timedelta(minutes=2), 120.0),
        ("30", None),
        (-1, None),
        (math.nan, None),
        (True, None),
        (None, None),
    ],
)
def test_an_exceptions_retry_after(value, seconds):
    error = ValueError()
    error.retry_after = value  # type: ignore[attr-defined]

    assert retry_after(error) == seconds


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        (-1, ValueError, "Snooze() takes a delay from 0 to 31536000 seconds (a year), not -1."),
        (math.inf, ValueError, "not inf"),
        (math.nan, ValueError, "not nan"),
        (400 * 86400, ValueError, "not 34560000"),
        ("60", TypeError, "Snooze() takes a delay in seconds (a number) or a timedelta, not '60'."),
        (True, TypeError, "not True"),
        (timedelta(seconds=-1), ValueError, "not datetime.timedelta(days=-1, seconds=86399)"),
    ],
)
def test_snooze_refuses_what_is_not_a_delay(value, kind, message):
    with pytest.raises(kind, match=re.escape(message)):
        Snooze(value)


def test_snooze_takes_seconds_or_a_timedelta():
    assert Snooze(timedelta(minutes=1)).seconds == 60.0
    assert Snooze(0).seconds == 0.0
    assert str(Snooze(1.5)) == "the task asked to run again in 1.5 seconds"


def test_do_not_retry_without_a_message_names_its_cause():
    try:
        try:
            int("x")
        except ValueError as exc:
            raise DoNotRetry() from exc
    except DoNotRetry as raised:
        error = raised

    assert str(error) == "builtins.ValueError: invalid literal for int() with base 10: 'x'"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"retry_on": ConnectionError},
            "retry_on of task 'tests.test_retries.a_function' must be a tuple of exception "
            "classes, not <class 'ConnectionError'> (write retry_on=(ConnectionError,)).",
        ),
        (
            {"retry_on": ("ConnectionError",)},
            "must hold exception classes (subclasses of Exception), not 'ConnectionError'.",
        ),
        ({"retry_on": (KeyboardInterrupt,)}, "not <class 'KeyboardInterrupt'>"),
        ({"retry_on": (Snooze,)}, "names Snooze, which is never retried as an error"),
        (
            {"max_snoozes": -1},
            "max_snoozes of task 'tests.test_retries.a_function' must be a whole number "
            "from 0 to 1000, not -1.",
        ),
        ({"max_snoozes": 2.0}, "not 2.0"),
        ({"max_snoozes": None}, "not None"),
        ({"max_snoozes": 1001}, "not 1001"),
    ],
)
def test_bad_retry_options_are_refused_when_the_task_is_defined(options, message):
    with pytest.raises(InvalidTask, match=re.escape(message)):
        task(**options)(a_function)


def test_retry_on_may_be_a_list():
    assert task(retry_on=[OSError])(a_function).retry_on == (OSError,)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("retry_on", "message"),
    [
        (
            "builtins.ConnectionError",
            "must be a list of exception classes' dotted paths, not 'builtins.ConnectionError' "
            "(write ['builtins.ConnectionError']).",
        ),
        (["builtins.NoSuchError"], "names 'builtins.NoSuchError', which cannot be imported"),
        (["builtins.len"], "must hold exception classes (subclasses of Exception), not <built-in"),
    ],
)
def test_retry_on_in_the_setting_is_checked(retry_on, message):
    (found,) = errors({"tests.tasks.record": {"retry_on": retry_on}})

    assert found[0].startswith("JOBSTATE_TASK_OPTIONS['tests.tasks.record']: retry_on of task")
    assert message in found[0]


@pytest.mark.django_db
def test_retry_on_in_the_setting_names_classes_by_their_paths():
    options = {"retry_on": ["builtins.ConnectionError", "json.JSONDecodeError"], "max_snoozes": 5}
    with override_settings(JOBSTATE_TASK_OPTIONS={"tests.tasks.record": options}):
        assert errors({"tests.tasks.record": options}) == []
        applied = with_settings(tasks.record)

    assert (applied.retry_on, applied.max_snoozes) == ((ConnectionError, json.JSONDecodeError), 5)


# The writes a decision leads to (managers/outcomes.py)


@pytest.mark.django_db
def test_a_snoozed_attempt_gets_a_next_attempt_that_does_not_count_it():
    job = JobFactory(running=True, max_attempts=1, backoff=600)

    after = Job.objects.fail(job, SNOOZED, delay=30)

    assert (job.state, job.failure_reason) == (State.FAILED, SNOOZED)
    assert after is not None
    assert (after.attempt, after.max_attempts, after.previous_id) == (2, 2, job.pk)
    assert (after.run_after - after.enqueued_at).total_seconds() == pytest.approx(30, abs=1)


@pytest.mark.django_db
def test_a_delay_replaces_the_backoff_of_a_retry():
    job = JobFactory(running=True, max_attempts=2, backoff=600)

    after = Job.objects.fail(job, ERROR, delay=5)

    assert after is not None
    assert after.max_attempts == 2
    assert (after.run_after - after.enqueued_at).total_seconds() == pytest.approx(5, abs=1)


@pytest.mark.django_db
def test_a_snoozed_attempt_that_was_cancelled_is_not_run_again():
    job = JobFactory(running=True, max_attempts=1)
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=job.started_at)

    assert Job.objects.fail(job, SNOOZED, delay=0) is None
    assert job.failure_reason == FailureReason.CANCELLED


@pytest.mark.django_db
def test_a_result_counts_no_snooze_as_an_error():
    snoozed = JobFactory(failed=True, failure_reason=SNOOZED, error_class="x.Snooze")
    waiting = JobFactory(result_id=snoozed.result_id, attempt=2, previous=snoozed)

    result = to_task_result([snoozed, waiting], tasks.record)

    assert (result.status, result.errors) == (TaskResultStatus.READY, [])


# ImmediateBackend: one attempt, as before; a snooze leaves the result waiting.

IMMEDIATE = {"default": {"BACKEND": "django_jobstate.backend.ImmediateBackend"}}


@pytest.mark.django_db
@override_settings(TASKS=IMMEDIATE)
def test_immediate_backend_leaves_a_snoozed_task_ready():
    finished = []

    def receiver(**kwargs: object) -> None:
        finished.append(kwargs)

    task_finished.connect(receiver)
    try:
        result = retry_tasks.snoozes_twice.enqueue("i", 60)
    finally:
        task_finished.disconnect(receiver)

    assert (result.status, result.errors, result.finished_at) == (TaskResultStatus.READY, [], None)
    assert finished == []


@pytest.mark.django_db
@override_settings(TASKS=IMMEDIATE)
def test_immediate_backend_fails_a_task_that_does_not_retry():
    result = retry_tasks.gives_up.enqueue("i")

    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_jobstate.exceptions.DoNotRetry"
    assert "invalid literal for int()" in result.errors[0].traceback


# The admin counts snoozes apart from runs, as hand-backs.


@pytest.mark.django_db
def test_the_admin_counts_snoozed_attempts_apart_from_runs(client):
    from tests.test_admin import LIST_URL, change_url, login

    login(client, "view")
    first = JobFactory(failed=True, failure_reason=SNOOZED, error_class="x.Snooze")
    second = JobFactory(
        failed=True, failure_reason=SNOOZED, result_id=first.result_id, attempt=2, max_attempts=2
    )
    third = JobFactory(result_id=first.result_id, attempt=3, max_attempts=3, previous=second)

    html = client.get(LIST_URL).content.decode()
    page = client.get(change_url(third)).content.decode()

    assert "1/1 (2 snoozed)" in html
    assert html.count("1/1 (snoozed)") == 2
    assert "3/3" not in html
    assert "snoozed: attempt 2 asked to run again later" in page
    assert "snoozed (runs again later)" in page
