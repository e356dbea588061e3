"""The django.tasks adapter: enqueue as a Job row, get_result as a view over attempts."""

import os
import pickle
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import modify_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobstate.backend import JobStateBackend
from django_jobstate.exceptions import InvalidPayload
from django_jobstate.managers.bulk import PIPELINED_CHUNK, pipelined
from django_jobstate.models import Job
from django_jobstate.payload import encode_payload
from django_jobstate.states import State
from django_jobstate.task_results import to_task_result
from django_jobstate.tasksapi import (
    FRAMEWORK,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    task,
    task_enqueued,
)
from tests.conftest import ROOT
from tests.factories import JobFactory
from tests.tasks import aliased, email, not_a_task, record, with_options

JOBSTATE_BACKEND = "django_jobstate.backend.JobStateBackend"


def get_result(job: Job):
    return default_task_backend.get_result(str(job.result_id))


# enqueue()


@pytest.mark.django_db
def test_enqueue_creates_one_queued_row():
    run_after = timezone.now() + timedelta(hours=1)
    result = record.using(queue_name="reports", priority=7, run_after=run_after).enqueue("a")

    job = Job.objects.get()
    assert (job.state, job.attempt, job.previous) == (State.QUEUED, 1, None)
    assert (job.task_path, job.args, job.kwargs) == ("tests.tasks.record", ["a"], {})
    assert (job.queue_name, job.priority, job.run_after) == ("reports", 7, run_after)
    assert job.backend == "default"
    assert (result.id, result.status) == (str(job.result_id), TaskResultStatus.READY)
    assert (result.args, result.enqueued_at, result.worker_ids) == (["a"], job.enqueued_at, [])


@pytest.mark.django_db
def test_enqueue_stores_kwargs_and_the_queue_of_the_decorator():
    email.enqueue(address="a@example.com")

    job = Job.objects.get()
    assert (job.task_path, job.queue_name) == ("tests.tasks.email", "emails")
    assert (job.args, job.kwargs) == ([], {"address": "a@example.com"})


@pytest.mark.django_db
def test_enqueue_stores_the_backend_alias(settings):
    settings.TASKS = {**settings.TASKS, "other": {"BACKEND": JOBSTATE_BACKEND}}

    result = record.using(backend="other").enqueue("a")

    assert Job.objects.get().backend == "other"
    assert result.backend == "other"


@pytest.mark.parametrize(
    ("enqueue", "overrides", "expected"),
    [
        (partial(record.enqueue, "a"), {}, (1, 10.0, None)),
        (
            partial(record.enqueue, "a"),
            {
                "JOBSTATE_DEFAULT_MAX_ATTEMPTS": 4,
                "JOBSTATE_DEFAULT_BACKOFF": 7.5,
                "JOBSTATE_DEFAULT_TIMEOUT": 30.0,
            },
            (4, 7.5, 30.0),
        ),
        (with_options.enqueue, {}, (3, 2.0, 5.0)),
        (with_options.enqueue, {"JOBSTATE_DEFAULT_MAX_ATTEMPTS": 4}, (3, 2.0, 5.0)),
    ],
    ids=["app-defaults", "settings-defaults", "task-options", "task-options-win"],
)
@pytest.mark.django_db
def test_enqueue_stores_the_retry_options(settings, enqueue, overrides, expected):
    for name, value in overrides.items():
        setattr(settings, name, value)

    enqueue()

    job = Job.objects.get()
    assert (job.max_attempts, job.backoff, job.timeout) == expected


@pytest.mark.django_db
def test_task_options_survive_using():
    with_options.using(priority=5).enqueue()

    job = Job.objects.get()
    assert (job.priority, job.max_attempts, job.backoff, job.timeout) == (5, 3, 2.0, 5.0)


@pytest.mark.django_db
def test_a_task_enqueued_without_run_after_is_runnable_at_once():
    missed = 0
    for n in range(200):
        result = record.enqueue(str(n))
        claimed = Job.objects.claim("w1", limit=10)
        missed += result.id not in {str(job.result_id) for job in claimed}
    assert missed == 0


