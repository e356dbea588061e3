"""Settling the attempts of workers that cannot write their own outcome: silent ones
(rescue_lost), ended processes (settle_ended), attempts past a deadline (time_out), and
attempts handed back unstarted (release). Each is a fenced fail() (outcomes.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Exists, Expression, Value

from ..conf import get_settings
from ..db.clock import Now
from ..exceptions import JobCancelled, LostRace, WorkerLost, describe_error
from ..states import FailureReason
from ..telemetry import metrics
from ..telemetry.logs import job_fields
from .base import brief_transaction, connection_lost, logger, process_now, timeout_error
from .conflicts import retries_conflicts
from .outcomes import Outcomes

if TYPE_CHECKING:
    from ..models import Job


def stopped(job: Job) -> tuple[FailureReason, Exception]:
    """Why an attempt stopped at its deadline failed: its timeout, or its cancel grace."""
    if job.cancel_requested_at is not None:
        grace = get_settings().CANCEL_GRACE
        return FailureReason.CANCELLED, JobCancelled(
            f"it was cancelled and stopped (JOBSTATE_CANCEL_GRACE is {grace:g} seconds)"
        )
    return FailureReason.TIMEOUT, timeout_error(job)


def _before(connection: BaseDatabaseWrapper, seconds: float) -> Expression:
    """The time `seconds` before now, by the database's clock, read before any wait of
    the statement that holds it: PostgreSQL's and MariaDB's/MySQL's now is the
    statement's start. SQLite's would be read once the statement has the write lock:
    there it is this machine's clock (SQLite's own), read here."""
    if connection.vendor == "sqlite":
        return Value(process_now(connection, -seconds)[0])
    return Now() - timedelta(seconds=seconds)


class Settle(Outcomes):
    def rescue_lost(
        self,
        lost_after: float,
        *,
        judges: Sequence[str] = (),
        judge_gap: float = 0,
        decided: float | None = None,
    ) -> int:
        """Fail as lost the running attempts of workers silent for `lost_after` seconds.

        Times are the database's, so workers' clocks do not matter. An attempt younger than
        `lost_after` is never rescued, whatever its worker did. With `judges`, nothing is
        rescued unless one of those workers beat within the last `judge_gap` seconds: a
        rescuer whose own beats stalled (its statement waited on a lock, it was paused)
        cannot tell a dead worker from one that was held up as it was (liveness.py).

        Judged as of `decided` (a time.monotonic() reading: when the rescuer found it may
        judge), not as of when the statement runs: its writes before it may have waited
        on a lock that held up every beat (SQLite's write lock, held past the window by a
        long transaction). Once it is gone the judge's own beat may land before the
        others', which were held up alike: they would look silent.
        """
        from ..models import WorkerHeartbeat

        connection = connections[router.db_for_write(self.model)]
        ago = 0.0 if decided is None else max(0.0, time.monotonic() - decided)
        cutoff = _before(connection, ago + lost_after)
        alive = WorkerHeartbeat.objects.filter(last_seen__gte=cutoff).values("worker_id")
        silent = self.running().filter(started_at__lt=cutoff).exclude(worker_id__in=alive)
        if judges:
            fresh = _before(connection, ago + judge_gap)
            silent = silent.filter(
                Exists(WorkerHeartbeat.objects.filter(worker_id__in=judges, last_seen__gte=fresh))
            )
        error = WorkerLost(f"its worker sent no heartbeat for {lost_after:g} seconds")
        return self._fail_each(silent, FailureReason.LOST, error, skip_locked=True)

    def fail_running(
        self, worker_id: str, reason: FailureReason, error: BaseException, *, pk: int | None = None
    ) -> int:
        """Fail the running attempts of a worker that is gone or stopped (or just one of them).

        Used by the watchdog of an attempt past its timeout, and by tests. Returns how many
        attempts it failed.
        """
        jobs = self.running().filter(worker_id=worker_id)
        return self._fail_each(jobs if pk is None else jobs.filter(pk=pk), reason, error)

    def release(self, worker_id: str, pks: Collection[int]) -> int:
        """Hand back attempts that `worker_id` claimed but never started; return how many.

        Each fails as released and its next attempt is queued at once, not counted against
        the task's attempts (see fail()).
        """
        error = WorkerLost(f"worker {worker_id} handed it back before starting it")
        jobs = self.running().filter(worker_id=worker_id, pk__in=pks)
        return self._fail_each(jobs, FailureReason.RELEASED, error)

    def settle_ended(
        self,
        worker_id: str,
        *,
        started: Collection[int],
        reason: FailureReason,
        error: BaseException,
        timed_out: int | None = None,
    ) -> int:
        """Fail the attempts still running for a worker process that ended; return how many.

        Its supervisor knows from the worker's ledger which attempts it `started`: those
        fail as `reason` (the one killed at its deadline as a timeout, or as cancelled if
        someone asked), and the others, never begun, are released.
        """
        failed = 0
        for job in self.running().filter(worker_id=worker_id):
            if job.pk == timed_out:
                failed += self._fail_each([job], *stopped(job))
            elif job.pk in started:
                failed += self._fail_each([job], reason, error)
            else:
                failed += self.release(worker_id, [job.pk])
        return failed

    def time_out(self, worker_id: str, pk: int) -> int:
        """Fail `worker_id`'s attempt `pk` as past its timeout (1), unless it has moved on (0)."""
        jobs = self.running().filter(worker_id=worker_id, pk=pk)
        return sum(self._fail_each([job], *stopped(job)) for job in jobs)

    def _fail_each(
        self,
        jobs: Iterable[Job],
        reason: FailureReason,
        error: BaseException,
        *,
        skip_locked: bool = False,
    ) -> int:
        """Fail each of `jobs` that is still where it was; return how many.

        With `skip_locked` (PostgreSQL), pass over a row that another transaction holds,
        rather than wait for it: a rescuer must keep heartbeating. (A worker cut off
        between its outcome's UPDATE and its COMMIT lets go of the row after half of
        LOST_AFTER: brief_transaction().)

        A write the database refuses for good (a constraint, a trigger) fails that attempt
        with the refusal instead (fail_refused()), and the others are written on.
        """
        failed = 0
        for job in jobs:
            try:
                if not self._fail_one(job, reason, error, skip_locked):
                    continue  # its writer holds it; see again at the next rescue
            except LostRace:
                continue  # its worker finished it, or another rescuer got there first
            except DatabaseError as exc:
                if connection_lost(exc):
                    raise  # the caller writes again once the database is back
                if self.fail_refused(job, exc, f"its failure as {reason}"):
                    failed += 1
                    if metrics.recorder is not None:
                        metrics.recorder.finished(job)
                continue
            logger.warning(
                "Job %s attempt %d failed as %s: %s",
                job.pk,
                job.attempt,
                reason,
                error,
                extra=job_fields(job, "job.settled", failure_reason=reason.value),
            )
            if metrics.recorder is not None:
                metrics.recorder.finished(job)
            failed += 1
        return failed

    @retries_conflicts
    def _fail_one(
        self, job: Job, reason: FailureReason, error: BaseException, skip_locked: bool
    ) -> bool:
        """Fail `job` (LostRace if it moved on); False if it was skipped as locked."""
        locking = brief_transaction(job._state.db)
        with locking if skip_locked else contextlib.nullcontext():
            if skip_locked and not self._lock_or_skip(job):
                return False
            self.fail(job, reason, **describe_error(error))
        return True

    def fail_refused(self, job: Job, refused: DatabaseError, what: str) -> bool:
        """Fail `job` with `refused`, the database's error for the write of `what` (its
        outcome), as an error and never retried: that write would be refused again, and
        retrying it for ever would hold up every write behind it. Logged with its cause.
        False if the row has moved on, or if the database refuses this write too."""
        fields = describe_error(refused)
        fields["error_message"] = (
            f"The database refused to record {what}, and would refuse it again: "
            f"{fields['error_message'].strip()}"
        )
        logger.error(
            "Job %s: %s; it fails with that error instead, not retried",
            job.pk,
            fields["error_message"],
            exc_info=refused,
            extra=job_fields(job, "job.write_refused", error_class=fields["error_class"]),
        )
        try:
            self.fail(job, FailureReason.ERROR, retry=False, **fields)
        except LostRace:
            return False
        except DatabaseError as exc:
            if connection_lost(exc):
                raise
            logger.error(
                "Job %s: the database refused its failure with that error too; the row "
                "stays as it is",
                job.pk,
                exc_info=exc,
                extra=job_fields(job, "job.write_refused"),
            )
            return False
        return True  # counted by the caller, which counts its other outcomes too

    def _lock_or_skip(self, job: Job) -> bool:
        """Lock `job`'s row unless another transaction holds it (SQLite: no row locks, and
        a read before the write would ask for a lock upgrade, so nothing to do)."""
        db = job._state.db or router.db_for_write(self.model)
        if not connections[db].features.has_select_for_update_skip_locked:
            return True
        row = self.using(db).filter(pk=job.pk).select_for_update(skip_locked=True)
        return bool(list(row.values_list("pk", flat=True)))
