"""The periodic jobs a project defines: every JobStateBackend's OPTIONS["SCHEDULES"], and
JOBSTATE_RETENTION's built-in prune schedule; and the system checks of them."""

from __future__ import annotations

import argparse
import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register

from ..backend import JobStateBackend
from ..loading import load_task
from ..tasksapi import InvalidTask, Task, task_backends
from .definitions import PRUNE_SCHEDULE, Definition, ScheduleError, parse

PRUNE_TASK = "django_jobstate.tasks.prune_jobs"
# Every key of TASKS[alias]["OPTIONS"] that a JobStateBackend reads (a new option is added
# here): any other is a mistake that would be silently ignored ("SCHEDULE" for
# "SCHEDULES" would stop every schedule of the alias).
OPTION_KEYS = ("SCHEDULES", "QUEUE_LIMITS")
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
    "task": (
        "A schedule's task is the dotted path of a @task in a task module, called with the "
        "schedule's args and kwargs.",
        "django_jobstate.E012",
    ),
    "options": (
        "Fix or remove the key: as written it has no effect. Until it is fixed, runjobs "
        "(with --skip-checks) keeps the stored schedules as they are.",
        "django_jobstate.E014",
    ),
}


def task_of(d: Definition) -> Task:
    """The @task of `d`, as its ticks will load it: in a task module, of d's backend
    alias, and taking d's args and kwargs; or ScheduleError (kind "task") saying why not."""
    try:
        task = load_task(d.task_path)
    except InvalidTask as exc:
        raise ScheduleError(f"Schedule {d.name!r}: {exc}", "task", "task") from None
    if task.backend != d.backend:
        raise ScheduleError(
            f"Schedule {d.name!r} is in TASKS[{d.backend!r}], but its task {d.task_path!r} "
            f"belongs to the backend {task.backend!r}; define the schedule under the task's "
            f"backend alias.",
            "task",
            "task",
        )
    try:
        inspect.signature(task.func).bind(
            *([None] if task.takes_context else []), *d.args, **d.kwargs
        )
    except TypeError as exc:
        raise ScheduleError(
            f"Schedule {d.name!r}: its args and kwargs do not match {task.name}(): {exc}.",
            "task",
            "args",
        ) from None
    return task


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    definitions, errors = load()
    messages: list[CheckMessage] = []
    for exc in errors:
        hint, check_id = HINTS[exc.kind]
        messages.append(Error(str(exc), hint=hint, id=check_id))
    for definition in definitions.values():
        try:
            task_of(definition)
        except ScheduleError as exc:
            hint, check_id = HINTS[exc.kind]
            messages.append(Error(str(exc), hint=hint, id=check_id))
    return messages


@register(Tags.database)
def check_schedule_names(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """E018: a schedule of the settings named as one made in the admin, which keeps its
    name (the settings never change a schedule made in the admin): the settings' one is
    not scheduled. Only with `check --database` (and migrate): it reads the table."""
    from django.db import DatabaseError, router

    from .model import Origin, Schedule

    if not databases or router.db_for_read(Schedule) not in databases:
        return []
    names = set(load()[0])
    try:
        clashes = sorted(
            Schedule.objects.filter(origin=Origin.ADMIN, name__in=names).values_list(
                "name", flat=True
            )
        )
    except DatabaseError:  # not migrated yet: migrate reports what it does
        return []
    return [
        Error(
            f"Schedule {name!r} of the settings is not scheduled: a schedule made in the admin "
            f"has that name, and keeps it (the settings never change a schedule made in the "
            f"admin).",
            hint="Rename the schedule in the settings, or delete the admin's schedule (the "
            "next start of runjobs, or `manage.py schedules --sync`, then stores the "
            "settings' one).",
            id="django_jobstate.E018",
        )
        for name in clashes
    ]
