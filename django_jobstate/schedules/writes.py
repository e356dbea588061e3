"""The writes of periodic jobs besides a tick's compare-and-set (scheduler.py): storing the
settings' definitions (sync), inserting the job of a tick or of a Run now, and the tick's
transaction, which waits little for a row another scheduler holds."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.utils import timezone

from ..conf import get_settings
from ..limits.concurrency import concurrency_key, is_limited
from ..limits.rates import rate_limit
from ..loading import load_task
from ..managers.conflicts import lock_conflict
from ..models import Job, Schedule
from ..task_options import with_settings
from ..uniqueness import UniqueScope, is_unique, unique_key
from .definitions import Definition
from .model import Origin

logger = logging.getLogger("django_jobstate.scheduler")

# A tick's transaction neither waits long for a row another scheduler holds, nor (on
# PostgreSQL and MariaDB) holds one long: a scheduler paused inside it (SIGSTOP, a frozen
# VM) is disconnected, its transaction rolled back, and the tick left for the others.
PG_GUARDS = "SET LOCAL lock_timeout = '2s'; SET LOCAL idle_in_transaction_session_timeout = '5s'"
LOCK_NOT_AVAILABLE = "55P03"
# MariaDB/MySQL have no SET LOCAL: the session's values are kept in user variables and
# put back after the transaction. idle_transaction_timeout is MariaDB's only (MySQL 8 has
# none: a scheduler paused inside a tick holds its row until it resumes or its connection
# is closed, and the others hold off from that schedule meanwhile).
MYSQL_GUARDS = (
    "SET @jobstate_lock_wait = @@SESSION.innodb_lock_wait_timeout, "
    "SESSION innodb_lock_wait_timeout = 2"
)
MYSQL_RESTORE = "SET SESSION innodb_lock_wait_timeout = @jobstate_lock_wait"
MARIADB_GUARDS = (
    ", @jobstate_idle = @@SESSION.idle_transaction_timeout, SESSION idle_transaction_timeout = 5"
)
MARIADB_RESTORE = ", SESSION idle_transaction_timeout = @jobstate_idle"

# sync(): how many times a definition's store is tried again when a tick of the old one
# changed the row between its read and its write (each try reads the row afresh).
STORE_TRIES = 5


def db_now(db: str) -> datetime:
    """Now by the database's clock (PostgreSQL, MariaDB/MySQL), or this machine's (SQLite)."""
    connection = connections[db]
    if connection.vendor == "sqlite":
        return timezone.now()
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            return cursor.fetchone()[0].replace(tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        return cursor.fetchone()[0]


def lock_not_available(exc: BaseException) -> bool:
    """Whether a tick's transaction gave up on a row another scheduler holds (or, on
    MariaDB/MySQL, was chosen as a deadlock's victim): nothing was written; try again soon."""
    return (
        getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE
        or lock_conflict(exc) is not None
    )


@contextmanager
def tick_transaction(db: str) -> Iterator[None]:
    """The transaction of one tick (scheduler.py), with the guards above."""
    connection = connections[db]
    if connection.vendor != "mysql":
        with transaction.atomic(using=db):
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(PG_GUARDS)
            yield
        return
    mariadb = getattr(connection, "mysql_is_mariadb", False)  # the MySQL backend's
    with connection.cursor() as cursor:
        cursor.execute(MYSQL_GUARDS + (MARIADB_GUARDS if mariadb else ""))
    try:
        with transaction.atomic(using=db):
            yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute(MYSQL_RESTORE + (MARIADB_RESTORE if mariadb else ""))
        except DatabaseError:
            pass  # the connection is lost, and its session with it (or a test's transaction failed)


def sync(definitions: Iterable[Definition], *, remove: bool = True) -> list[str]:
    """Store the settings' definitions: new rows, and the rows whose definition changed;
    return the names the settings share with schedules made in the admin (not stored).

    A changed definition takes effect from the tick after now: its first tick cannot be
    one already enqueued. Each write is conditional on the row as read, so schedulers
    starting together write each change once. Admin changes (enabled) are kept while the
    definition is unchanged. Names gone from the settings stop ticking (removed_at),
    unless `remove` is False: settings with errors (a misspelt key) may lack names that
    are only misread, and a removal would lose their state (an admin's disable, the ticks
    due meanwhile). A schedule made in the admin (origin "admin") is never written here:
    a settings schedule of its name is not stored, and that is logged as an error (and
    reported by check E018), until one of the two is renamed or the admin's deleted.
    """
    definitions = list(definitions)
    db = router.db_for_write(Schedule)
    now = db_now(db)
    rows = {row.name: row for row in Schedule.objects.using(db)}
    clashes = sorted(d.name for d in definitions if clash(rows.get(d.name)))
    if clashes:
        logger.error(
            "Schedules %s of the settings are not scheduled: schedules made in the admin "
            "have their names, and the settings never change those. Rename them in the "
            "settings, or delete the admin's (then the next start of runjobs, or "
            "`manage.py schedules --sync`, stores the settings' ones).",
            ", ".join(clashes),
            extra={"event": "schedules.name_clash"},
        )
    definitions = [d for d in definitions if d.name not in clashes]
    rows = {name: row for name, row in rows.items() if row.origin == Origin.SETTINGS}
    new = [
        Schedule(name=d.name, **d.fields(), next_tick_at=d.next_tick(now))
        for d in definitions
        if d.name not in rows
    ]
    # A conflict is a row stored since the read, by another process, or by the admin.
    Schedule.objects.using(db).bulk_create(new, ignore_conflicts=True)
    for d in definitions:
        row = rows.get(d.name)
        if row is not None and not stored(d, row):
            store(db, d, row)
    names = {d.name for d in definitions}
    gone = [name for name, row in rows.items() if name not in names and row.removed_at is None]
    if gone and remove:
        Schedule.objects.using(db).filter(
            name__in=gone, removed_at=None, origin=Origin.SETTINGS
        ).update(removed_at=now)
        logger.info(
            "Schedules no longer in the settings, stopped: %s",
            ", ".join(sorted(gone)),
            extra={"event": "schedules.removed"},
        )
    elif gone:
        logger.warning(
            "Schedules %s are not in the settings, which have errors: kept as they are "
            "(fix the settings, and they tick again; remove them, and they stop).",
            ", ".join(sorted(gone)),
            extra={"event": "schedules.kept"},
        )
    return clashes


