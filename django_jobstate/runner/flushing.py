"""Successes finished and not yet written, for the worker that runs one attempt at a time.

Successes are written together, in one fenced statement (recording.py), so a batch of
quick jobs costs one commit rather than one per job. Until then they show `running`,
and a worker process that dies fails them as lost (and they run again, if their task
allows). So they wait at most FLUSH_AFTER seconds, whatever the worker is doing:
- the worker writes them itself after an attempt, once the oldest has waited that long,
  and before it begins an attempt it expects to take longer than what is left of that;
- and a thread of the worker writes them at that bound if the attempt the worker runs
  meanwhile takes longer than expected (a slow call, a lock, a job unlike the others).

The thread has a connection of its own (a Django connection belongs to its thread),
opened for its first write and closed once it has had nothing to write for IDLE seconds.
One lock keeps the two writers apart: the worker's write at the end of a batch waits for
the thread's, so that nothing is still being written when the next batch is claimed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import connections

# The longest a finished success waits unwritten (worker.py's batches).
FLUSH_AFTER = 0.05

if TYPE_CHECKING:
    from .attempts import Outcome

logger = logging.getLogger("django_jobstate.worker")

# Seconds without anything to write after which the thread closes its connection: a
# worker whose batches seldom mix quick and slow jobs keeps one connection, not two.
IDLE = 5.0


class Flusher:
    """Holds a worker's unwritten successes; writes them within `after` seconds.

    `record` writes a list of outcomes (OutcomeWriter.record), in whichever thread calls
    it; `db` is the alias of the connection it uses.
    """

    def __init__(self, record: Callable[[list[Outcome]], None], db: str, after: float) -> None:
        self.after = after
        self._record = record
        self._db = db
        self._outcomes: list[Outcome] = []
        self._changed = threading.Condition()  # guards _outcomes, _closed, _thread_may_write
        self._writing = threading.Lock()  # held by whichever thread writes
        self._thread: threading.Thread | None = None
        self._closed = False
        # Whether the thread may write those held: not after its write failed (the
        # worker's next write reports the error), nor in a transaction (add()).
        self._thread_may_write = True

    def waited(self) -> float:
        """How long the oldest outcome held has waited (0 if none)."""
        outcomes = self._outcomes
        return time.monotonic() - outcomes[0].finished if outcomes else 0.0

    def add(self, outcome: Outcome) -> None:
        """Hold an outcome to write with the next ones (the thread writes it in time).

        Not the thread while the worker's connection is in a transaction (a worker run
        inside a test's): another connection would not see its rows.
        """
        with self._changed:
            self._outcomes.append(outcome)
            if len(self._outcomes) > 1:
                return  # the thread's timer runs from the first
            alone = connections[self._db].in_atomic_block
            self._thread_may_write = not alone
            self._changed.notify()
        # A thread that died of an unforeseen error is replaced: the bound holds again.
        if (self._thread is None or not self._thread.is_alive()) and not alone:
            self._thread = threading.Thread(target=self._run, name="jobstate-flusher", daemon=True)
            self._thread.start()

    def write(self, *also: Outcome) -> None:
        """Write the outcomes held (and `also`), in this thread, now."""
        with self._writing:
            with self._changed:
                outcomes, self._outcomes = [*self._outcomes, *also], []
            if outcomes:
                self._record(outcomes)

    def close(self) -> None:
        """Stop the thread, after the write it may be making (the worker writes what it
        holds at the end of each batch: nothing is left by then)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._closed = False  # a worker may run again: the next add() starts a thread

    def _run(self) -> None:
        try:
            while self._wait_until_due():
                self._write_from_thread()
        finally:
            connections[self._db].close()

    def _wait_until_due(self) -> bool:
        """Wait until the oldest outcome held is due; False once closed."""
        while True:
            with self._changed:
                if self._closed:
                    return False
                if self._outcomes and self._thread_may_write:
                    wait = self._outcomes[0].finished + self.after - time.monotonic()
                    if wait <= 0:
                        return True
                    self._changed.wait(wait)
                    continue
                if self._changed.wait(IDLE):
                    continue
            # Idle: give the connection back, outside the lock (add() must not wait on it).
            connections[self._db].close()

    def _write_from_thread(self) -> None:
        with self._writing:
            with self._changed:
                outcomes, self._outcomes = self._outcomes, []
            if not outcomes:  # the worker wrote them meanwhile
                return
            try:
                self._record(outcomes)
            except Exception:
                # Not a lost connection (record() waits those out): leave them to the
                # worker, which writes them itself after this attempt.
                logger.warning(
                    "Could not write %d finished attempt(s) while the next one runs; the "
                    "worker writes them once it returns",
                    len(outcomes),
                    exc_info=True,
                    extra={"event": "worker.flush_failed"},
                )
                with self._changed:
                    self._outcomes[:0] = outcomes
                    self._thread_may_write = False
