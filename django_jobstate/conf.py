"""The app's settings: `JOBSTATE_*` names in the project's settings, with defaults."""

import argparse
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from django.conf import settings as django_settings


@dataclass(frozen=True)
class Settings:
    # Seconds between a worker's heartbeats.
    HEARTBEAT_INTERVAL: float = 5.0
    # Seconds without a heartbeat after which a worker's running attempts fail as lost.
    LOST_AFTER: float = 30.0
    # Seconds a worker sleeps when nothing is runnable (LISTEN/NOTIFY wakes it sooner).
    POLL_INTERVAL: float = 1.0
    # Largest JSON encoding, in bytes, of a job's arguments or of its return value.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    # Per-task defaults for the options of @task(...).
    DEFAULT_MAX_ATTEMPTS: int = 1
    DEFAULT_BACKOFF: float = 10.0
    DEFAULT_TIMEOUT: float | None = None
    # Largest delay, in seconds, between two attempts of a task.
    MAX_BACKOFF: float = 3600.0
    # Seconds a running attempt that someone cancelled may take to stop on its own (its
    # context says so) before its worker process is stopped, as at a timeout.
    CANCEL_GRACE: float = 30.0
    # Dotted paths of modules that define tasks, besides every installed app's `tasks`
    # module: the only modules a worker imports to find a job's task (loading.py).
    TASK_MODULES: Sequence[str] = ()
    # {"app.tasks.name": {"unique": True, "max_attempts": 3, ...}}: options of tasks by
    # path, for tasks you do not own; they win over @task's own (task_options.py).
    TASK_OPTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({})
    # OpenTelemetry spans for enqueue and each attempt (tracing.py; needs opentelemetry-api).
    TRACING: bool = False
    # {"succeeded": "7d", "failed": "30d"}: prune older finished tasks hourly, on a built-in
    # schedule (schedules/settings.py); None keeps every job.
    RETENTION: Mapping[str, str | float] | None = None
    # The DATABASES alias the LISTEN connection of wake-ups and cancels uses (wakeup.py,
    # relay.py); None: the jobs' own. Name a direct connection to the same PostgreSQL
    # database when the jobs' alias goes through PgBouncer in transaction mode, which
    # does not deliver notifications.
    LISTEN_DATABASE: str | None = None


DAY = 86_400.0
YEAR = 365 * DAY
# The largest value of each setting in seconds. Beyond it a wait overflows
# (threading.Event.wait refuses more than about 292 years), and so does the datetime
# arithmetic of a deadline (Python's year 9999, PostgreSQL's timestamp range): a crash
# loop of the worker, and of the supervisor. Waits are at most a day (a worker that polls
# or heartbeats less often is no worker); backoffs, timeouts and lost-after at most a year.
# checks.py reports a larger value, @task options and runjobs' options refuse it, and
# get_settings() clamps it.
MAXIMUM = {
    "HEARTBEAT_INTERVAL": DAY,
    "POLL_INTERVAL": DAY,
    "LOST_AFTER": YEAR,
    "DEFAULT_BACKOFF": YEAR,
    "DEFAULT_TIMEOUT": YEAR,
    "MAX_BACKOFF": YEAR,
    "CANCEL_GRACE": DAY,
}
LIMIT_NAMES = {DAY: "a day", YEAR: "a year"}


@functools.cache
def get_settings() -> Settings:
    """The JOBSTATE_* settings; read once, again after a setting_changed signal (tests)."""
    return Settings(
        **{
            f.name: _bounded(f.name, getattr(django_settings, f"JOBSTATE_{f.name}"))
            for f in fields(Settings)
            if hasattr(django_settings, f"JOBSTATE_{f.name}")
        }
    )


def _bounded(name: str, value: Any) -> Any:
    """Clamp a number above its MAXIMUM (NaN included), the last defence against a crash.

    Anything else is left as it is, for the system checks to report.
    """
    limit = MAXIMUM.get(name)
    if limit is None or isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return value if value <= limit else limit


def reload_settings(**kwargs: Any) -> None:
    """Receiver of setting_changed (connected in JobStateConfig.ready()).

    Any setting, not only JOBSTATE_*: what enqueue() works out once per task (task_plan.py)
    holds while get_settings() returns the same object, and it depends on TASKS and
    INSTALLED_APPS too."""
    get_settings.cache_clear()


# Ages: prunejobs --older-than and JOBSTATE_RETENTION.
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# A larger age is surely a typo, and would overflow the database's date arithmetic.
MAX_AGE_DAYS = 36500
AGE_FORMAT = "a number and a unit: 30s, 15m, 12h, 7d or 2w (a bare number is days)"


def age(text: str) -> timedelta:
    """Parse `30s`, `15m`, `12h`, `7d` or `2w`; a bare number is days."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age; use {AGE_FORMAT}")
    seconds = float(match[1]) * UNIT_SECONDS[match[2] or "d"]
    if seconds > MAX_AGE_DAYS * UNIT_SECONDS["d"]:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {MAX_AGE_DAYS} days")
    return timedelta(seconds=seconds)
