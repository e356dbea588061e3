"""Settings for bench/torture/torture.py and the `runjobs` supervisors it starts.

torture.py sets the database in the environment: JOBSTATE_TORTURE_DB (postgres, mysql or
sqlite) and JOBSTATE_TORTURE_DB_NAME (a database name or a file path); the PostgreSQL
server is the one in the PG* variables, MariaDB the one in JOBSTATE_MYSQL_*.
"""

import os

from bench.common import database_settings

SECRET_KEY = "torture-not-secret"
DEBUG = False  # no query log growing in long-lived workers
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_jobstate", "bench"]

_vendor = os.environ.get("JOBSTATE_TORTURE_DB", "sqlite")
_name = os.environ.get("JOBSTATE_TORTURE_DB_NAME", "")
DATABASES = {"default": database_settings(_vendor, _name)}

TASKS = {"default": {"BACKEND": "django_jobstate.backend.JobStateBackend"}}
# Schedules ticking (torture.py sets it unless --no-ticks): a tick a second, each to be
# enqueued exactly once across every supervisor, and none skipped (catch_up "all": the
# ticks an outage held back are enqueued after it).
if _seed := os.environ.get("JOBSTATE_TORTURE_TICKS"):
    TASKS["default"]["OPTIONS"] = {
        "SCHEDULES": {
            "torture-tick": {
                "task": "bench.torture.torture_tasks.once",
                "every": 1,
                "args": [int(_seed), "tick", 0, 0.0],
                "catch_up": "all",
            }
        }
    }
# The tasks' module is no app's `tasks` module, which is all a worker imports unasked.
JOBSTATE_TASK_MODULES = ["bench.torture.torture_tasks"]

# Short, so that a lost worker is rescued in seconds. LOST_AFTER is 8 heartbeats: a
# loaded machine may miss a few without a live worker being taken for lost.
JOBSTATE_HEARTBEAT_INTERVAL = 0.5
JOBSTATE_LOST_AFTER = 4.0
JOBSTATE_POLL_INTERVAL = 0.1
JOBSTATE_MAX_BACKOFF = 1.0
# Every attempt has a deadline that its supervisor enforces: longer than any planned body
# (sleeps up to 1.5 s, an interpreter held for LOST_AFTER + 2 s), plus a long SIGSTOP of
# its worker (LOST_AFTER + 2 s) or an outage (the same) on top.
JOBSTATE_DEFAULT_TIMEOUT = 12.0
# A cancelled running attempt (the bodies never look at their context) is stopped this
# long after the request, well within the run.
JOBSTATE_CANCEL_GRACE = 2.0

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(process)d %(levelname)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_jobstate": {"handlers": ["console"], "level": "WARNING"}},
}
