"""Third-party apps' tasks: a task a project task module imports is enqueued and run by
real workers, without a setting; a row naming any other module still never imports it.

tests.searchapp (an installed app) re-exports tests.searchlib.tasks' tasks, as
`wagtail.search.tasks` re-exports `modelsearch.tasks`' search task.
"""

import sys

import pytest
from django.core import checks

from django_jobstate.loading import is_task_module, load_task
from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import InvalidTask, TaskResultStatus
from tests.models import Execution
from tests.searchapp import tasks as searchapp_tasks

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_library_module_is_no_task_module_but_its_task_is_exposed():
    from django_jobstate.loading import exposed_task

    assert not is_task_module("tests.searchlib.tasks")
    assert exposed_task("tests.searchlib.tasks.index_page") is searchapp_tasks.index_page
    assert load_task("tests.searchlib.tasks.index_page") is searchapp_tasks.index_page


@pytest.mark.slow
def test_a_reexported_task_is_enqueued_and_run_by_runjobs(runjobs):
    result = searchapp_tasks.index_page.enqueue("home")

    done = runjobs.run("--burst")

    assert done.returncode == 0, done.stdout
    job = Job.objects.get(result_id=result.id)
    assert job.task_path == "tests.searchlib.tasks.index_page"  # the task's own path
    assert (job.state, job.return_value) == (State.SUCCEEDED, "indexed home")
    assert searchapp_tasks.index_page.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert list(Execution.objects.values_list("label", flat=True)) == ["home"]


@pytest.mark.slow
def test_a_row_naming_a_module_that_is_no_task_module_never_imports_it(runjobs, tmp_path):
    marker = tmp_path / "imported"
    job = Job.objects.enqueue("tests.searchlib.unsafe.job")  # written behind the app's back

    done = runjobs.run("--burst", JOBSTATE_TEST_IMPORT_MARKER=str(marker))

    assert done.returncode == 0, done.stdout
    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert "'tests.searchlib.unsafe' is not a task module of this project" in job.error_message
    assert not marker.exists()  # the worker never imported it
    assert "tests.searchlib.unsafe" not in sys.modules
    with pytest.raises(InvalidTask, match="is not a task module of this project"):
        load_task("tests.searchlib.unsafe.job")
    assert "tests.searchlib.unsafe" not in sys.modules


def test_check_does_not_warn_of_an_exposed_task():
    warnings = [m for m in checks.run_checks() if m.id == "django_jobstate.W004"]

    assert not [w for w in warnings if "tests.searchlib" in w.msg]
