"""Conformance: what Django's own tests check of a tasks backend, checked of ours.

Read upstream, and adapted here to a database backend with workers (our own tests, in
our style; jobs run by an in-process `Worker(burst=True)`, or by `runjobs` where a real
process matters):

- Django, tests/tasks/test_tasks.py: enqueue and aenqueue; non-JSON arguments raise
  TypeError; using() priority, queue_name, run_after, backend (new instance, chained,
  the original unchanged); unknown and missing backends; refresh and arefresh; naive
  run_after; invalid priority; unknown queue and QUEUES = []; get_result and
  aget_result; missing result; TaskResultMismatch; module-level functions only;
  get_backend; pickling a task and a result; TaskError.exception_class;
  takes_context without `context`; run_after in the decorator.
- Django, tests/tasks/test_immediate_backend.py: a sync and an async task run to
  SUCCESSFUL with every timestamp, attempts == 1; a failure (ValueError, SystemExit,
  a "complex" exception) recorded with its class and traceback, return_value raising
  "Task failed"; a non-JSON return value fails the task with a TypeError; return
  values; the django.tasks log lines (enqueued, RUNNING, SUCCESSFUL, FAILED, no
  "NoneType"); takes_context and TaskContext; validation again at enqueue/aenqueue.
- Django, tests/tasks/test_dummy_backend.py: get_result equals the enqueued result,
  refresh and arefresh follow the stored result.
- Django, tests/tasks/test_custom_backend.py: alias and OPTIONS; async tasks and
  priorities accepted where the backend says it supports them.
- Django, tests/tasks/test_utils.py (normalize_json): tuples as lists, bytes as text,
  anything else refused. Django's signals, as django/tasks/signals.py and its backends
  send them (the stored copy of Django's tests/tasks has no test_signals.py):
  task_enqueued, task_started, task_finished, sent by the backend class with the task's
  TaskResult, and the error in sys.exc_info() of a task_finished receiver.
- django-tasks-db, tests/tests.py (database backend): READY result with no timestamps,
  attempts == 0 and one task_enqueued; get_result round trip; refresh after a worker
  ran it; missing and malformed ids; rows naming no task fail without running; check()
  and its hint; the priority range enforced by the database; enqueue writes in the
  caller's transaction; a worker runs due jobs only, in priority then run_after order,
  only its queues, at most --max-jobs; SystemExit, KeyboardInterrupt and exit() in a
  task fail it without stopping the worker; pruned results no longer exist; a real
  worker process (several at once) runs everything and exits 0; a signal mid-task
  finishes it; a second Ctrl-C fails it.

Not applicable: ImmediateBackend/DummyBackend internals (results lists, no get_result,
run_after refused, enqueue_on_commit, which Django 6 no longer has), metadata and
TaskResult ordering and hashing (Django main, newer than the 6.1 installed here),
django-tasks-db's id_function, its SQL query counts and its lock helpers (ours:
tests/test_claim.py, tests/test_managers.py).

Where we differ on purpose, the test asserts our documented behaviour and says so.

Count: 107 upstream behaviours (Django: test_tasks 29, test_immediate_backend 16,
test_dummy_backend 5, test_custom_backend 3, capability flags 2, normalize_json 2,
signals 4; django-tasks-db: backend 20, worker 18, pruning 2, worker processes 6), all
passing on SQLite and PostgreSQL; and 2 of our own found while probing JSON: keys read
back as JSON makes them, and large floats read back as the same floats on PostgreSQL too.
"""

import dataclasses
import logging
import pickle
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.test import modify_settings
from django.utils import timezone

