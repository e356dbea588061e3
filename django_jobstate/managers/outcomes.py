"""Outcomes: a running attempt to succeeded or failed, its next attempt with it (by its
worker; by its supervisor or a rescuer through settle.py), and a retry."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Case, Value, When
from django.db.models.expressions import RawSQL

from ..conf import get_settings
from ..dbclock import Now
from ..exceptions import JobAlreadyEnqueued, LostRace
from ..limits import Hold
from ..notify import NOTIFY_QUEUE, queue_payload
from ..states import FailureReason, State, check_transition
from ..telemetry.logs import job_fields
from ..uniqueness import HOLDS_KEY, KEY_INDEX, UniqueScope
from .base import logger, now_sql, write_lock_first, writing
from .conflicts import retries_conflicts
from .mysql import MySQLWrites

if TYPE_CHECKING:
    from ..models import Job


def _violates_unique_key(exc: IntegrityError) -> bool:
    """Whether `exc` is a unique key's index refusing a row (not another constraint)."""
    diag = getattr(exc.__cause__, "diag", None)  # PostgreSQL names the index
    if diag is not None:
        return diag.constraint_name in KEY_INDEX.values()
    if any(f"'{name}'" in str(exc) for name in KEY_INDEX.values()):
        return True  # MariaDB/MySQL: "Duplicate entry '...' for key 'jobstate_job_unique_live'"
    return "unique_key" in str(exc)  # SQLite names the column


def backoff_delay(backoff: float, attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1`: exponential, jittered, capped."""
    cap = get_settings().MAX_BACKOFF
    return min(cap, backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


class Outcomes(MySQLWrites):
    @retries_conflicts
    def succeed(self, job: Job, return_value: Any) -> None:
        """Record that `job`'s task returned `return_value`."""
        self._transition(job, State.SUCCEEDED, finished_at=Now(), return_value=return_value)

    @retries_conflicts
    def succeed_many(self, worker_id: str, outcomes: Sequence[tuple[Job, Any]]) -> set[int]:
        """Record several successes of `worker_id` in one statement; return the ids written.

        Each row is still fenced by state and worker: an attempt that was failed meanwhile
        (rescued as lost, timed out) is left alone and its id is missing from the result.
        """
        check_transition(State.RUNNING, State.SUCCEEDED)
        limited = [(job, value) for job, value in outcomes if job.concurrency_key is not None]
        if limited:  # one by one, each handing its slot on (limits.py); only they pay
            outcomes = [(job, value) for job, value in outcomes if job.concurrency_key is None]
            return self._succeed_each(limited) | self.succeed_many(worker_id, outcomes)
        if not outcomes:
            return set()
        db = router.db_for_write(self.model)
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        if connection.vendor == "mysql":
            return self._succeed_many_mysql(db, worker_id, outcomes)
        row = "(%s::bigint, %s::jsonb)" if connection.vendor == "postgresql" else "(%s, %s)"
        values = []
        for job, value in outcomes:
            values += [job.pk, json.dumps(value)]
        with write_lock_first(db), connection.cursor() as cursor:
            now, now_params = now_sql(connection)
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
            cursor.execute(sql, params)
            return {row[0] for row in cursor.fetchall()}

    def _succeed_each(self, outcomes: Sequence[tuple[Job, Any]]) -> set[int]:
        written = set()
        for job, value in outcomes:
            try:
                self.succeed(job, value)
            except LostRace:
                continue  # failed meanwhile (rescued, timed out): left alone, as above
            written.add(job.pk)
        return written

    @retries_conflicts
    def fail(
        self,
        job: Job,
        reason: FailureReason,
        *,
        error_class: str = "",
        error_message: str = "",
        traceback: str = "",
        retry: bool = True,
        delay: float | None = None,
    ) -> Job | None:
        """Fail `job` and, if its task allows another attempt (and `retry`), create it,
        due after `delay` seconds (None: the task's backoff); return it.

        An attempt RELEASED (claimed, never started) or SNOOZED (its task asked to run
        again later) always gets a next attempt, due at once or after `delay`, that does
        not use up one of the task's attempts. A running attempt that
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
            if job.failure_reason == FailureReason.CANCELLED or not retry:
                return None
            if reason in (FailureReason.RELEASED, FailureReason.SNOOZED):
                options: dict[str, Any] = {"max_attempts": job.max_attempts + 1}
                options["delay"] = delay or 0.0
            elif job.attempt < job.max_attempts:
                backoff = backoff_delay(job.backoff, job.attempt) if delay is None else delay
                options = {"delay": backoff}
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

    @retries_conflicts
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
        try:
            with transaction.atomic(using=db):
                # Read inside the transaction: on SQLite, once it holds the write lock.
                now = RawSQL(*now_sql(connection), output_field=models.DateTimeField())
                due = RawSQL(*now_sql(connection, delay), output_field=models.DateTimeField())
                # prune() may be deleting `job`'s task, having read it before this retry:
                # lock `job` (prune locks it too) so that it cannot go until this commits.
                # Before the INSERT: InnoDB checks the INSERT's foreign key at once, with a
                # shared lock on `job` that a later FOR UPDATE would have to upgrade, a
                # deadlock with a prune waiting for it (one in ten races on MariaDB).
                no_key = connection.features.has_select_for_no_key_update  # not MySQL
                kept = self.using(db).filter(pk=job.pk).select_for_update(no_key=no_key)
                if not kept.values_list("pk", flat=True):
                    raise LostRace(
                        f"Job {job.pk} was deleted (pruned) before its next attempt was "
                        f"written: nothing was retried."
                    )
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
                    # Through the gate of an enqueue: held, then a free slot if any.
                    concurrency_key=job.concurrency_key,
                    concurrency_limit=job.concurrency_limit,
                    hold=None if job.concurrency_key is None else Hold.LIMIT,
                )
                if job.concurrency_key is not None:
                    self._release_slots(db, [job.concurrency_key])
                    next_attempt.refresh_from_db(fields=["hold", "concurrency_slot"])
                if isinstance(next_attempt.enqueued_at, RawSQL):
                    # Django 5.2 leaves the expressions on the instance (6.0 reads them back
                    # with the INSERT's RETURNING): read the values the database wrote.
                    next_attempt.refresh_from_db(fields=["run_after", "enqueued_at"])
                due_now = next_attempt.run_after <= next_attempt.enqueued_at
                due_now = due_now and next_attempt.hold is None  # else the release wakes
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
        that is the task's own next attempt, or if `job` has one already (the INSERT broke
        both constraints: the database names one, SQLite the key's), else JobAlreadyEnqueued."""
        scope = UniqueScope(cast(str, job.unique_scope))
        attempts = self.using(job._state.db)
        if attempts.filter(result_id=job.result_id, attempt=job.attempt + 1).exists():
            return LostRace(f"Job {job.pk} already has a next attempt: another writer retried it.")
        held = attempts.filter(HOLDS_KEY[scope], unique_key=job.unique_key)
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
