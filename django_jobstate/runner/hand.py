"""Jobs an --in-flight worker has claimed and holds, waiting for a place in its pool.

Quick jobs are claimed by the batch (Claims.in_hand: as many as the places run in
BATCH_WINDOW seconds), so most wait here a few milliseconds. Each has a place in the
ledger from its claim: a process that dies has them handed back by its supervisor, and a
stop hands them back itself (give_back()). One held longer than HEARTBEAT_INTERVAL (a
paused process) may have been failed as lost meanwhile: it is started only if its row
is still this worker's.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ..conf import get_settings

if TYPE_CHECKING:
    from ..models import Job
    from .worker import Worker


class Hand:
    """Attempts claimed and held in the ledger, waiting for a place in the pool."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.jobs: deque[tuple[Job, int]] = deque()
        self._checked = 0.0  # when their rows were last known to be this worker's

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, jobs: list[Job]) -> None:
        if not self.jobs:
            self._checked = time.monotonic()
        self.jobs.extend(zip(jobs, self.worker.ledger.hold([j.pk for j in jobs]), strict=True))

    def take(self, count: int) -> list[tuple[Job, int]]:
        """Up to `count` of them, in claim order. Held longer than HEARTBEAT_INTERVAL (this
        process paused, say), they may have been failed as lost: only those still its own."""
        worker = self.worker
        if self.jobs and time.monotonic() - self._checked > get_settings().HEARTBEAT_INTERVAL:
            self._checked = time.monotonic()
            mine = worker._still_mine([job for job, _index in self.jobs])
            for job, index in [held for held in self.jobs if held[0].pk not in mine]:
                worker.lost_race(job, "it was failed meanwhile (taken for lost while held)")
                worker.ledger.free([index])
            self.jobs = deque(held for held in self.jobs if held[0].pk in mine)
        return [self.jobs.popleft() for _ in range(min(count, len(self.jobs)))]

    def give_back(self) -> None:
        """A stop: hand back the attempts not started (fenced, as a stop does)."""
        if self.jobs:
            self.worker._hand_back([job.pk for job, _index in self.jobs])
            self.worker.ledger.free([index for _job, index in self.jobs])
            self.jobs.clear()
