"""Settings shared by the benchmark's two runners (see bench_settings_jobstate/_tasksdb).

The database comes from the environment, set by bench.py for each fresh database:
BENCH_DB (sqlite, postgres or mysql) and BENCH_DB_NAME (a file path or a database name),
and the usual PG* variables for PostgreSQL, JOBSTATE_MYSQL_* (scripts/mysql) for MariaDB.
"""

import os
from typing import Any

from bench.common import database_settings

SECRET_KEY = "bench-not-secret"
DEBUG = False  # no query log growing in a long-lived worker, no autoreloader
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database(sqlite_options: dict[str, Any] | None = None) -> dict[str, Any]:
    vendor = os.environ.get("BENCH_DB", "sqlite")
    name = os.environ.get("BENCH_DB_NAME", "")
    # Persistent connections, as a worker deployment would set: with Django's default of
    # 0, a worker that calls close_old_connections() between jobs reconnects each time
    # (django-tasks-db then reconnects per job, ~3.5 ms on PostgreSQL over TCP, far from
    # its reference figures). BENCH_CONN_MAX_AGE=0 measures that default.
    age = os.environ.get("BENCH_CONN_MAX_AGE", "none")
    extra: dict[str, Any] = {"CONN_MAX_AGE": None if age == "none" else int(age)}
    if vendor == "sqlite":
        extra["OPTIONS"] = sqlite_options or {}
    return database_settings(vendor, name, **extra)
