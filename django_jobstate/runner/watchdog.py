"""The watchdog thread beside a worker that runs in this process (`Worker.run()`).

Under `runjobs` the supervisor does this job from its own process (supervisor.py), which
a task that holds the interpreter cannot silence; a worker run in-process (tests, an
embedding program) has only threads. The watchdog rescues the attempts of lost workers
(liveness.py), passes cancel requests to the worker's ledger every beat interval
(cancels.py), and fails the attempt in hand once it is past its timeout (or its cancel
grace); its heart thread beats (liveness.Heart), so that none of those writes, waiting
on a row lock, holds up a beat. A thread cannot stop the task: it runs on, and its late
outcome is refused.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from ..heartbeats import Process
from ..managers import close_connection, connection_lost
from ..models import Job, WorkerHeartbeat
from .cancels import pass_cancel_requests
from .liveness import Heart, Pulse

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("django_jobstate.worker")


class Watchdog(threading.Thread):
    """Heartbeats for its worker, rescues lost workers' attempts, fails overdue attempts."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name=f"jobstate-watchdog-{worker.worker_id}", daemon=True)
        self.worker = worker
        # A worker run inside a caller's transaction (a Django TestCase's, say) registers in
        # it: its heartbeat row is that transaction's, seen by no one else until it
        # commits. The heart's own connection would wait on that row until then, and the
        # worker waits for its threads at its end: it beats only from the worker's thread
        # (the heart is not started).
        self.in_callers_transaction = connections[worker.db].in_atomic_block
        self.pulse = Pulse(f"Worker {worker.worker_id}")
        process = Process(in_flight=worker.in_flight)
        self.heart = Heart(
            self.pulse, lambda: {worker.worker_id: os.getpid()}, worker.queues, process
        )
        self._done = threading.Event()
        self._overdue: list[int] = []  # attempts past their deadline, not yet failed

    def run(self) -> None:
        interval = self.pulse.settings.HEARTBEAT_INTERVAL
        next_rescue = time.monotonic() + interval
        if not self.in_callers_transaction:
            self.heart.start()
        try:
            while not self._done.is_set():
                now = time.monotonic()
                if (pk := self.worker.ledger.overdue(now)) is not None:
                    self._overdue.append(pk)
                self._time_out()
                if now >= next_rescue:
                    next_rescue = now + interval
                    self.pulse.rescue([self.worker.worker_id])
                    ledgers = {self.worker.worker_id: self.worker.ledger}
                    pass_cancel_requests(ledgers, self.pulse.name)
                # Twice a second while an overdue write waits for the database.
                wake = min(next_rescue, self.worker.ledger.next_deadline())
                if self._overdue:
                    wake = min(wake, now + 0.5)
                self._done.wait(max(0.01, wake - time.monotonic()))
        finally:
            close_connection()

    def beat(self) -> None:
        """Register the worker, from the worker's thread (before start())."""
        self.pulse.beat(self.heart.workers(), self.heart.queues, self.heart.process)

    def _time_out(self) -> None:
        for pk in list(self._overdue):
            try:
                Job.objects.time_out(self.worker.worker_id, pk)
            except DatabaseError as exc:
                if not connection_lost(exc):  # it would fail again: do not hold up the rest
                    logger.error(
                        "Worker %s: could not fail job %s as timed out, and would not on "
                        "a retry: %s",
                        self.worker.worker_id,
                        pk,
                        exc,
                        exc_info=True,
                        extra={"event": "job.write_refused", "job_id": pk},
                    )
                    self._overdue.remove(pk)
                    continue
                logger.warning(
                    "Worker %s: database unavailable; will fail job %s as timed out later",
                    self.worker.worker_id,
                    pk,
                    exc_info=True,
                    extra={"event": "database.unavailable", "job_id": pk},
                )
                close_connection()
                return
            self._overdue.remove(pk)

    def finish(self) -> None:
        self._done.set()
        self.join()
        if self.heart.is_alive():  # it alone writes the row: after any beat it began
            self.heart.forget(self.worker.worker_id)
            self.heart.finish()
            return
        try:
            WorkerHeartbeat.objects.forget(self.worker.worker_id)
        except DatabaseError:
            close_connection()  # its row is forgotten as lost later