# get_result()


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (State.QUEUED, TaskResultStatus.READY),
        (State.RUNNING, TaskResultStatus.RUNNING),
        (State.SUCCEEDED, TaskResultStatus.SUCCESSFUL),
        (State.FAILED, TaskResultStatus.FAILED),
    ],
)
@pytest.mark.django_db
def test_get_result_maps_each_state(state, status):
    job = JobFactory.in_state(state)

    result = get_result(job)

    assert (result.id, result.status) == (str(job.result_id), status)
    assert result.task.module_path == "tests.tasks.record"
    assert result.args == ["factory"]
    assert result.worker_ids == ([] if state == State.QUEUED else ["factory-worker"])


@pytest.mark.django_db
def test_get_result_of_a_success_has_its_return_value():
    job = JobFactory.in_state(State.SUCCEEDED, return_value={"rows": [1, 2]})

    result = get_result(job)

    assert result.return_value == {"rows": [1, 2]}
    assert (result.started_at, result.finished_at) == (job.started_at, job.finished_at)
    assert result.errors == []


@pytest.mark.django_db
def test_get_result_of_a_failure_has_its_error():
    job = JobFactory.in_state(State.FAILED)

    result = get_result(job)

    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback == job.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


@pytest.mark.parametrize(
    ("retry_state", "status"),
    [(State.QUEUED, TaskResultStatus.READY), (State.RUNNING, TaskResultStatus.RUNNING)],
)
@pytest.mark.django_db
def test_get_result_while_a_retry_is_live(retry_state, status):
    first = JobFactory.in_state(State.FAILED, worker_id="w1")
    owner = {} if retry_state == State.QUEUED else {"worker_id": "w2"}
    JobFactory.in_state(retry_state, result_id=first.result_id, attempt=2, previous=first, **owner)

    result = get_result(first)

    assert (result.id, result.status) == (str(first.result_id), status)
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert result.worker_ids == (["w1"] if retry_state == State.QUEUED else ["w1", "w2"])
    assert (result.enqueued_at, result.started_at) == (first.enqueued_at, first.started_at)


@pytest.mark.django_db
def test_refresh_follows_the_row():
    result = record.using(run_after=timezone.now() - timedelta(seconds=1)).enqueue("a")
    [job] = Job.objects.claim("w1")

    result.refresh()
    assert (result.status, result.worker_ids) == (TaskResultStatus.RUNNING, ["w1"])

    Job.objects.succeed(job, "a")
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "a")


@pytest.mark.parametrize("result_id", [lambda: str(uuid.uuid4()), lambda: "not-a-uuid"])
@pytest.mark.django_db
def test_get_result_of_an_unknown_id_does_not_exist(result_id):
    JobFactory()

    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id())
    with pytest.raises(TaskResultDoesNotExist):
        record.get_result(result_id())


@pytest.mark.django_db
def test_get_result_through_another_task_is_a_mismatch():
    result = record.enqueue("a")

    assert record.get_result(result.id).id == result.id
    with pytest.raises(TaskResultMismatch, match=re.escape("tests.tasks.record")):
        email.get_result(result.id)


# Signals


@pytest.mark.django_db
def test_enqueue_sends_task_enqueued_with_the_result():
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = record.enqueue("a")
        with pytest.raises(InvalidTask):
            aliased.enqueue()
    finally:
        task_enqueued.disconnect(receiver)

    assert received == [(JobStateBackend, result)]
    assert received[0][1].status == TaskResultStatus.READY


@pytest.mark.django_db
def test_bulk_enqueue_sends_task_enqueued_for_each_call_to_a_receiver():
    received = []
    backend = record.get_backend()
    backend.bulk_enqueue(record, [(("unheard",), {})])  # nothing but the log receiver
    task_enqueued.connect(receiver := lambda task_result, **kwargs: received.append(task_result))
    try:
        results = backend.bulk_enqueue(record, [(("a",), {}), (("b",), {})])
    finally:
        task_enqueued.disconnect(receiver)

    assert received == results


# Bad input writes nothing


