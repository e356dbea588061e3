"""The benchmark's settings for django-jobstate: its app and its backend, nothing else."""

from bench.bench_settings import *  # noqa: F403
from bench.bench_settings import database

INSTALLED_APPS = ["django_jobstate"]
# Django's default SQLite settings: the app sets WAL and a busy timeout on its connections.
DATABASES = {"default": database()}
TASKS = {"default": {"BACKEND": "django_jobstate.backend.JobStateBackend"}}
# The tasks' module is no app's `tasks` module, which is all a worker imports unasked.
JOBSTATE_TASK_MODULES = ["bench.bench_tasks"]
