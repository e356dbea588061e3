"""The Tasks framework's seam: Django 6.1's django.tasks, or the django-tasks backport.

Runs on every pair of the test matrix (scripts/test): what a pair lacks is skipped, so each
pair tests what it has (Django 5.2 + backport, 6.0 + backport, 6.1 with and without it).
"""

import contextlib
import functools
import importlib
import importlib.util
import json
import logging
import os
import pickle
import subprocess
import sys
import time

import django
import pytest
from django.test import override_settings

from django_jobstate import tasksapi
from django_jobstate.backend import JobStateBackend, JobStateTask
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from tests import tasks
from tests.conftest import ROOT
from tests.framework import INVALID_TASK

HAS_BACKPORT = importlib.util.find_spec("django_tasks") is not None
needs_backport = pytest.mark.skipif(not HAS_BACKPORT, reason="django-tasks is not installed")

# Each framework present: Django's own from 6.0 (6.0's is not used, but its signals can have
# receivers), the backport where installed.
SIGNAL_MODULES = [
    name
    for name, present in [
        ("django.tasks.signals", django.VERSION >= (6, 0)),
        ("django_tasks.signals", HAS_BACKPORT),
    ]
    if present
]


def test_the_framework_follows_the_django_version():
    name = "django.tasks" if django.VERSION >= (6, 1) else "django_tasks"

    assert name == tasksapi.FRAMEWORK
    assert tasksapi.task_backends is importlib.import_module(name).task_backends
    assert tasksapi.Task is importlib.import_module(f"{name}.base").Task
    assert issubclass(JobStateBackend, tasksapi.BaseTaskBackend)


@pytest.mark.skipif(django.VERSION >= (6, 1), reason="Django 6.1 needs no backport")
def test_without_the_backport_the_error_says_what_to_install():
    # None in sys.modules: the import fails as it does where the package is not installed.
    code = "import sys; sys.modules['django_tasks'] = None; import django_jobstate.tasksapi"

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 1
    assert "ImproperlyConfigured" in done.stderr
    assert "pip install 'django-jobstate[backport]'" in done.stderr


@needs_backport
def test_the_backports_decorator_forwards_the_options_to_our_task_class():
    backport = tasks.backport_flaky

    assert isinstance(backport, JobStateTask)
    assert (backport.max_attempts, backport.backoff) == (2, 0)
    assert (backport.queue_name, backport.priority) == ("emails", 5)


@needs_backport
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_declared_with_the_backport_runs_beside_the_frameworks_own(runjobs):
    mixed = tasks.backport_flaky.enqueue("mixed")
    own = tasks.record.enqueue("beside it")  # the framework's decorator, the same backend

    # A retry due "now" may miss a burst run by a millisecond on SQLite: run until done.
    deadline = time.monotonic() + 120  # a safety net only
    while Job.objects.live().exists():
        assert time.monotonic() < deadline, "jobs stayed live"
        done = runjobs.run("--burst")
        assert done.returncode == 0, done.stdout

    result = tasks.backport_flaky.get_result(mixed.id)
    assert result.status == tasksapi.TaskResultStatus.SUCCESSFUL
    assert result.return_value == "mixed"
    assert [e.exception_class for e in result.errors] == [ValueError]  # max_attempts=2 held
    assert result.attempts == 2
    assert tasks.record.get_result(own.id).return_value == "beside it"
    first = Job.objects.filter(result_id=mixed.id).earliest("attempt")
    assert (first.queue_name, first.priority, first.max_attempts) == ("emails", 5, 2)


@pytest.mark.django_db
def test_every_present_frameworks_signals_are_sent():
    sent: list[tuple[str, str, str]] = []
    connected = []
    for module_name in SIGNAL_MODULES:
        module = importlib.import_module(module_name)  # imported: now "in use"
        for name in ("task_enqueued", "task_started", "task_finished"):

            def receiver(sender, task_result, _where=(module_name, name), **kwargs):
                sent.append((*_where, task_result.id))

            getattr(module, name).connect(receiver, weak=False)
            connected.append((getattr(module, name), receiver))
    try:
        result = tasks.record.enqueue("signalled")
        Worker(burst=True).run()
    finally:
        for signal, receiver in connected:
            signal.disconnect(receiver)

    assert sorted(sent) == sorted(
        (module_name, name, result.id)
        for module_name in SIGNAL_MODULES
        for name in ("task_enqueued", "task_started", "task_finished")
    )


# Signals nothing would hear: the worker builds no TaskResult for them (tasksapi.audible)


