"""The periodic jobs a project defines: every JobStateBackend's OPTIONS["SCHEDULES"], and
JOBSTATE_RETENTION's built-in prune schedule; and the system checks of them."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from ..backend import JobStateBackend
from ..loading import load_task
from ..tasksapi import InvalidTask, task_backends
from .definitions import PRUNE_SCHEDULE, Definition, ScheduleError, parse

PRUNE_TASK = "django_jobstate.tasks.prune_jobs"
# Every key of TASKS[alias]["OPTIONS"] that a JobStateBackend reads (a new option is added
# here): any other is a mistake that would be silently ignored ("SCHEDULE" for
# "SCHEDULES" would stop every schedule of the alias).
OPTION_KEYS = ("SCHEDULES",)
RETENTION_STATES = ("succeeded", "failed")


def jobstate_backends() -> list[JobStateBackend]:
    return [b for b in task_backends.all() if isinstance(b, JobStateBackend)]


def load() -> tuple[dict[str, Definition], list[ScheduleError]]:
    """Every schedule of the settings, by name, and the errors of those that are invalid."""
    definitions: dict[str, Definition] = {}
    errors: list[ScheduleError] = []
    time_zone = settings.TIME_ZONE or "UTC"
    backends = jobstate_backends()
    for backend in backends:
        if problems := option_errors(backend):
            errors += problems
            continue
        raw = backend.options.get("SCHEDULES") or {}
        if not isinstance(raw, Mapping):
            errors.append(
                ScheduleError(
                    f'TASKS[{backend.alias!r}]["OPTIONS"]["SCHEDULES"] must be a dict of '
                    f"schedules by name, not {type(raw).__name__}."
                )
            )
            continue
        for name, definition in raw.items():
            try:
                if not isinstance(name, str) or not name or len(name) > 200:
                    raise ScheduleError(f"Schedule name {name!r} must be text of 1-200 chars.")
                if name in definitions or name == PRUNE_SCHEDULE:
                    raise ScheduleError(
                        f"Schedule {name!r} of TASKS[{backend.alias!r}] is defined twice "
                        f"(or is the built-in {PRUNE_SCHEDULE!r}): names are project-wide."
                    )
                definitions[name] = parse(
                    name,
                    definition,
                    alias=backend.alias,
                    queues=sorted(backend.queues),
                    time_zone=time_zone,
                )
            except ScheduleError as exc:
                errors.append(exc)
    try:
        prune = retention_definition(backends)
    except ScheduleError as exc:
        errors.append(exc)
    else:
        if prune is not None:
            definitions[prune.name] = prune
    return definitions, errors


def option_errors(backend: JobStateBackend) -> list[ScheduleError]:
    """What is wrong with the keys of the alias's OPTIONS (the JobStateBackend's only:
    another backend's OPTIONS are its own)."""
    where = f'TASKS[{backend.alias!r}]["OPTIONS"]'
    if not isinstance(backend.options, Mapping):
        return [
            ScheduleError(
                f"{where} must be a dict, not {type(backend.options).__name__}.", "options"
            )
        ]
    errors = []
    for key in backend.options:
        if key in OPTION_KEYS:
            continue
        close = difflib.get_close_matches(str(key), OPTION_KEYS, n=1)
        errors.append(
            ScheduleError(
                f"{where} has the unknown key {key!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; the keys of {backend.alias!r}'s OPTIONS are: {', '.join(OPTION_KEYS)}.",
                "options",
            )
        )
    return errors


def retention() -> dict[str, str | float] | None:
    """JOBSTATE_RETENTION, checked: {state: age}, or None (keep every job)."""
    from ..conf import age

    raw = getattr(settings, "JOBSTATE_RETENTION", None)
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw or set(raw) - set(RETENTION_STATES):
        raise ScheduleError(
            f"JOBSTATE_RETENTION must be a dict with the keys succeeded and/or failed, each an "
            f'age, for example {{"succeeded": "7d", "failed": "30d"}}; not {raw!r}.'
        )
    for state, value in raw.items():
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise argparse.ArgumentTypeError(f"{value!r} is not an age")
            age(str(value))
        except argparse.ArgumentTypeError as exc:
            raise ScheduleError(
                f"JOBSTATE_RETENTION[{state!r}]: {exc} (30s, 15m, 12h, 7d, 2w; a bare number "
                f"is days)."
            ) from None
    return dict(raw)


def retention_definition(backends: list[JobStateBackend]) -> Definition | None:
    """The hourly schedule that prunes what JOBSTATE_RETENTION says, on the first
    JobStateBackend alias (django_jobstate.tasks defines its task there)."""
    kept = retention()
    if kept is None or not backends:
        return None
    backend = backends[0]
    return parse(
        PRUNE_SCHEDULE,
        {"task": PRUNE_TASK, "every": 3600, "kwargs": kept, "unique": True},
        alias=backend.alias,
        queues=sorted(backend.queues),
        time_zone="UTC",
    )


# Per kind of ScheduleError: the hint and the id of its check.
HINTS = {
    "definition": (
        "Fix the schedule in the settings: no scheduler runs it as it is.",
        "django_jobstate.E010",
    ),
    "timezone": ("Use an IANA name such as 'Europe/Paris' or 'UTC'.", "django_jobstate.E011"),
    "options": (
        "Fix or remove the key: as written it has no effect. Until it is fixed, runjobs "
        "(with --skip-checks) keeps the stored schedules as they are.",
        "django_jobstate.E014",
    ),
}


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    definitions, errors = load()
    messages: list[CheckMessage] = []
    for exc in errors:
        hint, check_id = HINTS[exc.kind]
        messages.append(Error(str(exc), hint=hint, id=check_id))
    for definition in definitions.values():
        try:
            task = load_task(definition.task_path)
        except InvalidTask as exc:
            messages.append(
                Error(
                    f"Schedule {definition.name!r}: {exc}",
                    hint="A schedule's task is the dotted path of a @task in a task module.",
                    id="django_jobstate.E012",
                )
            )
            continue
        if task.backend != definition.backend:
            messages.append(
                Error(
                    f"Schedule {definition.name!r} is in TASKS[{definition.backend!r}], but its "
                    f"task {definition.task_path!r} belongs to the backend {task.backend!r}.",
                    hint="Define the schedule under the task's backend alias.",
                    id="django_jobstate.E012",
                )
            )
    return messages
