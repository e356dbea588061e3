"""How a worker claims: how many jobs at a time, and from where in claim order (a mixin
of Worker, worker.py; the claim itself is JobManager.claim, managers/claim.py)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from ..managers import ClaimKey, claim_key
from ..models import Job
from ..telemetry import metrics
from .wakeup import Waiter

if TYPE_CHECKING:
    from .flushing import Flusher
    from .ledger import Ledger

logger = logging.getLogger("django_jobstate.worker")

# Batches: a worker claims as many jobs as it expects to run in BATCH_WINDOW seconds (one
# at a time until it has seen how long jobs take), and writes successes together at most
# flushing.FLUSH_AFTER seconds after the first of them finished, whatever the batch holds.
# Both bound what a crash costs: claimed jobs not yet run are handed back (fail as lost
# if the whole host died), and finished jobs not yet written fail as lost.
BATCH_WINDOW = 0.05
MAX_BATCH = 100
# While draining a backlog, a worker claims from where its previous batch began, not from
# the head of the queue, where the index entries of claimed rows pile up until VACUUM
# (see JobManager.claim). It claims from the head again after RESCAN_AFTER seconds, and
# whenever the claim from its key finds nothing: a job that claim order puts before that
# key (a higher priority enqueued meanwhile, a run_after in the past) waits at most that.
RESCAN_AFTER = 1.0


def drop_broken_connections() -> None:
    """Before a claim: close this thread's connections that are broken, or older than a
    CONN_MAX_AGE above 0. Not those of Django's default CONN_MAX_AGE=0, as
    close_old_connections() would: a busy worker would connect again for every claim (a
    new server process on PostgreSQL, a few ms: more than a claim of a few jobs costs).
    A worker holds its connection, idle or not, as it did between two claims before."""
    for connection in connections.all(initialized_only=True):
        if connection.settings_dict["CONN_MAX_AGE"] != 0 or connection.errors_occurred:
            connection.close_if_unusable_or_obsolete()


class Claims:
    """Worker's claims; the attributes are Worker's."""

    worker_id: str
    queues: list[str] | None
    poll_interval: float
    burst: bool
    max_jobs: int | None
    max_batch: int
    in_flight: int
    jobs_done: int
    unavailable: bool
    db: str
    _stopping: threading.Event
    _average_duration: float | None
    _from_key: ClaimKey | None
    _rescan_at: float
    _waiter: Waiter | None
    _queue_names: list[str]
    _claim_in_doubt: bool
    flusher: Flusher
    ledger: Ledger

    def claim_limit(self, in_flight: int = 0) -> int:
        """How many jobs to claim next: one at a time, as many as run in BATCH_WINDOW
        seconds; with --in-flight, a batch (the caller caps it to its free places). Never
        more than --max-jobs leaves, counting the `in_flight` attempts not yet done."""
        size = self.max_batch
        if self.in_flight == 1:
            if self._average_duration is None:
                size = 1
            elif self._average_duration > 0:
                size = min(size, max(1, int(BATCH_WINDOW / self._average_duration)))
        if self.max_jobs is not None:
            size = min(size, self.max_jobs - self.jobs_done - in_flight)
        return size

    def claim(self, limit: int | None = None) -> list[Job]:
        limit = self.claim_limit() if limit is None else limit
        connection = connections[self.db]
        if not connection.in_atomic_block:
            drop_broken_connections()
        if time.monotonic() >= self._rescan_at:
            self._from_key = None
        elif self._from_key is not None and self._waiter is not None:
            # A job enqueued since that sorts before the key (PostgreSQL only): look from
            # the head now, not at the rescan.
            known = None if self.queues is not None else self._queue_names
            if self._waiter.ahead(-self._from_key[0], known):
                self._from_key = None
        try:
            if self._claim_in_doubt:
                self._release_unknown()
            jobs = self._claim_from(self._from_key, limit)
            if not jobs and self._from_key is not None:  # never idle without a look from the head
                jobs = self._claim_from(None, limit)
        except DatabaseError:
            # The connection may have dropped after the claim committed (the server
            # restarting as it replied): then rows are running in this worker's name that it
            # never received, and, as it stays alive, nobody would ever fail them as lost.
            self._claim_in_doubt = True
            connection.close()
            if self.burst:  # "nothing runnable" is not known: say so, do not exit as done
                logger.exception(
                    "Worker %s could not claim jobs; stopping",
                    self.worker_id,
                    extra={"event": "worker.claim_failed", "worker_id": self.worker_id},
                )
                self.unavailable = True
                self._stopping.set()
                return []
            logger.exception(
                "Worker %s could not claim jobs; retrying",
                self.worker_id,
                extra={"event": "worker.claim_failed", "worker_id": self.worker_id},
            )
            self._stopping.wait(self.poll_interval)
            return []
        if jobs:
            logger.debug(
                "Worker %s claimed %d job(s) of %d asked",
                self.worker_id,
                len(jobs),
                limit,
                extra={"event": "worker.claimed", "worker_id": self.worker_id, "count": len(jobs)},
            )
            if metrics.recorder is not None:
                metrics.recorder.claimed(jobs)
        # A full batch means a backlog: claim the next one from where this one began.
        self._from_key = claim_key(jobs[0]) if len(jobs) == limit else None
        return jobs

    def _claim_from(self, from_key: ClaimKey | None, limit: int) -> list[Job]:
        queues = self.queues
        if queues is None:
            # Serving every queue: claim from those that had jobs when it last looked from
            # the head; a new queue's jobs wait at most as long as a key's (RESCAN_AFTER).
            if from_key is None:
                self._queue_names = Job.objects.queue_names()
            queues = self._queue_names
        jobs = Job.objects.claim(self.worker_id, queues=queues, limit=limit, from_key=from_key)
        if from_key is None:
            self._rescan_at = time.monotonic() + RESCAN_AFTER
        return jobs

    def _release_unknown(self) -> None:
        """After a claim whose outcome is unknown: hand back the attempts running in this
        worker's name that it does not hold (claimed, never received, never started)."""
        self.flusher.write()  # outcomes in hand, written: their rows no longer run
        known = self.ledger.pks()
        mine = Job.objects.running().filter(worker_id=self.worker_id)
        unknown = [pk for pk in mine.values_list("pk", flat=True) if pk not in known]
        if unknown and Job.objects.release(self.worker_id, unknown):
            logger.warning(
                "Worker %s handed back %d attempt(s) of a claim whose reply it lost: %s",
                self.worker_id,
                len(unknown),
                ", ".join(map(str, unknown)),
                extra={"event": "worker.released_unknown", "worker_id": self.worker_id},
            )
        self._claim_in_doubt = False
