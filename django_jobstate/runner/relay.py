"""The one LISTEN connection of a supervisor, passed on to its worker processes.

Were each worker process to LISTEN for itself, a supervisor of N workers would hold 2N
connections for them. The relay, a thread of the supervisor, listens for them all: to
the jobs' channel, whose payloads it writes to each worker's pipe (the worker's Waiter
reads them: wakeup.Inbox), to the cancel channel, on which it has the monitor read
the cancel requests at once (cancels.py), and to the schedules' channel, on which it
wakes the supervisor's scheduler (a schedule made or changed in the admin). So a
supervisor of N workers holds N + 1 connections, besides its own (the monitor's, and the
scheduler's unless --no-schedules).

A notification is a hint (wakeup.py), and the relay never waits for a worker: its pipes
do not block, and a worker busy long enough to leave its pipe full (thousands of unread
payloads) misses the next ones, which it would not have acted on before its next claim
anyway. When the connection drops (a PostgreSQL restart), the relay connects again every
RECONNECT_DELAY seconds while the workers poll; once back, it wakes them all once, and
has cancel requests read, for what it may have missed.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from django.db import connections, router

from ..db.notify import CANCEL_CHANNEL, CHANNEL, SCHEDULES_CHANNEL, queue_payload, serves
from .wakeup import listen

logger = logging.getLogger("django_jobstate.worker")

RECONNECT_DELAY = 1.0
# A write of at most PIPE_BUF bytes to a pipe is whole or refused, never partly done: the
# relay writes payloads in chunks of at most that, so a full pipe drops whole payloads.
CHUNK = select.PIPE_BUF
WAKE_ALL = queue_payload("")  # of no known queue: wakes every worker, which looks at the head


class Relay(threading.Thread):
    """Listens for the supervisor; writes each job payload to every worker's pipe."""

    def __init__(
        self,
        context: BaseContext,
        queues: Iterable[str] | None,
        on_cancel: Callable[[], None],
        on_schedules: Callable[[], None] = lambda: None,
    ) -> None:
        from ..models import Job

        super().__init__(name="jobstate-relay", daemon=True)
        self.context = context
        self.queues = None if queues is None else frozenset(queues)
        self.on_cancel = on_cancel
        self.on_schedules = on_schedules
        self.using = router.db_for_write(Job)
        self.enabled = connections[self.using].vendor == "postgresql"  # else: no NOTIFY
        self.dropped = 0  # payloads a full pipe refused
        self.listening = threading.Event()  # connected and listening
        self._pipes: dict[str, Connection] = {}  # {worker_id: write end}
        self._lock = threading.Lock()  # a pipe is closed only while no write is under way
        self._done = threading.Event()

    def start(self) -> None:
        if self.enabled:
            super().start()

    def add(self, worker_id: str) -> Connection | None:
        """A pipe to a new worker process: its read end, to pass to the process (None
        when the relay is off: not PostgreSQL)."""
        if not self.enabled:
            return None
        reader, writer = self.context.Pipe(duplex=False)
        os.set_blocking(writer.fileno(), False)
        with self._lock:
            self._pipes[worker_id] = writer
        return reader

    def remove(self, worker_id: str) -> None:
        """Close the pipe of a worker process that ended."""
        with self._lock:
            writer = self._pipes.pop(worker_id, None)
        if writer is not None:
            writer.close()

    def run(self) -> None:
        listener: Any = None
        lost = False
        try:
            while not self._done.is_set():
                try:
                    if listener is None:
                        listener = listen(self.using, CHANNEL, CANCEL_CHANNEL, SCHEDULES_CHANNEL)
                        self.listening.set()
                        if lost:
                            lost = False
                            logger.info(
                                "LISTEN connection back; waking the workers",
                                extra={"event": "wakeup.restored"},
                            )
                            self._dispatch([WAKE_ALL], cancels=True, schedules=True)
                    notifies = list(listener.notifies(timeout=0.5, stop_after=1))
                    if notifies:  # and those that came with it, relayed together
                        notifies += listener.notifies(timeout=0)
                except Exception:  # psycopg errors: the server restarted, the network dropped
                    if not lost:
                        logger.warning(
                            "The supervisor's LISTEN connection is lost; its workers poll "
                            "until it is back",
                            exc_info=True,
                            extra={"event": "wakeup.lost"},
                        )
                    lost = True
                    self.listening.clear()
                    _close(listener)
                    listener = None
                    self._done.wait(RECONNECT_DELAY)
                    continue
                self._dispatch(
                    [n.payload for n in notifies if n.channel == CHANNEL],
                    cancels=any(n.channel == CANCEL_CHANNEL for n in notifies),
                    schedules=any(n.channel == SCHEDULES_CHANNEL for n in notifies),
                )
        finally:
            _close(listener)

    def _dispatch(self, payloads: list[str], *, cancels: bool, schedules: bool = False) -> None:
        if cancels:
            self.on_cancel()
        if schedules:
            self.on_schedules()
        # Once each: a worker acts on a queue and priority, not on how many jobs.
        wakes = [p for p in dict.fromkeys(payloads) if serves(self.queues, p)]
        if wakes:
            self._write(_chunks(wakes))

    def _write(self, chunks: list[bytes]) -> None:
        with self._lock:
            for writer in self._pipes.values():
                for chunk in chunks:
                    try:
                        os.write(writer.fileno(), chunk)
                    except BlockingIOError:  # full: the worker has unread wake-ups enough
                        self.dropped += chunk.count(b"\0")
                        break
                    except OSError:  # the worker is gone; the supervisor removes its pipe
                        break

    def finish(self) -> None:
        """Stop listening, and close the pipes left."""
        self._done.set()
        if self.is_alive():
            self.join(5)
        for worker_id in list(self._pipes):
            self.remove(worker_id)


def _chunks(payloads: list[str]) -> list[bytes]:
    """The payloads, each ended by a NUL byte, in chunks of at most CHUNK bytes."""
    chunks: list[bytes] = []
    chunk = b""
    for payload in payloads:
        data = payload.encode() + b"\0"
        if len(data) > CHUNK:  # not one of ours (a NOTIFY by hand?): wake every worker
            data = WAKE_ALL.encode() + b"\0"
        if len(chunk) + len(data) > CHUNK:
            chunks.append(chunk)
            chunk = b""
        chunk += data
    return [*chunks, chunk] if chunk else chunks


def _close(listener: Any) -> None:
    if listener is not None:
        try:
            listener.close()
        except Exception:  # already broken
            logger.debug("closing a broken LISTEN connection", exc_info=True)