@pytest.fixture
def default_logging(monkeypatch):
    """Logging as a new project has it, DEBUG off: Django's default LOGGING, and nothing
    for the backport's logger (whose records then go to Python's last resort, WARNING and
    up). Each test takes pytest's capture handlers off the root logger itself (pytest adds
    them again as the test's call begins)."""
    monkeypatch.setattr(logging.getLogger("django_tasks"), "handlers", [])
    return functools.partial(monkeypatch.setattr, logging.root, "handlers", [])


@pytest.fixture
def framework_at_info():
    """The framework's logger set to INFO, as a project that wants its lines sets it."""
    logger = logging.getLogger(tasksapi.FRAMEWORK)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


def test_a_signal_only_the_frameworks_log_receiver_would_drop_is_not_audible(default_logging):
    default_logging()
    started, finished = tasksapi.task_started, tasksapi.task_finished

    assert not tasksapi.audible(started, JobStateBackend)
    assert not tasksapi.audible(finished, JobStateBackend)
    # A failure is heard: mail_admins takes ERROR without DEBUG (the backport's logger:
    # Python's last resort, which takes WARNING and up).
    assert tasksapi.audible(finished, JobStateBackend, logging.ERROR)


def test_a_signal_is_audible_to_any_receiver_or_handler_not_known_to_drop(
    default_logging, framework_at_info, monkeypatch
):
    default_logging()
    started = tasksapi.task_started
    assert not tasksapi.audible(started, JobStateBackend)

    if tasksapi.FRAMEWORK == "django.tasks":  # the backport logs through its own logger
        with override_settings(DEBUG=True):  # Django's console handler prints INFO then
            assert tasksapi.audible(started, JobStateBackend)
    with logging_handler(logging.Handler()):  # a handler of the project's
        assert tasksapi.audible(started, JobStateBackend)
    plain = logging.Handler()
    plain.addFilter(lambda record: "id=" in record.getMessage())  # it reads the record
    with logging_handler(plain):
        assert tasksapi.audible(started, JobStateBackend)
    with monkeypatch.context() as patched:  # as Sentry's breadcrumbs do
        patched.setattr(logging.Logger, "callHandlers", lambda self, record: None)
        assert tasksapi.audible(started, JobStateBackend)
    original = logging.Logger.callHandlers

    @functools.wraps(original)  # a wrapper that passes for the original by its name
    def wrapper(self, record):
        return original(self, record)

    with monkeypatch.context() as patched:
        patched.setattr(logging.Logger, "callHandlers", wrapper)
        assert tasksapi.audible(started, JobStateBackend)
    started.connect(receiver := lambda **kwargs: None, weak=False)
    try:
        assert tasksapi.audible(started, JobStateBackend)
    finally:
        started.disconnect(receiver)
    assert not tasksapi.audible(started, JobStateBackend)


@contextlib.contextmanager
def logging_handler(handler):
    logging.root.addHandler(handler)
    try:
        yield
    finally:
        logging.root.removeHandler(handler)