def clash(row: Schedule | None) -> bool:
    """Whether a settings definition's name is a schedule made in the admin's."""
    return row is not None and row.origin == Origin.ADMIN


def stored(d: Definition, row: Schedule | None) -> bool:
    """Whether `row` holds `d` (or is gone: nothing to store then)."""
    return row is None or (row.definition_hash == d.hash and row.removed_at is None)


def store(db: str, d: Definition, row: Schedule) -> None:
    """Write `d` over `row`, from the tick after now, if the row is still as read.

    The write names next_tick_at as read: a tick the old definition enqueued since (a
    rolling deploy, where the old release still ticks) changes it, and the row is read
    again, so that the new definition never starts at a tick already enqueued.
    """
    for _ in range(STORE_TRIES):
        now = db_now(db)
        after = max(now, row.last_tick_at or now)
        same = Schedule.objects.using(db).filter(
            name=d.name,
            origin=Origin.SETTINGS,
            definition_hash=row.definition_hash,
            removed_at=row.removed_at,
            next_tick_at=row.next_tick_at,
        )
        if same.update(**d.fields(), next_tick_at=d.next_tick(after), removed_at=None):
            logger.info(
                "Schedule %s: stored this process's definition (%s)",
                d.name,
                d.expression,
                extra={"event": "schedule.stored"},
            )
            return
        fresh = Schedule.objects.using(db).filter(name=d.name, origin=Origin.SETTINGS).first()
        if stored(d, fresh):
            return  # another process stored it, or the row was deleted
        assert fresh is not None
        row = fresh
    logger.warning(
        "Schedule %s: its row kept changing; this process's definition is not stored yet "
        "(its next restart, or `manage.py schedules --sync`, stores it)",
        d.name,
        extra={"event": "schedule.not_stored"},
    )


def enqueue_tick(db: str, d: Definition, tick: datetime, *, last_result_id: Any = None) -> Job:
    """Insert the job of one tick of `d` (the caller holds the schedule's row), or return
    the live job that holds its unique key, with `deduplicated` set.

    A unique task keeps its key and scope, as enqueue() writes them: a tick never adds a
    second live (or queued) job for a key the task declares unique, nor lets enqueue()
    add one beside it. The schedule's own `unique` (skip while its last run is live) is
    then checked on its last tick's job, `last_result_id`; for another task, it is the
    key `schedule:<name>`.
    """
    task = with_settings(load_task(d.task_path))  # JOBSTATE_TASK_OPTIONS, as at enqueue()
    unique: dict[str, Any] = {}
    if is_unique(task):
        scope = UniqueScope(getattr(task, "unique_scope", UniqueScope.LIVE))
        unique = {"unique_keys": [unique_key(task, d.args, d.kwargs)], "unique_scope": scope}
        if d.unique and last_result_id is not None:
            live = Job.objects.using(db).filter(result_id=last_result_id, finished_at=None)
            if (last := live.first()) is not None:
                last.deduplicated = True
                return last
    elif d.unique:
        key = hashlib.sha256(f"schedule:{d.name}".encode()).hexdigest()
        unique = {"unique_keys": [key], "unique_scope": UniqueScope.LIVE}
    if is_limited(task):  # a tick waits for a slot as an enqueue() does (limits/concurrency.py)
        unique["concurrency_keys"] = [concurrency_key(task, d.args, d.kwargs)]
        unique["concurrency_limit"] = task.concurrency  # type: ignore[attr-defined]
    if (rate := rate_limit(task)) is not None:  # a tick starts at the task's rate too
        unique["rate_limit"] = rate
    defaults = get_settings()

    def option(name: str) -> Any:
        value = getattr(task, name, None)
        return getattr(defaults, f"DEFAULT_{name.upper()}") if value is None else value

    [job] = Job.objects.db_manager(db).enqueue_many(
        d.task_path,
        [(d.args, d.kwargs)],
        queue_name=d.queue_name,
        priority=d.priority,
        backend=d.backend,
        max_attempts=option("max_attempts"),
        backoff=option("backoff"),
        timeout=option("timeout"),
        schedule_name=d.name,
        scheduled_for=tick,
        **unique,
    )
    return job