from django_jobstate.backend import JobStateBackend, JobStateTask
from django_jobstate.exceptions import InvalidPayload, WorkerInterrupted
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import (
    FRAMEWORK,
    InvalidTask,
    InvalidTaskBackend,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    normalize_json,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests import tasks
from tests.factories import JobFactory
from tests.framework import INVALID_TASK, LOGGER
from tests.models import Execution
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

JOBSTATE_BACKEND = "django_jobstate.backend.JobStateBackend"
POSTGRES = django_settings.DB == "postgres"


def run_worker(**options: Any) -> Worker:
    worker = Worker(burst=True, **options)
    worker.run()
    return worker


def run_until_idle() -> None:
    """Burst runs until nothing is queued (a retry due "now" can be a millisecond late)."""
    deadline = time.monotonic() + 30
    while Job.objects.queued().exists():
        assert time.monotonic() < deadline, "jobs stayed queued"
        run_worker()


def enqueue(t: Any, how: str, *args: Any, **kwargs: Any) -> TaskResult:
    """Enqueue with enqueue(), or with aenqueue() from async code."""
    if how == "aenqueue":
        return async_to_sync(t.aenqueue)(*args, **kwargs)
    return t.enqueue(*args, **kwargs)


@pytest.fixture
def received():
    """Every django.tasks signal sent: (signal, sender, result, exception class in flight)."""
    seen: list[tuple[str, Any, TaskResult, Any]] = []
    names = {"enqueued": task_enqueued, "started": task_started, "finished": task_finished}

    def receiver_for(name: str) -> Callable[..., None]:
        def receive(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
            seen.append((name, sender, task_result, sys.exc_info()[0]))

        return receive

    receivers = {name: receiver_for(name) for name in names}
    for name, sig in names.items():
        sig.connect(receivers[name])
    yield seen
    for name, sig in names.items():
        sig.disconnect(receivers[name])


# The backend and its capabilities


def test_the_backend_is_built_from_its_settings(settings):
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], JobStateBackend)
    assert (default_task_backend.alias, default_task_backend.options) == ("default", {})

    settings.TASKS = {
        **settings.TASKS,
        "other": {"BACKEND": JOBSTATE_BACKEND, "OPTIONS": {"prefix": "x"}},
    }
    assert (task_backends["other"].alias, task_backends["other"].options) == (
        "other",
        {"prefix": "x"},
    )


@pytest.mark.parametrize(
    ("flag", "what_it_allows"),
    [
        ("supports_defer", lambda: tasks.noop.using(run_after=timezone.now())),
        ("supports_async_task", lambda: default_task_backend.validate_task(tasks.noop_async)),
        ("supports_get_result", lambda: tasks.noop.get_result(tasks.noop.enqueue().id)),
        ("supports_priority", lambda: tasks.noop.using(priority=10)),
    ],
)
def test_every_capability_flag_is_true_and_honest(flag, what_it_allows):
    assert getattr(JobStateBackend, flag) is True
    what_it_allows()  # Django's base class would raise InvalidTask/NotImplementedError


@pytest.mark.parametrize(("remove", "errors"), [([], 0), (["django_jobstate"], 1)])
def test_check_wants_the_app(remove, errors):
    with modify_settings(INSTALLED_APPS={"remove": remove}):
        messages = default_task_backend.check()

    assert len(messages) == errors
    assert all("django_jobstate" in str(m.hint) for m in messages)


# enqueue() and aenqueue()


@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
@pytest.mark.parametrize("task_name", ["noop", "noop_async"])
def test_enqueue_returns_a_ready_result(received, task_name, how):
    t = getattr(tasks, task_name)

    result = enqueue(t, how, 1, two=3)

    assert (result.status, result.is_finished) == (TaskResultStatus.READY, False)
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert (result.task, result.args, result.kwargs) == (t, [1], {"two": 3})
    assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])
    assert result.backend == "default"
    # django-tasks-db checks for a UUID4; ours are UUID7 (time-ordered, see README).
    assert uuid.UUID(result.id).version == 7
    assert received == [("enqueued", JobStateBackend, result, None)]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (((1, 2),), {}),
        ((b"utf-8 bytes",), {}),
        (({"nested": ((1,), b"x")},), {}),
        ((), {"pair": (3, 4), "raw": b"y"}),
    ],
    ids=["tuple", "bytes", "nested", "kwargs"],
)
def test_arguments_are_normalized_as_django_normalizes_them(args, kwargs):
    result = tasks.noop.enqueue(*args, **kwargs)

    expected = (normalize_json(list(args)), normalize_json(kwargs))
    assert (result.args, result.kwargs) == expected
    job = Job.objects.get()
    assert (job.args, job.kwargs) == expected
    read = tasks.noop.get_result(result.id)
    assert (read.args, read.kwargs) == expected


