"""What a worker process holds, in memory its supervisor reads without the worker's help.

A worker claims attempts in batches and runs them one at a time (or several at once, with
runjobs --in-flight). Its supervisor must know which of them the worker started, and when
one passes its deadline, even while the worker's interpreter is stuck in a task that never
gives up control (a C extension, a catastrophic regular expression): to stop that attempt
by killing the process, to hand back attempts held behind a slow one, and, when the
process ends, to fail only what it started and hand back what it never began. So the
worker writes each step here, in shared memory, before it takes it; reading needs nothing
from the worker. The supervisor writes one thing back: that someone asked to cancel an
attempt (a flag the task reads through its context, and an earlier deadline if it runs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from ctypes import c_byte, c_double, c_longlong
from multiprocessing.context import BaseContext

from ..conf import get_settings

# A held attempt's mark. HELD: claimed, not started. STARTED: its body may have run.
# RELEASED: the supervisor took it back before it started; the worker must not start it.
HELD, STARTED, RELEASED = 0, 1, 2


def ledger_size(max_batch: int, in_flight: int) -> int:
    """The places of a worker's ledger: a batch; with --in-flight, the attempts running
    and the outcomes not yet written (at most a batch: inflight.py writes them then)."""
    return max_batch if in_flight == 1 else max_batch + in_flight


class Ledger:
    """The attempts one worker process holds, and the deadlines of those it runs.

    The worker calls hold() after each claim and start()/finish() around each attempt;
    the supervisor calls overdue() and release_held(), and marks() once the process ended.
    One lock orders start() against the supervisor's decisions, so an attempt is either
    started by the worker or taken back by the supervisor, never both.

    A worker runs one attempt at a time, or up to `in_flight` at once (runjobs
    --in-flight): each place keeps its own start and deadline. A place's `grace` is how
    long after its deadline the supervisor kills the process: none for a task on a thread,
    which nothing else can stop; a little for an async task, which the worker cancels
    itself at the deadline (due()).
    """

    def __init__(self, context: BaseContext, size: int, in_flight: int = 1) -> None:
        self.size = size
        self.in_flight = in_flight
        self._lock = context.Lock()
        self._pks = context.RawArray(c_longlong, size)  # 0: an empty place
        self._marks = context.RawArray(c_byte, size)
        self._cancel = context.RawArray(c_byte, size)  # 1: someone asked to cancel it
        # Of the attempts running (monotonic clock, one clock for all processes of the
        # machine): start, deadline (inf: none, or not running) and grace.
        self._begun = context.RawArray(c_double, size)
        self._deadline = context.RawArray(c_double, [math.inf] * size)
        self._grace = context.RawArray(c_double, size)
        self._running = context.RawArray(c_byte, size)

    def hold(self, pks: list[int]) -> list[int]:
        """Record claimed attempts, held and not started, in free places; return those
        places. One at a time, a new batch replaces the last one whole."""
        with self._lock:
            if self.in_flight == 1:
                self._clear(range(self.size))
            free = [index for index in range(self.size) if not self._pks[index]]
            if len(pks) > len(free):
                raise ValueError(
                    f"{len(pks)} attempts do not fit the {len(free)} free places of a ledger "
                    f"of {self.size}."
                )
            for index, pk in zip(free, pks, strict=False):
                self._pks[index] = pk
            return free[: len(pks)]

    def free(self, indexes: list[int]) -> None:
        """Forget attempts whose outcome is written: their places take new claims."""
        with self._lock:
            self._clear(indexes)

    def _clear(self, indexes: Iterable[int]) -> None:
        for index in indexes:
            self._pks[index] = 0
            self._marks[index] = HELD
            self._cancel[index] = 0
            self._running[index] = 0
            self._deadline[index] = math.inf

    def start(self, index: int, timeout: float | None, grace: float = 0.0) -> bool:
        """Start the attempt at `index`, unless the supervisor took it back."""
        with self._lock:
            if self._marks[index] == RELEASED:
                return False
            self._marks[index] = STARTED
            now = time.monotonic()
            self._begun[index], self._grace[index] = now, grace
            deadline = math.inf if timeout is None else now + timeout
            if self._cancel[index]:  # asked to cancel as it started: the grace runs from now
                deadline = min(deadline, now + get_settings().CANCEL_GRACE)
            self._deadline[index] = deadline
            self._running[index] = 1
            return True

    def finish(self, index: int) -> None:
        """The attempt at `index` returned. (No lock: a supervisor that reads the old
        deadline in between finds it no more than microseconds past.)"""
        self._running[index] = 0
        self._deadline[index] = math.inf

    def overdue(self, now: float) -> int | None:
        """The pk of an attempt running past its deadline and grace, once; else None.

        The caller kills the process: from then on, the attempt counts as timed out.
        """
        if now < self.next_deadline():
            return None
        with self._lock:
            for index in range(self.size):
                if self._running[index] and now >= self._deadline[index] + self._grace[index]:
                    self._deadline[index] = math.inf
                    return int(self._pks[index])
            return None

    def due(self, now: float) -> list[int]:
        """The places of the attempts running past their deadline (not their grace): for
        the worker to stop those it can (an async task)."""
        return [
            index
            for index in range(self.size)
            if self._running[index] and now >= self._deadline[index]
        ]

    def request_cancel(self, pk: int, stop_at: float) -> bool:
        """Flag held attempt `pk` as cancelled; if it is running, stop it by `stop_at`
        (monotonic) at the latest. False if this ledger does not hold it."""
        with self._lock:
            for index in range(self.size):
                if self._pks[index] == pk and self._marks[index] != RELEASED:
                    self._cancel[index] = 1
                    if self._running[index]:
                        self._deadline[index] = min(self._deadline[index], stop_at)
                    return True
            return False

    def cancel_requested(self, index: int) -> bool:
        """Whether someone asked to cancel the attempt at `index` (no lock: a flag)."""
        return bool(self._cancel[index])

    def next_deadline(self) -> float:
        """When the supervisor must next look: the earliest deadline plus grace."""
        return min(
            (
                self._deadline[index] + self._grace[index]
                for index in range(self.size)
                if self._running[index]
            ),
            default=math.inf,
        )

    def release_held(self, now: float, after: float) -> list[int]:
        """Take back the attempts not started, if one running has run `after` seconds.
        (With several in flight, a claim starts at once: nothing waits behind another.)"""
        if self.in_flight > 1 or not any(
            self._running[index] and now - self._begun[index] >= after for index in range(self.size)
        ):
            return []
        with self._lock:
            released = []
            for index in range(self.size):
                if self._pks[index] and self._marks[index] == HELD:
                    self._marks[index] = RELEASED
                    released.append(int(self._pks[index]))
            return released

    def pks(self) -> set[int]:
        """The attempts held: claimed, running, or with an outcome not yet written."""
        with self._lock:
            return {int(pk) for pk in self._pks if pk}

    def marks(self) -> dict[int, int]:
        """{pk: mark} of the attempts held; for a process that has ended (no lock taken:
        a process killed while holding it would never give it back)."""
        return {int(pk): int(mark) for pk, mark in zip(self._pks, self._marks, strict=True) if pk}
