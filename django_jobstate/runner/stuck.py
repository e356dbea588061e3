"""Why a running attempt may be stuck, before anyone has acted on it.

An attempt whose worker went silent stays `running` until a rescuer fails it as lost:
JOBSTATE_LOST_AFTER seconds after the worker's last heartbeat at the earliest, and later
when no `runjobs` has been up that long (after a restart, or with every worker gone). One
asked to cancel, or past its timeout, stays `running` until its supervisor stops it,
which a dead supervisor never does. Until then it looks like any running attempt.

These are marks for people (the job admin's list and page), never writes: settling such
attempts is the rescuer's and the supervisor's (managers/settle.py). They are judged by
the database clock, as the rescuer judges: `with_liveness()` reads it, and each row's
worker's last heartbeat, in the query that reads the rows, so a page of attempts costs no
query per row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db.models import OuterRef, QuerySet, Subquery

from ..conf import Settings, get_settings
from ..dbclock import Now
from ..states import State

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


@dataclass(frozen=True)
class Mark:
    """One reason to think an attempt is stuck.

    `since`: when the concern began (the worker's last heartbeat, the attempt's start, the
    cancel request, the deadline); `age`: how long ago that was, by the database clock;
    `limit`: the seconds the concern is measured against (silent_after(), the grace, the
    timeout).
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
    """`jobs`, each with `worker_last_seen` and `db_now` read in the same query."""
    from ..models import WorkerHeartbeat

    beats = WorkerHeartbeat.objects.filter(worker_id=OuterRef("worker_id"))
    return jobs.annotate(worker_last_seen=Subquery(beats.values("last_seen")[:1]), db_now=Now())


def why_stuck(job: Job) -> list[Mark]:
    """What marks `job` as possibly stuck; [] for a healthy or finished attempt.

    Reads the annotations of with_liveness(), or, for a job read without them, one query.
    """
    if job.state != State.RUNNING:
        return []
    if not hasattr(job, "db_now"):
        from ..models import Job

        job = with_liveness(Job.objects.filter(pk=job.pk, state=State.RUNNING)).first() or job
        if not hasattr(job, "db_now"):
            return []  # it finished meanwhile
    started = job.started_at
    if started is None:
        return []
    settings = get_settings()
    now: datetime = job.db_now
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