def test_keys_read_back_as_json_makes_them():
    # Django's normalize_json keeps {1: "a"}; a row holds JSON, so ours says at enqueue()
    # what the task will get and get_result() will read: {"1": "a"}.
    result = tasks.echo.enqueue({1: "a", None: "b", 2.5: "c"})
    run_worker()

    read = tasks.echo.get_result(result.id)
    assert result.args == read.args == [{"1": "a", "null": "b", "2.5": "c"}]
    assert read.return_value == {"1": "a", "null": "b", "2.5": "c"}


@pytest.mark.parametrize("value", [1e16, -1.5e300, 1e308])
def test_a_large_float_reads_back_as_the_same_float(value):
    # PostgreSQL's jsonb stores numbers as numeric: json's `1e+16` read back as an int, and
    # `1e+308` as 10**308, another value. payload.exact_floats() writes them out in full.
    payload = [value, {"in a string": "1e+16", "1e+16": value}]
    result = tasks.echo.enqueue(payload)
    Job.objects.filter(result_id=result.id).update(metadata={"m": value})  # the ORM's write
    run_worker()

    read = tasks.echo.get_result(result.id)
    stored = Job.objects.get(result_id=result.id)
    assert read.args == result.args == [payload]
    assert read.return_value == payload
    for found in (read.args[0][0], read.return_value[0], stored.metadata["m"]):
        assert type(found) is float
        assert found == value


@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
@pytest.mark.parametrize(
    "argument",
    [datetime.now(), object(), {1, 2}, b"\xff not utf-8"],
    ids=["datetime", "object", "set", "bad-bytes"],
)
def test_arguments_that_are_not_json_raise_a_type_error(argument, how):
    # Django raises TypeError("Unsupported type: ...") (ValueError for undecodable bytes);
    # ours is InvalidPayload, both a TypeError and a ValueError, with json's own words.
    with pytest.raises(TypeError) as caught:
        enqueue(tasks.noop, how, argument)

    assert isinstance(caught.value, InvalidPayload | ValueError)
    assert "Task arguments must be JSON" in str(caught.value)
    assert not Job.objects.exists()


def test_enqueue_writes_in_the_callers_transaction():
    seen = []

    def enqueue_then_roll_back() -> None:
        with transaction.atomic():
            result = tasks.noop.enqueue()
            # Written at once, not on commit: the row is there inside the transaction.
            seen.append((result.enqueued_at, Job.objects.filter(result_id=result.id).exists()))
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        enqueue_then_roll_back()

    [(enqueued_at, existed)] = seen
    assert enqueued_at is not None
    assert existed
    assert not Job.objects.exists()  # and it went with the caller's data


# Validation


def local_function() -> Callable[..., None]:
    def inner() -> None:
        pass

    return inner


INVALID_TASKS = {
    "priority-too-low": (
        lambda: tasks.noop.using(priority=-101),
        InvalidTask,
        "priority must be a whole number between -100 and 100.",
    ),
    "priority-too-high": (
        lambda: tasks.noop.using(priority=101),
        InvalidTask,
        "priority must be a whole number between -100 and 100.",
    ),
    "priority-not-whole": (
        lambda: tasks.noop.using(priority=3.1),
        InvalidTask,
        "priority must be a whole number between -100 and 100.",
    ),
    "naive-run-after": (
        lambda: tasks.noop.using(run_after=datetime.now()),
        InvalidTask,
        "run_after must be an aware datetime.",
    ),
    # Ours goes on to name the backend and its QUEUES (issue 12).
    "unknown-queue": (
        lambda: tasks.noop.using(queue_name="queue-2"),
        InvalidTask,
        "Queue 'queue-2' is not valid for backend 'default'; its QUEUES are: default, emails",
    ),
    "builtin": (
        lambda: task()(any),
        InvalidTask,
        "Task function must be defined at a module level.",
    ),
    "local-function": (
        lambda: task(local_function()),
        InvalidTask,
        "Task function must be defined at a module level.",
    ),
    "context-without-context": (
        lambda: task(takes_context=True)(tasks.meaning_of_life.func),
        InvalidTask,
        "Task takes context but does not have a first argument of 'context'.",
    ),
    "run-after-in-decorator": (
        lambda: task(run_after=timezone.now())(tasks.meaning_of_life.func),
        TypeError,
        # The backport's decorator refuses it before any backend sees it, in Python's words.
        "run_after cannot be defined statically with the @task decorator."
        if FRAMEWORK == "django.tasks"
        else "got multiple values for keyword argument 'run_after'",
    ),
    "unknown-backend": (
        lambda: tasks.noop.using(backend="unknown"),
        InvalidTaskBackend,
        "The connection 'unknown' doesn't exist.",
    ),
}


