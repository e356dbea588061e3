"""Settings shared by the benchmark's two runners (see bench_settings_jobstate/_tasksdb).

The database comes from the environment, set by bench.py for each fresh database:
BENCH_DB (sqlite, postgres or mysql) and BENCH_DB_NAME (a file path or a database name),
and the usual PG* variables for PostgreSQL, JOBSTATE_MYSQL_* (scripts/mysql) for MariaDB.
"""

import os
from typing import Any

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
    common = {"CONN_MAX_AGE": None if age == "none" else int(age)}
    if vendor == "postgres":
        return {
            **common,
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    if vendor == "mysql":  # the same settings for both runners, as the test suite's
        return {
            **common,
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "HOST": os.environ.get("JOBSTATE_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("JOBSTATE_MYSQL_PORT", "3306"),
            "USER": os.environ.get("JOBSTATE_MYSQL_USER", "jobstate"),
            "PASSWORD": os.environ.get("JOBSTATE_MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    if vendor == "sqlite":
        return {
            **common,
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "OPTIONS": sqlite_options or {},
        }
    raise RuntimeError(f"BENCH_DB must be 'sqlite', 'postgres' or 'mysql', not {vendor!r}")
