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
import traceback
import uuid
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Exists
from django.db.models.expressions import RawSQL
from django.db.models.fields import NOT_PROVIDED
from django.db.models.functions import Now
from django.utils import timezone

from .conf import get_settings
from .exceptions import JobTimeout, LostRace, WorkerLost
from .payload import encode_payload
from .querysets import JobQuerySet
from .states import TERMINAL_STATES, FailureReason, State, check_transition
from .wakeup import NOTIFY

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("django_jobstate")


def class_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def describe_error(exc: BaseException) -> dict[str, str]:
    """The error fields of a failed attempt, for any exception.

    Its str() may raise (the traceback module says so instead), and PostgreSQL stores no
    NUL character and no lone surrogate in text: both are written as escapes.
    """
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the error failed>"
    return {
        "error_class": storable_text(class_path(exc))[:255],
        "error_message": storable_text(message),
        "traceback": storable_text("".join(traceback.format_exception(exc))),
    }


def timeout_error(job: Job) -> JobTimeout:
    return JobTimeout(f"the attempt ran past its timeout of {job.timeout:g} seconds")


def storable_text(text: str) -> str:
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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


def _now_sql(connection: BaseDatabaseWrapper, delay: float = 0.0) -> tuple[str, list[Any]]:
    """SQL for "now" (plus `delay` seconds) in a write, and its parameters.

    Every time the claim compares (run_after, and the enqueued_at beside it) is written
    with this, never with the writing process's clock: on PostgreSQL it is the database
    clock, so a worker whose clock is behind cannot skip a retry's backoff and a web
    process whose clock is ahead cannot enqueue jobs that wait for the database to catch
    up. SQLite: this process's clock, as SQLite's has only milliseconds and run_after has
    microseconds (a job due now would wait); SQLite is one machine with one clock.
    """
    if connection.vendor == "postgresql":
        if delay:
            return "(STATEMENT_TIMESTAMP() + %s)", [timedelta(seconds=delay)]
        return "STATEMENT_TIMESTAMP()", []
    now = timezone.now() + timedelta(seconds=delay)
    return "%s", [connection.ops.adapt_datetimefield_value(now)]


def _from_db(connection: BaseDatabaseWrapper, field: models.Field[Any, Any], value: Any) -> Any:
    """A value of `field` read with a raw cursor, as the ORM would give it (SQLite: text)."""
    column = field.get_col(field.model._meta.db_table)
    for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
        value = convert(value, column, connection)
    return value


# enqueue_many(): calls per INSERT, and the fields that differ between its rows.
ENQUEUE_CHUNK = 5000
_PER_CALL = ("result_id", "args", "kwargs")
# The times an INSERT takes from _now_sql() when not given, and reads back.
_CLOCKED = ("run_after", "enqueued_at")


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
        # Without run_after (and enqueued_at), the INSERT takes them from its clock.
        template = self.model(
            task_path=task_path,
            queue_name=queue_name,
            priority=priority,
            backend=backend,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
        )
        if run_after is not None:
            template.run_after = run_after
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
                ids, times = self._insert(db, template, chunk)
                for job in jobs[start : start + ENQUEUE_CHUNK]:
                    job.pk = ids[job.result_id.hex]
                    job.run_after, job.enqueued_at = times
        return jobs

    def _insert(
        self, db: str, template: Job, rows: list[tuple[uuid.UUID, Any, str, Any, str]]
    ) -> tuple[dict[str, int], tuple[datetime, datetime]]:
        """INSERT `rows` (result_id, args, args JSON, kwargs, kwargs JSON) like `template`.

        Returns {result_id hex: id}, and the run_after and enqueued_at stored (the same for
        every row of one statement). One row is a plain INSERT ... VALUES, which PostgreSQL
        plans faster; several are selected from one JSON array of [result_id, args, kwargs].
        """
        connection = connections[db]
        qn = connection.ops.quote_name
        now, now_params = _now_sql(connection)
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
            elif field.attname in _CLOCKED and value is None:
                expr, expr_params = now, now_params
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
        returning = ", ".join(qn(name) for name in ("id", "result_id", *_CLOCKED))
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
            returned = cursor.fetchall()
        meta = self.model._meta
        times = returned[0][2:]
        run_after = _from_db(connection, meta.get_field("run_after"), times[0])
        enqueued_at = _from_db(connection, meta.get_field("enqueued_at"), times[1])
        # result_id reads back as a UUID on PostgreSQL, as its hex on SQLite.
        return {getattr(r, "hex", r): pk for pk, r, *_ in returned}, (run_after, enqueued_at)

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
        """Fail `job` and, if its task allows another attempt, create it; return it.

        An attempt RELEASED (claimed, never started) always gets a next attempt, due at
        once, that does not use up one of the task's attempts.
        """
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
            if reason == FailureReason.RELEASED:
                return self.retry(job, max_attempts=job.max_attempts + 1)
            if job.attempt >= job.max_attempts:
                return None
            delay = backoff_delay(job.backoff, job.attempt)
            return self.retry(job, delay=delay)

    def retry(
        self,
        job: Job,
        *,
        run_after: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int | None = None,
    ) -> Job:
        """Create the next attempt of a failed `job`; the failed row stays as it is.

        It runs at `run_after`, or else `delay` seconds from now by the INSERT's clock.
        """
        if job.state != State.FAILED:
            raise LostRace(f"Only a failed attempt can be retried; job {job.pk} is {job.state}.")
        db = job._state.db or router.db_for_write(self.model)
        connection = connections[db]
        now = RawSQL(*_now_sql(connection), output_field=models.DateTimeField())
        due = RawSQL(*_now_sql(connection, delay), output_field=models.DateTimeField())
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
                        cursor.execute(f"SELECT {NOTIFY}")
                return next_attempt
        except IntegrityError:
            raise LostRace(
                f"Job {job.pk} already has a next attempt (or a live one): "
                f"another writer retried it first."
            ) from None

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
        from .models import WorkerHeartbeat

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
        fail as `reason` (the one killed at its deadline as a timeout), and the others,
        never begun, are released.
        """
        failed = 0
        for job in self.running().filter(worker_id=worker_id):
            if job.pk == timed_out:
                failed += self._fail_each([job], FailureReason.TIMEOUT, timeout_error(job))
            elif job.pk in started:
                failed += self._fail_each([job], reason, error)
            else:
                failed += self.release(worker_id, [job.pk])
        return failed

    def time_out(self, worker_id: str, pk: int) -> int:
        """Fail `worker_id`'s attempt `pk` as past its timeout (1), unless it has moved on (0)."""
        jobs = self.running().filter(worker_id=worker_id, pk=pk)
        return sum(
            self._fail_each([job], FailureReason.TIMEOUT, timeout_error(job)) for job in jobs
        )

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
                locking = transaction.atomic(using=job._state.db)
                with locking if skip_locked else contextlib.nullcontext():
                    if skip_locked and not self._lock_or_skip(job):
                        continue  # its writer holds it; see again at the next rescue
                    self.fail(job, reason, **describe_error(error))
            except LostRace:
                continue  # its worker finished it, or another rescuer got there first
            logger.warning("Job %s attempt %d failed as %s: %s", job.pk, job.attempt, reason, error)
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
