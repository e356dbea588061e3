"""System checks for the settings and the TASKS configuration.

They read the raw JOBSTATE_* values, not get_settings(), so that `manage.py check` reports a
bad value (a string, a negative number) instead of crashing on it.
"""

import difflib
import importlib.util
import math
from dataclasses import fields
from typing import Any, get_args, get_type_hints

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning
from django.db import connections
from django.utils.module_loading import import_string

from ..backend import DummyBackend, ImmediateBackend, JobStateBackend
from ..conf import LIMIT_NAMES, MAXIMUM, Settings

DEFAULTS = {f.name: f.default for f in fields(Settings)}
# The numeric settings, with the types each allows (int, float, None), read from its hint.
NUMBERS = {
    name: types
    for name, hint in get_type_hints(Settings).items()
    if (types := set(get_args(hint) or [hint])) - {type(None)} <= {int, float}
}
# A backoff of 0 retries at once, as @task(backoff=0) does; a grace of 0 stops a
# cancelled attempt at once.
ZERO_ALLOWED = {"DEFAULT_BACKOFF", "MAX_BACKOFF", "CANCEL_GRACE"}
MAX_ATTEMPTS_LIMIT = 1000  # as for @task(max_attempts=...)
JOBSTATE_BACKENDS = (JobStateBackend, ImmediateBackend, DummyBackend)
BACKEND_PATH = f"{JobStateBackend.__module__}.{JobStateBackend.__qualname__}"


def _raw(name: str) -> Any:
    return getattr(settings, f"JOBSTATE_{name}", DEFAULTS[name])


def _check_number(name: str, value: Any) -> CheckMessage | None:
    """Say what is wrong with `value` for JOBSTATE_<name>, if anything."""
    whole, none_allowed = float not in NUMBERS[name], type(None) in NUMBERS[name]
    if value is None and none_allowed:
        return None
    kind = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "a whole number" if whole else "a number of seconds"
        if none_allowed:
            what += " or None"
        example = 60 if DEFAULTS[name] is None else DEFAULTS[name]
        return Error(
            f"JOBSTATE_{name} must be {what}, not {type(value).__name__} {value!r}.",
            hint=f"Write it as a number, without quotes: JOBSTATE_{name} = {example!r}.",
            id="django_jobstate.E004",
        )
    if name == "DEFAULT_MAX_ATTEMPTS":
        if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
            return Error(
                f"JOBSTATE_DEFAULT_MAX_ATTEMPTS must be from 1 to {MAX_ATTEMPTS_LIMIT}, "
                f"not {value!r}.",
                hint="It counts every attempt, the first included: 1 means no retry.",
                id="django_jobstate.E005",
            )
        return None
    minimum_ok = value >= 0 if name in ZERO_ALLOWED else value > 0
    if not (minimum_ok and math.isfinite(value)):
        what = "zero or a positive" if name in ZERO_ALLOWED else "a positive"
        unit = "whole number" if whole else "number of seconds"
        return Error(
            f"JOBSTATE_{name} must be {what} {unit}, not {value!r}.",
            hint=f"The default is {DEFAULTS[name]!r}.",
            id="django_jobstate.E002",
        )
    if name in MAXIMUM and value > MAXIMUM[name]:
        limit = MAXIMUM[name]
        return Error(
            f"JOBSTATE_{name} must be at most {limit:g} seconds ({LIMIT_NAMES[limit]}), "
            f"not {value!r}.",
            hint=f"The default is {DEFAULTS[name]!r}; a longer wait or delay would overflow.",
            id="django_jobstate.E002",
        )
    return None


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages = []
    valid = {}
    for name in NUMBERS:
        value = _raw(name)
        if problem := _check_number(name, value):
            messages.append(problem)
        else:
            valid[name] = value
    if {"LOST_AFTER", "HEARTBEAT_INTERVAL"} <= valid.keys():
        lost_after, interval = valid["LOST_AFTER"], valid["HEARTBEAT_INTERVAL"]
        if lost_after < 3 * interval:
            messages.append(
                Error(
                    f"JOBSTATE_LOST_AFTER ({lost_after}s) must be at least three times "
                    f"JOBSTATE_HEARTBEAT_INTERVAL ({interval}s): live workers would be "
                    f"taken for lost, and no runjobs could judge others (its own beats must "
                    f"land at most JOBSTATE_LOST_AFTER / 2 apart).",
                    hint="Make JOBSTATE_LOST_AFTER at least three heartbeat intervals.",
                    id="django_jobstate.E001",
                )
            )
    if {"MAX_BACKOFF", "DEFAULT_BACKOFF"} <= valid.keys():
        cap, backoff = valid["MAX_BACKOFF"], valid["DEFAULT_BACKOFF"]
        if cap < backoff:
            messages.append(
                CheckWarning(
                    f"JOBSTATE_MAX_BACKOFF ({cap}s) is shorter than JOBSTATE_DEFAULT_BACKOFF "
                    f"({backoff}s): no retry waits longer than the cap, so the default "
                    f"backoff never applies as set.",
                    hint="Raise JOBSTATE_MAX_BACKOFF or lower JOBSTATE_DEFAULT_BACKOFF.",
                    id="django_jobstate.W001",
                )
            )
    return messages


