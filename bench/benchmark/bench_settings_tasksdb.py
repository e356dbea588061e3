"""The benchmark's settings for django-tasks-db: its app and its backend, nothing else."""

from bench.benchmark.bench_settings import *  # noqa: F403
from bench.benchmark.bench_settings import database

INSTALLED_APPS = ["django_tasks_db"]
# django-tasks-db sets nothing on SQLite connections. bench.py turns WAL on in its database
# file (WAL persists in the file) as the reference figures did; a 30 s busy timeout (the
# same as django-jobstate's) so that contention waits instead of failing.
DATABASES = {"default": database({"timeout": 30})}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
