"""Conditional writes of Job rows: the only code that writes a state.

Every write names the state it expects (and, for a running attempt, the worker that owns
it). When the row has moved on, the write matches zero rows, changes nothing and raises
LostRace.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.fields import NOT_PROVIDED
from django.db.models.functions import Now
from django.utils import timezone

from .conf import get_settings
from .exceptions import LostRace, WorkerLost
from .payload import encode_payload
from .querysets import JobQuerySet
from .states import TERMINAL_STATES, FailureReason, State, check_transition
from .wakeup import NOTIFY

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("django_jobstate")


def class_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562, version 7), for result ids.

    With random (version 4) ids, every enqueue writes the result_id indexes at a random
    page: on a table of millions of rows, a page that is rarely in memory (the benchmark
    read ~6,500 index pages per 5,000-job drain for it). Time-ordered ids are written at
    the indexes' right edge, like serial ids.
    """
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10))  # 74 of these 80 bits are used
    value = (ms & (1 << 48) - 1) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64
    return uuid.UUID(int=value | 0b10 << 62 | rand & (1 << 62) - 1)


def backoff_delay(backoff: float, attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1`: exponential, jittered, capped."""
    cap = get_settings().MAX_BACKOFF
    return min(cap, backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


ClaimKey = tuple[int, datetime, int]


def claim_key(job: Job) -> ClaimKey:
    """Where `job` stands in claim order: higher priority first, then run_after, then id."""
    return (-job.priority, job.run_after, job.pk)


def _now_sql(connection: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
    """SQL for "now" in a conditional write, and its parameters.

    PostgreSQL: the database clock, so a worker whose clock is off cannot run a job early.
    SQLite: this process's clock, as SQLite's has only milliseconds and run_after has
    microseconds (a job due now would wait); SQLite is one machine with one clock.
    """
    if connection.vendor == "postgresql":
        return "STATEMENT_TIMESTAMP()", []
    return "%s", [connection.ops.adapt_datetimefield_value(timezone.now())]


# enqueue_many(): calls per INSERT, and the fields that differ between its rows.
ENQUEUE_CHUNK = 5000
_PER_CALL = ("result_id", "args", "kwargs")


# A module-level name, so that django-stubs types the manager's queryset methods.
_JobManagerBase = models.Manager.from_queryset(JobQuerySet)


class JobManager(_JobManagerBase["Job"]):
    def enqueue(
        self,
        task_path: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Create the first attempt of a task, queued. `options` as for enqueue_many()."""
        return self.enqueue_many(task_path, [(args, kwargs or {})], **options)[0]

    def enqueue_many(
        self,
        task_path: str,
        calls: Iterable[tuple[Sequence[Any], dict[str, Any]]],
        *,
        queue_name: str = "default",
        priority: int = 0,
        run_after: datetime | None = None,
        backend: str = "default",
        max_attempts: int = 1,
        backoff: float = 0,
        timeout: float | None = None,
    ) -> list[Job]:
        """Create the first attempts of several calls of one task: all of them, or none.

        One INSERT ... SELECT per ENQUEUE_CHUNK calls, whose rows differ only in result_id,
        args and kwargs: they travel as one JSON parameter, the rest as one parameter each
        (the ORM's INSERT would compile and adapt every field of every row, which the
        profile showed was most of an enqueue's time). On PostgreSQL, the INSERT also
        wakes listening workers (wakeup.py).
        """
        now = timezone.now()
        template = self.model(
            task_path=task_path,
            queue_name=queue_name,
            priority=priority,
            run_after=run_after or now,
            enqueued_at=now,
            backend=backend,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
        )
        rows = [
            (
                uuid7(),
                *encode_payload(list(args), "Task arguments"),
                *encode_payload(dict(kwargs), "Task keyword arguments"),
            )
            for args, kwargs in calls
        ]
        db = router.db_for_write(self.model)
        # The Job objects, as if read back: positional, not keyword, construction is faster.
        fields = [f.attname for f in self.model._meta.concrete_fields]
        values = [getattr(template, name) for name in fields]
        at = [fields.index(name) for name in _PER_CALL]
        jobs = []
        for result_id, args, _, kwargs, _ in rows:
            values[at[0]], values[at[1]], values[at[2]] = result_id, args, kwargs
            jobs.append(self.model.from_db(db, fields, values))
        # One statement is atomic on its own; a transaction would cost two round trips.
        chunks = range(0, len(rows), ENQUEUE_CHUNK)
        with transaction.atomic(using=db) if len(chunks) > 1 else contextlib.nullcontext():
            for start in chunks:
                chunk = rows[start : start + ENQUEUE_CHUNK]
                ids = self._insert(db, template, chunk)
                for job in jobs[start : start + ENQUEUE_CHUNK]:
                    job.pk = ids[job.result_id.hex]
        return jobs

    def _insert(
        self, db: str, template: Job, rows: list[tuple[uuid.UUID, Any, str, Any, str]]
    ) -> dict[str, int]:
        """INSERT `rows` (result_id, args, args JSON, kwargs, kwargs JSON) like `template`.

        Returns {result_id hex: id}. One row is a plain INSERT ... VALUES, which PostgreSQL
        plans faster; several are selected from one JSON array of [result_id, args, kwargs].
        """
        connection = connections[db]
        qn = connection.ops.quote_name
        per_call: dict[str, tuple[str, list[Any]]]
        if len(rows) == 1:
            [(result_id, _, args, _, kwargs)] = rows
            values = [result_id.hex, args, kwargs]
            per_call = {
                name: ("%s", [value]) for name, value in zip(_PER_CALL, values, strict=True)
            }
            source, source_params = "", []
        else:
            calls = ",".join(f'["{r.hex}",{args},{kwargs}]' for r, _, args, _, kwargs in rows)
            source_params = [f"[{calls}]"]
            if connection.vendor == "postgresql":
                exprs = ["(value ->> 0)::uuid", "value -> 1", "value -> 2"]
                source = "FROM jsonb_array_elements(%s::jsonb) AS call(value)"
            else:
                exprs = [f"json_extract(value, '$[{i}]')" for i in range(3)]
                source = "FROM json_each(%s) AS call"
            per_call = {name: (expr, []) for name, expr in zip(_PER_CALL, exprs, strict=True)}
        columns, selected, params = [], [], []
        for field in self.model._meta.concrete_fields:
            value = getattr(template, field.attname)
            if field.attname in per_call:
                expr, expr_params = per_call[field.attname]
            elif value is None or (
                field.db_default is not NOT_PROVIDED and value == field.db_default
            ):
                continue  # the id, the columns that start as NULL, and the database's defaults
            else:
                expr, expr_params = "%s", [field.get_db_prep_save(value, connection)]
            columns.append(qn(str(field.column)))
            selected.append(expr)
            params += expr_params
        row = (
            f"SELECT {', '.join(selected)} {source}"
            if source
            else f"VALUES ({', '.join(selected)})"
        )
        returning = f"{qn('id')}, {qn('result_id')}"
        if connection.vendor == "postgresql":
            # Wake listening workers when this commits (wakeup.py). Per row, but PostgreSQL
            # sends one notification per transaction for identical ones.
            returning += f", {NOTIFY}"
        sql = (
            f"INSERT INTO {qn(self.model._meta.db_table)} ({', '.join(columns)}) {row} "
            f"RETURNING {returning}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, *source_params])
            # result_id reads back as a UUID on PostgreSQL, as its hex on SQLite.
            return {getattr(r, "hex", r): pk for pk, r, *_ in cursor.fetchall()}

    def claim(
        self,
        worker_id: str,
        *,
        queues: Iterable[str] | None = None,
        limit: int = 1,
        from_key: ClaimKey | None = None,
    ) -> list[Job]:
        """Move up to `limit` runnable jobs to running for `worker_id`; return those won.

        One UPDATE ... RETURNING statement, conditional on the rows still being queued, so
        two callers can never win the same row. PostgreSQL picks candidates with
        SKIP LOCKED, so concurrent claimers take different rows instead of waiting.

        Jobs are claimed in claim order (priority first, then run_after, then id). With
        `from_key` (the claim_key() of a job claimed before), jobs before it in that
        order are not considered: on PostgreSQL, the index entries of claimed rows stay
        at the head of that order until VACUUM, and a claim from the head would walk
        all of them each time. The worker passes it while draining a backlog.
        """
        if not worker_id:
            raise ValueError("claim() needs a worker_id.")
        if limit < 1:
            raise ValueError(f"claim() limit must be at least 1, not {limit}.")
        check_transition(State.QUEUED, State.RUNNING)
        queues = None if queues is None else list(queues)
        if queues == []:
            return []
        db = router.db_for_write(self.model)
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        now, now_params = _now_sql(connection)
        order = f"({qn('priority')} * -1), {qn('run_after')}, {qn('id')}"  # the index's
        where, where_params = "", list[Any]()
        if queues is not None:
            where = f"AND {qn('queue_name')} IN ({', '.join(['%s'] * len(queues))})"
            where_params += queues
        if from_key is not None:
            where += f" AND ({order}) >= (%s, %s, %s)"
            rank, run_after, pk = from_key
            where_params += [rank, connection.ops.adapt_datetimefield_value(run_after), pk]
        lock = "FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
        columns = ", ".join(
            f"{table}.{qn(str(f.column))}" for f in self.model._meta.concrete_fields
        )
        # The candidates are picked once, in a materialized CTE: as a plain IN (subquery),
        # PostgreSQL may rescan the subquery while updating and claim more than `limit`.
        # The update finds them by id: its state fence is written `state || ''` so that no
        # partial index on the state can serve it. Otherwise, after an ANALYZE that saw an
        # empty queue, PostgreSQL drives the update from the runnable index and compares
        # every queued row with every picked one (61 ms instead of 5 for 100 of 5,000).
        sql = f"""
            WITH picked AS MATERIALIZED (
                SELECT {qn("id")} FROM {table}
                WHERE {qn("state")} = %s AND {qn("run_after")} <= {now} {where}
                ORDER BY {order}
                LIMIT %s {lock}
            )
            UPDATE {table}
            SET {qn("state")} = %s, {qn("worker_id")} = %s, {qn("started_at")} = {now}
            FROM picked
            WHERE {table}.{qn("id")} = picked.{qn("id")} AND {table}.{qn("state")} || '' = %s
            RETURNING {columns}
        """
        params = [State.QUEUED, *now_params, *where_params, limit]
        params += [State.RUNNING, worker_id, *now_params, State.QUEUED]
        return sorted(self.raw(sql, params, using=db), key=claim_key)

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
        now, now_params = _now_sql(connection)
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
        """Fail `job` and, if its task allows another attempt, create it; return it."""
        with transaction.atomic(using=job._state.db):
            self._transition(
                job,
                State.FAILED,
                finished_at=Now(),
                failure_reason=reason,
                error_class=error_class,
                error_message=error_message,
                traceback=traceback,
            )
            if job.attempt >= job.max_attempts:
                return None
            delay = backoff_delay(job.backoff, job.attempt)
            return self.retry(job, run_after=timezone.now() + timedelta(seconds=delay))

    def retry(self, job: Job, *, run_after: datetime | None = None) -> Job:
        """Create the next attempt of a failed `job`; the failed row stays as it is."""
        if job.state != State.FAILED:
            raise LostRace(f"Only a failed attempt can be retried; job {job.pk} is {job.state}.")
        now = timezone.now()
        db = job._state.db or router.db_for_write(self.model)
        connection = connections[db]
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
                    run_after=run_after or now,
                    enqueued_at=now,
                    max_attempts=job.max_attempts,
                    backoff=job.backoff,
                    timeout=job.timeout,
                )
                # prune() may be deleting `job`'s task, having read it before this INSERT:
                # lock `job` (prune locks it too) so that it cannot go until this commits.
                kept = self.using(db).filter(pk=job.pk).select_for_update(no_key=True)
                if not kept.values_list("pk", flat=True):
                    raise LostRace(
                        f"Job {job.pk} was deleted (pruned) before its next attempt was "
                        f"written: nothing was retried."
                    )
                if connection.vendor == "postgresql" and next_attempt.run_after <= now:
                    with connection.cursor() as cursor:  # due at once: wake a worker
                        cursor.execute(f"SELECT {NOTIFY}")
                return next_attempt
        except IntegrityError:
            raise LostRace(
                f"Job {job.pk} already has a next attempt (or a live one): "
                f"another writer retried it first."
            ) from None

    def rescue_lost(self, lost_after: float) -> int:
        """Fail as lost the running attempts of workers silent for `lost_after` seconds.

        Times are the database's, so workers' clocks do not matter. An attempt younger than
        `lost_after` is never rescued, whatever its worker did.
        """
        from .models import WorkerHeartbeat

        cutoff = Now() - timedelta(seconds=lost_after)
        alive = WorkerHeartbeat.objects.filter(last_seen__gte=cutoff).values("worker_id")
        silent = self.running().filter(started_at__lt=cutoff).exclude(worker_id__in=alive)
        error = WorkerLost(f"its worker sent no heartbeat for {lost_after:g} seconds")
        return self._fail_each(silent, FailureReason.LOST, error)

    def fail_running(
        self, worker_id: str, reason: FailureReason, error: BaseException, *, pk: int | None = None
    ) -> int:
        """Fail the running attempts of a worker that is gone or stopped (or just one of them).

        Used by a supervisor whose worker process died or was killed, and by the watchdog
        of an attempt past its timeout. Returns how many attempts it failed.
        """
        jobs = self.running().filter(worker_id=worker_id)
        return self._fail_each(jobs if pk is None else jobs.filter(pk=pk), reason, error)

    def _fail_each(self, jobs: JobQuerySet, reason: FailureReason, error: BaseException) -> int:
        failed = 0
        for job in jobs:
            try:
                self.fail(job, reason, error_class=class_path(error), error_message=str(error))
            except LostRace:
                continue  # its worker finished it, or another rescuer got there first
            logger.warning("Job %s attempt %d failed as %s: %s", job.pk, job.attempt, reason, error)
            failed += 1
        return failed

    def cancel(self, job: Job) -> None:
        """Delete `job` if it is still queued: a cancelled job never runs."""
        if not self.cancel_many([job.pk], using=job._state.db):
            raise LostRace(f"Job {job.pk} is no longer queued; it was not cancelled.")

    def cancel_many(self, pks: Iterable[int], *, using: str | None = None) -> int:
        """Delete those of `pks` that are still queued; return how many were deleted.

        One DELETE conditional on the state: QuerySet.delete() would read the rows first
        and then delete them by pk alone, deleting a job claimed in between.
        """
        pks = list(pks)
        if not pks:
            return 0
        connection = connections[using or router.db_for_write(self.model)]
        qn = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {qn(self.model._meta.db_table)} "
                f"WHERE {qn('id')} IN ({', '.join(['%s'] * len(pks))}) AND {qn('state')} = %s",
                [*pks, State.QUEUED],
            )
            return cursor.rowcount

    def _transition(self, job: Job, new: State, **values: Any) -> None:
        """Move `job` to `new` if it is still where this process last saw it.

        The write is conditional on the state (and, for running attempts, the worker);
        on success `job` is refreshed from the row, on a lost race nothing changes.
        """
        check_transition(job.state, new)
        fence: dict[str, Any] = {"pk": job.pk, "state": job.state}
        if job.state == State.RUNNING:
            fence["worker_id"] = job.worker_id
        updated = self.using(job._state.db).filter(**fence).update(state=new, **values)
        if updated != 1:
            raise LostRace(
                f"Job {job.pk} was no longer {job.state}"
                + (f" for worker {job.worker_id}" if "worker_id" in fence else "")
                + f" when moving it to {new}: another writer got there first. Nothing was changed."
            )
        job.refresh_from_db(fields=["state", *values])

    def prune(
        self,
        older_than: timedelta,
        *,
        states: Iterable[str] | None = None,
        batch_size: int = 1000,
        dry_run: bool = False,
    ) -> int:
        """Delete the prunable() attempts, whole tasks of about `batch_size` attempts per
        batch; return how many. With `dry_run`, count them instead.

        A retry may commit while a batch runs. So each batch is one short transaction that
        deletes a task only if, by a snapshot taken after it locked the rows, all of the
        task's attempts are among them (no new attempt, live or not) and terminal. On
        PostgreSQL it locks them first (FOR UPDATE): a retry locks its predecessor too
        (retry()), so either the retry committed first and the re-check sees it, or it
        waits and then finds its predecessor gone. On SQLite the one DELETE does it all
        under the write lock. Not QuerySet.delete(): its SET_NULL of `previous` would keep
        such a retry, unlinked from the deleted attempt.
        """
        if batch_size < 1:
            raise ValueError(f"prune() batch_size must be at least 1, not {batch_size}.")
        db = router.db_for_write(self.model)
        candidates = self.using(db).prunable(older_than, states).order_by("result_id", "attempt")
        if dry_run:
            return candidates.count()
        deleted, last = 0, None
        while True:
            after = candidates if last is None else candidates.filter(result_id__gt=last)
            rows = list(after.values_list("pk", "result_id")[: batch_size + 1])
            if not rows:
                return deleted
            if len(rows) > batch_size:  # the task of the extra row may go on past it
                split = rows[-1][1]
                rows = [row for row in rows if row[1] != split] or list(
                    after.filter(result_id=split).values_list("pk", "result_id")
                )
            last = rows[-1][1]
            deleted += self._delete_tasks(db, [pk for pk, _ in rows])

    def _delete_tasks(self, db: str, ids: list[int]) -> int:
        """Delete the tasks all of whose attempts are among `ids`, and terminal."""
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        with transaction.atomic(using=db):
            if connection.vendor == "postgresql":
                locked = self.using(db).filter(pk__in=ids).select_for_update().order_by("pk")
                ids = list(locked.values_list("pk", flat=True))  # any deleted meanwhile: gone
                if not ids:
                    return 0
            marks = ", ".join(["%s"] * len(ids))
            terminal = sorted(TERMINAL_STATES)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""DELETE FROM {table}
                    WHERE {qn("id")} IN ({marks}) AND NOT EXISTS (
                        SELECT 1 FROM {table} AS other
                        WHERE other.{qn("result_id")} = {table}.{qn("result_id")} AND (
                            other.{qn("id")} NOT IN ({marks})
                            OR other.{qn("state")} NOT IN ({", ".join(["%s"] * len(terminal))})
                        )
                    )
                    """,
                    [*ids, *ids, *terminal],
                )
                return cursor.rowcount
