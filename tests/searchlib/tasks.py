"""A library's tasks: defined here, reached by the project only through tests.searchapp.tasks'
re-export (as Wagtail's search task lives in `modelsearch.tasks`)."""

import time

from django_jobstate.tasksapi import task


@task
def index_page(label: str) -> str:
    from tests.models import Execution

    Execution.objects.create(label=label)
    return f"indexed {label}"


@task
def slow_index(label: str, seconds: float) -> str:
    time.sleep(seconds)
    from tests.models import Execution

    Execution.objects.create(label=label)
    return label


@task
def writes_then_fails(label: str) -> None:
    from tests.models import Execution

    Execution.objects.create(label=label)
    raise RuntimeError("after writing")
