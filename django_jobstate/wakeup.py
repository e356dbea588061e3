"""Wake idle workers when a job is enqueued: LISTEN/NOTIFY on PostgreSQL, polling elsewhere.

The notification is sent by the INSERT of enqueue (JobManager._insert) and by a retry
due at once, when their transaction commits. It is only a hint to claim now; a worker
that misses one (say, for a row inserted behind the app's back) still finds the job at
its next poll, so nothing depends on delivery. (Until migration 0003 a trigger on the
table sent it: the trigger cost about 6% of a single enqueue on PostgreSQL.)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import connections

logger = logging.getLogger("django_jobstate.worker")

CHANNEL = "django_jobstate"
# The SQL expression that wakes listening workers, once the transaction commits.
NOTIFY = f"pg_notify('{CHANNEL}', '')"


class Waiter:
    """Sleep until a job may be runnable: a notification, the poll interval, or a stop."""

    def __init__(self, stopping: threading.Event, using: str = "default") -> None:
        self.stopping = stopping
        self.using = using
        self._listener: Any = None

    def wait(self, timeout: float) -> None:
        if connections[self.using].vendor != "postgresql":
            self.stopping.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        try:
            listener = self._listen()
            # Short slices, so that a stop request is seen promptly.
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                for _ in listener.notifies(timeout=min(left, 0.5), stop_after=1):
                    return
        except Exception:  # psycopg errors: the server restarted, the network dropped
            logger.warning(
                "LISTEN connection lost; polling until it is back",
                exc_info=True,
                extra={"event": "wakeup.lost"},
            )
            self.close()
            self.stopping.wait(max(0.0, deadline - time.monotonic()))

    def _listen(self) -> Any:
        if self._listener is None:
            wrapper = connections[self.using]
            listener = wrapper.get_new_connection(wrapper.get_connection_params())
            listener.autocommit = True
            listener.execute(f'LISTEN "{CHANNEL}"')
            self._listener = listener
        return self._listener

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None
