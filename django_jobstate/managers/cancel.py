"""Cancel: a queued attempt to failed (cancelled, never started); a running one asked to stop.

A queued attempt moves at once, conditional on still being queued: a claim that wins
first wins, and the cancel then asks the running attempt to stop. A running attempt gets
`cancel_requested_at`; its worker's supervisor learns of it (NOTIFY on PostgreSQL, its
next heartbeat elsewhere), tells the task through its context, and stops the process
JOBSTATE_CANCEL_GRACE seconds after the request. Whatever then ends the attempt, it fails
as cancelled (Outcomes.fail), unless the task returned first: then it succeeded.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING

from django.db import connections, models
from django.db.models.functions import Coalesce

from ..db.clock import Now
from ..db.notify import NOTIFY_CANCEL
from ..exceptions import JobCancelled, LostRace, describe_error
from ..states import FailureReason, State
from .base import Writes, brief_transaction, writing
from .conflicts import retries_conflicts

if TYPE_CHECKING:
    from ..models import Job


class CancelOutcome(StrEnum):
    CANCELLED = "cancelled"  # it was queued: failed as cancelled, never started
    REQUESTED = "requested"  # it is running: asked to stop, stopped after the grace
    FINISHED = "finished"  # it had finished (or was pruned): nothing to cancel


class Cancel(Writes):
    @retries_conflicts
    def cancel(self, job: Job) -> CancelOutcome:
        """Cancel attempt `job` wherever it is now; say what happened.

        Each write is conditional on the state read just before it; when it loses, the
        row is read again and the cancel goes on from where the row is.
        """
        db = job._state.db
        for _ in range(10):  # each lost race means the row moved forward: few rounds
            if job.state == State.QUEUED:
                try:
                    with writing(job):  # with the read back: both or neither
                        self._transition(
                            job,
                            State.FAILED,
                            failure_reason=FailureReason.CANCELLED,
                            cancel_requested_at=Now(),
                            hold=None,  # no longer waiting for a slot (limits.py)
                            finished_at=Now(),
                            **describe_error(JobCancelled("it was cancelled before it started")),
                        )
                        if job.has_dependents:  # what waits for it is cancelled too (deps.py)
                            self._after_failure(db or "default", job)
                except LostRace:
                    pass
                else:
                    return CancelOutcome.CANCELLED
            elif job.state == State.RUNNING:
                if self._request_cancel(job):
                    return CancelOutcome.REQUESTED
            else:
                return CancelOutcome.FINISHED
            try:
                job = self.using(db).get(pk=job.pk)
            except self.model.DoesNotExist:
                return CancelOutcome.FINISHED
        raise LostRace(f"Job {job.pk} kept moving; it was not cancelled.")  # pragma: no cover

    @retries_conflicts
    def cancel_task(self, result_id: str | uuid.UUID) -> CancelOutcome:
        """Cancel the live attempt of a task (its newest); DoesNotExist if there is none.

        A retry created while the cancel ran (its attempt failed meanwhile) is cancelled
        too: the task's newest attempt is read again until the cancel acts or it finished.
        """
        seen: set[int] = set()
        while True:
            newest = self.attempts_of(result_id).last()
            if newest is None:
                raise self.model.DoesNotExist(f"No job has result id {result_id}.")
            if newest.pk in seen:
                return CancelOutcome.FINISHED
            seen.add(newest.pk)
            outcome = self.cancel(newest)
            if outcome != CancelOutcome.FINISHED:
                return outcome

    def _request_cancel(self, job: Job) -> bool:
        """Ask running attempt `job` to stop (the first request's time stays); False if it
        is no longer running."""
        db = job._state.db
        connection = connections[db or "default"]
        with brief_transaction(db):
            requested = (
                self.using(db)
                .filter(pk=job.pk, state=State.RUNNING)
                .update(cancel_requested_at=Coalesce("cancel_requested_at", Now()))
            )
            if requested and connection.vendor == "postgresql":
                with connection.cursor() as cursor:  # sent at the commit
                    cursor.execute(f"SELECT {NOTIFY_CANCEL}", [str(job.pk)])
        return bool(requested)

    def cancel_requests(self, worker_ids: Iterable[str]) -> list[tuple[int, str, float]]:
        """The running attempts of `worker_ids` that someone asked to cancel:
        (pk, worker_id, seconds since the request by the database clock)."""
        rows = (
            self.running()
            .filter(worker_id__in=list(worker_ids), cancel_requested_at__isnull=False)
            .annotate(age=Now() - models.F("cancel_requested_at"))
            .values_list("pk", "worker_id", "age")
        )
        return [(pk, str(worker), max(0.0, age.total_seconds())) for pk, worker, age in rows]
