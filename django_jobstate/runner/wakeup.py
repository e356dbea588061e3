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

Who listens: a worker run in-process opens its own LISTEN connection. Under `runjobs`
the supervisor holds the one LISTEN connection of all its worker processes (relay.py)
and passes each payload on through a pipe per worker, which that worker's Waiter reads
(its Inbox): one listener per supervisor, not one per worker. JOBSTATE_LISTEN_DATABASE
names the database alias the listener connects with (a direct connection, when the
jobs' alias goes through PgBouncer in transaction mode).
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from django.db import connections

from ..conf import get_settings
from ..db.notify import CHANNEL, parse_payload, serves

logger = logging.getLogger("django_jobstate.worker")


def listen(using: str, *channels: str) -> Any:
    """A new psycopg connection, autocommit, that LISTENs to `channels`: made with the
    settings of JOBSTATE_LISTEN_DATABASE if set, else of `using` (the jobs' alias)."""
    wrapper = connections[get_settings().LISTEN_DATABASE or using]
    listener = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        listener.autocommit = True
        for channel in channels:
            listener.execute(f'LISTEN "{channel}"')
    except BaseException:
        listener.close()
        raise
    return listener


class Inbox:
    """The read end of a supervised worker's pipe from its supervisor's relay (relay.py):
    payloads, each followed by a NUL byte (a payload is PostgreSQL text, which has none).
    For one thread at a time, like the Waiter that reads it."""

    def __init__(self, reader: Connection) -> None:
        self.reader = reader  # kept: its fd closes with it
        self.fd = reader.fileno()
        os.set_blocking(self.fd, False)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self.closed = False  # the supervisor's end closed: it is gone
        self._partial = b""

    def receive(self, timeout: float) -> list[str]:
        """The payloads that arrived, waiting up to `timeout` seconds for the first."""
        if self.closed:
            return []
        if timeout > 0:
            self._poll.poll(timeout * 1000)
        data = self._partial
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                self.closed = True
                break
            data += chunk
        *payloads, self._partial = data.split(b"\0")
        return [payload.decode(errors="replace") for payload in payloads]


# The inbox of this process, if it is a worker process of a supervisor (run_child()
# installs it): every Waiter of the jobs' channel in this process reads it.
_inbox: Inbox | None = None


def receive_from(reader: Connection) -> None:
    """Have this process's Waiters hear wake-ups from the supervisor's relay, through
    `reader`, instead of each opening a LISTEN connection."""
    global _inbox
    _inbox = Inbox(reader)


@dataclass
class Heard:
    """What notifications said since a worker last looked: the first in claim order of
    the jobs they announced, (-priority, seconds of run_after), and their queues."""

    first: tuple[int, float] | None = None
    queues: set[str] = field(default_factory=set)

    def note(self, payload: str) -> None:
        queue, priority, at = parse_payload(payload)
        self.queues.add(queue)
        if self.first is None or (-priority, at) < self.first:
            self.first = (-priority, at)

    def ahead(
        self, priority: int, at: float = -math.inf, queues: Iterable[str] | None = None
    ) -> bool:
        """Whether a job was heard of that sorts before a claim key of `priority` and a
        run_after of `at` seconds (-inf: a higher priority only), or of a queue not in
        `queues` (when given). A job whose run_after was not said sorts first in its
        priority."""
        return (self.first is not None and self.first < (-priority, at)) or (
            queues is not None and not self.queues <= set(queues)
        )


class Waiter:
    """Sleep until a job may be runnable: a notification, the poll interval, or a stop.

    It hears of jobs from its own LISTEN connection, or, in a worker process of a
    supervisor, from the supervisor's relay (its inbox). Either way a notification is a
    hint: a lost connection or a full pipe leaves the worker to its poll interval.
    """

    def __init__(
        self,
        stopping: threading.Event,
        using: str = "default",
        queues: Iterable[str] | None = None,
        channel: str = CHANNEL,
        inbox: Inbox | None = None,
    ) -> None:
        self.stopping = stopping
        self.using = using
        self.queues = None if queues is None else frozenset(queues)
        self.channel = channel
        self.inbox = inbox if inbox is not None else _inbox if channel == CHANNEL else None
        self._listener: Any = None
        self._pending: deque[str] = deque()  # received, not looked at yet
        self.payloads: list[str] = []  # of the notifications that woke wait()
        self._heard = Heard()  # what our payloads said since take_heard()

    def hears(self) -> bool:
        """Whether notifications reach it (PostgreSQL, or a live relay), or it only polls."""
        if self.inbox is not None:
            return not self.inbox.closed
        return connections[self.using].vendor == "postgresql"

    def wait(self, timeout: float) -> None:
        if not self.hears():
            self.stopping.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        try:
            # Short slices, so that a stop request is seen promptly.
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                if not self._pending:
                    self._pending.extend(self._receive(min(left, 0.5)))
                while self._pending:
                    payload = self._pending.popleft()
                    # Another queue's job is not this worker's to claim: sleep on.
                    if self._ours(payload):
                        self.payloads.append(payload)
                        self._heard.note(payload)
                        return
                if self.inbox is not None and self.inbox.closed:  # the supervisor is gone
                    break
        except Exception:  # psycopg errors: the server restarted, the network dropped
            logger.warning(
                "LISTEN connection lost; polling until it is back",
                exc_info=True,
                extra={"event": "wakeup.lost"},
            )
            self.close()
        self.stopping.wait(max(0.0, deadline - time.monotonic()))

    def _receive(self, timeout: float) -> list[str]:
        if self.inbox is not None:
            return self.inbox.receive(timeout)
        notifies = self._listen().notifies(timeout=timeout, stop_after=1)
        return [notify.payload for notify in notifies]

    def _ours(self, payload: str) -> bool:
        return serves(self.queues, payload)

    def start(self) -> None:
        """Listen now (PostgreSQL), so that ahead() hears of jobs while the worker is busy."""
        if self.inbox is None and connections[self.using].vendor == "postgresql":
            try:
                self._listen()
            except Exception:  # the database is away: wait() and ahead() try again
                self.close()

    def _drain(self) -> list[str]:
        """Our payloads received since the last look, without waiting (ahead() reads them
        again, whoever drained them first)."""
        payloads = list(self._pending)
        self._pending.clear()
        if self.inbox is not None:
            payloads += self.inbox.receive(0)
        elif self._listener is not None:
            try:
                payloads += [notify.payload for notify in self._listener.notifies(timeout=0)]
            except Exception:  # the connection broke: wait() reconnects, or polls
                self.close()
        ours = [payload for payload in payloads if self._ours(payload)]
        for payload in ours:
            self._heard.note(payload)
        return ours

    def take_heard(self) -> Heard:
        """What the notifications of this worker's queues said since the last call: those
        that arrived, and those that wait() and heard() read (they woke the worker, and
        did not say where to look). Does not wait."""
        self._drain()
        heard, self._heard = self._heard, Heard()
        return heard

    def ahead(
        self, priority: int, at: float = -math.inf, queues: Iterable[str] | None = None
    ) -> bool:
        """take_heard().ahead(...)."""
        return self.take_heard().ahead(priority, at, queues)

    def heard(self) -> bool:
        """Whether, since the last look, a job of this worker's queues was enqueued (any
        priority). Does not wait; reads the notifications that arrived."""
        return bool(self._drain())

    def _listen(self) -> Any:
        if self._listener is None:
            self._listener = listen(self.using, self.channel)
        return self._listener

    def close(self) -> None:
        self._pending.clear()
        self._heard = Heard()
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None
