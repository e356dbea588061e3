"""The scheduler: enqueues each tick of each schedule exactly once, with no leader.

Every `runjobs` supervisor runs one (a thread, SchedulerThread). Per wake-up it reads the
earliest ticks of the enabled schedules (one query on an index) with the database's clock,
and for each one due it makes one short transaction that begins with a compare-and-set:

    UPDATE schedule SET next_tick_at = <the tick after now>
     WHERE name = ... AND next_tick_at = <the due tick it read>
       AND definition_hash = <its own> AND enabled AND removed_at IS NULL

and, if that changed the row, inserts the tick's job. Of any number of schedulers that
read the same due tick, one changes the row; the others wait for its commit and match no
row. If it dies before committing, its transaction rolls back and the next one wins: a
tick is never lost, never enqueued twice (and a unique index on the first attempt of each
(schedule, tick) is the backstop). Times come from the database (PostgreSQL's clock;
SQLite's is this machine's): a scheduler whose own clock is ahead neither ticks early nor
twice. A scheduler whose definition is not the stored one (a rolling deploy) matches no
row, so it cannot enqueue with it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.utils import timezone

from .conf import get_settings
from .loading import load_task
from .models import Job, Schedule
from .schedule_settings import load
from .schedules import Definition, Plan
from .tasksapi import InvalidTask
from .uniqueness import UniqueScope

logger = logging.getLogger("django_jobstate.scheduler")

DUE_BATCH = 100  # due rows handled per query
MAX_SLEEP = 10.0  # seconds between reads when no tick is nearer (an admin's enable, a sync)
WAKE_MARGIN = 0.002  # past the tick, so that it is due by the time the query runs
HOLD = 10.0  # seconds before retrying a schedule whose tick failed (its task is missing...)
# On PostgreSQL, a tick's transaction neither waits long for a row another scheduler holds,
# nor holds one long: a scheduler paused inside it (SIGSTOP, a frozen VM) is disconnected,
# its transaction rolled back, and the tick left for the others.
PG_GUARDS = "SET LOCAL lock_timeout = '2s'; SET LOCAL idle_in_transaction_session_timeout = '5s'"
LOCK_NOT_AVAILABLE = "55P03"


def db_now(db: str) -> datetime:
    """Now by the database's clock (PostgreSQL), or this machine's (SQLite)."""
    connection = connections[db]
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        return cursor.fetchone()[0]


def sync(definitions: Iterable[Definition]) -> None:
    """Store the settings' definitions: new rows, and the rows whose definition changed.

    A changed definition takes effect from the tick after now: its first tick cannot be
    one already enqueued. Each write is conditional on the row as read, so schedulers
    starting together write each change once. Admin changes (enabled) are kept while the
    definition is unchanged. Names gone from the settings stop ticking (removed_at).
    """
    definitions = list(definitions)
    db = router.db_for_write(Schedule)
    now = db_now(db)
    rows = {row.name: row for row in Schedule.objects.using(db)}
    new = [
        Schedule(name=d.name, **d.fields(), next_tick_at=d.next_tick(now))
        for d in definitions
        if d.name not in rows
    ]
    Schedule.objects.using(db).bulk_create(new, ignore_conflicts=True)
    for d in definitions:
        row = rows.get(d.name)
        if row is None or (row.definition_hash == d.hash and row.removed_at is None):
            continue
        after = max(now, row.last_tick_at or now)
        changed = Schedule.objects.using(db).filter(
            name=d.name, definition_hash=row.definition_hash, removed_at=row.removed_at
        )
        if changed.update(**d.fields(), next_tick_at=d.next_tick(after), removed_at=None):
            logger.info("Schedule %s: stored this process's definition (%s)", d.name, d.expression)
    names = {d.name for d in definitions}
    gone = [name for name, row in rows.items() if name not in names and row.removed_at is None]
    if gone:
        Schedule.objects.using(db).filter(name__in=gone, removed_at=None).update(removed_at=now)
        logger.info("Schedules no longer in the settings, stopped: %s", ", ".join(sorted(gone)))


def enqueue_tick(db: str, d: Definition, tick: datetime) -> Job:
    """Insert the job of one tick of `d` (the caller holds the schedule's row)."""
    task = load_task(d.task_path)
    defaults = get_settings()
    unique: dict[str, Any] = {}
    if d.unique or getattr(task, "unique", False):
        from .uniqueness import unique_key

        key = (
            hashlib.sha256(f"schedule:{d.name}".encode()).hexdigest()
            if d.unique
            else unique_key(task, d.args, d.kwargs)
        )
        unique = {"unique_keys": [key], "unique_scope": UniqueScope.LIVE}

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


class Scheduler:
    """One process's scheduler: call run_once() and sleep for the seconds it returns."""

    def __init__(self, name: str, definitions: dict[str, Definition] | None = None) -> None:
        self.name = name
        if definitions is None:
            definitions, errors = load()
            for exc in errors:
                logger.error("%s: not scheduled: %s", name, exc)
        self.definitions = definitions
        if definitions:
            listed = [f"{d.name} ({d.expression})" for d in list(definitions.values())[:10]]
            more = f" and {len(definitions) - 10} more" if len(definitions) > 10 else ""
            logger.info("%s: schedules %s%s", name, ", ".join(listed), more)
        self.by_hash = {d.hash: d for d in definitions.values()}
        self.synced = False
        self._hold: dict[str, float] = {}  # {name: monotonic time before which not to try}

    def run_once(self) -> float:
        """Enqueue the due ticks; return the seconds until the next one may be due."""
        if not self.synced:  # even with none: the rows of removed schedules say so
            sync(self.definitions.values())
            self.synced = True
        if not self.definitions:
            return MAX_SLEEP
        db = router.db_for_write(Schedule)
        rows, now = self._earliest(db)
        wait, ticked = MAX_SLEEP, False
        for name, due, definition_hash in rows:
            if due > now:
                wait = min(wait, (due - now).total_seconds())
                break
            held = self._hold.get(name, 0) - time.monotonic()
            if held > 0:
                wait = min(wait, held)
                continue
            self._tick(db, self.by_hash[definition_hash], due, now)
            ticked = True
        return 0.0 if ticked else wait + WAKE_MARGIN

    def _earliest(self, db: str) -> tuple[list[tuple[str, datetime, str]], datetime]:
        """The earliest ticks of the enabled schedules this process defines as stored, and
        the database's now, in one query on jobstate_schedule_due."""
        rows = Schedule.objects.using(db).filter(
            enabled=True, removed_at=None, definition_hash__in=list(self.by_hash)
        )
        fields = ["name", "next_tick_at", "definition_hash"]
        if connections[db].vendor == "postgresql":
            now_sql = RawSQL("STATEMENT_TIMESTAMP()", [])
            found = list(
                rows.annotate(db_now=now_sql)
                .order_by("next_tick_at")
                .values_list(*fields, "db_now")[: DUE_BATCH + 1]
            )
            now = found[0][3] if found else timezone.now()
            return [row[:3] for row in found], now
        found = list(rows.order_by("next_tick_at").values_list(*fields)[: DUE_BATCH + 1])
        return found, timezone.now()

    def _tick(self, db: str, d: Definition, due: datetime, now: datetime) -> None:
        plan = d.plan(due, now)
        connection = connections[db]
        try:
            with transaction.atomic(using=db):
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute(PG_GUARDS)
                won = Schedule.objects.using(db).filter(
                    name=d.name,
                    next_tick_at=due,
                    definition_hash=d.hash,
                    enabled=True,
                    removed_at=None,
                )
                if not won.update(next_tick_at=plan.next_tick_at):
                    logger.debug(
                        "Schedule %s: tick %s taken by another scheduler (or the row changed)",
                        d.name,
                        due.isoformat(),
                    )
                    return
                self._enqueue(db, d, plan)
        except DatabaseError as exc:
            if isinstance(exc, IntegrityError) or (
                getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE
            ):
                self._hold_off(d, exc)
                return
            raise
        except (InvalidTask, TypeError, ValueError) as exc:
            self._hold_off(d, exc)

    def _enqueue(self, db: str, d: Definition, plan: Plan) -> None:
        updates: dict[str, Any] = {}
        for tick in plan.enqueue:
            job = enqueue_tick(db, d, tick)
            if job.deduplicated:
                logger.info(
                    "Schedule %s: tick %s skipped, its last run (job %s) is still %s",
                    d.name,
                    tick.isoformat(),
                    job.pk,
                    job.state,
                )
                updates["skipped"] = F("skipped") + 1
                updates["last_skipped_at"] = tick
            else:
                logger.debug("Schedule %s: tick %s enqueued as job %s", d.name, tick, job.pk)
                updates.update(last_tick_at=tick, last_result_id=job.result_id)
        if plan.missed:
            logger.warning(
                "Schedule %s: %d tick(s) before %s not enqueued (catch_up=%s, max_lateness=%gs)",
                d.name,
                plan.missed,
                plan.next_tick_at.isoformat(),
                d.catch_up,
                d.max_lateness,
            )
            updates["missed"] = F("missed") + plan.missed
        if updates:
            Schedule.objects.using(db).filter(name=d.name).update(**updates)

    def _hold_off(self, d: Definition, exc: BaseException) -> None:
        if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            self._hold[d.name] = time.monotonic() + 1.0  # another holds it: try again soon
            return
        logger.error(
            "%s: schedule %s could not enqueue its tick; retrying in %gs: %s",
            self.name,
            d.name,
            HOLD,
            exc,
        )
        self._hold[d.name] = time.monotonic() + HOLD


class SchedulerThread(threading.Thread):
    """Runs a Scheduler until stop(); a database error is logged and retried."""

    def __init__(self, name: str) -> None:
        super().__init__(name="jobstate-scheduler", daemon=True)
        self.scheduler_name = self.name_ = name
        self._stop_event = threading.Event()

    def run(self) -> None:
        from .liveness import close_connection

        failures = 0
        scheduler = None
        try:
            while not self._stop_event.is_set():
                try:
                    scheduler = scheduler or Scheduler(self.scheduler_name)
                    wait = scheduler.run_once()
                    failures = 0
                except DatabaseError as exc:
                    failures += 1
                    logger.warning("%s: database unavailable (%s); will retry", self.name_, exc)
                    close_connection()
                    wait = min(0.25 * 2**failures, 5.0)
                except Exception:  # a bug must not stop every schedule for good
                    logger.exception("%s: the scheduler failed; will retry", self.name_)
                    wait = HOLD
                self._stop_event.wait(wait)
        finally:
            close_connection()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)