@pytest.mark.parametrize(("make", "error", "message"), INVALID_TASKS.values(), ids=INVALID_TASKS)
def test_an_invalid_task_is_refused(make, error, message):
    with pytest.raises(error) as caught:
        make()

    assert message in str(caught.value)
    assert not Job.objects.exists()


def test_a_backend_that_cannot_be_imported_is_refused(settings):
    settings.TASKS = {**settings.TASKS, "missing": {"BACKEND": "does.not.exist"}}

    with pytest.raises(InvalidTaskBackend, match=r"Could not find backend 'does\.not\.exist'"):
        tasks.noop.using(backend="missing")


@pytest.mark.parametrize("priority", [-100, 0, 100])
def test_the_priority_bounds_are_valid(priority):
    result = tasks.noop.using(priority=priority).enqueue()

    assert Job.objects.get(result_id=result.id).priority == priority


def test_the_database_enforces_the_priority_range():
    for priority in (-101, 101):
        with pytest.raises(IntegrityError), transaction.atomic():
            JobFactory(priority=priority)


@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
def test_a_task_is_validated_again_when_enqueued(settings, how):
    valid_then = tasks.noop.using(queue_name="reports")
    settings.TASKS = {"default": {"BACKEND": JOBSTATE_BACKEND, "QUEUES": ["default"]}}

    with pytest.raises(InvalidTask, match="Queue 'reports' is not valid for backend"):
        enqueue(valid_then, how)
    assert not Job.objects.exists()


def test_empty_queues_allow_any_queue_and_its_jobs_run(settings):
    settings.TASKS = {**settings.TASKS, "anyq": {"BACKEND": JOBSTATE_BACKEND, "QUEUES": []}}

    result = tasks.meaning_of_life.using(backend="anyq", queue_name="queue-2").enqueue()
    run_worker()

    assert (result.backend, result.task.queue_name) == ("anyq", "queue-2")
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


# using(), get_backend(), pickling


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("priority", 1),
        ("queue_name", "emails"),
        ("run_after", timezone.now()),
        ("backend", "default"),
    ],
)
def test_using_makes_a_new_task_and_leaves_the_original(option, value):
    before = getattr(tasks.with_options, option)

    changed = tasks.with_options.using(**{option: value})
    chained = changed.using(priority=10)

    assert getattr(changed, option) == value
    assert getattr(tasks.with_options, option) == before
    assert chained.priority == 10
    if option != "priority":
        assert getattr(chained, option) == value  # kept through a second using()
    # Our task options ride along (JobStateTask, DESIGN.md).
    assert (chained.max_attempts, chained.backoff, chained.timeout) == (3, 2, 5)
    assert tasks.with_options.using() == tasks.with_options
    assert tasks.with_options.using() is not tasks.with_options


def test_get_backend_follows_the_alias(settings):
    settings.TASKS = {**settings.TASKS, "other": {"BACKEND": JOBSTATE_BACKEND}}

    assert isinstance(tasks.noop.get_backend(), JobStateBackend)
    other = tasks.noop.using(backend="other")
    assert (other.backend, other.get_backend().alias) == ("other", "other")


def test_a_task_and_its_result_pickle():
    assert pickle.loads(pickle.dumps(tasks.with_options)) == tasks.with_options
    assert isinstance(pickle.loads(pickle.dumps(tasks.with_options)), JobStateTask)

    result = tasks.meaning_of_life.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result
    run_worker()
    finished = tasks.meaning_of_life.get_result(result.id)
    assert pickle.loads(pickle.dumps(finished)).return_value == 42


