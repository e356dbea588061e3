"""The outcomes of a worker with --in-flight, written by a thread of their own.

A write of a batch of outcomes waits on the database (a commit: milliseconds with a
durable server). Written by the loop that starts attempts, every place of the pool that
frees meanwhile would wait for it too: with quick jobs, the places would be idle more
than busy. So the loop hands each batch to this thread, which writes it (fenced, as
every outcome: OutcomeWriter.record) with its own connection and then frees the batch's
places in the ledger, while the loop goes on starting attempts and claiming.

Until written, the outcomes keep their places, so the ledger bounds how many can wait
here; a worker process that dies fails them as lost, as before. An error the thread
cannot wait out (record() waits out a lost connection) is raised in the loop at its next
turn, as if the loop had written the batch itself; the batches after it are left
unwritten, to be failed as lost with the process.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

from django.db import connections

if TYPE_CHECKING:
    from .attempts import Outcome
    from .worker import Worker


class Writer:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._batches: queue.SimpleQueue[tuple[list[Outcome], list[int]] | None] = (
            queue.SimpleQueue()
        )
        self._written = threading.Condition()  # guards places
        self.places = 0  # the ledger places of the batches handed over, not yet written
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def write(self, outcomes: list[Outcome], places: list[int]) -> None:
        """Write `outcomes` and free `places`: in the thread, or here inside a transaction
        (a worker run inside a test's: another connection would not see its rows)."""
        self.check()
        if connections[self.worker.db].in_atomic_block:
            self._write(outcomes, places)
            return
        with self._written:
            self.places += len(places)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jobstate-writer", daemon=True)
            self._thread.start()
        self._batches.put((outcomes, places))

    def wait(self) -> None:
        """Until every batch handed over is written (or failed to be)."""
        with self._written:
            self._written.wait_for(lambda: self.places == 0 or self._error is not None)
        self.check()

    def check(self) -> None:
        """Raise the error a write met, in the caller's thread."""
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Write what was handed over, then stop the thread."""
        if self._thread is not None:
            self._batches.put(None)
            self._thread.join()
            self._thread = None

    def _write(self, outcomes: list[Outcome], places: list[int]) -> None:
        self.worker.record(outcomes)
        self.worker.ledger.free(places)

    def _run(self) -> None:
        try:
            while (batch := self._batches.get()) is not None:
                outcomes, places = batch
                try:
                    if self._error is None:
                        self._write(outcomes, places)
                except BaseException as exc:
                    self._error = exc
                finally:
                    with self._written:
                        self.places -= len(places)
                        self._written.notify_all()
        finally:
            connections[self.worker.db].close()
