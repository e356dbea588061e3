"""Test settings: SQLite by default, PostgreSQL with JOBSTATE_TEST_DB=postgres.

Worker subprocesses started by the tests use these settings too; they read the test
database's name from JOBSTATE_TEST_DB_NAME, which the tests set for them.
"""

import json
import os
import tempfile
from pathlib import Path

SECRET_KEY = "tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobstate",
    "tests",
    "tests.searchapp",  # a third-party app: its tasks.py re-exports tests.searchlib's tasks
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"
# Django's advice for tests: a fast hasher. The default (PBKDF2) took about half a second of
# CPU for each password the tests set or check.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DB = os.environ.get("JOBSTATE_TEST_DB", "sqlite")
TEST_DB_NAME = os.environ.get("JOBSTATE_TEST_DB_NAME")  # set for worker subprocesses

if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": TEST_DB_NAME or os.environ.get("PGDATABASE", "jobstate"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "jobstate"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    }
elif DB == "sqlite":
    # A file, not :memory:, so that worker subprocesses share the test database.
    # One file per test run (pid), so that concurrent runs never share it. In /dev/shm
    # where there is one: every commit's fsync costs nothing there, and a test kills
    # processes, never the machine, so the file behaves as on a disk.
    shm = Path("/dev/shm")
    folder = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    sqlite_path = folder / f"jobstate-tests-{os.getpid()}.sqlite3"
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": TEST_DB_NAME or sqlite_path,
            "TEST": {"NAME": sqlite_path},
        }
    }
elif DB == "mysql":  # MariaDB or MySQL: scripts/mysql (or scripts/test) starts one
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": TEST_DB_NAME or "jobstate",
            "HOST": os.environ.get("JOBSTATE_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("JOBSTATE_MYSQL_PORT", "3306"),
            "USER": os.environ.get("JOBSTATE_MYSQL_USER", "jobstate"),
            "PASSWORD": os.environ.get("JOBSTATE_MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
            # One test database per run (pid), as SQLite's file: runs may share a server.
            "TEST": {
                "NAME": f"test_jobstate_{os.getpid()}",
                "CHARSET": "utf8mb4",
                "COLLATION": "utf8mb4_unicode_ci",
            },
        }
    }
    # e.g. "repeatable read" (Django's default is "read committed"): tests/test_isolation.py
    if isolation := os.environ.get("JOBSTATE_TEST_MYSQL_ISOLATION"):
        DATABASES["default"]["OPTIONS"]["isolation_level"] = isolation
else:
    raise RuntimeError(f"JOBSTATE_TEST_DB must be 'sqlite', 'postgres' or 'mysql', not {DB!r}")
# A worker subprocess that keeps its connection between claims (Django's default, 0,
# opens one per claim): tests of a connection the server dropped under an idle worker.
if max_age := os.environ.get("JOBSTATE_TEST_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = None if max_age == "none" else int(max_age)

TASKS = {
    "default": {
        "BACKEND": "django_jobstate.backend.JobStateBackend",
        "QUEUES": ["default", "emails", "reports"],
    }
}

# An idle worker claims this often where nothing wakes it (SQLite, MariaDB; PostgreSQL's
# notifications do): 0.05 cost each idle worker and supervisor ~5% of a core, which the
# dozens of runjobs processes of CI's side-by-side passes took from the tests.
JOBSTATE_POLL_INTERVAL = 0.2
# Short, so that recovery tests wait seconds, not minutes; LOST_AFTER leaves room for a
# loaded CI machine to miss a few heartbeats without a live worker being taken for lost.
# Each beat is also a rescue pass (several statements): at 0.25 an idle supervisor took
# 5% of a core.
JOBSTATE_HEARTBEAT_INTERVAL = 0.5
JOBSTATE_LOST_AFTER = 3.0

# Extra settings for a worker subprocess, as JSON (tests of out-of-range values).
globals().update(json.loads(os.environ.get("JOBSTATE_TEST_SETTINGS", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {
        "console": {"class": "logging.StreamHandler"},
        "null": {"class": "logging.NullHandler"},
    },
    "loggers": {
        "django_jobstate": {"handlers": ["console"], "level": "INFO"},
        # The backport's logger (Django 5.2, 6.0), handled as Django's default logging
        # handles django.tasks (under "django": printed only with DEBUG, still propagated).
        # With no handler at all, its failure lines would reach Python's last-resort
        # handler: plain text among a worker's JSON lines.
        "django_tasks": {"handlers": ["null"]},
    },
}
if os.environ.get("JOBSTATE_TEST_JSON_LOGS"):  # a worker subprocess logging JSON lines
    LOGGING["formatters"] = {"json": {"()": "django_jobstate.logs.JsonFormatter"}}
    LOGGING["handlers"]["console"]["formatter"] = "json"
if spans_file := os.environ.get("JOBSTATE_TEST_SPANS"):  # a worker subprocess's spans
    from tests.otel import export_spans_to

    export_spans_to(spans_file)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
