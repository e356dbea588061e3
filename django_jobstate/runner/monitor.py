"""The supervisor's database work, in a thread of its own (supervisor.py).

The supervisor's main loop must never wait for the database: it kills workers at their
deadlines whatever the database does. So its monitor thread makes the database work of
the supervisor: cancel requests passed to its workers' ledgers (cancels.py), and the
writes the main loop hands over (settling a worker that ended, handing back held
attempts), each retried until the database takes it, if its error can pass
(connection_lost()). Those may wait on a row lock; the heartbeats for its workers and the
rescue of lost workers elsewhere must not, so they come from threads of the monitor's own
(liveness.Heart, liveness.Judge). An error
that cannot (a constraint, a trigger) would stop every write behind it for good: the write
is logged with its cause and dropped (an attempt the database refuses to fail as lost
fails with that refusal instead: Settle.fail_refused()), and so is a write that raises
anything else (a bug); the thread itself outlives any exception, saying so in the log.
"""

from __future__ import annotations

import functools
import logging
import math
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

# A statement a worker sent before it died may still commit: a claim queued behind a lock
# on the job table (a migration's) commits once the lock is gone, for a worker already
# settled. The server ends a gone client's statement within receivers.CLIENT_CHECK_MS
# (PostgreSQL); this long after its settle, the worker's rows are looked at once more, and
# what it claimed then, never started, is handed back (not failed as lost).
SETTLE_AGAIN_AFTER = 1.5


def release(worker_id: str, pks: list[int]) -> None:
    from ..models import Job

    Job.objects.release(worker_id, pks)


class Monitor(threading.Thread):
    """The supervisor's database work: the writes the main loop hands over (settling a
    worker that ended, handing back held attempts), each retried until the database takes
    it; the heart that beats for its workers, and the judge that rescues lost workers
    elsewhere."""

    def __init__(self, supervisor: Supervisor) -> None:
        from ..heartbeats import Process
        from .liveness import Heart, Judge, Pulse

        super().__init__(name="jobstate-monitor", daemon=True)
        self.supervisor = supervisor
        self.pulse = Pulse(f"Supervisor {supervisor.base_id}")
        process = Process(
            supervisor=supervisor.base_id[:64],
            supervisor_pid=os.getpid(),
            concurrency=supervisor.concurrency,
            in_flight=supervisor.options.get("in_flight", 1),
        )
        self.heart = Heart(
            self.pulse,
            lambda: supervisor.workers,
            supervisor.options.get("queues"),
            process,
            vouching=self.is_alive,  # a monitor gone (a bug) settles nothing more
        )
        # Rescues from a thread of their own: not behind a write here that waits on a lock.
        self.judge = Judge(self.pulse, lambda: list(supervisor.workers))
        self._pending: list[Callable[[], None]] = []
        self._later: list[tuple[float, Callable[[], None]]] = []  # (monotonic time, write)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._cancels_now = False

    def beat_soon(self) -> None:
        self.heart.beat_soon()

    def settle(
        self,
        worker_id: str,
        started: set[int],
        reason: FailureReason,
        error: BaseException,
        timed_out: int | None,
        *,
        again_later: bool = True,
    ) -> None:
        """A write for submit() (the heart vouches for the worker until then): fail the
        attempts of a worker process that ended and hand back the rest; then, if it did
        not end on its own (`again_later`: killed, or stopped at a timeout), once more
        SETTLE_AGAIN_AFTER later for what it claimed as it died; then forget its row.
        Refused for good, its attempts are left to the rescue of lost workers."""
        from ..managers import connection_lost
        from ..models import Job

        again = False  # the write is made again once the database is back
        try:
            Job.objects.settle_ended(
                worker_id, started=started, reason=reason, error=error, timed_out=timed_out
            )
        except DatabaseError as exc:
            again = connection_lost(exc)
            raise
        finally:
            if not again and again_later:  # the same again, in case this one was refused
                late = functools.partial(
                    self.settle, worker_id, started, reason, error, timed_out, again_later=False
                )
                self.submit_later(SETTLE_AGAIN_AFTER, late)
            elif not again:
                self.heart.forget(worker_id)

    def check_cancels_soon(self) -> None:
        self._cancels_now = True
        self._wake.set()

    def submit(self, write: Callable[[], None]) -> None:
        with self._lock:
            self._pending.append(write)
        self._wake.set()

    def submit_later(self, delay: float, write: Callable[[], None]) -> None:
        """submit() `write` in `delay` seconds; at once when stopping (finish())."""
        with self._lock:
            if self._done.is_set():
                self._pending.append(write)
            else:
                self._later.append((time.monotonic() + delay, write))

    def _due(self) -> None:
        """Move the later writes that are due (all of them once stopping) to the queue."""
        until = math.inf if self._done.is_set() else time.monotonic()
        with self._lock:
            self._pending.extend(write for at, write in self._later if at <= until)
            self._later = [(at, write) for at, write in self._later if at > until]

    def _next_due(self) -> float:
        """When the next later write is due (math.inf: none is waiting)."""
        with self._lock:
            return min((at for at, _ in self._later), default=math.inf)

    def written(self) -> bool:
        """Whether every write submitted so far is done (a write leaves the queue once it
        has been made)."""
        with self._lock:
            return not self._pending

    def run(self) -> None:
        from ..managers import close_connection
        from .cancels import pass_cancel_requests

        self.heart.start()
        self.judge.start()
        interval = self.pulse.settings.HEARTBEAT_INTERVAL
        next_look = time.monotonic()  # at the cancel requests
        next_due = math.inf
        try:
            while True:
                try:
                    self._due()
                    self._write_pending(close_connection)
                    next_due = self._next_due()  # a settle just made may have added one
                    if self._done.is_set() and not self._pending and next_due == math.inf:
                        return
                    look = time.monotonic() >= next_look
                    if look:
                        next_look = time.monotonic() + interval
                    if look or self._cancels_now:
                        self._cancels_now = False
                        pass_cancel_requests(self.supervisor.ledgers, self.pulse.name)
                except Exception:
                    # A bug, or something no database error covers: ended here, the thread
                    # would leave every later settle and cancel undone until a restart.
                    # Said, and tried again at the next turn.
                    logger.exception(
                        "The supervisor's monitor failed; it goes on",
                        extra={"event": "supervisor.monitor_failed"},
                    )
                    close_connection()
                    self._done.wait(min(1.0, interval))
                self._wake.wait(max(0.0, min(next_look, next_due) - time.monotonic()))
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
            except Exception as exc:  # a bug: it too would fail again, and hold up the rest
                logger.error(
                    "A write of the supervisor failed; dropped: %r",
                    exc,
                    exc_info=True,
                    extra={"event": "supervisor.write_failed"},
                )
            with self._lock:
                self._pending.pop(0)

    def finish(self) -> None:
        """Stop once the pending writes are done, or JOBSTATE_LOST_AFTER has passed."""
        from ..conf import get_settings

        self._done.set()
        self._wake.set()
        self.join(get_settings().LOST_AFTER)
        self.judge.finish()
        self.heart.finish()
        if self.is_alive():
            logger.error(
                "The database did not take the outcomes of ended workers; their attempts "
                "fail as lost once JOBSTATE_LOST_AFTER has passed",
                extra={"event": "supervisor.outcomes_unwritten"},
            )
