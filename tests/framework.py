"""The Tasks framework the tests run on: Django's own on 6.1, the django-tasks backport on
5.2 and 6.0 (the pairs of scripts/test's matrix). Tests name the framework's modules, logger
and exceptions through these, so that every pair runs them as written."""

from django_jobstate.tasksapi import FRAMEWORK, InvalidTask

LOGGER = FRAMEWORK  # the framework's own log lines: enqueued, RUNNING, SUCCESSFUL, FAILED
# InvalidTask as Job.error_class stores it (the backport calls it InvalidTaskError).
INVALID_TASK = f"{InvalidTask.__module__}.{InvalidTask.__qualname__}"
IMPORT_TASK = f"from {FRAMEWORK} import task\n"  # the first line of a task module's source
IMMEDIATE_BACKEND = f"{FRAMEWORK}.backends.immediate.ImmediateBackend"
DUMMY_BACKEND = f"{FRAMEWORK}.backends.dummy.DummyBackend"