def test_a_payload_is_known_by_its_type_before_its_truth_is_asked():
    """An empty list or dict needs no encoding; anything else's truth may raise or query."""

    class Ambiguous:  # an array, a QuerySet...
        def __bool__(self) -> bool:
            raise ValueError("the truth value is ambiguous")

    class Items(list):
        pass

    with pytest.raises(InvalidPayload, match="must be JSON: Object of type Ambiguous"):
        encode_payload(Ambiguous(), "The task's return value")
    assert encode_payload(Items(), "Task arguments") == ([], "[]")
    assert type(encode_payload(Items(), "Task arguments")[0]) is list
    assert encode_payload({}, "Task keyword arguments") == ({}, "{}")


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((datetime.now(UTC),), {}, "arguments must be JSON: Object of type datetime"),
        (({1, 2},), {}, "arguments must be JSON: Object of type set"),
        ((object(),), {}, "arguments must be JSON: Object of type object"),
        ((float("nan"),), {}, "arguments must be JSON: Out of range float values .*: nan"),
        ((float("inf"),), {}, "arguments must be JSON: Out of range float values .*: inf"),
        ((), {"label": datetime.now(UTC)}, "keyword arguments must be JSON: .* datetime"),
        ((), {"label": [float("-inf")]}, "keyword arguments must be JSON: .*: -inf"),
    ],
    ids=["datetime", "set", "object", "nan", "inf", "kwarg-datetime", "kwarg-nested-inf"],
)
@pytest.mark.django_db
def test_arguments_that_are_not_json_are_refused(args, kwargs, message):
    # A TypeError, as Django documents: `except TypeError:` around enqueue() catches it.
    with pytest.raises(TypeError, match=message):
        record.enqueue(*args, **kwargs)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "fits"),
    [
        (("x" * 996,), {}, True),  # ["xxx..."] is exactly 1,000 bytes
        (("x" * 997,), {}, False),
        ((), {"label": "x" * 2000}, False),
    ],
    ids=["at-the-limit", "one-byte-over", "kwargs-over"],
)
@pytest.mark.django_db
def test_payload_size_is_limited(settings, args, kwargs, fits):
    settings.JOBSTATE_MAX_PAYLOAD_BYTES = 1000

    if fits:
        record.enqueue(*args, **kwargs)
        assert Job.objects.count() == 1
    else:
        with pytest.raises(ValueError, match=r"more than JOBSTATE_MAX_PAYLOAD_BYTES \(1,000\)"):
            record.enqueue(*args, **kwargs)
        assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("using", "message"),
    [
        (
            {"queue_name": "nope"},
            "Queue 'nope' is not valid for backend 'default'; its QUEUES are: default, "
            "emails, reports.",
        ),
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"priority": -101}, "priority must be a whole number between -100 and 100"),
    ],
)
@pytest.mark.django_db
def test_invalid_queue_or_priority_is_refused(using, message):
    with pytest.raises(InvalidTask, match=message):
        record.using(**using).enqueue("a")
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_task_whose_path_does_not_lead_back_to_it_is_refused():
    with pytest.raises(
        InvalidTask, match=re.escape("'tests.tasks._registered_under_another_name'")
    ):
        aliased.enqueue()
    assert Job.objects.count() == 0


def test_a_task_defined_in_a_function_is_refused():
    def local() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(local)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts .* at least 1, not 0"),
        ({"max_attempts": 1.5}, "max_attempts .* whole number"),
        ({"max_attempts": 2.0}, "max_attempts .* whole number"),
        ({"max_attempts": "3"}, "max_attempts .* not '3'"),
        ({"max_attempts": True}, "max_attempts .* not True"),
        ({"backoff": -1}, "backoff .* at least 0, not -1"),
        ({"backoff": float("nan")}, "backoff .* not nan"),
        ({"timeout": 0}, "timeout .* not 0"),
        ({"timeout": "5"}, "timeout .* not '5'"),
        ({"max_attempts": 40_000}, "max_attempts .* from 1 to 1000, not 40000"),
        (
            {"backoff": 1e12},
            r"backoff .* at most 3.1536e\+07 seconds \(a year\), not 1000000000000.0",
        ),
        ({"timeout": 366 * 86_400}, r"timeout .* at most 3.1536e\+07 seconds \(a year\)"),
    ],
)
def test_invalid_options_are_refused_when_the_task_is_defined(options, message):
    # not_a_task is at module level, so only the option can be what is refused.
    with pytest.raises(InvalidTask, match=message):
        task(**options)(not_a_task)