# get_result(), aget_result(), refresh(), arefresh()


GETTERS = {
    "backend.get_result": lambda t, id: default_task_backend.get_result(id),
    "task.get_result": lambda t, id: t.get_result(id),
    "backend.aget_result": lambda t, id: async_to_sync(default_task_backend.aget_result)(id),
    "task.aget_result": lambda t, id: async_to_sync(t.aget_result)(id),
}


@pytest.mark.parametrize("get", GETTERS.values(), ids=GETTERS)
def test_get_result_equals_what_enqueue_returned(get):
    later = timezone.now() + timedelta(hours=1)
    results = [
        tasks.noop.enqueue(),
        tasks.noop_async.using(priority=5, queue_name="reports", run_after=later).enqueue("a"),
    ]

    for result in results:
        assert get(result.task, result.id) == result


@pytest.mark.parametrize("get", GETTERS.values(), ids=GETTERS)
@pytest.mark.parametrize("result_id", ["123", 123, str(uuid.uuid4()), ""])
def test_a_missing_result_does_not_exist(get, result_id):
    tasks.noop.enqueue()

    with pytest.raises(TaskResultDoesNotExist):
        get(tasks.noop, result_id)


@pytest.mark.parametrize("get", [GETTERS["task.get_result"], GETTERS["task.aget_result"]])
def test_a_result_of_another_task_is_a_mismatch(get):
    result = tasks.noop_async.enqueue()

    with pytest.raises(
        TaskResultMismatch, match=r"Task does not match \(received 'tests.tasks.noop_async'\)"
    ):
        get(tasks.noop, result.id)


@pytest.mark.parametrize("how", ["refresh", "arefresh"])
def test_refreshing_an_unchanged_result_changes_nothing(how):
    result = tasks.noop.enqueue()
    before = dataclasses.asdict(result)

    refresh = result.refresh if how == "refresh" else async_to_sync(result.arefresh)
    refresh()

    assert dataclasses.asdict(result) == before


@pytest.mark.parametrize("how", ["refresh", "arefresh"])
def test_refresh_follows_the_result_through_a_worker(how):
    result = tasks.meaning_of_life.enqueue()

    worker = run_worker()

    assert (result.status, result.attempts) == (TaskResultStatus.READY, 0)  # a snapshot
    refresh = result.refresh if how == "refresh" else async_to_sync(result.arefresh)
    refresh()
    assert (result.status, result.is_finished) == (TaskResultStatus.SUCCESSFUL, True)
    assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert (result.return_value, result.attempts) == (42, 1)
    assert result.worker_ids == [worker.worker_id]
    assert not Job.objects.queued().exists()


# Running: statuses, return values, errors


@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
@pytest.mark.parametrize("task_name", ["noop", "noop_async"])
def test_a_task_runs_to_success(task_name, how):
    t = getattr(tasks, task_name)
    result = enqueue(t, how, 1, two=3)

    run_worker()

    result = t.get_result(result.id)
    assert (result.status, result.is_finished) == (TaskResultStatus.SUCCESSFUL, True)
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert (result.return_value, result.errors, result.attempts) == (None, [], 1)
    assert (result.task, result.args, result.kwargs) == (t, [1], {"two": 3})


@pytest.mark.parametrize(
    ("task_name", "expected"),
    [
        ("meaning_of_life", 42),
        ("returns_normalizable", {"pair": [1, 2], "raw": "text", "nested": [[3]]}),
    ],
)
def test_a_return_value_reads_back_as_django_normalizes_it(task_name, expected):
    t = getattr(tasks, task_name)
    result = t.enqueue()

    run_worker()

    assert t.get_result(result.id).return_value == expected


FAILURES = {
    # kind: (exception class, how the traceback ends or what it holds)
    "value-error": (ValueError, "ValueError: This task failed due to ValueError\n"),
    "system-exit": (SystemExit, "SystemExit: This task failed due to SystemExit\n"),
    # Django's ImmediateBackend lets it through (the user pressed Ctrl-C); in a worker it
    # is the task's own error, as django-tasks-db records it.
    "keyboard-interrupt": (
        KeyboardInterrupt,
        "KeyboardInterrupt: This task failed due to KeyboardInterrupt\n",
    ),
    "exit": (SystemExit, "SystemExit: 1\n"),
    "complex": (ValueError, 'ValueError(ValueError("This task failed"))'),
}


