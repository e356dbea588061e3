"""Which modules a job row may name: the project's task modules, found once, and no other."""

import importlib
import sys
import types

import pytest
from django.test import override_settings
from django.utils.functional import SimpleLazyObject

from django_jobstate.loading import (
    check_loadable,
    exposed_tasks,
    is_task_module,
    load_task,
    task_modules,
)
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import State
from django_jobstate.tasksapi import InvalidTask
from tests import tasks
from tests.framework import IMPORT_TASK
from tests.searchapp import tasks as searchapp_tasks

TASK_SOURCE = IMPORT_TASK + "@task\ndef job() -> str:\n    return 'ran'\n"


def test_every_installed_apps_tasks_module_is_a_task_module():
    assert "tests.tasks" in task_modules()  # "tests" is an installed app
    assert not is_task_module("tests")
    assert not is_task_module("tests.tasksx")
    assert not is_task_module("django_jobstate")
    assert is_task_module("django_jobstate.tasks")  # the app's own: prune_jobs (retention)
    assert load_task("tests.tasks.record") is tasks.record


def test_a_listed_module_is_imported_at_the_first_load(make_module, tmp_path):
    imported = tmp_path / "imported"
    name = make_module("jobs", f"import pathlib\npathlib.Path({str(imported)!r}).touch()\n")

    with override_settings(JOBSTATE_TASK_MODULES=[name]):
        with pytest.raises(InvalidTask, match="has no 'nothing'"):
            load_task(f"{name}.nothing")
        assert is_task_module(name)

    assert imported.exists()


def test_a_module_outside_the_task_modules_is_not_imported(make_module, tmp_path):
    imported = tmp_path / "imported"
    name = make_module("jobs", f"import pathlib\npathlib.Path({str(imported)!r}).touch()\n")

    with pytest.raises(InvalidTask) as refused:
        load_task(f"{name}.job")

    assert f"{name!r} is not a task module of this project" in str(refused.value)
    assert f"or add {name!r} to the JOBSTATE_TASK_MODULES setting" in str(refused.value)
    assert not imported.exists()


def test_a_submodule_of_a_listed_package_is_imported_on_demand(make_module):
    name = make_module("jobs.emails", TASK_SOURCE)
    package = name.rpartition(".")[0]

    with override_settings(JOBSTATE_TASK_MODULES=[package]):
        assert name not in sys.modules  # a fresh worker: only the package is imported
        assert load_task(f"{name}.job").call() == "ran"


def test_an_imported_module_is_read_without_its_getattr(monkeypatch):
    asked = []
    lazy = types.ModuleType("jobstate_lazy")
    lazy.__getattr__ = asked.append  # PEP 562: may import anything it likes
    monkeypatch.setitem(sys.modules, "jobstate_lazy", lazy)

    with pytest.raises(InvalidTask, match="has no 'job'"):
        load_task("jobstate_lazy.job")

    assert asked == []


@pytest.mark.django_db(transaction=True)  # a Worker's watchdog has its own connection
def test_a_task_outside_the_task_modules_is_refused_at_enqueue_until_listed(make_module):
    name = make_module("jobs", TASK_SOURCE)
    stray = __import__(name, fromlist=["job"]).job  # imported by the project, say a view

    with pytest.raises(InvalidTask) as refused:
        stray.enqueue()

    assert str(refused.value) == (
        f"A worker would refuse the task '{name}.job': its module {name!r} is not a task "
        f"module of this project, and workers import no other; define the task in an "
        f"installed app's `tasks` module (or import it there), or add {name!r} to the "
        f"JOBSTATE_TASK_MODULES setting."
    )
    assert not Job.objects.exists()
    with override_settings(JOBSTATE_TASK_MODULES=[name]):
        result = stray.enqueue()
        Worker(burst=True).run()
    job = Job.objects.get(result_id=result.id)
    assert (job.state, job.return_value) == (State.SUCCEEDED, "ran")


# The exposed tasks (a third-party app's, imported by a task module) are read once


def test_the_exposed_tasks_are_read_once_while_the_task_modules_stay_the_same():
    first = exposed_tasks()

    assert exposed_tasks() is first  # not every task module's namespace again at each enqueue
    assert first["tests.searchlib.tasks.index_page"] is searchapp_tasks.index_page


def test_a_task_module_imported_later_exposes_its_tasks(make_module):
    library = make_module("lib.jobs", TASK_SOURCE)  # a third-party app's, no task module
    extra = make_module("app.tasks.extra", f"from {library} import job  # noqa: F401\n")
    package = extra.rpartition(".")[0]

    with override_settings(JOBSTATE_TASK_MODULES=[package]):
        before = exposed_tasks()
        assert f"{library}.job" not in before
        job = importlib.import_module(extra).job  # a `tasks/` package's submodule, imported now

        assert exposed_tasks()[f"{library}.job"] is job
        check_loadable(job)  # enqueue() accepts it


def test_a_task_module_that_grew_exposes_its_new_tasks(make_module, monkeypatch):
    library = make_module("lib.jobs", TASK_SOURCE)
    module = importlib.import_module(library)
    exposed_tasks()

    # As a task module still being imported when the tasks were read, then finished.
    monkeypatch.setattr(tasks, "late_import", module.job, raising=False)

    assert exposed_tasks()[f"{library}.job"] is module.job


def never_set_up() -> object:
    raise AssertionError("set up: it ran code")  # as admin.site without the admin app raises


def test_a_lazy_object_in_a_task_module_is_never_set_up(monkeypatch):
    # django.contrib.admin's `site`, imported into a task module, or by the backport's
    # django_stubs_ext into every project: isinstance() would set it up.
    monkeypatch.setattr(tasks, "site", SimpleLazyObject(never_set_up), raising=False)

    assert "tests.tasks.record" in exposed_tasks()
    with pytest.raises(InvalidTask) as refused:
        load_task("tests.tasks.site")
    assert "'tests.tasks.site' is a SimpleLazyObject, not a Task" in str(refused.value)
