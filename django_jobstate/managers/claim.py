"""The claim: queued attempts to running, for one worker, in one statement."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router
from django.db.backends.base.base import BaseDatabaseWrapper

from ..states import State, check_transition
from .base import ClaimKey, built_directly, claim_key, instance, now_sql, write_lock_first
from .conflicts import retries_conflicts
from .mysql import MySQLWrites
from .queue_claim import QueueClaim, limited_queues, limited_row
from .rate_claim import RateClaim, rated_pairs

if TYPE_CHECKING:
    from ..models import Job


class Unreadable(str):
    """A claimed row's value that could not be decoded: the text says why."""

    __slots__ = ()


class Claim(QueueClaim, RateClaim, MySQLWrites):
    @retries_conflicts
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
        SKIP LOCKED, so concurrent claimers take different rows instead of waiting. Jobs
        of a paused queue (JobQueue) are never claimed: the statement itself excludes
        them, so a claim that starts after a pause committed sees it.
        A queue with limits (limits/queues.py) is claimed apart, within them, under its
        lock (queue_claim.py); a rate-limited task's jobs apart too, at its rate
        (rate_claim.py); the others as before.

        Jobs are claimed in claim order (priority first, then run_after, then id). The
        runnable index holds that order per queue: the statement takes the head of each
        queue asked for and merges them, so a claim never walks another queue's backlog.
        With `queues=None` the queues that have queued jobs are found first (queue_names()).
        With `from_key` (the claim_key() of a job claimed before), jobs before it in that
        order are not considered: on PostgreSQL, the index entries of claimed rows stay
        at the head of that order until VACUUM, and a claim from the head would walk
        all of them each time. The worker passes it while draining a backlog.
        """
        if not worker_id:
            raise ValueError("claim() needs a worker_id.")
        if limit < 1:
            raise ValueError(f"claim() limit must be at least 1, not {limit}.")
        check_transition(State.QUEUED, State.RUNNING)
        queues = self.queue_names() if queues is None else sorted(set(queues))
        if not queues:
            return []
        db = router.db_for_write(self.model)
        connection = connections[db]
        limited = limited_queues(db, queues)
        rated = rated_pairs(db)  # cached: no statement while none waits
        if not limited and not rated:
            return self._claim_rows(connection, db, worker_id, queues, limit, from_key)
        # Queues with limits, each in a transaction of its own (queue_claim.py), then the
        # rate-limited tasks' jobs of the others, per task (rate_claim.py), then the rest
        # of the others in one statement, as without limits.
        jobs: list[Job] = []
        for queue in limited:
            if len(jobs) < limit:
                jobs += self._claim_limited(
                    connection, db, worker_id, queue, limit - len(jobs), from_key
                )
        free = [queue for queue in queues if queue not in limited]
        by_task: dict[str, list[str]] = {}
        for task, queue in rated:
            if queue in free:
                by_task.setdefault(task, []).append(queue)
        for task, task_queues in by_task.items():
            if len(jobs) < limit:
                jobs += self._claim_rated(
                    connection, db, worker_id, task, task_queues, limit - len(jobs)
                )
        if free and len(jobs) < limit:
            jobs += self._claim_rows(connection, db, worker_id, free, limit - len(jobs), from_key)
        return sorted(jobs, key=claim_key)

    def _claim_rows(
        self,
        connection: BaseDatabaseWrapper,
        db: str,
        worker_id: str,
        queues: list[str],
        limit: int,
        from_key: ClaimKey | None,
        limited: bool = False,
    ) -> list[Job]:
        """The claim statement over `queues`; a queue whose JobQueue row sets limits is
        left out unless `limited` (its claim under its lock, queue_claim.py)."""
        if connection.vendor == "mysql":
            return self._claim_mysql(connection, db, worker_id, queues, limit, from_key, limited)
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        with write_lock_first(db):
            now, now_params = now_sql(connection)
            picked, picked_params = self._heads(
                connection, queues, now, now_params, limit, from_key, limited
            )
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
                WITH picked AS MATERIALIZED ({picked})
                UPDATE {table}
                SET {qn("state")} = %s, {qn("worker_id")} = %s, {qn("started_at")} = {now}
                FROM picked
                WHERE {table}.{qn("id")} = picked.{qn("id")} AND {table}.{qn("state")} || '' = %s
                RETURNING {columns}
            """
            params = [*picked_params, State.RUNNING, worker_id, *now_params, State.QUEUED]
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                rows = cursor.fetchall()
        return sorted(self._jobs(connection, db, rows), key=claim_key)

    def _jobs(self, connection: BaseDatabaseWrapper, db: str, rows: list[Any]) -> list[Job]:
        """The claimed rows as Jobs, as raw() would give them, except that a value this
        Python cannot decode (JSON nested deeper than its json module reads: 1,500 levels on
        3.12) is Unreadable instead of a RecursionError: these rows are running already, and
        one hostile row must not crash the worker and leave its whole batch to be lost. The
        worker fails that attempt, naming the field (attempts.py)."""
        fields = self.model._meta.concrete_fields
        names = [f.attname for f in fields]
        converters = []
        for i, f in enumerate(fields):
            column = f.get_col(self.model._meta.db_table)
            found = connection.ops.get_db_converters(column) + f.get_db_converters(connection)
            if _plain_json(f, found):
                found = [_json_value]  # the same, a fifth of a claimed row's decoding
            if found:
                converters.append((i, column, found))
        direct = built_directly(self.model)
        jobs = []
        for row in rows:
            values = list(row)
            for i, column, found in converters:
                try:
                    for convert in found:
                        values[i] = convert(values[i], column, connection)
                except RecursionError:
                    values[i] = Unreadable(f"{names[i]} is nested too deeply to decode")
            if direct:
                jobs.append(instance(self.model, db, dict(zip(names, values, strict=True))))
            else:
                jobs.append(self.model.from_db(db, names, values))
        return jobs

    def _heads(
        self,
        connection: BaseDatabaseWrapper,
        queues: list[str],
        now: str,
        now_params: list[Any],
        limit: int,
        from_key: ClaimKey | None,
        limited: bool = False,
    ) -> tuple[str, list[Any]]:
        """The SELECT of the candidates' ids: the first `limit` of each unpaused queue in
        claim order, merged; one index range per queue."""
        from ..models import JobQueue

        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        paused_table = qn(JobQueue._meta.db_table)
        order = f"({qn('priority')} * -1), {qn('run_after')}, {qn('id')}"  # the index's
        key, key_params = "", list[Any]()
        if from_key is not None:
            key = f"AND ({order}) >= (%s, %s, %s)"
            rank, run_after, pk = from_key
            key_params = [rank, connection.ops.adapt_datetimefield_value(run_after), pk]
        # Not paused: an uncorrelated test, evaluated once per queue before its index range.
        paused = (
            f"NOT EXISTS (SELECT 1 FROM {paused_table} WHERE {qn('name')} = {{queue}} "
            f"AND ({qn('paused_at')} IS NOT NULL{'' if limited else limited_row(qn)}))"
        )
        head = f"""
            SELECT {qn("id")}, ({qn("priority")} * -1) AS rank, {qn("run_after")}
            FROM {table}
            WHERE {qn("state")} = %s AND {qn("hold")} IS NULL AND {qn("queue_name")} = {{queue}}
                AND {qn("run_after")} <= {now} {key} AND {paused}
            ORDER BY {order} LIMIT %s
        """
        if connection.vendor == "postgresql":
            if len(queues) == 1:
                sql = head.format(queue="%s") + " FOR UPDATE SKIP LOCKED"
                params = [State.QUEUED, queues[0], *now_params, *key_params, queues[0], limit]
                return sql, params
            # LATERAL: one index range per queue, each locked with SKIP LOCKED (a row
            # locked and not picked is free again when the statement ends).
            values = ", ".join(["(%s)"] * len(queues))
            lateral = head.format(queue="queue.name") + " FOR UPDATE SKIP LOCKED"
            sql = f"""
                SELECT head.{qn("id")}
                FROM (VALUES {values}) AS queue(name) CROSS JOIN LATERAL ({lateral}) AS head
                ORDER BY head.rank, head.{qn("run_after")}, head.{qn("id")} LIMIT %s
            """
            params = [*queues, State.QUEUED, *now_params, *key_params, limit, limit]
            return sql, params
        # SQLite (no LATERAL, no row locks: the statement runs under the write lock).
        parts, params = [], []
        for queue in queues:
            parts.append(f"SELECT * FROM ({head.format(queue='%s')})")
            params += [State.QUEUED, queue, *now_params, *key_params, queue, limit]
        if len(queues) == 1:
            return parts[0], params
        union = " UNION ALL ".join(parts)
        return f"SELECT {qn('id')} FROM ({union}) ORDER BY rank, run_after, id LIMIT %s", [
            *params,
            limit,
        ]

    def queue_names(self) -> list[str]:
        """The queues that have queued jobs, paused ones included (not those held by a
        concurrency limit: limits.py).

        A loose index scan: one step of the runnable index per queue, from the end of
        each queue's range, where its newest jobs are, never the claimed rows whose index
        entries PostgreSQL keeps at a queue's head until VACUUM.
        """
        connection = connections[router.db_for_read(self.model)]
        qn = connection.ops.quote_name
        table, name = qn(self.model._meta.db_table), qn("queue_name")

        def below(bound: str) -> str:
            return (
                f"SELECT {name} FROM {table} WHERE {qn('state')} = %s AND {qn('hold')} IS NULL "
                f"{bound} "
                f"ORDER BY {name} DESC LIMIT 1"
            )

        sql = f"""
            WITH RECURSIVE queue(name) AS (
                SELECT ({below("")})
                UNION ALL
                SELECT ({below(f"AND {name} < queue.name")}) FROM queue
                WHERE queue.name IS NOT NULL
            )
            SELECT name FROM queue WHERE name IS NOT NULL
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, [State.QUEUED, State.QUEUED])
            found = {row[0] for row in cursor.fetchall()}
        # And those where only rate-limited tasks' jobs wait (rate_claim.py, cached).
        return sorted(found | {queue for _, queue in rated_pairs(connection.alias)})


def _plain_json(field: Any, converters: list[Any]) -> bool:
    """Whether `field` reads as Django's own JSONField without a decoder of its own, with
    no converter of the database's."""
    return (
        isinstance(field, models.JSONField)
        and field.decoder is None
        and type(field).from_db_value is models.JSONField.from_db_value
        and converters == [field.from_db_value]
    )


def _json_value(value: Any, expression: Any, connection: Any) -> Any:
    """JSONField.from_db_value() for a column read whole (no key transform, no decoder),
    without decoding the empty array and object that most rows hold."""
    if value is None:
        return None
    if value == "{}":
        return {}
    if value == "[]":
        return []
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