@pytest.mark.parametrize(
    ("kind", "error", "traceback"), [(k, *v) for k, v in FAILURES.items()], ids=FAILURES
)
def test_a_failure_is_recorded_as_django_records_it(kind, error, traceback):
    failed = tasks.fails.enqueue(kind)
    after = tasks.noop.enqueue()  # the worker carries on

    run_worker()

    result = tasks.fails.get_result(failed.id)
    assert (result.status, result.is_finished) == (TaskResultStatus.FAILED, True)
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result._return_value is None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    [recorded] = result.errors
    assert recorded.exception_class is error
    assert recorded.exception_class_path == f"builtins.{error.__name__}"
    assert recorded.traceback.endswith(traceback) or traceback in recorded.traceback
    assert recorded.traceback.startswith("Traceback (most recent call last):")
    assert tasks.noop.get_result(after.id).status == TaskResultStatus.SUCCESSFUL


# Django's normalize_json passes NaN through; JSON has no NaN, so ours fails the task as
# for any other value that is not JSON (README: arguments and return values are JSON).
@pytest.mark.parametrize(
    "task_name", ["returns_a_function", "returns_set", "returns_nan_in_a_list"]
)
def test_a_return_value_that_is_not_json_fails_the_task(task_name):
    t = getattr(tasks, task_name)
    result = t.enqueue()

    run_worker()

    result = t.get_result(result.id)
    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    # Django records TypeError("Unsupported type: ..."); ours is InvalidPayload, a TypeError,
    # with json's words (as django-tasks-db's: "is not JSON serializable").
    [recorded] = result.errors
    assert issubclass(recorded.exception_class, TypeError)
    assert recorded.exception_class is InvalidPayload
    assert re.search("is not JSON serializable|Out of range float values", recorded.traceback)


def test_an_unknown_error_class_path_is_django_s_error():
    failed = tasks.fails.enqueue("value-error")
    run_worker()
    [recorded] = tasks.fails.get_result(failed.id).errors

    for path, error in [("subprocess.run", ValueError), ("does.not.exist", ImportError)]:
        object.__setattr__(recorded, "exception_class_path", path)
        with pytest.raises(error):
            recorded.exception_class  # noqa: B018


# takes_context and TaskContext


def test_a_task_that_takes_context_gets_its_result():
    sync = tasks.returns_its_result_id.enqueue()
    async_ = tasks.returns_its_context_async.enqueue()

    run_worker()

    assert tasks.returns_its_result_id.get_result(sync.id).return_value == sync.id
    context = tasks.returns_its_context_async.get_result(async_.id).return_value
    assert context == {"id": async_.id, "attempt": 1}


def test_the_context_counts_attempts_and_the_result_lists_every_one():
    result = tasks.async_fails_once.enqueue("ctx")

    first = run_worker(max_jobs=1)
    result.refresh()
    # A view over attempts (DESIGN.md): READY again while the retry waits, one error and
    # one worker id per attempt so far.
    assert result.status == TaskResultStatus.READY
    assert [e.exception_class for e in result.errors] == [ValueError]
    assert result.worker_ids == [first.worker_id]

    run_until_idle()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    # TaskContext.attempt is Job.attempt (DESIGN.md); Django's is len(worker_ids): the same
    # here, where no attempt was handed back unstarted.
    assert result.return_value == {"attempt": 2, "data": "bytes as text"}
    assert result.attempts == 2
    assert list(Job.objects.values_list("attempt", flat=True).order_by("attempt")) == [1, 2]


# Signals and logs


