"""The worker loop: claim runnable jobs, run each task, record the outcome.

Under `runjobs` each worker is a child process of a supervisor (supervisor.py), which
heartbeats for it and stops an attempt past its timeout by ending the whole process,
whatever the task is doing: the worker writes what it holds and starts to a ledger in
shared memory (ledger.py) that the supervisor reads. Run in-process, a worker has a
watchdog thread (watchdog.py) instead.

This module is the loop; claiming is claims.py, running an attempt attempts.py, writing
its outcome recording.py, and with --in-flight the loop is inflight.py's.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, TypeVar

from django.db import (
    router,
)

from ..conf import get_settings
from ..managers import ClaimKey
from ..models import Job
from ..tasksapi import Task
from ..telemetry.logs import job_fields
from .attempts import AttemptRunner
from .burst import BurstEnd
from .claims import MAX_BATCH, Claims
from .flushing import FLUSH_AFTER, Flusher
from .ledger import Ledger, ledger_size
from .recording import OutcomeWriter
from .wakeup import Waiter
from .watchdog import Watchdog

logger = logging.getLogger("django_jobstate.worker")
T = TypeVar("T")

# After a stop, the worker runs on the attempts of its batch for this long, then hands back
# those it has not started. Not at once: handing one back is a write of its own, and the
# rest of a batch of quick jobs takes less than writing that.
STOP_GRACE = 0.5


def default_worker_id() -> str:
    host = socket.gethostname()[:40]
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker(Claims, AttemptRunner, OutcomeWriter):
    """Runs jobs in this process until stopped, or until --burst/--max-jobs says so.

    Under a supervisor, `ledger` is shared with it and `parent` is its pid (the worker
    stops if it is gone). Without one, a watchdog thread heartbeats and fails an attempt
    past its timeout, which runs on (a thread cannot be killed) and has its late outcome
    refused.
    """

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        queues: Iterable[str] | None = None,
        poll_interval: float | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        max_batch: int = MAX_BATCH,
        in_flight: int = 1,
        ledger: Ledger | None = None,
        parent: int | None = None,
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.queues = None if queues is None else sorted(set(queues))
        self.poll_interval = (
            get_settings().POLL_INTERVAL if poll_interval is None else poll_interval
        )
        self.burst = burst
        self.max_jobs = max_jobs
        self.max_batch = max_batch
        self.in_flight = in_flight
        self.supervised = ledger is not None
        self.ledger = ledger or Ledger(
            multiprocessing.get_context("spawn"), ledger_size(max_batch, in_flight), in_flight
        )
        self.parent = parent
        self.jobs_done = 0
        self.unavailable = False  # a burst run that could not reach the database
        self.db = router.db_for_write(Job)  # the connection to close after an error
        self._stopping = threading.Event()
        self._tasks: dict[str, Task] = {}
        self._average_duration: float | None = None
        self._durations: dict[str, float] = {}
        # The successes of the batch in hand not yet written (one at a time; inflight.py
        # keeps its own).
        self.flusher = Flusher(self.record, self.db, FLUSH_AFTER)
        self._from_key: ClaimKey | None = None
        self._draining = False  # claims.py: its last claim filled its batch
        self._rescan_at = 0.0
        self._claim_in_doubt = False  # claims.py: a claim failed, rows may be ours unseen
        self.tracing: Any = None  # tracing.py, with JOBSTATE_TRACING
        if get_settings().TRACING:
            from ..telemetry import tracing

            self.tracing = tracing
        self._waiter: Waiter | None = None  # run()'s, for claim() to hear of jobs ahead
        self._queue_names: list[str] = []  # serving all queues: those seen with jobs
        self._burst_end = BurstEnd(self.worker_id, self.queues, self.db)

    def stop(self) -> None:
        """Finish the attempts in hand, claim no more."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def reached_max_jobs(self) -> bool:
        return self.max_jobs is not None and self.jobs_done >= self.max_jobs

    def run(self) -> None:
        queues = ", ".join(self.queues) if self.queues else "all queues"
        logger.info(
            "Worker %s started on %s",
            self.worker_id,
            queues,
            extra={"event": "worker.started", "worker_id": self.worker_id, "queues": self.queues},
        )
        watchdog = None if self.supervised else Watchdog(self)
        if watchdog:
            watchdog.beat()  # register; if the database is away, the next beat will
            watchdog.start()
        waiter = self._waiter = Waiter(self._stopping, using=self.db, queues=self.queues)
        waiter.start()
        try:
            if self.in_flight > 1:
                from .inflight import run_in_flight

                run_in_flight(self, waiter)
            while self.in_flight == 1 and not self.stopping and not self.reached_max_jobs:
                if self.orphaned():
                    break
                jobs = self.claim()
                if jobs:
                    self._run_batch(jobs)
                elif self.burst and self.burst_done():
                    break
                else:
                    waiter.wait(self.look_again_in(time.monotonic()))
        finally:
            self.flusher.close()
            waiter.close()
            if watchdog:
                watchdog.finish()
            logger.info(
                "Worker %s stopped after %d jobs",
                self.worker_id,
                self.jobs_done,
                extra={
                    "event": "worker.stopped",
                    "worker_id": self.worker_id,
                    "jobs_done": self.jobs_done,
                },
            )

    def orphaned(self) -> bool:
        """Whether its supervisor is gone (then it stops: nobody would stop an attempt
        at its deadline)."""
        if self.parent is None or os.getppid() == self.parent:
            return False
        if not self.stopping:
            logger.warning(
                "Worker %s lost its supervisor; stopping",
                self.worker_id,
                extra={"event": "worker.orphaned", "worker_id": self.worker_id},
            )
            self._stopping.set()
        return True

    def burst_done(self) -> bool:
        """After a claim that found nothing: whether a --burst run exits (burst.py)."""
        return self._burst_end.reached()

    def _run_batch(self, jobs: list[Job]) -> None:
        """Run every claimed job (they are in hand: a stop request waits for them)."""
        # An attempt past its timeout ends the process, and the attempts held behind it
        # are handed back: run the attempts with a timeout last, to hand back fewer.
        jobs = sorted(jobs, key=lambda job: job.timeout is not None)
        self.ledger.hold([job.pk for job in jobs])
        self.listen()
        checked, mine = time.monotonic(), {job.pk for job in jobs}
        stop_seen: float | None = None
        for index, job in enumerate(jobs):
            if self.stopping:
                # A stop waits for the rest of the batch STOP_GRACE at most, then hands back
                # what is not started: a batch is sized by what its bodies took before, and
                # jobs slower than those (or a loaded machine) can make it take seconds.
                stop_seen = stop_seen or time.monotonic()
                if time.monotonic() - stop_seen >= STOP_GRACE:
                    self.flusher.write()
                    self._hand_back([j.pk for j in jobs[index:] if j.pk in mine])
                    return
            if time.monotonic() - checked > get_settings().HEARTBEAT_INTERVAL:
                # This process may have been paused long enough to be taken for lost (its
                # heartbeats stop too): start only the attempts that are still its own.
                checked, mine = time.monotonic(), self._still_mine(jobs[index:])
            if job.pk not in mine:
                self.lost_race(
                    job,
                    "it was failed meanwhile (handed back by the supervisor, or "
                    "taken for lost while this worker was not heard from)",
                )
                continue
            if job.timeout is not None or self._may_keep_waiting(job):
                # A timeout ends the process; a long attempt would keep the successes held
                # unwritten (the flusher's thread would write them meanwhile: this way
                # the worker does, without a second connection). Write them first.
                self.flusher.write()
            if (outcome := self._execute(job, index)) is None:
                logger.info(
                    "Worker %s handed job %s back unstarted",
                    self.worker_id,
                    job.pk,
                    extra=job_fields(job, "job.handed_back"),
                )
                continue
            self.jobs_done += 1
            if outcome.error is None:
                self.flusher.add(outcome)
            else:
                self.flusher.write(outcome)  # a failure is written at once, with the rest
        self.flusher.write()

    def _hand_back(self, pks: list[int]) -> None:
        """Hand back held attempts it never started (fenced: one failed meanwhile stays so)."""
        if not pks:
            return
        released = self.retrying(lambda: Job.objects.release(self.worker_id, pks))
        logger.info(
            "Worker %s stopping: handed back %d attempt(s) it had not started",
            self.worker_id,
            released,
            extra={"event": "worker.released", "worker_id": self.worker_id, "jobs": pks},
        )

    def _may_keep_waiting(self, job: Job) -> bool:
        """Whether the successes held would wait past FLUSH_AFTER if `job` took as long
        as its task's attempts did (a task not seen yet may take long)."""
        waited = self.flusher.waited()
        return waited > 0 and waited + self._durations.get(job.task_path, FLUSH_AFTER) > FLUSH_AFTER

    def _still_mine(self, jobs: list[Job]) -> set[int]:
        mine = Job.objects.running().filter(worker_id=self.worker_id, pk__in=[j.pk for j in jobs])
        return set(self.retrying(lambda: set(mine.values_list("pk", flat=True))))

    def run_attempt(self, job: Job) -> None:
        """Run one claimed attempt and record its outcome, fenced by state and worker."""
        self.ledger.hold([job.pk])
        outcome = self._execute(job, 0)
        assert outcome is not None  # nobody shares this ledger
        self.record([outcome])
