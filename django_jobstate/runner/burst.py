"""When a --burst run is done: no job it can claim, and none due soon.

A claim that finds nothing does not mean that no job is runnable. On PostgreSQL the
claim passes over rows another transaction has locked (SKIP LOCKED): a
`select_for_update()` in the application, an admin action, another worker's claim in
flight. The last of these holds its rows for one statement, then runs them; the others
may hold theirs for as long as they like. So a runnable job that no claim could take for
LOCKED_GRACE seconds is taken as locked: the run exits without it, and says so in its
log. A job not yet runnable but due within BURST_HORIZON seconds (a retry waiting for a
short backoff) is waited for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta

from django.db import DatabaseError, connections

from ..db.clock import Now
from ..limits.concurrency import Hold
from ..models import Job, JobQueue

logger = logging.getLogger("django_jobstate.worker")

# A --burst run exits once no job is runnable and none is due within this many seconds.
BURST_HORIZON = 10.0
# ... and takes a runnable job that its claims passed over for this long as locked by
# another transaction: far longer than a claim statement, which only locks for its own
# duration (and whose jobs are then running, not runnable).
LOCKED_GRACE = 2.0
# The runnable jobs looked at (and named in the log) at most.
LOCKED_LISTED = 100


class BurstEnd:
    """Tells a --burst worker, after a claim that found nothing, whether to exit."""

    def __init__(self, worker_id: str, queues: Sequence[str] | None, db: str) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self.db = db
        self._passed_over: dict[int, float] = {}  # runnable job id -> first seen unclaimed

    def reached(self) -> bool:
        """Whether nothing is left to claim now or within BURST_HORIZON (call it after a
        claim that found nothing: the runnable jobs it sees were passed over)."""
        paused = JobQueue.objects.paused().values("name")
        # Not those a concurrency limit holds (out of the runnable index, which serves
        # this): a finish releases them, and a run waits for the finishes it runs.
        jobs = (
            Job.objects.queued()
            .filter(hold=None)
            .for_queues(self.queues)
            .exclude(queue_name__in=paused)
        )
        runnable = Job.objects.runnable(self.queues).order_by("-priority", "run_after", "pk")
        later = jobs.filter(
            run_after__gt=Now(), run_after__lte=Now() + timedelta(seconds=BURST_HORIZON)
        )
        # Due jobs of rate-limited tasks (limits/rates.py): they start as their rate allows.
        rated = (
            Job.objects.queued()
            .filter(hold=Hold.RATE, run_after__lte=Now() + timedelta(seconds=BURST_HORIZON))
            .for_queues(self.queues)
            .exclude(queue_name__in=paused)
        )
        try:
            # `later` first: a job that falls due between the two reads is then runnable
            # in the second (the other order would miss it in both, and exit before it).
            due_later = later.exists() or rated.exists()
            ids = list(runnable.values_list("pk", flat=True)[:LOCKED_LISTED])
        except DatabaseError:
            connections[self.db].close()
            return False  # the next claim says what is wrong
        now = time.monotonic()
        # A job seen again keeps the time it was first passed over; one claimed, finished
        # or cancelled meanwhile is forgotten. One seen for the first time may have fallen
        # due (or been enqueued) after the claim that found nothing: only the next claim
        # can pass it over, so it never counts as locked yet (whatever LOCKED_GRACE).
        seen_before, self._passed_over = self._passed_over, {}
        for pk in ids:
            self._passed_over[pk] = seen_before.get(pk, now)
        new = any(pk not in seen_before for pk in ids)
        if due_later or new or any(now - t < LOCKED_GRACE for t in self._passed_over.values()):
            return False
        if ids:
            logger.warning(
                "Worker %s leaves %s runnable job(s) that no claim could take for %g s: "
                "another transaction holds them locked (SKIP LOCKED passes them over): %s",
                self.worker_id,
                f"at least {len(ids)}" if len(ids) == LOCKED_LISTED else len(ids),
                LOCKED_GRACE,
                ", ".join(map(str, ids)),
                extra={
                    "event": "worker.skipped_locked",
                    "worker_id": self.worker_id,
                    "job_ids": ids,
                },
            )
        return True