def test_signals_carry_the_result_at_each_step(received):
    ok = tasks.meaning_of_life.enqueue()
    bad = tasks.fails.enqueue("value-error")
    statuses_seen_by_get_result = []
    task_started.connect(
        seen := lambda sender, task_result, **kw: statuses_seen_by_get_result.append(
            default_task_backend.get_result(task_result.id).status
        )
    )
    try:
        worker = run_worker()
    finally:
        task_started.disconnect(seen)

    by_step = {(name, r.id): (sender, r, exc) for name, sender, r, exc in received}
    assert {sender for sender, _, _ in by_step.values()} == {JobStateBackend}
    for result in (ok, bad):
        assert by_step["enqueued", result.id][1] == result
        started = by_step["started", result.id][1]
        assert (started.status, started.worker_ids) == (
            TaskResultStatus.RUNNING,
            [worker.worker_id],
        )
        assert started.started_at is not None
        assert started.finished_at is None
    assert statuses_seen_by_get_result == [TaskResultStatus.RUNNING] * 2
    _, succeeded, no_error = by_step["finished", ok.id]
    assert (succeeded.status, succeeded.return_value, no_error) == (
        TaskResultStatus.SUCCESSFUL,
        42,
        None,
    )
    # Sent inside the except block, as Django's backends send it: receivers (and Django's
    # own logger) see the error.
    _, failed, in_flight = by_step["finished", bad.id]
    assert (failed.status, in_flight) == (TaskResultStatus.FAILED, ValueError)
    assert failed.errors[0].exception_class is ValueError


def test_the_django_tasks_log_says_what_django_s_says(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)

    ok = tasks.noop.enqueue()
    enqueued = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(enqueued) == 1
    assert "enqueued" in enqueued[0]
    assert ok.id in enqueued[0]

    caplog.clear()
    bad = tasks.fails.enqueue("value-error")
    caplog.clear()
    run_worker()

    lines = [(r.levelno, r.getMessage(), r) for r in caplog.records if r.name == LOGGER]
    for result_id, final, level in [
        (ok.id, "SUCCESSFUL", logging.INFO),
        (bad.id, "FAILED", logging.ERROR),
    ]:
        mine = [(lvl, msg, r) for lvl, msg, r in lines if result_id in msg]
        assert [msg.rpartition("state=")[2] for _, msg, _ in mine] == ["RUNNING", final]
        assert mine[-1][0] == level
    assert not any("NoneType" in msg for _, msg, _ in lines)
    [failure] = [r for lvl, msg, r in lines if bad.id in msg and "FAILED" in msg]
    assert failure.exc_info is not None
    assert failure.exc_info[0] is ValueError


# What a worker runs, and in which order


def test_a_job_runs_only_once_due():
    result = tasks.noop.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()

    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.READY

    Job.objects.filter(result_id=result.id).update(run_after=timezone.now() - timedelta(seconds=1))
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_jobs_run_by_priority_then_run_after():
    now = timezone.now()
    plan = [  # label, priority, run_after
        ("old", 20, now - timedelta(hours=2)),
        ("very old", 20, now - timedelta(hours=10)),
        ("far future", 0, now + timedelta(hours=10)),
        ("high far future", 10, now + timedelta(hours=10)),
        ("future", 0, now + timedelta(hours=2)),
        ("high", 10, None),
        ("low", 2, None),
        ("lower", -2, None),
    ]
    for label, priority, run_after in plan:
        tasks.record.using(priority=priority, run_after=run_after).enqueue(label)

    run_worker()

    ran = list(Execution.objects.order_by("pk").values_list("label", flat=True))
    assert ran == ["very old", "old", "high", "low", "lower"]


def test_a_worker_runs_only_its_queues():
    other = tasks.noop.using(queue_name="reports").enqueue()

    run_worker(queues=["default"])
    other.refresh()
    assert other.status == TaskResultStatus.READY

    run_worker()  # every queue
    other.refresh()
    assert other.status == TaskResultStatus.SUCCESSFUL


def test_a_worker_stops_after_max_jobs():
    results = [tasks.noop.enqueue() for _ in range(5)]

    assert run_worker(max_jobs=2).jobs_done == 2

    for result in results:
        result.refresh()
    statuses = sorted(r.status for r in results)
    assert statuses == [TaskResultStatus.READY] * 3 + [TaskResultStatus.SUCCESSFUL] * 2


def test_a_worker_with_nothing_to_do_stops():
    assert run_worker().jobs_done == 0