@register()
def check_setting_names(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    known = [f"JOBSTATE_{name}" for name in DEFAULTS]
    messages: list[CheckMessage] = []
    for name in sorted(dir(settings)):
        if not name.startswith("JOBSTATE_") or name in known:
            continue
        # Without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name.removeprefix("JOBSTATE_"), DEFAULTS, n=1)
        messages.append(
            CheckWarning(
                f"{name} is not a django-jobstate setting; it has no effect.",
                hint=f"Did you mean JOBSTATE_{close[0]}?"
                if close
                else f"The settings are: {', '.join(known)}.",
                id="django_jobstate.W002",
            )
        )
    return messages


@register()
def check_tasks_backend(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if not apps.is_installed("django_jobstate"):
        return []  # JobStateBackend.check() reports the reverse (E003)
    tasks = getattr(settings, "TASKS", None)
    for config in tasks.values() if isinstance(tasks, dict) else []:
        try:
            backend = import_string(config["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # django.tasks reports a backend it cannot load
        # The app's ImmediateBackend and DummyBackend are the test settings' JobStateBackend.
        if isinstance(backend, type) and issubclass(backend, JOBSTATE_BACKENDS):
            return []
    return [
        CheckWarning(
            f"django_jobstate is installed, but no TASKS alias uses {BACKEND_PATH}, so "
            f"enqueue() does not create jobs for runjobs to run (and Django's backends "
            f"refuse task options such as @task(max_attempts=3) with a TypeError).",
            hint=f'Set TASKS = {{"default": {{"BACKEND": "{BACKEND_PATH}"}}}}; in test '
            f"settings, django_jobstate.backend.ImmediateBackend runs tasks at enqueue() "
            f"and accepts their options. Or remove django_jobstate from INSTALLED_APPS.",
            id="django_jobstate.W003",
        )
    ]


@register()
def check_tracing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if _raw("TRACING") is not True or importlib.util.find_spec("opentelemetry") is not None:
        return []
    return [
        Error(
            "JOBSTATE_TRACING is True, but opentelemetry-api is not installed: every "
            "enqueue() would fail to import it.",
            hint="pip install 'django-jobstate[tracing]', or set JOBSTATE_TRACING = False.",
            id="django_jobstate.E009",
        )
    ]


@register()
def check_listen_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    alias = _raw("LISTEN_DATABASE")
    if alias is None:
        return []
    hint = (
        "Name the DATABASES entry that connects to the jobs' PostgreSQL database directly "
        "(not through PgBouncer in transaction mode), or remove the setting to listen on "
        "the jobs' own connection settings."
    )
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            Error(
                f"JOBSTATE_LISTEN_DATABASE is {alias!r}, which is not an alias of DATABASES "
                f"({', '.join(map(repr, settings.DATABASES))}): workers could not LISTEN "
                f"for new jobs and cancels.",
                hint=hint,
                id="django_jobstate.E013",
            )
        ]
    if connections[alias].vendor != "postgresql":
        return [
            Error(
                f"JOBSTATE_LISTEN_DATABASE names DATABASES[{alias!r}], which is "
                f"{connections[alias].display_name}, not PostgreSQL: only PostgreSQL has "
                f"LISTEN/NOTIFY.",
                hint=hint,
                id="django_jobstate.E013",
            )
        ]
    return []


@register()
def check_queue_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Each TASKS alias's QUEUE_LIMITS (limits/queues.py): values a claim can use, for
    queues the alias has."""
    from ..limits.queues import validate

    errors: list[CheckMessage] = []
    tasks = getattr(settings, "TASKS", None)
    for alias, config in tasks.items() if isinstance(tasks, dict) else []:
        options = config.get("OPTIONS") if isinstance(config, dict) else None
        limits = options.get("QUEUE_LIMITS", {}) if isinstance(options, dict) else {}
        where = f'TASKS[{alias!r}]["OPTIONS"]["QUEUE_LIMITS"]'
        if not isinstance(limits, dict):
            limits = {where: limits}  # reported below as a bad entry
        queues = config.get("QUEUES") or []
        for queue, value in limits.items():
            problem = None
            try:
                validate(queue, value)
            except ValueError as exc:
                problem = f"{where}: {exc}"
            if problem is None and queues and queue not in queues:
                problem = f"{where} limits {queue!r}, which is not one of its QUEUES: {queues}."
            if problem:
                hint = 'Write {"queue": {"concurrency": 4, "rate": "100/m"}} for queues of QUEUES.'
                errors.append(Error(problem, hint=hint, id="django_jobstate.E019"))
    return errors
