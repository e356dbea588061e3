"""Wake idle workers when a job is enqueued: LISTEN/NOTIFY on PostgreSQL, polling elsewhere.

The notification is sent by the INSERT of enqueue (JobManager._insert), by a retry due
at once and by the resume of a queue, when their transaction commits. Its payload is the
job's queue: a worker serving other queues does not wake (and claim) for it. A cancel
request sends its own notification, to the supervisor of the attempt's worker
(CANCEL_CHANNEL: the job's id). A notification is only a hint to act now; a worker
that misses one (say, for a row inserted behind the app's back) still finds the job at
its next poll, so nothing depends on delivery. (Until migration 0003 a trigger on the
table sent it: the trigger cost about 6% of a single enqueue on PostgreSQL.)

The payload also carries the job's priority, so that a worker draining a backlog, which
claims from where its last batch began (claim(from_key=...)), hears of a job that sorts
before that point between two batches and claims from the head again (ahead()).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from django.db import connections

logger = logging.getLogger("django_jobstate.worker")

CHANNEL = "django_jobstate"
# The SQL expression that wakes listening workers of the queue of the row an INSERT
# returns, once the transaction commits: "<queue> <priority>". NOTIFY_QUEUE takes them as
# parameters (queue_payload()).
NOTIFY = f"pg_notify('{CHANNEL}', \"queue_name\" || ' ' || \"priority\")"
NOTIFY_QUEUE = f"pg_notify('{CHANNEL}', %s)"
# The priority of a notification that is not about one job (a queue resumed): it sorts
# before every job, so that a draining worker looks from the head.
ANY_PRIORITY = 101


def queue_payload(queue: str, priority: int = ANY_PRIORITY) -> str:
    return f"{queue} {priority}"


def parse_payload(payload: str) -> tuple[str, int]:
    """The queue and priority of a notification (an unknown one: any queue, first)."""
    queue, _, priority = payload.rpartition(" ")
    try:
        return queue, int(priority)
    except ValueError:
        return "", ANY_PRIORITY


CANCEL_CHANNEL = "django_jobstate_cancel"
NOTIFY_CANCEL = f"pg_notify('{CANCEL_CHANNEL}', %s)"


class Waiter:
    """Sleep until a job may be runnable: a notification, the poll interval, or a stop."""

    def __init__(
        self,
        stopping: threading.Event,
        using: str = "default",
        queues: Iterable[str] | None = None,
        channel: str = CHANNEL,
    ) -> None:
        self.stopping = stopping
        self.using = using
        self.queues = None if queues is None else frozenset(queues)
        self.channel = channel
        self._listener: Any = None
        self.payloads: list[str] = []  # of the notifications that woke wait()

    def wait(self, timeout: float) -> None:
        if connections[self.using].vendor != "postgresql":
            self.stopping.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        try:
            listener = self._listen()
            # Short slices, so that a stop request is seen promptly.
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                for notify in listener.notifies(timeout=min(left, 0.5), stop_after=1):
                    # Another queue's job is not this worker's to claim: sleep on.
                    if self._ours(notify.payload):
                        self.payloads.append(notify.payload)
                        return
        except Exception:  # psycopg errors: the server restarted, the network dropped
            logger.warning(
                "LISTEN connection lost; polling until it is back",
                exc_info=True,
                extra={"event": "wakeup.lost"},
            )
            self.close()
            self.stopping.wait(max(0.0, deadline - time.monotonic()))

    def _ours(self, payload: str) -> bool:
        queue = parse_payload(payload)[0]
        return self.queues is None or queue in self.queues or not queue

    def start(self) -> None:
        """Listen now (PostgreSQL), so that ahead() hears of jobs while the worker is busy."""
        if connections[self.using].vendor == "postgresql":
            try:
                self._listen()
            except Exception:  # the database is away: wait() and ahead() try again
                self.close()

    def ahead(self, priority: int, queues: Iterable[str] | None = None) -> bool:
        """Whether, since the last look, a job of this worker's queues was enqueued with a
        priority above `priority`, or in a queue not in `queues` (when given). Does not
        wait; reads the notifications that arrived, and drops the rest."""
        if self._listener is None:
            return False
        known = None if queues is None else set(queues)
        found = False
        try:
            for notify in self._listener.notifies(timeout=0):
                queue, job_priority = parse_payload(notify.payload)
                if self._ours(notify.payload) and (
                    job_priority > priority or (known is not None and queue not in known)
                ):
                    found = True
        except Exception:  # the connection broke: wait() reconnects, or polls
            self.close()
        return found

    def heard(self) -> bool:
        """Whether, since the last look, a job of this worker's queues was enqueued (any
        priority). Does not wait."""
        return self.ahead(-ANY_PRIORITY)

    def _listen(self) -> Any:
        if self._listener is None:
            wrapper = connections[self.using]
            listener = wrapper.get_new_connection(wrapper.get_connection_params())
            listener.autocommit = True
            listener.execute(f'LISTEN "{self.channel}"')
            self._listener = listener
        return self._listener

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None
