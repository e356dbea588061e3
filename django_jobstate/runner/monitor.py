"""The supervisor's database work, in a thread of its own (supervisor.py).

The supervisor's main loop must never wait for the database: it kills workers at their
deadlines whatever the database does. So its monitor thread makes every database write of
the supervisor: heartbeats for its workers, the rescue of lost workers elsewhere
(liveness.py), cancel requests passed to its workers' ledgers (cancels.py), and the writes
the main loop hands over (settling a worker that ended, handing back held attempts), each
retried until the database takes it, if its error can pass (connection_lost()). An error
that cannot (a constraint, a trigger) would stop every write behind it for good: the write
is logged with its cause and dropped (an attempt the database refuses to fail as lost
fails with that refusal instead: Settle.fail_refused()).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ..states import FailureReason

if TYPE_CHECKING:
    from .supervisor import Supervisor

logger = logging.getLogger("django_jobstate.worker")


def release(worker_id: str, pks: list[int]) -> None:
    from ..models import Job

    Job.objects.release(worker_id, pks)


def settle(
    worker_id: str,
    started: set[int],
    reason: FailureReason,
    error: BaseException,
    timed_out: int | None,
) -> None:
    from ..models import Job, WorkerHeartbeat

    Job.objects.settle_ended(
        worker_id, started=started, reason=reason, error=error, timed_out=timed_out
    )
    WorkerHeartbeat.objects.forget(worker_id)


class Monitor(threading.Thread):
    """The supervisor's database work: heartbeats for its workers, rescue of lost workers
    elsewhere, and the writes the main loop hands over (settling a worker that ended,
    handing back held attempts), each retried until the database takes it."""

    def __init__(self, supervisor: Supervisor) -> None:
        super().__init__(name="jobstate-monitor", daemon=True)
        self.supervisor = supervisor
        self._pending: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._beat_now = False
        self._cancels_now = False

    def beat_soon(self) -> None:
        self._beat_now = True
        self._wake.set()

    def check_cancels_soon(self) -> None:
        self._cancels_now = True
        self._wake.set()

    def submit(self, write: Callable[[], None]) -> None:
        with self._lock:
            self._pending.append(write)
        self._wake.set()

    def written(self) -> bool:
        """Whether every write submitted so far is done (a write leaves the queue once it
        has been made)."""
        with self._lock:
            return not self._pending

    def run(self) -> None:
        from ..heartbeats import Process
        from ..managers import close_connection
        from .cancels import pass_cancel_requests
        from .liveness import Pulse

        pulse = Pulse(f"Supervisor {self.supervisor.base_id}")
        process = Process(
            supervisor=self.supervisor.base_id[:64],
            supervisor_pid=os.getpid(),
            concurrency=self.supervisor.concurrency,
            in_flight=self.supervisor.options.get("in_flight", 1),
        )
        interval = pulse.settings.HEARTBEAT_INTERVAL
        next_beat = time.monotonic()
        try:
            while True:
                self._write_pending(close_connection)
                if self._done.is_set() and not self._pending:
                    return
                beat = time.monotonic() >= next_beat or self._beat_now
                if beat:
                    self._beat_now = False
                    next_beat = time.monotonic() + interval
                    workers = self.supervisor.workers
                    pulse.beat(workers, self.supervisor.options.get("queues"), process)
                    pulse.rescue(list(workers))
                if beat or self._cancels_now:
                    self._cancels_now = False
                    pass_cancel_requests(self.supervisor.ledgers, pulse.name)
                self._wake.wait(max(0.0, next_beat - time.monotonic()))
                self._wake.clear()
        finally:
            close_connection()

    def _write_pending(self, close_connection: Callable[[], None]) -> None:
        from ..managers import connection_lost

        while self._pending:
            write = self._pending[0]
            try:
                write()
            except DatabaseError as exc:
                close_connection()
                if connection_lost(exc):
                    logger.warning(
                        "Database unavailable; will retry",
                        exc_info=True,
                        extra={"event": "supervisor.database_unavailable"},
                    )
                    self._done.wait(0.5)
                    return
                logger.error(  # it would fail again: retrying would hold up the rest
                    "The database refused a write of the supervisor, which would fail "
                    "again; dropped: %s",
                    exc,
                    exc_info=True,
                    extra={"event": "supervisor.write_refused"},
                )
            with self._lock:
                self._pending.pop(0)

    def finish(self) -> None:
        """Stop once the pending writes are done, or JOBSTATE_LOST_AFTER has passed."""
        from ..conf import get_settings

        self._done.set()
        self._wake.set()
        self.join(get_settings().LOST_AFTER)
        if self.is_alive():
            logger.error(
                "The database did not take the outcomes of ended workers; their attempts "
                "fail as lost once JOBSTATE_LOST_AFTER has passed",
                extra={"event": "supervisor.outcomes_unwritten"},
            )