# check()


@pytest.mark.parametrize(("remove", "expected"), [([], []), (["django_jobstate"], ["E003"])])
def test_check_requires_the_app(remove, expected):
    with modify_settings(INSTALLED_APPS={"remove": remove}):
        errors = JobStateBackend("x", {}).check()

    assert [e.id for e in errors] == [f"django_jobstate.{id}" for id in expected]
    assert all("TASKS['x']" in e.msg for e in errors)


def test_enqueue_without_the_app_says_so():
    with (
        modify_settings(INSTALLED_APPS={"remove": ["django_jobstate"]}),
        pytest.raises(ImproperlyConfigured, match="django_jobstate is not in INSTALLED_APPS"),
    ):
        record.enqueue("nowhere to go")


def test_a_task_of_an_alias_without_the_app_is_refused_at_its_definition():
    with (
        modify_settings(INSTALLED_APPS={"remove": ["django_jobstate"]}),
        pytest.raises(ImproperlyConfigured, match=r"INSTALLED_APPS.*\(django_jobstate\.E003\)"),
    ):
        task(not_a_task)


# A project without the app: its settings, and an app of its own. {imports} is what the app
# imports at start-up; its URLconf imports its tasks, as views that enqueue them do.
PROJECT = {
    "noapp_settings.py": (
        "SECRET_KEY = 'x'\n"
        "INSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth', 'shop']\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}\n"
        "ROOT_URLCONF = 'shop.urls'\n"
        "TASKS = {'default': {'BACKEND': 'django_jobstate.backend.JobStateBackend'}}\n"
    ),
    "shop/__init__.py": "",
    "shop/models.py": "{imports}",
    "shop/tasks.py": f"from {FRAMEWORK} import task\n\n\n@task\ndef ship(order_id): ...\n",
    "shop/urls.py": "from . import tasks  # noqa\n\nurlpatterns = []\n",
}


@pytest.mark.parametrize(
    "imports",
    [
        "",  # nothing: the URL check imports the tasks, after Django chose which checks run
        f"import {FRAMEWORK}\n",  # the framework's check of TASKS runs, and the backend's check()
    ],
)
def test_manage_py_check_reports_e003_without_the_app(tmp_path, imports):
    for name, text in PROJECT.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text.replace("{imports}", imports))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "noapp_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "TASKS['default'] uses JobStateBackend, but django_jobstate is not in" in output
    assert "django_jobstate.E003" in output
    assert "Add 'django_jobstate' to INSTALLED_APPS and run migrate." in output


def inserts(queries: CaptureQueriesContext) -> int:
    return sum("INSERT INTO" in q["sql"].upper() for q in queries.captured_queries)