@pytest.mark.parametrize(
    ("task_path", "args"),
    [
        ("subprocess.check_output", [["exit", "1"]]),
        ("missing.func", []),
        ("tests.tasks.some_test", []),
        ("tests.tasks.not_a_task", []),
    ],
)
def test_a_row_that_names_no_task_fails_without_running(task_path, args):
    # django-tasks-db raises SuspiciousOperation or ImportError for these; ours is
    # InvalidTask, for the attempt's error and for get_result() (README: "Usage").
    job = JobFactory(task_path=task_path, args=args)

    run_worker()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_class == INVALID_TASK
    assert task_path in job.traceback
    with pytest.raises(InvalidTask):
        default_task_backend.get_result(str(job.result_id))


def test_a_pruned_result_no_longer_exists():
    done = tasks.noop.enqueue()
    waiting = tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue()
    run_worker()
    Job.objects.filter(result_id=done.id).update(finished_at=timezone.now() - timedelta(days=1))

    call_command("prunejobs", "--older-than", "1h", verbosity=0)

    with pytest.raises(TaskResultDoesNotExist):
        done.refresh()
    waiting.refresh()  # a queued task is never pruned
    assert waiting.status == TaskResultStatus.READY


# A real worker process


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_real_worker_processes_run_every_kind_of_task(runjobs):
    expected = [
        (tasks.noop.enqueue(1, two=3), TaskResultStatus.SUCCESSFUL, None),
        (tasks.noop_async.enqueue(), TaskResultStatus.SUCCESSFUL, None),
        (tasks.returns_its_context_async.enqueue(), TaskResultStatus.SUCCESSFUL, None),
        (tasks.fails.enqueue("system-exit"), TaskResultStatus.FAILED, SystemExit),
        (tasks.fails.enqueue("keyboard-interrupt"), TaskResultStatus.FAILED, KeyboardInterrupt),
        (tasks.fails.enqueue("exit"), TaskResultStatus.FAILED, SystemExit),
    ]
    expected += [
        (tasks.sleep_then_record.enqueue(f"s{n}", 0.05), TaskResultStatus.SUCCESSFUL, None)
        for n in range(6)
    ]

    done = runjobs.run("--burst", "--concurrency", "2")

    assert done.returncode == 0, done.stdout
    for enqueued, status, error in expected:
        result = enqueued.task.get_result(enqueued.id)
        assert result.status == status, (enqueued.task.name, result.errors)
        assert [e.exception_class for e in result.errors] == ([error] if error else [])
        assert len(result.worker_ids) == 1
    context = expected[2][0]
    assert context.task.get_result(context.id).return_value == {"id": context.id, "attempt": 1}
    assert Execution.objects.count() == 6


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_signal_mid_task_lets_it_finish_a_second_one_fails_it(runjobs):
    finishing = tasks.sleep_then_record.enqueue("finishes", 1.0)
    proc = runjobs.start("--burst")
    wait_for(lambda: finishing.task.get_result(finishing.id).status == TaskResultStatus.RUNNING)

    proc.send_signal(signal.SIGINT)  # Ctrl-C: finish the attempt in hand, exit 0
    assert proc.wait(timeout=30) == 0, runjobs.output(proc)
    assert finishing.task.get_result(finishing.id).status == TaskResultStatus.SUCCESSFUL

    stuck = tasks.record_then_sleep.enqueue("interrupted", 60)
    proc = runjobs.start()
    # The body began, not only the claim: an attempt claimed but not begun is handed back.
    wait_for(lambda: Execution.objects.filter(label="interrupted").exists())
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "SIGINT received" in runjobs.output(proc))
    proc.send_signal(signal.SIGINT)
    # django-tasks-db exits 0 and records SystemExit; ours exits 130 (a forced stop, as a
    # shell reports one) and records WorkerInterrupted, reason `interrupted` (README).
    assert proc.wait(timeout=30) == 128 + signal.SIGINT, runjobs.output(proc)
    result = stuck.task.get_result(stuck.id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [WorkerInterrupted]
    assert Job.objects.get(result_id=stuck.id).failure_reason == FailureReason.INTERRUPTED
