"""Retry: the next attempt of a failed one (by fail(), or by hand: Job.objects.retry, the
admin's Retry). A task that depends on others enters held again until they succeed; one
that others depend on brings back, after a retry by hand, those that failed because of it
(deps.py)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, cast

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models.expressions import RawSQL

from ..db import notify
from ..exceptions import JobAlreadyEnqueued, LostRace
from ..limits.concurrency import Hold
from ..states import State
from ..uniqueness import HOLDS_KEY, KEY_INDEX, UniqueScope
from .base import now_sql
from .conflicts import retries_conflicts
from .deps import Dependencies

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


class Retry(Dependencies):
    @retries_conflicts
    def retry(
        self,
        job: Job,
        *,
        run_after: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int | None = None,
        revive: bool = True,
    ) -> Job:
        """Create the next attempt of a failed `job`; the failed row stays as it is.

        It runs at `run_after`, or else `delay` seconds from now by the INSERT's clock. It
        keeps `job`'s unique key: if another task holds it (which only a task with
        unique_scope "queued", or a retry by hand, can meet), JobAlreadyEnqueued is raised
        and nothing is written. A task that depends on others is held until those that
        have not succeeded do; with `revive` (a retry by hand, not fail()'s), the tasks
        that failed because `job` did come back too (deps.py).
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
                # The payload as stored, not `job`'s: the attempt ran with these objects, and
                # a task may have changed them in place (its context's metadata, a list
                # argument) without saving, even into something JSON cannot store.
                marks = kept.values_list("has_dependents", "args", "kwargs", "metadata")
                if not marks:
                    raise LostRace(
                        f"Job {job.pk} was deleted (pruned) before its next attempt was "
                        f"written: nothing was retried."
                    )
                # Read under the lock: a dependent's mark is final.
                has_dependents, args, kwargs, metadata = marks[0]
                # Through the gate of an enqueue: its slot first, then its rate (rates.py).
                hold = Hold.LIMIT if job.concurrency_key else Hold.RATE if job.rate_limit else None
                pending = None
                if job.pending_deps is not None:  # it depends on others: held until they succeed
                    pending, _ = self._pending_for(db, job.result_id)
                    hold = Hold.DEPS if pending else hold
                    if not pending and job.pending_deps and job.receives is not None:
                        # Never released (failed or cancelled while held), and nothing to
                        # wait for now: given its upstreams' results here, as a release does.
                        args, kwargs = self._given_results(db, job)
                next_attempt = self.create(
                    result_id=job.result_id,
                    attempt=job.attempt + 1,
                    previous=job,
                    task_path=job.task_path,
                    args=args,
                    kwargs=kwargs,
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
                    metadata=metadata,
                    trace_context=job.trace_context,
                    schedule_name=job.schedule_name,
                    scheduled_for=job.scheduled_for,
                    # Through the gate of an enqueue: held, then a free slot if any.
                    concurrency_key=job.concurrency_key,
                    concurrency_limit=job.concurrency_limit,
                    hold=hold,
                    rate_limit=job.rate_limit,
                    workflow_id=job.workflow_id,
                    pending_deps=pending,
                    has_dependents=has_dependents,
                    receives=job.receives,
                )
                if job.concurrency_key is not None:
                    self._release_slots(db, [job.concurrency_key])
                    next_attempt.refresh_from_db(fields=["hold", "concurrency_slot"])
                if isinstance(next_attempt.enqueued_at, RawSQL):
                    # Django 5.2 leaves the expressions on the instance (6.0 reads them back
                    # with the INSERT's RETURNING): read the values the database wrote.
                    next_attempt.refresh_from_db(fields=["run_after", "enqueued_at"])
                due_now = next_attempt.run_after <= next_attempt.enqueued_at
                # Else the release of its slot or dependencies wakes a worker.
                due_now = due_now and next_attempt.hold in (None, Hold.RATE)
                if due_now:  # due at once: wake a worker
                    notify.send(
                        connection, [(job.queue_name, job.priority, next_attempt.run_after)]
                    )
                if revive and has_dependents:
                    self._revive(db, job.result_id)
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
