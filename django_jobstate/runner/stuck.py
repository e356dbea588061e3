"""Why a live attempt may be stuck, before anyone has acted on it.

An attempt whose worker went silent stays `running` until a rescuer fails it as lost:
JOBSTATE_LOST_AFTER seconds after the worker's last heartbeat at the earliest, and later
when no `runjobs` has been up that long (after a restart, or with every worker gone). One
asked to cancel, or past its timeout, stays `running` until its supervisor stops it,
which a dead supervisor never does. Until then it looks like any running attempt. A
queued attempt of a paused queue (queues.py) waits until someone resumes it, however due.
One held by a concurrency limit (limits/) is not stuck: it waits for a slot of its key.

These are marks for people (the job admin's list and page), never writes: settling such
attempts is the rescuer's and the supervisor's (managers/settle.py). They are judged by
the database clock, as the rescuer judges: `with_liveness()` reads it, and each row's
worker's last heartbeat, in the query that reads the rows, so a page of attempts costs no
query per row. `stuck()` finds them the same way, in the WHERE clause of one query: running
rows from the index of running rows, queued ones from the claim's index.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, Exists, F, Func, OuterRef, Q, QuerySet, Subquery
from django.db.models.sql.compiler import SQLCompiler

from ..conf import Settings, get_settings
from ..db.clock import Now
from ..states import LIVE_STATES, State

if TYPE_CHECKING:
    from ..models import Job

# A worker that missed this many heartbeats in a row is silent: one late beat is a busy
# database, three are a worker in trouble (the rescuer waits for JOBSTATE_LOST_AFTER).
SILENT_BEATS = 3


class Concern(enum.StrEnum):
    SILENT = "silent"  # its worker's last heartbeat is older than silent_after()
    UNSEEN = "unseen"  # its worker has no heartbeat at all (never beat, or forgotten)
    CANCEL_OVERDUE = "cancel_overdue"  # asked to cancel longer than JOBSTATE_CANCEL_GRACE ago
    PAST_TIMEOUT = "past_timeout"  # running longer than its task's timeout
    QUEUE_PAUSED = "queue_paused"  # queued in a paused queue: no worker claims it


@dataclass(frozen=True)
class Mark:
    """One reason to think an attempt is stuck.

    `since`: when the concern began (the worker's last heartbeat, the attempt's start, the
    cancel request, the deadline); `age`: how long ago that was, by the database clock;
    `limit`: the seconds the concern is measured against (silent_after(), the grace, the
    timeout; 0 for a paused queue, which has no limit).
    """

    concern: Concern
    since: datetime
    age: timedelta
    limit: float


def silent_after(settings: Settings | None = None) -> float:
    """Seconds without a heartbeat after which a worker is marked silent."""
    settings = settings or get_settings()
    return min(SILENT_BEATS * settings.HEARTBEAT_INTERVAL, settings.LOST_AFTER)


def with_liveness(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """`jobs`, each with `worker_last_seen`, `queue_paused_at` and `db_now` read in the
    same query."""
    from ..models import JobQueue, WorkerHeartbeat

    beats = WorkerHeartbeat.objects.filter(worker_id=OuterRef("worker_id"))
    queue = JobQueue.objects.filter(name=OuterRef("queue_name"))
    return jobs.annotate(
        worker_last_seen=Subquery(beats.values("last_seen")[:1]),
        queue_paused_at=Subquery(queue.values("paused_at")[:1]),
        db_now=Now(),
    )


class PastTimeout(Func):
    """True for a row whose started_at plus its timeout (seconds, a float) is before the
    database clock. Each database adds seconds to a time its own way, and Django's
    duration arithmetic cannot multiply a float column into an interval on SQLite."""

    output_field = BooleanField()

    def __init__(self) -> None:
        super().__init__(F("started_at"), F("timeout"))

    def as_sql(  # type: ignore[override]
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any
    ) -> tuple[str, list[Any]]:
        started, timeout = self.get_source_expressions()
        started_sql, started_params = compiler.compile(started)
        timeout_sql, timeout_params = compiler.compile(timeout)
        if connection.vendor == "postgresql":
            sql = f"{started_sql} + {timeout_sql} * INTERVAL '1 second' < STATEMENT_TIMESTAMP()"
        elif connection.vendor == "mysql":  # UTC, as db.clock.Now
            sql = (
                f"{started_sql} + INTERVAL ROUND({timeout_sql} * 1000000) MICROSECOND "
                f"< UTC_TIMESTAMP(6)"
            )
        else:  # SQLite keeps UTC times as text, which julianday() reads
            sql = f"julianday({started_sql}) + {timeout_sql} / 86400.0 < julianday('now')"
        return f"({sql})", [*started_params, *timeout_params]


def stuck(concern: Concern, settings: Settings | None = None) -> Q:
    """The condition, for a filter() of jobs, that why_stuck() would mark with `concern`
    (SILENT also finds UNSEEN), judged by the database clock."""
    from ..models import JobQueue, WorkerHeartbeat

    settings = settings or get_settings()
    if concern == Concern.QUEUE_PAUSED:
        # Not a job held by a concurrency limit: it waits for a slot first (limits/concurrency.py).
        paused = JobQueue.objects.paused().values("name")
        return Q(state=State.QUEUED, hold=None, queue_name__in=paused)
    if concern in (Concern.SILENT, Concern.UNSEEN):
        since = Now() - timedelta(seconds=silent_after(settings))
        beats = WorkerHeartbeat.objects.filter(worker_id=OuterRef("worker_id"))
        silent = Q(Exists(beats.filter(last_seen__lt=since)))
        unseen = ~Q(Exists(beats)) & Q(started_at__lt=since)
        return Q(state=State.RUNNING) & (silent | unseen)
    if concern == Concern.CANCEL_OVERDUE:
        grace = timedelta(seconds=settings.CANCEL_GRACE)
        return Q(state=State.RUNNING, cancel_requested_at__lt=Now() - grace)
    return Q(state=State.RUNNING, timeout__isnull=False) & Q(PastTimeout())


def why_stuck(job: Job) -> list[Mark]:
    """What marks `job` as possibly stuck; [] for a healthy or finished attempt.

    Reads the annotations of with_liveness(), or, for a job read without them, one query.
    """
    if job.state not in LIVE_STATES:
        return []
    if not hasattr(job, "db_now"):
        from ..models import Job

        fresh = with_liveness(Job.objects.filter(pk=job.pk, state=job.state)).first()
        if fresh is None:
            return []  # it moved on meanwhile
        job = fresh
    now: datetime = job.db_now  # type: ignore[attr-defined]
    if job.state == State.QUEUED:
        paused_at: datetime | None = job.queue_paused_at  # type: ignore[attr-defined]
        if paused_at is None or job.hold:  # held: waits for a slot (admin/holds.py)
            return []
        return [Mark(Concern.QUEUE_PAUSED, paused_at, max(now - paused_at, timedelta()), 0.0)]
    started = job.started_at
    if started is None:
        return []
    settings = get_settings()
    last_seen: datetime | None = job.worker_last_seen  # type: ignore[attr-defined]
    marks = []
    silent = silent_after(settings)
    if last_seen is not None and now - last_seen > timedelta(seconds=silent):
        marks.append(Mark(Concern.SILENT, last_seen, now - last_seen, silent))
    elif last_seen is None and now - started > timedelta(seconds=silent):
        marks.append(Mark(Concern.UNSEEN, started, now - started, silent))
    grace = settings.CANCEL_GRACE
    asked = job.cancel_requested_at
    if asked is not None and now - asked > timedelta(seconds=grace):
        marks.append(Mark(Concern.CANCEL_OVERDUE, asked, now - asked, grace))
    if job.timeout is not None:
        deadline = started + timedelta(seconds=job.timeout)
        if now > deadline:
            marks.append(Mark(Concern.PAST_TIMEOUT, deadline, now - deadline, job.timeout))
    return marks
