"""The scheduler thread of each runjobs supervisor: runs a Scheduler (scheduler.py) until
stopped, sleeping until its next tick may be due, or until woken: on PostgreSQL the
supervisor's relay (runner/relay.py) wakes it when a schedule is made or changed in the
admin (edits.py), so that it reads the schedules at once."""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError

from .scheduler import HOLD, Scheduler

logger = logging.getLogger("django_jobstate.scheduler")


class SchedulerThread(threading.Thread):
    """Runs a Scheduler until stop(); a database error is logged and retried."""

    def __init__(self, name: str) -> None:
        super().__init__(name="jobstate-scheduler", daemon=True)
        self.scheduler_name = self.name_ = name
        self._stopping = False
        self._wakeup = threading.Event()  # stop() or wake(): read the schedules now

    def run(self) -> None:
        from ..managers import close_connection

        failures = 0
        scheduler = None
        try:
            while not self._stopping:
                # Cleared before the read: a wake() during it is not lost.
                self._wakeup.clear()
                try:
                    scheduler = scheduler or Scheduler(self.scheduler_name)
                    wait = scheduler.run_once()
                    failures = 0
                except DatabaseError as exc:
                    failures += 1
                    logger.warning(
                        "%s: database unavailable (%s); will retry",
                        self.name_,
                        exc,
                        extra={"event": "scheduler.database_unavailable"},
                    )
                    close_connection()
                    wait = min(0.25 * 2**failures, 5.0)
                except Exception:  # a bug must not stop every schedule for good
                    logger.exception(
                        "%s: the scheduler failed; will retry",
                        self.name_,
                        extra={"event": "scheduler.failed"},
                    )
                    wait = HOLD
                self._wakeup.wait(wait)
        finally:
            close_connection()

    def wake(self) -> None:
        """Read the schedules now (one was made or changed in the admin)."""
        self._wakeup.set()

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self.join(10)
