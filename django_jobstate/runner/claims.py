"""How a worker claims: how many jobs at a time, and from where in claim order (a mixin
of Worker, worker.py; the claim itself is JobManager.claim, managers/claim.py)."""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from ..managers import ClaimKey, claim_key
from ..managers.queue_claim import limited_queues
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
# A worker claims from a key in claim order, not from the head of the queue, where the
# index entries of claimed rows pile up until VACUUM (see JobManager.claim), and longer
# while an old snapshot holds VACUUM back: a claim from the head walks all of them.
# - Draining a backlog (its claim filled the batch): from where its previous batch began.
#   When that finds nothing, the backlog is done: it looks from the head once.
# - Under continuous load (its claim took what there was): from the last job it claimed,
#   less LIVE_MARGIN seconds of run_after. A job's run_after is its INSERT's time, and a
#   transaction may commit after a later one: the margin finds the jobs of those.
#   Only where notifications announce what sorts before it (PostgreSQL), and not while a
#   queue it serves has limits; elsewhere the next claim looks from the head, as before.
#   A claim that finds nothing keeps the key, from the head as well.
# It claims from the head again RESCAN_AFTER seconds after it last did (an idle worker
# with a key wakes for it; after a look that found nothing, at its poll interval), and at
# once when a notification says that a job sorts before its key (each names its job's
# priority and run_after: a higher priority, a run_after given in the past, a transaction
# that committed late, a job made runnable in the place it kept). A job before the key
# that nothing announced waits until then. A worker of every queue claims a queue it
# hears of from its key.
RESCAN_AFTER = 1.0
LIVE_MARGIN = timedelta(seconds=1)


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
    _draining: bool
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
        key = self._from_key
        if self._waiter is not None:  # PostgreSQL: what the notifications said
            heard = self._waiter.take_heard()
            named = heard.queues - {""}  # "": of no known queue, sorts before every key
            if self.queues is None and not named <= set(self._queue_names):
                # Serving every queue: claim those it heard of too. The jobs announced are
                # after the key; any older ones of those queues wait for the rescan.
                self._queue_names = sorted(set(self._queue_names) | named)
            # A job that sorts before the key: look from the head now, not at the rescan.
            # Draining, a key's run_after is a job's, to which its batch's backlog came: a
            # job of its priority announced meanwhile waits for the backlog's end.
            if key is not None:
                at = -math.inf if self._draining else key[1].timestamp()
                if heard.ahead(-key[0], at):
                    key = None
        if time.monotonic() >= self._rescan_at:
            key = None
        try:
            if self._claim_in_doubt:
                self._release_unknown()
            jobs = self._claim_from(key, limit)
            # A backlog ended (or, in a --burst run, which exits when nothing is left):
            # look from the head before waiting.
            if not jobs and key is not None and (self._draining or self.burst):
                key = None
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
        # A full batch means a backlog: claim the next one from where this one began. A
        # claim that found nothing keeps a live key: what comes later sorts after it or
        # is announced (a worker that lost a job to another does not walk the head).
        self._draining = len(jobs) == limit
        if self._draining:
            self._from_key = claim_key(jobs[0])
        elif jobs:
            rank, run_after, _ = claim_key(jobs[-1])
            live = self._live_keys()
            self._from_key = (rank, run_after - LIVE_MARGIN, 0) if live else None
        elif self._from_key is not None and (
            self._from_key[2] != 0  # the backlog ended: its head look found nothing either
            or (key is None and not self._live_keys())  # its queues are limited now
        ):
            self._from_key = None
        elif key is None and self._from_key is not None:
            # Nothing anywhere: what comes next is announced, or waits for the poll
            # interval, as it would without a key (no rescan a second for an idle worker).
            self._rescan_at = time.monotonic() + max(RESCAN_AFTER, self.poll_interval)
        return jobs

    def _live_keys(self) -> bool:
        """Whether a key may outlive a claim that took what there was: only where
        notifications announce the jobs that sort before it (PostgreSQL; elsewhere the
        next claim looks from the head, as a job of a higher priority would wait for the
        rescan), and not while a queue it serves has limits (its jobs wait for a slot or a
        token in the place they kept, and nothing announces those)."""
        if self._waiter is None or not self._waiter.hears():
            return False
        queues = self.queues if self.queues is not None else self._queue_names
        try:
            return not limited_queues(self.db, list(queues))
        except DatabaseError:
            # Read after a claim that succeeded (a restart, a failover meanwhile): keep no
            # key, and let the next claim meet the outage, which it survives. Raised, it
            # ended the worker process, and the attempts it had just claimed and begun
            # were failed as lost (a torture run's outage).
            return False

    def look_again_in(self, last_look: float) -> float:
        """Seconds an idle worker waits for a notification before it claims again: its poll
        interval since `last_look`, and while it claims from a key, no later than its
        rescan (a job before the key that nothing announced waits at most that)."""
        at = last_look + self.poll_interval
        if self._from_key is not None:
            at = min(at, self._rescan_at)
        return max(0.0, at - time.monotonic())

    def _claim_from(self, from_key: ClaimKey | None, limit: int) -> list[Job]:
        queues = self.queues
        if queues is None:
            # Serving every queue: claim from those that had jobs when it last looked from
            # the head, and those it heard of since; a new queue's jobs that nothing
            # announced wait at most as long as a key's (RESCAN_AFTER).
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
