"""Which modules a job row may name: the project's task modules, found once, and no other."""

import sys
import types

import pytest
from django.test import override_settings

from django_jobstate.loading import is_task_module, load_task, task_modules
from django_jobstate.models import Job
from django_jobstate.states import State
from django_jobstate.tasksapi import InvalidTask
from django_jobstate.worker import Worker
from tests import tasks
from tests.framework import IMPORT_TASK

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
