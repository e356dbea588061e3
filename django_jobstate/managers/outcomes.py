"""Outcomes: a running attempt to succeeded or failed, its next attempt with it (by its
worker; by its supervisor or a rescuer through settle.py), and a retry."""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from django.db import connections, router
from django.db.models import Case, Value, When

from ..conf import get_settings
from ..db.clock import Now
from ..exceptions import JobAlreadyEnqueued, LostRace
from ..payload import dumps
from ..states import FailureReason, State, check_transition
from ..telemetry.logs import job_fields
from .base import brief_transaction, logger, now_sql, write_lock_first, writing
from .conflicts import retries_conflicts
from .mysql import MySQLWrites
from .retry import Retry

if TYPE_CHECKING:
    from ..models import Job


def backoff_delay(backoff: float, attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1`: exponential, jittered, capped."""
    cap = get_settings().MAX_BACKOFF
    return min(cap, backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


class Outcomes(MySQLWrites, Retry):
    @retries_conflicts
    def succeed(self, job: Job, return_value: Any) -> None:
        """Record that `job`'s task returned `return_value`, and release what waits for
        it in the same transaction (deps.py)."""
        db = job._state.db or router.db_for_write(self.model)
        with nullcontext() if connections[db].in_atomic_block else writing(job):
            self._transition(job, State.SUCCEEDED, finished_at=Now(), return_value=return_value)
            if job.has_dependents:  # read back by the write: current, not as claimed
                self._after_successes(db, [job.result_id])

    @retries_conflicts
    def succeed_many(self, worker_id: str, outcomes: Sequence[tuple[Job, Any]]) -> set[int]:
        """Record several successes of `worker_id` in one statement; return the ids written.

        Each row is still fenced by state and worker: an attempt that was failed meanwhile
        (rescued as lost, timed out) is left alone and its id is missing from the result.
        """
        check_transition(State.RUNNING, State.SUCCEEDED)
        # One by one, each in its transaction: a limited job hands its slot on
        # (limits/concurrency.py). Jobs with dependents: together, in a transaction that
        # releases what waits for them (deps.py). Only they pay. The plain ones first: the
        # others write rows beside their own (a held job, a dependent), which an
        # application's transaction may hold, and what waits for them must not hold back
        # the rest of the batch.
        limited = [(job, value) for job, value in outcomes if job.concurrency_key is not None]
        linked = [o for o in outcomes if o[0].has_dependents and o[0].concurrency_key is None]
        plain = [o for o in outcomes if not o[0].has_dependents and o[0].concurrency_key is None]
        written: set[int] = set()
        if plain:
            written = self._succeed_many(worker_id, plain)
            # Not written: lost to another writer, or given a dependent since it was
            # claimed (the statement leaves has_dependents rows alone): written as linked.
            linked += [o for o in plain if o[0].pk not in written]
        if linked:
            written |= self._succeed_linked(worker_id, linked)
        if limited:
            written |= self._succeed_each(limited)
        return written

    def _succeed_linked(self, worker_id: str, outcomes: Sequence[tuple[Job, Any]]) -> set[int]:
        db = router.db_for_write(self.model)
        with brief_transaction(db):
            written = self._succeed_many(worker_id, outcomes, linked=True)
            ups = [job.result_id for job, _ in outcomes if job.pk in written]
            if ups:
                self._after_successes(db, ups)
        return written

    def _succeed_many(
        self, worker_id: str, outcomes: Sequence[tuple[Job, Any]], linked: bool = False
    ) -> set[int]:
        """The one statement of succeed_many(): rows with dependents only if `linked`."""
        db = router.db_for_write(self.model)
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        if connection.vendor == "mysql":
            return self._succeed_many_mysql(db, worker_id, outcomes, linked)
        if connection.vendor == "postgresql":
            # One JSON array of [id, return value] pairs, not a VALUES row per job: the
            # client-side binding quotes one string (json makes it in C), and the
            # server parses a short statement. A batch of 100 took 3.3 ms as VALUES, 1.2
            # as two arrays (psycopg formats those element by element: 0.44 ms), 0.7 so.
            rows = "SELECT (e ->> 0)::bigint, e -> 1 FROM jsonb_array_elements(%s::jsonb) e"
            values: list[Any] = [dumps([[job.pk, value] for job, value in outcomes])]
            # The rows by their ids, whatever the statistics say: from a worker id they
            # never saw (a fresh backlog analyzed), the planner took the rows for one, and
            # on a table under ~20,000 rows read it all for the batch (3.5 ms against 1.6
            # at 10,000 rows). An array it cannot see into makes the id index the cheaper.
            by_id = f"AND {table}.{qn('id')} = ANY(ARRAY(SELECT id FROM outcome))"
        else:
            rows = "VALUES " + ", ".join(["(%s, %s)"] * len(outcomes))
            values = [param for job, value in outcomes for param in (job.pk, dumps(value))]
            by_id = ""
        with write_lock_first(db), connection.cursor() as cursor:
            now, now_params = now_sql(connection)
            # The rows are found by id; the fence is written `state || ''` so that the
            # partial index of running rows by worker cannot serve it: while an old
            # snapshot holds VACUUM back, that index keeps an entry for every job the
            # worker ever ran, and the write walked them all (10 ms a batch after 40,000).
            sql = f"""
                WITH outcome(id, return_value) AS ({rows})
                UPDATE {table}
                SET {qn("state")} = %s, {qn("finished_at")} = {now},
                    {qn("return_value")} = outcome.return_value
                FROM outcome
                WHERE {table}.{qn("id")} = outcome.id {by_id}
                    AND {qn("state")} || '' = %s AND {qn("worker_id")} = %s
                    AND ({qn("has_dependents")} = %s OR %s)
                RETURNING {table}.{qn("id")}
            """
            marks = [State.RUNNING, worker_id, False, linked]
            params = [*values, State.SUCCEEDED, *now_params, *marks]
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
        with writing(job):
            next_attempt = self._fail(
                job, reason, error_class, error_message, traceback, retry, delay
            )
            if next_attempt is None and job.has_dependents:  # failed for good: so do they
                self._after_failure(job._state.db or router.db_for_write(self.model), job)
            return next_attempt

    def _fail(
        self,
        job: Job,
        reason: FailureReason,
        error_class: str,
        error_message: str,
        traceback: str,
        retry: bool,
        delay: float | None,
    ) -> Job | None:
        failure_reason: Any = reason
        if job.state == State.RUNNING:
            failure_reason = Case(
                When(cancel_requested_at__isnull=False, then=Value(FailureReason.CANCELLED)),
                default=Value(reason),
            )
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
            return self.retry(job, **options, revive=False)
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
