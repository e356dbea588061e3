"""The watchdog thread beside each worker loop.

It heartbeats for its worker, fails the attempts of workers that stopped heartbeating
(any live worker does this, so a lost worker is rescued as long as one worker runs), and
fails the attempt in hand once it is past its timeout.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError, connection

from .conf import get_settings
from .exceptions import JobTimeout
from .models import Job, WorkerHeartbeat
from .states import FailureReason

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("django_jobstate.worker")


class Watchdog(threading.Thread):
    """Heartbeats for its worker, rescues lost workers' attempts, enforces timeouts."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name=f"jobstate-watchdog-{worker.worker_id}", daemon=True)
        self.worker = worker
        self.settings = get_settings()
        self._done = threading.Event()
        self._parent = os.getppid()

    def run(self) -> None:
        next_beat = time.monotonic() + self.settings.HEARTBEAT_INTERVAL
        try:
            while not self._done.wait(self._sleep(next_beat)):
                current = self.worker.current
                if current and current[1] is not None and time.monotonic() >= current[1]:
                    self.guarded(functools.partial(self._time_out, current[0]))
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.settings.HEARTBEAT_INTERVAL
                    self.guarded(self.beat)
                    self.guarded(self.rescue)
                    if os.getppid() != self._parent:
                        logger.warning("Worker %s lost its parent; stopping", self.worker.worker_id)
                        self.worker.stop()
        finally:
            connection.close()

    def _sleep(self, next_beat: float) -> float:
        wake = next_beat
        current = self.worker.current
        if current is not None and current[1] is not None:
            # Past the deadline already means the timeout write failed: retry twice a second.
            wake = min(wake, max(current[1], time.monotonic() + 0.5))
        return max(0.01, wake - time.monotonic())

    def guarded(self, action: Callable[[], object]) -> None:  # a DB outage must not end it
        try:
            action()
        except DatabaseError:
            logger.exception("Worker %s: database unavailable; will retry", self.worker.worker_id)
            connection.close()

    def beat(self) -> None:
        WorkerHeartbeat.objects.beat(
            self.worker.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=self.worker.queues,
        )

    def rescue(self) -> None:
        Job.objects.rescue_lost(self.settings.LOST_AFTER)
        WorkerHeartbeat.objects.forget_lost(self.settings.LOST_AFTER)

    def _time_out(self, job: Job) -> None:
        error = JobTimeout(f"the attempt ran past its timeout of {job.timeout:g} seconds")
        failed = Job.objects.fail_running(
            self.worker.worker_id, FailureReason.TIMEOUT, error, pk=job.pk
        )
        # Only now: if the write failed (the database is away), the next wake tries again.
        self.worker.current = None
        if failed and self.worker.on_timeout is not None:
            self.worker.on_timeout(job)

    def finish(self) -> None:
        self._done.set()
        self.join()
        self.guarded(lambda: WorkerHeartbeat.objects.forget(self.worker.worker_id))
