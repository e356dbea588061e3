"""Outcomes: a running attempt to succeeded or failed (its next attempt with it), by its
worker, its supervisor, a rescuer of lost workers; and cancelling an attempt (cancel.py)."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Case, Exists, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from .. import metrics
from ..conf import get_settings
from ..exceptions import JobAlreadyEnqueued, JobCancelled, LostRace, WorkerLost
from ..logs import job_fields
from ..states import FailureReason, State, check_transition
from ..uniqueness import HOLDS_KEY, KEY_INDEX, UniqueScope
from ..wakeup import NOTIFY_QUEUE, queue_payload
from .base import (
    Writes,
    brief_transaction,
    describe_error,
    logger,
    now_sql,
    timeout_error,
    writing,
)

if TYPE_CHECKING:
    from ..models import Job


def _violates_unique_key(exc: IntegrityError) -> bool:
    """Whether `exc` is a unique key's index refusing a row (not another constraint)."""
    diag = getattr(exc.__cause__, "diag", None)  # PostgreSQL names the index
    if diag is not None:
        return diag.constraint_name in KEY_INDEX.values()
    return "unique_key" in str(exc)  # SQLite names the column


def backoff_delay(backoff: float, attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1`: exponential, jittered, capped."""
    cap = get_settings().MAX_BACKOFF
    return min(cap, backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def stopped(job: Job) -> tuple[FailureReason, Exception]:
    """Why an attempt stopped at its deadline failed: its timeout, or its cancel grace."""
    if job.cancel_requested_at is not None:
        grace = get_settings().CANCEL_GRACE
        return FailureReason.CANCELLED, JobCancelled(
            f"it was cancelled and stopped (JOBSTATE_CANCEL_GRACE is {grace:g} seconds)"
        )
    return FailureReason.TIMEOUT, timeout_error(job)


class Outcomes(Writes):
    def succeed(self, job: Job, return_value: Any) -> None:
        """Record that `job`'s task returned `return_value`."""
        self._transition(job, State.SUCCEEDED, finished_at=Now(), return_value=return_value)

    def succeed_many(self, worker_id: str, outcomes: Sequence[tuple[Job, Any]]) -> set[int]:
        """Record several successes of `worker_id` in one statement; return the ids written.

        Each row is still fenced by state and worker: an attempt that was failed meanwhile
        (rescued as lost, timed out) is left alone and its id is missing from the result.
        """
        check_transition(State.RUNNING, State.SUCCEEDED)
        if not outcomes:
            return set()
        connection = connections[router.db_for_write(self.model)]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        now, now_params = now_sql(connection)
        row = "(%s::bigint, %s::jsonb)" if connection.vendor == "postgresql" else "(%s, %s)"
        values = []
        for job, value in outcomes:
            values += [job.pk, json.dumps(value)]
        sql = f"""
            WITH outcome(id, return_value) AS (VALUES {", ".join([row] * len(outcomes))})
            UPDATE {table}
            SET {qn("state")} = %s, {qn("finished_at")} = {now},
                {qn("return_value")} = outcome.return_value
            FROM outcome
            WHERE {table}.{qn("id")} = outcome.id
                AND {qn("state")} = %s AND {qn("worker_id")} = %s
            RETURNING {table}.{qn("id")}
        """
        params = [*values, State.SUCCEEDED, *now_params, State.RUNNING, worker_id]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {row[0] for row in cursor.fetchall()}

    def fail(
        self,
        job: Job,
        reason: FailureReason,
        *,
        error_class: str = "",
        error_message: str = "",
        traceback: str = "",
    ) -> Job | None:
        """Fail `job` and, if its task allows another attempt, create it; return it.

        An attempt RELEASED (claimed, never started) always gets a next attempt, due at
        once, that does not use up one of the task's attempts. A running attempt that
        someone asked to cancel fails as CANCELLED whatever ended it (the database
        decides, so a stale `job` cannot miss a request), and is never retried.
        """
        failure_reason: Any = reason
        if job.state == State.RUNNING:
            failure_reason = Case(
                When(cancel_requested_at__isnull=False, then=Value(FailureReason.CANCELLED)),
                default=Value(reason),
            )
        with writing(job):
            self._transition(
                job,
                State.FAILED,
                finished_at=Now(),
                failure_reason=failure_reason,
                error_class=error_class,
                error_message=error_message,
                traceback=traceback,
            )
            if job.failure_reason == FailureReason.CANCELLED:
                return None
            if reason == FailureReason.RELEASED:
                options: dict[str, Any] = {"max_attempts": job.max_attempts + 1}
            elif job.attempt < job.max_attempts:
                options = {"delay": backoff_delay(job.backoff, job.attempt)}
            else:
                return None
            try:
                return self.retry(job, **options)
            except JobAlreadyEnqueued as exc:
                # Only with unique_scope "queued": a newer call of the task with the same
                # key is waiting, and will run in this one's place.
                logger.warning(
                    "Job %s (%s, attempt %s) failed and is not retried: a newer job with "
                    "its unique key was queued (%s), which supersedes the retry.",
                    job.pk,
                    job.task_path,
                    job.attempt,
                    exc.result_id or "since claimed",
                    extra=job_fields(job, "job.retry_superseded"),
                )
                return None

    def retry(
        self,
        job: Job,
        *,
        run_after: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int | None = None,
    ) -> Job:
        """Create the next attempt of a failed `job`; the failed row stays as it is.

        It runs at `run_after`, or else `delay` seconds from now by the INSERT's clock. It
        keeps `job`'s unique key: if another task holds it (which only a task with
        unique_scope "queued", or a retry by hand, can meet), JobAlreadyEnqueued is raised
        and nothing is written.
        """
        if job.state != State.FAILED:
            raise LostRace(f"Only a failed attempt can be retried; job {job.pk} is {job.state}.")
        db = job._state.db or router.db_for_write(self.model)
        connection = connections[db]
        now = RawSQL(*now_sql(connection), output_field=models.DateTimeField())
        due = RawSQL(*now_sql(connection, delay), output_field=models.DateTimeField())
        try:
            with transaction.atomic(using=db):
                next_attempt = self.create(
                    result_id=job.result_id,
                    attempt=job.attempt + 1,
                    previous=job,
                    task_path=job.task_path,
                    args=job.args,
                    kwargs=job.kwargs,
                    backend=job.backend,
                    queue_name=job.queue_name,
                    priority=job.priority,
                    run_after=run_after or due,
                    enqueued_at=now,
                    max_attempts=job.max_attempts if max_attempts is None else max_attempts,
                    backoff=job.backoff,
                    timeout=job.timeout,
                    unique_key=job.unique_key,
                    unique_scope=job.unique_scope,
                    metadata=job.metadata,
                    trace_context=job.trace_context,
                    schedule_name=job.schedule_name,
                    scheduled_for=job.scheduled_for,
                )
                # prune() may be deleting `job`'s task, having read it before this INSERT:
                # lock `job` (prune locks it too) so that it cannot go until this commits.
                kept = self.using(db).filter(pk=job.pk).select_for_update(no_key=True)
                if not kept.values_list("pk", flat=True):
                    raise LostRace(
                        f"Job {job.pk} was deleted (pruned) before its next attempt was "
                        f"written: nothing was retried."
                    )
                due_now = next_attempt.run_after <= next_attempt.enqueued_at
                if connection.vendor == "postgresql" and due_now:
                    with connection.cursor() as cursor:  # due at once: wake a worker
                        payload = queue_payload(job.queue_name, job.priority)
                        cursor.execute(f"SELECT {NOTIFY_QUEUE}", [payload])
                return next_attempt
        except IntegrityError as exc:
            if job.unique_key is not None and _violates_unique_key(exc):
                raise self._key_held(job) from None
            raise LostRace(
                f"Job {job.pk} already has a next attempt (or a live one): "
                f"another writer retried it first."
            ) from None

    def _key_held(self, job: Job) -> Exception:
        """The error for a retry of `job` that met a live row with its key: LostRace if
        that is the task's own next attempt, else JobAlreadyEnqueued."""
        scope = UniqueScope(cast(str, job.unique_scope))
        held = self.using(job._state.db).filter(HOLDS_KEY[scope], unique_key=job.unique_key)
        holder = held.first()
        if holder is not None and holder.result_id == job.result_id:
            return LostRace(f"Job {job.pk} already has a next attempt: {holder}.")
        if holder is None:  # the holder moved on since (it was claimed, or it finished)
            return JobAlreadyEnqueued(
                f"Job {job.pk} was not retried: another job with its unique key was "
                f"{'queued' if scope == UniqueScope.QUEUED else 'live'}.",
                result_id=None,
            )
        return JobAlreadyEnqueued(
            f"Job {job.pk} was not retried: job {holder.pk} ({holder.result_id}) with the "
            f"same unique key is {holder.state}.",
            result_id=str(holder.result_id),
        )

    def rescue_lost(
        self, lost_after: float, *, judges: Sequence[str] = (), judge_gap: float = 0
    ) -> int:
        """Fail as lost the running attempts of workers silent for `lost_after` seconds.

        Times are the database's, so workers' clocks do not matter. An attempt younger than
        `lost_after` is never rescued, whatever its worker did. With `judges`, nothing is
        rescued unless one of those workers beat within the last `judge_gap` seconds: a
        rescuer whose own beats stalled (its statement waited on a lock, it was paused)
        cannot tell a dead worker from one that was held up as it was (liveness.py).
        """
        from ..models import WorkerHeartbeat

        cutoff = Now() - timedelta(seconds=lost_after)
        alive = WorkerHeartbeat.objects.filter(last_seen__gte=cutoff).values("worker_id")
        silent = self.running().filter(started_at__lt=cutoff).exclude(worker_id__in=alive)
        if judges:
            fresh = Now() - timedelta(seconds=judge_gap)
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
        rather than wait for it: a worker cut off between its outcome's UPDATE and its
        COMMIT holds the row until its connection is dropped, which for a host that never
        comes back can take hours, and a rescuer must keep heartbeating meanwhile.
        """
        failed = 0
        for job in jobs:
            try:
                locking = brief_transaction(job._state.db)
                with locking if skip_locked else contextlib.nullcontext():
                    if skip_locked and not self._lock_or_skip(job):
                        continue  # its writer holds it; see again at the next rescue
                    self.fail(job, reason, **describe_error(error))
            except LostRace:
                continue  # its worker finished it, or another rescuer got there first
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

    def _lock_or_skip(self, job: Job) -> bool:
        """Lock `job`'s row unless another transaction holds it (SQLite: no row locks, and
        a read before the write would ask for a lock upgrade, so nothing to do)."""
        db = job._state.db or router.db_for_write(self.model)
        if not connections[db].features.has_select_for_update_skip_locked:
            return True
        row = self.using(db).filter(pk=job.pk).select_for_update(skip_locked=True)
        return bool(list(row.values_list("pk", flat=True)))
