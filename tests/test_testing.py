"""The test settings' backends enforce exactly the rules JobStateBackend enforces, so a
project's test suite fails where production would; DummyBackend keeps, ImmediateBackend runs."""

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_jobstate.models import Job
from django_jobstate.tasksapi import InvalidTask, TaskResultStatus, task_backends
from tests import tasks
from tests.framework import IMPORT_TASK
from tests.models import Execution
from tests.searchapp import tasks as searchapp_tasks

pytestmark = [pytest.mark.django_db(transaction=True)]

BACKENDS = [
    "django_jobstate.backend.JobStateBackend",
    "django_jobstate.backend.ImmediateBackend",
    "django_jobstate.backend.DummyBackend",
]
STRAY = IMPORT_TASK + "@task\ndef job() -> None: ...\n"


def using(backend):
    return override_settings(
        TASKS={"default": {"BACKEND": backend, "QUEUES": ["default", "emails", "reports"]}}
    )


def outcome(enqueue):
    """The exception enqueue() raised, as (class name, message); None if it raised none."""
    try:
        enqueue()
    except Exception as exc:  # whatever JobStateBackend raises, the others must too
        return type(exc).__name__, str(exc)
    return None


CASES = {
    "unknown queue": lambda: tasks.record.using(queue_name="nope").enqueue("x"),
    "not JSON": lambda: tasks.record.enqueue({1, 2}),
    "NaN": lambda: tasks.record.enqueue(float("nan")),
    "too large": lambda: tasks.record.enqueue("x" * 2000),
    "unique, arguments that do not match": lambda: tasks.unique_record.enqueue(nope=1),
    "bad option from settings": lambda: tasks.record.enqueue("x"),
}


@pytest.mark.parametrize("case", CASES)
def test_every_backend_refuses_what_jobstatebackend_refuses(case):
    options = {"tests.tasks.record": {"max_attempts": 0}} if "settings" in case else {}
    seen = {}
    for backend in BACKENDS:
        with (
            using(backend),
            override_settings(JOBSTATE_MAX_PAYLOAD_BYTES=1000, JOBSTATE_TASK_OPTIONS=options),
        ):
            seen[backend] = outcome(CASES[case])

    assert seen[BACKENDS[0]] is not None
    assert seen == dict.fromkeys(BACKENDS, seen[BACKENDS[0]])
    assert not Job.objects.exists()
    assert not Execution.objects.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_refuses_a_task_outside_the_task_modules(backend, make_module):
    with using(backend):
        stray = __import__(make_module("jobs", STRAY), fromlist=["job"]).job
        refused = outcome(stray.enqueue)

    assert refused is not None
    assert refused[0] == InvalidTask.__name__  # InvalidTaskError in the backport
    assert "A worker would refuse the task" in refused[1]


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_the_test_backends_accept_every_option_and_third_party_tasks(backend):
    with using(backend):
        results = [
            tasks.with_options.enqueue(),
            tasks.unique_record.using(unique_key="k").enqueue("x"),
            searchapp_tasks.index_page.enqueue("home"),
        ]

    assert [r.task.module_path for r in results] == [
        "tests.tasks.with_options",
        "tests.tasks.unique_record",
        "tests.searchlib.tasks.index_page",
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_enqueues_in_bulk_all_or_none(backend):
    with using(backend):
        bulk = task_backends["default"].bulk_enqueue
        refused = outcome(lambda: bulk(tasks.record, [(["a"], {}), ([{1, 2}], {})]))
        results = bulk(tasks.record, [(["b"], {}), ([], {"label": "c"})])
        kept = getattr(task_backends["default"], "results", None)  # DummyBackend's

    assert refused is not None
    assert kept is None or [r.args for r in kept] == [["b"], []]
    assert refused[0] == "InvalidPayload"
    assert [(r.args, r.kwargs) for r in results] == [(["b"], {}), ([], {"label": "c"})]
    ran = list(Execution.objects.values_list("label", flat=True))
    assert ran == (["b", "c"] if "Immediate" in backend else [])
    assert Job.objects.count() == (2 if backend == BACKENDS[0] else 0)


def test_dummy_backend_runs_nothing_and_keeps_what_was_enqueued():
    with using("django_jobstate.backend.DummyBackend"):
        result = tasks.record.using(queue_name="emails").enqueue("kept")
        backend = task_backends["default"]

        assert [(r.id, r.args, r.task.queue_name) for r in backend.results] == [
            (result.id, ["kept"], "emails")
        ]
        assert result.status == TaskResultStatus.READY
        backend.clear()
        assert backend.results == []
    assert not Execution.objects.exists()
    assert not Job.objects.exists()


def test_immediate_backend_runs_with_the_settings_options_checked():
    options = {"tests.tasks.record": {"max_attempts": 2, "timeout": 5}}
    with (
        using("django_jobstate.backend.ImmediateBackend"),
        override_settings(JOBSTATE_TASK_OPTIONS=options),
    ):
        result = tasks.record.enqueue("ran")

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert (result.task.max_attempts, result.task.timeout) == (2, 5)
    assert list(Execution.objects.values_list("label", flat=True)) == ["ran"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_w004_is_reported_under_every_backend_of_the_package(backend, make_module):
    with using(backend):
        name = make_module("jobs", STRAY)
        __import__(name)  # as the project's views would
        found = [m for m in run_checks() if m.id == "django_jobstate.W004"]

    assert [m.msg for m in found if name in m.msg] == [
        f"Workers would refuse the task '{name}.job', and enqueue() raises for it: "
        f"{name!r} is not a task module of this project."
    ]