@pytest.fixture
def unheard(monkeypatch):
    """The worker's view when nothing hears its signals (pytest's own log handler hears
    them in this process otherwise)."""
    monkeypatch.setattr("django_jobstate.runner.attempts.audible", lambda *a, **k: False)
    monkeypatch.setattr("django_jobstate.runner.recording.audible", lambda *a, **k: False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_flight", [1, 4])
def test_a_worker_runs_every_kind_of_attempt_when_nothing_hears(unheard, in_flight):
    plain = tasks.record.enqueue("plain")
    context = tasks.attempt_number.enqueue()
    retried = tasks.fails_once.enqueue("retried")
    failed = tasks.boom.enqueue()
    asynchronous = tasks.async_fails_once.enqueue("async")
    bare_async = tasks.noop_async.enqueue()
    metadata = tasks.record.enqueue("metadata")
    Job.objects.filter(result_id=metadata.id).update(metadata=["not", "an", "object"])

    Worker(burst=True, in_flight=in_flight).run()

    assert tasks.record.get_result(plain.id).return_value == "plain"
    assert tasks.attempt_number.get_result(context.id).return_value == 1
    assert tasks.fails_once.get_result(retried.id).attempts == 2
    assert tasks.boom.get_result(failed.id).status == tasksapi.TaskResultStatus.FAILED
    assert tasks.async_fails_once.get_result(asynchronous.id).status == (
        tasksapi.TaskResultStatus.SUCCESSFUL
    )
    assert tasks.noop_async.get_result(bare_async.id).status == (
        tasksapi.TaskResultStatus.SUCCESSFUL
    )
    bad = Job.objects.get(result_id=metadata.id)
    assert (bad.state, bad.error_class) == ("failed", INVALID_TASK)
    assert "has metadata list; it must be a JSON object" in bad.error_message


@pytest.mark.django_db
def test_a_worker_sends_the_signals_a_log_handler_hears(caplog):
    caplog.set_level(logging.INFO, logger=tasksapi.FRAMEWORK)  # pytest's handler takes them
    result = tasks.record.enqueue("logged")

    Worker(burst=True).run()

    logged = [r.getMessage() for r in caplog.records if r.name == tasksapi.FRAMEWORK]
    assert [line for line in logged if result.id in line and "state=" in line] == [
        f"Task id={result.id} path={tasks.record.module_path} state={status}"
        for status in (tasksapi.TaskResultStatus.RUNNING, tasksapi.TaskResultStatus.SUCCESSFUL)
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("debug", [False, True])
def test_runjobs_builds_the_signals_result_only_for_what_would_hear_it(runjobs, debug):
    plain = tasks.record.enqueue("plain")
    context = tasks.attempt_number.enqueue()  # its context's TaskResult is built either way

    done = runjobs.run("--burst", JOBSTATE_TEST_SETTINGS=json.dumps({"DEBUG": debug}))

    assert done.returncode == 0, done.stdout
    assert tasks.record.get_result(plain.id).return_value == "plain"
    assert tasks.attempt_number.get_result(context.id).return_value == 1
    # DEBUG: Django's console handler prints the framework's lines; without, it drops them
    # (the worker then sends no signal nothing hears, and builds no TaskResult for it).
    # The backport's logger is not Django's (the test settings give it a NullHandler); on
    # Django 6.0 the worker sends django.tasks' namesakes too, which Django's logger takes.
    for result in (plain, context):
        lines = {
            f"Task id={result.id} path={result.task.module_path} state={s}"
            for s in (tasksapi.TaskResultStatus.RUNNING, tasksapi.TaskResultStatus.SUCCESSFUL)
        }
        printed = {line for line in lines if line in done.stdout}
        if not debug:
            assert printed == set()
        elif tasksapi.FRAMEWORK == "django.tasks":
            assert printed == lines


# What differs under the backport (README, Requirements)


@pytest.mark.django_db
def test_the_frameworks_log_lines_and_exception_names(caplog):
    backport = tasksapi.FRAMEWORK == "django_tasks"
    caplog.set_level(logging.DEBUG, logger=tasksapi.FRAMEWORK)

    result = tasks.record.enqueue("logged")

    logged = [r.getMessage() for r in caplog.records if r.name == tasksapi.FRAMEWORK]
    assert any(result.id in line and "enqueued" in line for line in logged)
    name = "InvalidTaskError" if backport else "InvalidTask"
    assert f"{tasksapi.InvalidTask.__module__}.{tasksapi.InvalidTask.__name__}" == (
        f"{tasksapi.FRAMEWORK}.exceptions.{name}"
    )


@pytest.mark.skipif(django.VERSION[:2] != (6, 0), reason="Django 6.0's own @task")
def test_on_django_6_0_its_own_decorator_builds_our_task_but_refuses_options():
    from django.tasks import task

    assert isinstance(task(tasks.record.func), JobStateTask)
    with pytest.raises(TypeError, match="max_attempts"):
        task(max_attempts=3)(tasks.record.func)


@pytest.mark.django_db
def test_a_task_and_its_result_pickle_on_every_pair():
    # Django 6.1's Task pickles; the backport's did not (PicklingError), so ours does itself.
    assert pickle.loads(pickle.dumps(tasks.with_options)) == tasks.with_options
    result = tasks.record.enqueue("pickled")

    assert pickle.loads(pickle.dumps(result)) == result


# Both frameworks check TASKS where both are in use, each with a backend instance of its own.
BOTH_CHECK = {
    "both_settings.py": (
        "SECRET_KEY = 'x'\n"
        "INSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth', 'django_tasks',"
        " 'shop']\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}\n"
        "TASKS = {'default': {'BACKEND': 'django_jobstate.backend.JobStateBackend'}}\n"
    ),
    "shop/__init__.py": "",
    "shop/models.py": "import django.tasks  # before the checks: Django's check runs too\n",
}


@needs_backport
@pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 5.2 has no django.tasks to check")
def test_an_error_of_the_backend_is_listed_once_when_both_frameworks_check(tmp_path):
    for name, text in BOTH_CHECK.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "both_settings",
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

    assert done.returncode != 0, done.stdout
    assert done.stderr.count("(django_jobstate.E003)") == 1, done.stderr
