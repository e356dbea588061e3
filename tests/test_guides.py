"""The guides' code that needs more than a project to run: docs/guides/from-django-tasks-db.md's
`move_waiting_tasks()`, run as the page writes it against django-tasks-db's real table, and
beside a real `db_worker` still draining it.

The test settings do not install django_tasks_db (other tests must not get its table): each
test installs it for itself and creates its table, then drops it.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.test import modify_settings
from django.utils import timezone

from django_jobstate.models import Job
from django_jobstate.states import State
from django_jobstate.tasksapi import InvalidTask
from tests.conftest import ROOT, Runjobs, subprocess_env
from tests.models import Execution
from tests.test_readme import snippet_run_by

PAGE = "docs/guides/from-django-tasks-db.md"
# One pass over every queue of the old alias, polling without a pause, then exit.
DB_WORKER = [
    *("--backend", "tasksdb", "--queue-name", "*"),
    *("--interval", "0", "--no-startup-delay", "--batch"),
]


@pytest.fixture
def tasks_db(transactional_db: None) -> Iterator[Any]:
    """django_tasks_db installed, with its table: yields its DBTaskResult model."""
    if importlib.util.find_spec("django_tasks_db") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must install django-tasks-db (the bench dependency group).")
        pytest.skip("django-tasks-db is not installed: install the bench dependency group.")
    with modify_settings(INSTALLED_APPS={"append": "django_tasks_db"}):
        from django_tasks_db.models import DBTaskResult

        with connection.schema_editor() as editor:
            editor.create_model(DBTaskResult)
        try:
            yield DBTaskResult
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(DBTaskResult)
            # Installing the app ran the admin's autodiscover, which registered its model
            # on the admin site for good: every later admin page would list an app that is
            # no longer installed (LookupError).
            for model in list(admin.site._registry):
                if model._meta.app_label == DBTaskResult._meta.app_label:
                    admin.site.unregister(model)


def guide_move() -> Callable[..., dict[str, str]]:
    """The page's move_waiting_tasks, defined by running its block as written."""
    namespace: dict[str, Any] = {"__name__": "cutover"}
    exec(compile(snippet_run_by(PAGE, "tests/test_guides.py"), PAGE, "exec"), namespace)
    return namespace["move_waiting_tasks"]


def old_task(model: Any, path: str, *args: Any, **fields: Any) -> Any:
    """A row as django-tasks-db's enqueue() writes it (run_after: its 'no time' date)."""
    from django_tasks_db.models import get_date_max

    kwargs = fields.pop("kwargs", {})
    fields.setdefault("run_after", get_date_max())
    fields.setdefault("backend_name", "default")
    return model.objects.create(
        task_path=path, args_kwargs={"args": list(args), "kwargs": kwargs}, **fields
    )


def test_the_guide_moves_waiting_tasks_with_their_arguments_queue_priority_and_time(
    tasks_db: Any, runjobs: Runjobs
) -> None:
    now = timezone.now()
    due = old_task(tasks_db, "tests.tasks.record", "due")
    late = old_task(tasks_db, "tests.tasks.record", "overdue", run_after=now - timedelta(hours=1))
    later = old_task(
        tasks_db,
        "tests.tasks.email",
        kwargs={"address": "later@example.com"},
        queue_name="emails",
        priority=10,
        run_after=now + timedelta(hours=1),
    )
    running = old_task(tasks_db, "tests.tasks.record", "running", status="RUNNING")
    done = old_task(tasks_db, "tests.tasks.record", "done", status="SUCCESSFUL")

    moved = guide_move()()

    assert set(moved) == {str(due.pk), str(late.pk), str(later.pk)}
    assert set(tasks_db.objects.values_list("pk", flat=True)) == {running.pk, done.pk}
    jobs = {str(job.result_id): job for job in Job.objects.all()}
    assert set(jobs) == set(moved.values())
    moved_later = jobs[moved[str(later.pk)]]
    assert (moved_later.task_path, moved_later.args, moved_later.kwargs) == (
        "tests.tasks.email",
        [],
        {"address": "later@example.com"},
    )
    assert (moved_later.queue_name, moved_later.priority) == ("emails", 10)
    assert moved_later.run_after == later.run_after
    assert jobs[moved[str(late.pk)]].run_after == late.run_after
    assert jobs[moved[str(due.pk)]].args == ["due"]
    assert guide_move()() == {}, "a second run moves nothing"

    # The due ones run here; the later one waits for its time.
    assert runjobs.run("--burst").returncode == 0
    assert sorted(Execution.objects.values_list("label", flat=True)) == ["due", "overdue"]
    assert Job.objects.get(result_id=moved[str(later.pk)]).state == State.QUEUED


def test_a_task_the_backend_refuses_stops_the_move_and_stays(tasks_db: Any) -> None:
    first = old_task(tasks_db, "tests.tasks.record", "first", priority=5)  # moved first
    refused = old_task(tasks_db, "oldapp.tasks.removed")  # not a task module
    last = old_task(tasks_db, "tests.tasks.record", "last", priority=-5)

    with pytest.raises(InvalidTask, match=r"'oldapp\.tasks' is not a task module"):
        guide_move()()

    assert list(Job.objects.values_list("args", flat=True)) == [["first"]]
    assert set(tasks_db.objects.values_list("pk", flat=True)) == {refused.pk, last.pk}
    assert first.pk not in set(tasks_db.objects.values_list("pk", flat=True))


@pytest.mark.slow
def test_the_move_is_safe_beside_a_db_worker_still_running(
    tasks_db: Any, runjobs: Runjobs, tmp_path: Any
) -> None:
    """Each waiting task runs once: taken by the old worker, or moved, never both."""
    from django_tasks_db.models import get_date_max

    count = 300  # the old worker runs about 10 before the move takes the rest
    tasks_db.objects.bulk_create(
        tasks_db(
            task_path="tests.tasks.record",
            args_kwargs={"args": [f"task-{i}"], "kwargs": {}},
            backend_name="tasksdb",
            run_after=get_date_max(),
        )
        for i in range(count)
    )
    # The old release's worker, on an alias of its own beside this backend's.
    old_settings = {
        "INSTALLED_APPS": settings.INSTALLED_APPS,
        "TASKS": {**settings.TASKS, "tasksdb": {"BACKEND": "django_tasks_db.DatabaseBackend"}},
    }
    log = tmp_path / "db_worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "db_worker", *DB_WORKER],
            cwd=ROOT,
            env=subprocess_env(JOBSTATE_TEST_SETTINGS=json.dumps(old_settings)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not Execution.objects.exists():  # the move starts while the worker works
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"db_worker ran nothing:\n{log.read_text()}"
            time.sleep(0.01)

        moved = guide_move()()

        assert worker.wait(timeout=120) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    ran_old = tasks_db.objects.filter(status="SUCCESSFUL").count()
    assert tasks_db.objects.count() == ran_old, "every row left is one the old worker ran"
    assert moved, "the old worker ran them all before the move began"
    assert ran_old + len(moved) == count
    assert runjobs.run("--burst", "--concurrency", "2", timeout=120).returncode == 0
    runs = Counter(Execution.objects.values_list("label", flat=True))
    assert [label for label, n in runs.items() if n > 1] == [], "ran twice"
    assert len(runs) == count, "never ran"
    print(f"old worker ran {ran_old}, moved {len(moved)}")
