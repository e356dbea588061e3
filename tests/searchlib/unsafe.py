"""A library module that is no task module: a row naming it must never get it imported."""

import os
import pathlib

from django_jobstate.tasksapi import task

if marker := os.environ.get("JOBSTATE_TEST_IMPORT_MARKER"):
    pathlib.Path(marker).touch()


@task
def job() -> str:
    return "ran"
