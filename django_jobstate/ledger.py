"""What a worker process holds, in memory its supervisor reads without the worker's help.

A worker claims attempts in batches and runs them one at a time. Its supervisor must know
which of them the worker started, and when the one in hand passes its deadline, even
while the worker's interpreter is stuck in a task that never gives up control (a C
extension, a catastrophic regular expression): to stop that attempt by killing the
process, to hand back attempts held behind a slow one, and, when the process ends, to
fail only what it started and hand back what it never began. So the worker writes each
step here, in shared memory, before it takes it; reading needs nothing from the worker.
The supervisor writes one thing back: that someone asked to cancel an attempt (a flag
the task reads through its context, and an earlier deadline for the one in hand).
"""

from __future__ import annotations

import math
import time
from ctypes import c_byte, c_double, c_longlong
from multiprocessing.context import BaseContext

from .conf import get_settings

# A held attempt's mark. HELD: claimed, not started. STARTED: its body may have run.
# RELEASED: the supervisor took it back before it started; the worker must not start it.
HELD, STARTED, RELEASED = 0, 1, 2


class Ledger:
    """The attempts one worker process holds, and the deadline of the one in hand.

    The worker calls hold() after each claim and start()/finish() around each attempt;
    the supervisor calls overdue() and release_held(), and marks() once the process ended.
    One lock orders start() against the supervisor's decisions, so an attempt is either
    started by the worker or taken back by the supervisor, never both.
    """

    def __init__(self, context: BaseContext, size: int) -> None:
        self.size = size
        self._lock = context.Lock()
        self._pks = context.RawArray(c_longlong, size)  # 0: an empty place
        self._marks = context.RawArray(c_byte, size)
        self._cancel = context.RawArray(c_byte, size)  # 1: someone asked to cancel it
        # The attempt in hand: its place (-1: none), start and deadline (monotonic clock,
        # which is one clock for all processes of the machine).
        self._current = context.RawValue(c_longlong, -1)
        self._times = context.RawArray(c_double, 2)

    def hold(self, pks: list[int]) -> None:
        """Record a new batch: every attempt held, none started."""
        if len(pks) > self.size:
            raise ValueError(
                f"A batch of {len(pks)} attempts does not fit a ledger of {self.size}."
            )
        with self._lock:
            self._current.value = -1
            for index in range(self.size):
                self._pks[index] = pks[index] if index < len(pks) else 0
                self._marks[index] = HELD
                self._cancel[index] = 0

    def start(self, index: int, timeout: float | None) -> bool:
        """Start the batch's attempt at `index`, unless the supervisor took it back."""
        with self._lock:
            if self._marks[index] == RELEASED:
                return False
            self._marks[index] = STARTED
            now = time.monotonic()
            self._times[0], self._times[1] = now, math.inf if timeout is None else now + timeout
            if self._cancel[index]:  # asked to cancel as it started: the grace runs from now
                self._times[1] = min(self._times[1], now + get_settings().CANCEL_GRACE)
            self._current.value = index
            return True

    def finish(self) -> None:
        """The attempt in hand returned. (No lock: a supervisor that reads the old deadline
        in between finds it no more than microseconds past.)"""
        self._current.value = -1

    def overdue(self, now: float) -> int | None:
        """The pk of the attempt in hand if it is past its deadline, once; else None.

        The caller kills the process: from then on, the attempt counts as timed out.
        """
        if self._current.value < 0 or now < self._times[1]:
            return None
        with self._lock:
            index = self._current.value
            if index < 0 or now < self._times[1]:
                return None
            self._times[1] = math.inf
            return int(self._pks[index])

    def request_cancel(self, pk: int, stop_at: float) -> bool:
        """Flag held attempt `pk` as cancelled; if it is the one in hand, stop it by
        `stop_at` (monotonic) at the latest. False if this ledger does not hold it."""
        with self._lock:
            for index in range(self.size):
                if self._pks[index] == pk and self._marks[index] != RELEASED:
                    self._cancel[index] = 1
                    if self._current.value == index:
                        self._times[1] = min(self._times[1], stop_at)
                    return True
            return False

    def cancel_requested(self, index: int) -> bool:
        """Whether someone asked to cancel the batch's attempt at `index` (no lock: a flag)."""
        return bool(self._cancel[index])

    def next_deadline(self) -> float:
        return self._times[1] if self._current.value >= 0 else math.inf

    def release_held(self, now: float, after: float) -> list[int]:
        """Take back the attempts not started, if the one in hand has run `after` seconds."""
        if self._current.value < 0 or now - self._times[0] < after:
            return []
        with self._lock:
            released = []
            for index in range(self.size):
                if self._pks[index] and self._marks[index] == HELD:
                    self._marks[index] = RELEASED
                    released.append(int(self._pks[index]))
            return released

    def marks(self) -> dict[int, int]:
        """{pk: mark} of the current batch; for a process that has ended (no lock taken:
        a process killed while holding it would never give it back)."""
        return {int(pk): int(mark) for pk, mark in zip(self._pks, self._marks, strict=True) if pk}
