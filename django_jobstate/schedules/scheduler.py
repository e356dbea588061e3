"""The scheduler: enqueues each tick of each schedule exactly once, with no leader.

Every `runjobs` supervisor runs one (a thread: thread.py). Per wake-up it reads the
earliest ticks of the enabled schedules (one query on an index) with the database's clock,
and for each one due it makes one short transaction that begins with a compare-and-set:

    UPDATE schedule SET next_tick_at = <the tick after now>
     WHERE name = ... AND next_tick_at = <the due tick it read>
       AND definition_hash = <its own> AND enabled AND removed_at IS NULL

and, if that changed the row, inserts the tick's job. Of any number of schedulers that
read the same due tick, one changes the row; the others wait for its commit and match no
row. If it dies before committing, its transaction rolls back and the next one wins: a
tick is never lost, never enqueued twice (and a unique index on the first attempt of each
(schedule, tick) is the backstop: a tick it finds enqueued already is skipped, and the
schedule moves on). Times come from the database (PostgreSQL's and MariaDB/MySQL's clock;
SQLite's is this machine's): a scheduler whose own clock is ahead neither ticks early nor
twice. A scheduler whose definition is not the stored one (a rolling deploy) matches no
row, so it cannot enqueue with it. Schedules made in the admin (origin "admin") are ticked
by their row as read, with its hash: an edit changes both (edits.py), so a tick of the old
definition matches no row either. One schedule whose tick fails, whatever it raises, is
logged and tried again later; the others go on.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, router
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from ..db.clock import Now
from ..managers import connection_lost
from ..models import Job, Schedule
from ..tasksapi import InvalidTask
from .definitions import Definition, Plan
from .model import Origin
from .settings import load
from .writes import db_now, enqueue_tick, lock_not_available, sync, tick_transaction

__all__ = ["Scheduler", "db_now", "enqueue_tick", "sync"]

logger = logging.getLogger("django_jobstate.scheduler")
Due = tuple[str, datetime, str, Definition]  # name, due tick, definition_hash, definition

DUE_BATCH = 100  # due rows handled per query
# Seconds between reads when no tick is nearer: how long a schedule added or enabled in the
# admin waits to be seen, where no notification wakes the scheduler (SQLite, MariaDB/MySQL).
MAX_SLEEP = 10.0
WAKE_MARGIN = 0.002  # past the tick, so that it is due by the time the query runs
HOLD = 10.0  # seconds before retrying a schedule whose tick failed (its task is missing...)


class Scheduler:
    """One process's scheduler: call run_once() and sleep for the seconds it returns."""

    def __init__(self, name: str, definitions: dict[str, Definition] | None = None) -> None:
        self.name = name
        self.settings_valid = True  # sync() removes the rows of names gone only then
        if definitions is None:
            definitions, errors = load()
            for exc in errors:
                logger.error(
                    "%s: not scheduled: %s",
                    name,
                    exc,
                    extra={"event": "scheduler.invalid_schedule"},
                )
            self.settings_valid = not errors
        self.definitions = definitions
        if definitions:
            listed = [f"{d.name} ({d.expression})" for d in list(definitions.values())[:10]]
            more = f" and {len(definitions) - 10} more" if len(definitions) > 10 else ""
            logger.info(
                "%s: schedules %s%s",
                name,
                ", ".join(listed),
                more,
                extra={"event": "scheduler.started"},
            )
        else:
            logger.info(
                "%s: no schedules in the settings (the admin's tick too)",
                name,
                extra={"event": "scheduler.started"},
            )
        self.by_hash = {d.hash: d for d in definitions.values()}
        self.synced = False
        self._hold: dict[str, float] = {}  # {name: monotonic time before which not to try}

    def run_once(self) -> float:
        """Enqueue the due ticks; return the seconds until the next one may be due.

        One schedule that fails (whatever it raises) is logged and tried again later: it
        never stops the others. Only a lost connection ends the wake-up.
        """
        if not self.synced:  # even with none: the rows of removed schedules say so
            sync(self.definitions.values(), remove=self.settings_valid)
            self.synced = True
        db = router.db_for_write(Schedule)  # even with none in the settings: the admin's
        rows, now = self._earliest(db)
        wait, ticked = MAX_SLEEP, False
        for name, due, token, definition in rows:
            if due > now:
                wait = min(wait, (due - now).total_seconds())
                break
            held = self._hold.get(name, 0) - time.monotonic()
            if held > 0:
                wait = min(wait, held)
                continue
            try:
                self._tick(db, definition, due, now, token)
            except DatabaseError as exc:
                if connection_lost(exc):
                    raise  # the database is away: the thread waits for it
                self._fail(name, due, exc)
            except Exception as exc:
                self._fail(name, due, exc)
            ticked = True
        return 0.0 if ticked else wait + WAKE_MARGIN

    def _earliest(self, db: str) -> tuple[list[Due], datetime]:
        """The earliest ticks of the enabled schedules this process defines as stored and
        of those made in the admin, and the database's now, in one query on
        jobstate_schedule_due."""
        rows = Schedule.objects.using(db).filter(
            Q(origin=Origin.SETTINGS, definition_hash__in=list(self.by_hash))
            | Q(origin=Origin.ADMIN),
            enabled=True,
            removed_at=None,
        )
        vendor = connections[db].vendor
        found: list[Schedule]
        if vendor in ("postgresql", "mysql"):
            now_sql = RawSQL("STATEMENT_TIMESTAMP()", []) if vendor == "postgresql" else Now()
            found = list(rows.annotate(db_now=now_sql).order_by("next_tick_at")[: DUE_BATCH + 1])
            now = getattr(found[0], "db_now") if found else timezone.now()  # noqa: B009
        else:
            found = list(rows.order_by("next_tick_at")[: DUE_BATCH + 1])
            now = db_now(db)  # SQLite: this machine's clock
        return [
            (r.name, r.next_tick_at, r.definition_hash, self._definition(r)) for r in found
        ], now

    def _definition(self, row: Schedule) -> Definition:
        """What a row's tick enqueues: the settings' definition of its hash, or the row's."""
        if row.origin == Origin.ADMIN:
            return Definition.from_row(row)
        return self.by_hash[row.definition_hash]

    def _tick(self, db: str, d: Definition, due: datetime, now: datetime, token: str = "") -> None:
        """Enqueue the due ticks of `d` if the row still holds `token` (its hash as read;
        by default d's own) and `due`."""
        token = token or d.hash
        plan = d.plan(due, now)
        try:
            try:
                self._write_tick(db, d, due, token, plan, enqueued_checked=False)
            except IntegrityError:
                # The backstop index met a tick enqueued already (a rolling deploy whose
                # store raced a tick of the old definition, a Run now at the very tick):
                # skip those ticks, so that the schedule moves on.
                self._write_tick(db, d, due, token, plan, enqueued_checked=True)
        except DatabaseError as exc:
            if isinstance(exc, IntegrityError) or lock_not_available(exc):
                self._hold_off(d, exc)
                return
            raise
        except (InvalidTask, TypeError, ValueError) as exc:
            self._hold_off(d, exc)

    def _write_tick(
        self,
        db: str,
        d: Definition,
        due: datetime,
        token: str,
        plan: Plan,
        *,
        enqueued_checked: bool,
    ) -> None:
        with tick_transaction(db):
            won = Schedule.objects.using(db).filter(
                name=d.name,
                next_tick_at=due,
                definition_hash=token,
                enabled=True,
                removed_at=None,
            )
            if not won.update(next_tick_at=plan.next_tick_at):
                logger.debug(
                    "Schedule %s: tick %s taken by another scheduler (or the row changed)",
                    d.name,
                    due.isoformat(),
                    extra={"event": "schedule.tick_taken"},
                )
                return
            ticks = self._not_enqueued(db, d, plan.enqueue) if enqueued_checked else plan.enqueue
            self._enqueue(db, d, ticks, plan)

    def _not_enqueued(self, db: str, d: Definition, ticks: list[datetime]) -> list[datetime]:
        """`ticks` less those whose job is in the table already (on the backstop's index)."""
        jobs = Job.objects.using(db).filter(
            schedule_name=d.name, attempt=1, scheduled_for__in=ticks
        )
        found = {job.scheduled_for: job.pk for job in jobs.only("scheduled_for")}
        for tick in ticks:
            if tick in found:
                logger.info(
                    "Schedule %s: tick %s was enqueued already (job %s); moving on",
                    d.name,
                    tick.isoformat(),
                    found[tick],
                    extra={"event": "schedule.tick_enqueued_already"},
                )
        return [tick for tick in ticks if tick not in found]

    def _enqueue(self, db: str, d: Definition, ticks: list[datetime], plan: Plan) -> None:
        updates: dict[str, Any] = {}
        last = None
        if d.unique:  # its last tick's job, which a unique task's tick checks
            row = Schedule.objects.using(db).filter(name=d.name).values_list("last_result_id")
            last = next(iter(row), (None,))[0]
        for tick in ticks:
            job = enqueue_tick(db, d, tick, last_result_id=last)
            if job.deduplicated:
                logger.info(
                    "Schedule %s: tick %s skipped, job %s (its last run, or another with its "
                    "task's unique key) is still %s",
                    d.name,
                    tick.isoformat(),
                    job.pk,
                    job.state,
                    extra={"event": "schedule.tick_skipped"},
                )
                updates["skipped"] = F("skipped") + 1
                updates["last_skipped_at"] = tick
            else:
                logger.debug(
                    "Schedule %s: tick %s enqueued as job %s",
                    d.name,
                    tick,
                    job.pk,
                    extra={"event": "schedule.tick_enqueued"},
                )
                updates.update(last_tick_at=tick, last_result_id=job.result_id)
                last = job.result_id
        if plan.missed:
            logger.warning(
                "Schedule %s: %d tick(s) before %s not enqueued (catch_up=%s, max_lateness=%gs)",
                d.name,
                plan.missed,
                plan.next_tick_at.isoformat(),
                d.catch_up,
                d.max_lateness,
                extra={"event": "schedule.ticks_missed"},
            )
            updates["missed"] = F("missed") + plan.missed
        if updates:
            Schedule.objects.using(db).filter(name=d.name).update(**updates)

    def _hold_off(self, d: Definition, exc: BaseException) -> None:
        if lock_not_available(exc):
            self._hold[d.name] = time.monotonic() + 1.0  # another holds it: try again soon
            return
        logger.error(
            "%s: schedule %s could not enqueue its tick; retrying in %gs: %s",
            self.name,
            d.name,
            HOLD,
            exc,
            extra={"event": "schedule.tick_failed"},
        )
        self._hold[d.name] = time.monotonic() + HOLD

    def _fail(self, name: str, due: datetime, exc: BaseException) -> None:
        """A schedule's tick raised what no one expected: say which, and go on."""
        logger.error(
            "%s: schedule %s failed at its tick %s; the other schedules go on, and it is "
            "tried again in %gs: %s: %s",
            self.name,
            name,
            due.isoformat(),
            HOLD,
            type(exc).__name__,
            exc,
            exc_info=exc,
            extra={"event": "schedule.failed"},
        )
        self._hold[name] = time.monotonic() + HOLD
