"""What every conditional write shares: the state check and fence, the database's "now",
and the error fields of a failed attempt."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
    models,
    router,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import (
    JobTimeout,
    LostRace,
)
from ..querysets import JobQuerySet
from ..states import TERMINAL_STATES, State, check_transition
from .conflicts import mysql_error_passes

if TYPE_CHECKING:
    from ..models import Job

logger = logging.getLogger("django_jobstate")


# Where a job stands in claim order (claim.py, mysql.py): claim_key().
ClaimKey = tuple[int, datetime, int]


def claim_key(job: Job) -> ClaimKey:
    """Where `job` stands in claim order: higher priority first, then run_after, then id."""
    return (-job.priority, job.run_after, job.pk)


# The fields that differ between the rows one enqueue INSERT writes (enqueue.py, mysql.py).
PER_CALL = ("result_id", "args", "kwargs", "unique_key")


def timeout_error(job: Job) -> JobTimeout:
    return JobTimeout(f"the attempt ran past its timeout of {job.timeout:g} seconds")


def now_sql(connection: BaseDatabaseWrapper, delay: float = 0.0) -> tuple[str, list[Any]]:
    """SQL for "now" (plus `delay` seconds) in a write, and its parameters.

    Every time the claim compares (run_after, and the enqueued_at beside it) is written
    with this, never with the writing process's clock: on PostgreSQL it is the database
    clock, so a worker whose clock is behind cannot skip a retry's backoff and a web
    process whose clock is ahead cannot enqueue jobs that wait for the database to catch
    up. MariaDB/MySQL: the server's clock too. SQLite: this process's clock, as SQLite's
    has only milliseconds and run_after has microseconds (a job due now would wait);
    SQLite is one machine with one clock.
    """
    if connection.vendor == "postgresql":
        if delay:
            return "(STATEMENT_TIMESTAMP() + %s)", [timedelta(seconds=delay)]
        return "STATEMENT_TIMESTAMP()", []
    if connection.vendor == "mysql":
        # The server's clock in UTC, as Django stores times with USE_TZ (checks.py warns
        # about a local TIME_ZONE without it), with microseconds as DATETIME(6) keeps.
        if delay:
            return "(UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)", [round(delay * 1e6)]
        return "UTC_TIMESTAMP(6)", []
    return "%s", [process_now(connection, delay)[1]]


def process_now(connection: BaseDatabaseWrapper, delay: float = 0.0) -> tuple[datetime, Any]:
    """SQLite's "now" (plus `delay` seconds), this process's clock: as the ORM reads it
    back, and as it is written."""
    now = timezone.now()
    if delay:
        now += timedelta(seconds=delay)
    if connection.vendor == "sqlite" and now.tzinfo is UTC and connection.timezone is UTC:
        # What adapt_datetimefield_value() writes, without its checks: a naive UTC time.
        return now, str(now.replace(tzinfo=None))
    return now, connection.ops.adapt_datetimefield_value(now)


@contextmanager
def write_lock_first(using: str) -> Iterator[None]:
    """For a write whose times come from now_sql(): on SQLite, outside a transaction, the
    write lock is taken first (BEGIN IMMEDIATE, receivers.configure_sqlite), so that the
    clock is read once this process holds it. A statement in autocommit binds this
    process's clock and then waits for the lock: a claim that waited seconds stamped
    started_at before the enqueued_at of rows committed meanwhile. (PostgreSQL reads its
    own clock when the statement runs; nothing to do.)"""
    connection = connections[using]
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
    else:
        yield


def from_db(connection: BaseDatabaseWrapper, field: models.Field[Any, Any], value: Any) -> Any:
    """A value of `field` read with a raw cursor, as the ORM would give it (SQLite: text)."""
    column = field.get_col(field.model._meta.db_table)
    for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
        value = convert(value, column, connection)
    return value


def built_directly(model: type[models.Model]) -> bool:
    """Whether instances of `model` may be built by instance(): while nothing listens to
    its pre_init or post_init, which only Model.__init__ sends, and neither __init__ nor
    from_db() is the model's own (or patched, as field trackers do)."""
    if model.__init__ is not models.Model.__init__:
        return False
    if model.from_db.__func__ is not models.Model.from_db.__func__:  # type: ignore[attr-defined]
        return False
    if not (pre_init.receivers or post_init.receivers):  # most projects: nothing to look up
        return True
    return not (pre_init.has_listeners(model) or post_init.has_listeners(model))


def instance[M: models.Model](model: type[M], db: str, attrs: dict[str, Any]) -> M:
    """What Model.__init__ and from_db() leave behind, `attrs` being every concrete field's
    value by attname, without walking the fields (a fifth of building a claimed batch).
    `attrs` becomes the instance's __dict__: give a dict of its own."""
    built = model.__new__(model)
    state = ModelState()
    state.adding, state.db = False, db
    attrs["_state"] = state
    built.__dict__ = attrs  # a quarter of the time of copying it into the new instance's
    return built


def close_connection() -> None:
    """Drop this thread's connection to the jobs' database, so the next use reconnects."""
    from ..models import Job

    connections[router.db_for_write(Job)].close()


# A module-level name, so that django-stubs types the manager's queryset methods.
_JobManagerBase = models.Manager.from_queryset(JobQuerySet)


