"""Schedules made in the admin (origin "admin"): their validation, as the settings' are
validated, and their writes, each conditional on the row as read.

An edit names the row's definition_hash and next_tick_at as read, as a tick's
compare-and-set does (scheduler.py), and changes both: a scheduler in the middle of a
tick of the old definition then matches no row (it never enqueues that tick after the
edit), and the new definition starts at its first tick after now and after the last tick
enqueued (never early, never at a tick already enqueued). Were a tick to commit between
the edit's read and its write, the write matches no row, and is made again over the row
as it is then.

Each write sends a notification on PostgreSQL when it commits (db/notify.py): the relay of
every runjobs supervisor hears it and wakes its scheduler, which reads the rows at once.
Elsewhere the schedulers read them at their next wake-up (scheduler.MAX_SLEEP at most).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, router, transaction

from ..backend import JobStateBackend
from ..db.notify import NOTIFY_SCHEDULES
from ..loading import load_task
from ..tasksapi import InvalidTask, task_backends
from .definitions import PRUNE_SCHEDULE, Definition, ScheduleError, parse
from .model import Origin, Schedule
from .settings import load, task_of
from .writes import db_now

logger = logging.getLogger("django_jobstate.scheduler")

TRIES = 5  # an edit made again over a row that ticks (every second) while it is written


class ScheduleChanged(Exception):
    """The row changed under an edit at every try, or was deleted: nothing written."""


def validate(name: str, raw: dict[str, Any]) -> Definition:
    """The Definition of a schedule made in the admin, checked as the settings' are
    (parse(), task_of()); `raw` has the keys of a settings definition. ScheduleError's
    `key` names the definition's key that is wrong."""
    where = f"Schedule {name!r}"
    try:
        task = load_task(str(raw.get("task", "")))
    except InvalidTask as exc:
        raise ScheduleError(str(exc), "task", "task") from None
    backend = task_backends[task.backend]
    if not isinstance(backend, JobStateBackend):
        raise ScheduleError(
            f"The task {task.module_path!r} belongs to the backend {task.backend!r}, which is "
            f"not a JobStateBackend: no runjobs would enqueue its ticks.",
            "task",
            "task",
        )
    definition = parse(
        name,
        raw,
        alias=backend.alias,
        queues=sorted(backend.queues),
        time_zone=settings.TIME_ZONE or "UTC",
        where=where,
    )
    task_of(definition)
    return definition


def name_taken(name: str, *, db: str | None = None) -> str:
    """Why a new schedule made in the admin may not be called `name` ("" if it may)."""
    if name == PRUNE_SCHEDULE or name in load()[0]:
        return (
            f"The settings define a schedule named {name!r} (TASKS[alias]['OPTIONS']"
            f"['SCHEDULES'] or JOBSTATE_RETENTION): names are project-wide; choose another."
        )
    row = Schedule.objects.using(db or router.db_for_read(Schedule)).filter(name=name).first()
    if row is None:
        return ""
    if row.origin == Origin.ADMIN:
        return f"A schedule named {name!r} exists already."
    return (
        f"A schedule of the settings named {name!r} is stored (removed from the settings, "
        f"it no longer ticks): delete it first to reuse its name."
    )


def token(d: Definition) -> str:
    """The definition_hash of an admin row: the definition's, whether enabled or not
    (enabling or disabling a schedule changes no tick's definition)."""
    return replace(d, enabled=True).hash


def columns(d: Definition) -> dict[str, Any]:
    values = d.fields()
    values["definition_hash"] = token(d)
    return values


def notify(db: str, name: str) -> None:
    """Wake every supervisor's scheduler when the transaction commits (PostgreSQL)."""
    if connections[db].vendor == "postgresql":
        with connections[db].cursor() as cursor:
            cursor.execute(f"SELECT {NOTIFY_SCHEDULES}", [name])


def add(d: Definition) -> Schedule:
    """Store a new schedule of the admin; it ticks from its first tick after now."""
    db = router.db_for_write(Schedule)
    try:
        with transaction.atomic(using=db):
            row = Schedule(
                name=d.name, origin=Origin.ADMIN, **columns(d), next_tick_at=d.next_tick(db_now(db))
            )
            row.save(using=db, force_insert=True)
            notify(db, d.name)
    except IntegrityError:
        # The name is the primary key: another operator's form, valid at the same moment
        # as this one, was saved first (the form's check read the table before it).
        raise ScheduleChanged(
            f"A schedule named {d.name!r} was added by someone else while this form was "
            f"saved: yours was not added. Edit theirs, or add yours under another name."
        ) from None
    logger.info(
        "Schedule %s: added in the admin (%s)",
        d.name,
        d.expression,
        extra={"event": "schedule.added"},
    )
    return row


def edit(row: Schedule, d: Definition) -> Schedule:
    """Write `d` (its `enabled` included) over the admin's `row`, conditionally on the
    row as read (see the module's docstring); return the row as written."""
    db = router.db_for_write(Schedule)
    for _ in range(TRIES):
        values = changes(db, row, d)
        if not values:
            return row
        same = Schedule.objects.using(db).filter(
            name=row.name,
            origin=Origin.ADMIN,
            definition_hash=row.definition_hash,
            next_tick_at=row.next_tick_at,
            enabled=row.enabled,
        )
        with transaction.atomic(using=db):
            if same.update(**values):
                notify(db, row.name)
                logger.info(
                    "Schedule %s: changed in the admin (%s)",
                    d.name,
                    d.expression,
                    extra={"event": "schedule.changed"},
                )
                return Schedule.objects.using(db).get(name=row.name)
        fresh = Schedule.objects.using(db).filter(name=row.name, origin=Origin.ADMIN).first()
        if fresh is None:
            raise ScheduleChanged(f"Schedule {row.name!r} was deleted meanwhile.")
        row = fresh
    raise ScheduleChanged(
        f"Schedule {row.name!r} kept changing while it was written ({TRIES} tries): nothing "
        f"was changed; try again."
    )


def changes(db: str, row: Schedule, d: Definition) -> dict[str, Any]:
    """The columns an edit writes over `row`: none when nothing changed."""
    values: dict[str, Any] = {}
    if token(d) != row.definition_hash:
        # From the first tick after now and after the last one enqueued (by the old
        # definition): never early, never a tick already enqueued.
        now = db_now(db)
        after = max(now, row.last_tick_at or now)
        values.update(columns(d), next_tick_at=d.next_tick(after))
    if d.enabled != row.enabled:
        values["enabled"] = d.enabled
        if d.enabled and "next_tick_at" not in values:
            # The ticks missed while disabled are not due: from the next after now.
            values["next_tick_at"] = d.next_tick(db_now(db))
    return values


def set_enabled(row: Schedule, enabled: bool) -> bool:
    """Enable or disable a schedule of either origin (the admin's actions); whether it
    changed. Enabling starts from the first tick after now."""
    db = router.db_for_write(Schedule)
    # A disabled row does not tick: its next_tick_at cannot change under the enable.
    same = Schedule.objects.using(db).filter(name=row.name, enabled=not enabled, removed_at=None)
    values: dict[str, Any] = {"enabled": enabled}
    if enabled:
        values["next_tick_at"] = Definition.from_row(row).next_tick(db_now(db))
    with transaction.atomic(using=db):
        changed = bool(same.update(**values))
        if changed:
            notify(db, row.name)
    return changed