@pytest.mark.django_db
def test_bulk_enqueue_writes_ten_thousand_small_calls_in_one_statement():
    """One statement; or where statements are pipelined (PostgreSQL with psycopg 3), one
    per PIPELINED_CHUNK calls, each sent while the one before is written."""
    calls = [([f"job {n}"], {}) for n in range(10_000)]  # a workflow's group of 10,000

    with CaptureQueriesContext(connection) as queries:
        results = default_task_backend.bulk_enqueue(record, calls)

    assert inserts(queries) == (10_000 // PIPELINED_CHUNK if pipelined(connection) else 1)
    assert len(results) == 10_000
    assert {r.status for r in results} == {TaskResultStatus.READY}
    rows = Job.objects.filter(result_id__in=[r.id for r in results[:10]]).order_by("id")
    assert [row.args for row in rows] == [[f"job {n}"] for n in range(10)]
    assert Job.objects.queued().count() == 10_000


@pytest.mark.django_db
def test_bulk_enqueue_builds_each_result_when_it_is_first_read():
    calls = [(["a"], {}), (["b"], {"n": 1}), ([], {})]

    results = default_task_backend.bulk_enqueue(record, calls)

    assert results._built == {}  # nothing built that nobody reads
    assert len(results) == 3
    last = results[-1]
    assert results._built == {2: last}
    assert results[2] is last  # once
    assert results[:2] == [results[0], results[1]]
    assert list(results) == [get_result(job) for job in Job.objects.order_by("id")]
    assert [(r.args, r.kwargs) for r in results] == [(["a"], {}), (["b"], {"n": 1}), ([], {})]
    assert results == tuple(results)
    assert results != list(results)[:2]
    with pytest.raises(IndexError):
        results[3]
    assert repr(results) == "<EnqueuedResults: 3 tasks>"
    assert pickle.loads(pickle.dumps(results, protocol=1)) == results  # as a list pickled


@pytest.mark.django_db
def test_bulk_enqueue_splits_large_arguments_below_the_servers_packet_size():
    """MariaDB refuses a statement past max_allowed_packet (16 MiB by default): calls whose
    arguments weigh more than a few MiB in all are written by several statements."""
    calls = [(["x" * 100_000, n], {}) for n in range(100)]  # ~10 MB of arguments

    with CaptureQueriesContext(connection) as queries:
        results = default_task_backend.bulk_enqueue(record, calls)

    assert inserts(queries) == 3  # at most 4 MiB each
    assert Job.objects.queued().count() == 100
    assert sorted(row[1] for row in Job.objects.values_list("args", flat=True)) == list(range(100))
    assert {r.status for r in results} == {TaskResultStatus.READY}


@pytest.mark.django_db(transaction=True)  # the rollback under test is bulk_enqueue's own
def test_bulk_enqueue_is_all_or_nothing():
    calls = [(["fine"], {}), ([{1, 2}], {}), (["also fine"], {})]

    with pytest.raises(InvalidPayload, match="Task arguments must be JSON"):
        default_task_backend.bulk_enqueue(record, calls)

    assert not Job.objects.exists()


@pytest.mark.django_db
def test_arguments_are_taken_as_djangos_backends_take_them():
    result = record.enqueue(b"bytes")

    assert Job.objects.get().args == ["bytes"]
    assert result.args == ["bytes"]


@pytest.mark.parametrize("run_after", [None, timezone.now() + timedelta(hours=1)])
@pytest.mark.django_db
def test_get_result_reads_back_every_field_enqueue_returned(run_after):
    enqueued = record.using(run_after=run_after, priority=5).enqueue("same")

    read = record.get_result(enqueued.id)

    assert read.task.run_after == run_after
    assert read.task == enqueued.task
    fields = ["id", "status", "enqueued_at", "started_at", "finished_at", "args", "kwargs"]
    assert [getattr(read, f) for f in fields] == [getattr(enqueued, f) for f in fields]
    assert (read.backend, read.errors, read.worker_ids) == (enqueued.backend, [], [])


@pytest.mark.django_db
@pytest.mark.parametrize("options", [{}, {"metadata": {"n": {"k": 1}}, "priority": 3}])
def test_enqueue_returns_what_its_row_reads_back_as(options):
    task = record.using(**options)
    enqueued = task.enqueue("x")

    read = to_task_result([Job.objects.get(result_id=enqueued.id)], task)

    assert enqueued == read  # every field, _return_value too (a slot left unset raises)
    assert (type(enqueued), repr(enqueued)) == (type(read), repr(read))
    assert enqueued.metadata == options.get("metadata", {})


@pytest.mark.django_db
def test_the_immediate_backend_for_test_settings_takes_every_task_option(settings):
    settings.TASKS = {"default": {"BACKEND": "django_jobstate.backend.ImmediateBackend"}}
    optioned = task(
        max_attempts=3,
        backoff=2,
        timeout=5,
        atomic=True,
        unique=["label"],
        unique_scope="queued",
        on_duplicate="raise",
    )(record.func)

    result = optioned.enqueue("at once")
    assert optioned.using(unique_key="k").enqueue("at once").return_value == "at once"

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "at once"
    assert Job.objects.count() == 0  # run in the caller's process, stored nowhere
    with pytest.raises(InvalidTask, match=re.escape("max_attempts of task 'tests.tasks.record'")):
        task(max_attempts=0)(record.func)