# On PostgreSQL and MariaDB the server ends a transaction of ours that holds Job rows (an outcome, a
# rescue, a cancel request) once its client has been silent in it for this share of
# JOBSTATE_LOST_AFTER. A host cut off, or dead, between such a write and its COMMIT would
# hold the rows until the server drops its connection (when TCP gives up: up to hours),
# and no rescuer can fail an attempt whose row is held (it skips locked rows). Below 1,
# the rows are free before the host's silence makes its attempts lost, so the rescue is
# not delayed; ours take milliseconds, and a writer that was only slow gets an error and
# writes again.
IDLE_IN_WRITE_SHARE = 0.5
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"  # the SQLSTATE of that end (an InternalError)


def connection_lost(exc: DatabaseError) -> bool:
    """Whether `exc` can pass, so that the write may be made again on a new connection:
    the database is away, it ended a transaction of ours left idle, or the write waited
    too long for a lock (a lock or statement timeout, a deadlock: OperationalError on both
    databases, as SQLite's "database is locked"). Any other error (a constraint, a value
    the column refuses, a trigger's) would fail the same write again. MariaDB/MySQL call
    a trigger's refusal OperationalError too: their errors are told apart by number."""
    if isinstance(exc, InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        return mysql_error_passes(exc)
    return getattr(exc.__cause__, "sqlstate", None) == IDLE_IN_TRANSACTION_TIMEOUT


@contextmanager
def brief_transaction(using: str | None) -> Iterator[None]:
    """transaction.atomic, for a write of ours that holds Job rows (IDLE_IN_WRITE_SHARE)."""
    connection = connections[using or DEFAULT_DB_ALIAS]
    outermost = not connection.in_atomic_block
    idle = get_settings().LOST_AFTER * IDLE_IN_WRITE_SHARE
    mariadb = outermost and getattr(connection, "mysql_is_mariadb", False)
    try:
        with transaction.atomic(using=using):
            if outermost and connection.vendor == "postgresql":
                ms = min(max(1, int(idle * 1000)), 2**31 - 1)  # a PostgreSQL int (24 days)
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                        [str(ms)],
                    )
            elif mariadb:
                # No SET LOCAL: the session's value is kept and put back after the
                # transaction. Whole seconds, at least 1. (MySQL 8 has no such timeout: a
                # writer cut off mid-write holds its rows until the server drops it.)
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SET @jobstate_idle = @@SESSION.idle_transaction_timeout, "
                        "SESSION idle_transaction_timeout = %s",
                        [min(max(1, math.ceil(idle)), 31_536_000)],
                    )
            yield
    finally:
        if mariadb and connection.connection is not None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SET SESSION idle_transaction_timeout = @jobstate_idle")
            except DatabaseError:
                pass  # the connection is gone (or going): a new one starts with the default


@contextmanager
def writing(job: Job, *, brief: bool = True) -> Iterator[None]:
    """A transaction for writes that move `job` (_transition refreshes it in place): if
    it does not commit, `job` is put back as it was, which is what the row still holds.
    `brief`: a write of ours alone (brief_transaction), not a task's body with it.

    An outcome whose write failed because the database went away is written again once
    it is back (the worker's retrying()): it must start from the state the database has,
    not from the one its rolled-back write had put in memory. (If the COMMIT went through
    and only its answer was lost, the write again loses its fence and says so.)
    """
    saved = job.__dict__.copy()
    db = job._state.db
    try:
        with brief_transaction(db) if brief else transaction.atomic(using=db):
            yield
    except BaseException:
        job.__dict__.update(saved)
        raise


class Writes(_JobManagerBase["Job"]):
    """The base of JobManager's parts (enqueue.py, claim.py, outcomes.py, settle.py, ...)."""

    if TYPE_CHECKING:  # limits.py's

        def _release_slots(self, db: str, keys: Iterable[str]) -> int: ...

        def _lock_key(self, db: str, key: str) -> None: ...

        # deps.py's
        def _after_failure(self, db: str, job: Job, root: Job | None = None) -> None: ...

    def _transition(self, job: Job, new: State, **values: Any) -> None:
        """Move `job` to `new` if it is still where this process last saw it.

        The write is conditional on the state (and, for running attempts, the worker);
        on success `job` is refreshed from the row, on a lost race nothing changes.
        """
        reason = values.get("failure_reason")
        check_transition(job.state, new, reason if isinstance(reason, str) else None)
        fence: dict[str, Any] = {"pk": job.pk, "state": job.state}
        if job.state == State.RUNNING:
            fence["worker_id"] = job.worker_id
        db = job._state.db or router.db_for_write(self.model)
        # A limited row that finishes hands its slot on in the same transaction
        # (managers/limits.py), brief: it holds the key's lock. Other rows write as before,
        # in one statement.
        key = job.concurrency_key if new in TERMINAL_STATES else None
        with brief_transaction(db) if key else nullcontext():
            if key is not None and job.state == State.QUEUED:
                # A queued row may be held, which whoever hands out the key's slots writes
                # under the key's lock: take it first, in their order (a running row is
                # never theirs to write, and is written first, as a rescuer locks it).
                self._lock_key(db, key)
            updated = self.using(db).filter(**fence).update(state=new, **values)
            if updated == 1 and key is not None:
                self._release_slots(db, [key])
        if updated != 1:
            raise LostRace(
                f"Job {job.pk} was no longer {job.state}"
                + (f" for worker {job.worker_id}" if "worker_id" in fence else "")
                + f" when moving it to {new}: another writer got there first. Nothing was changed."
            )
        # has_dependents too: a dependent enqueued since `job` was read marked it
        # (deps.py), and this write's lock made that mark final.
        job.refresh_from_db(fields=["state", "has_dependents", *values])
