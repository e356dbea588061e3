"""The claim of a rate-limited task's jobs (limits/rates.py): at most its rate of starts.

Such a task's queued rows wait held (`hold = "rate"`), out of the claim's index, so the
claim of every other job is the one statement it was and never walks them. A worker
claims them apart, per task, in a short transaction of its own: it takes the task's
TaskRate row without waiting (FOR UPDATE SKIP LOCKED; SQLite: the write lock every claim
takes), so that a worker that finds it taken moves on to other jobs; refills the bucket
by the database's clock; starts at most as many of the task's due rows, in claim order,
as the bucket holds; and spends that many tokens in the same transaction. The bucket is
thus shared by every worker and host, whatever their number.

Which tasks have such rows (and in which queues) is read once per RATES_TTL seconds per
process (one loose scan of their index), so a worker pays nothing while no rate-limited
job waits. A worker that finds a bucket empty leaves the task alone until its next token
is due, and one that finds none of its jobs due (scheduled later) for RATES_TTL: it never
spins on jobs it may not start.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..limits.concurrency import Hold
from ..limits.queues import burst, parse_rate
from ..states import State
from .base import from_db, now_sql
from .queue_claim import limited_row

if TYPE_CHECKING:
    from ..models import Job

RATES_TTL = 1.0
# The index of the rows a rate holds (limits/fields.py).
RATED_INDEX = "jobstate_job_rated"

_pairs: dict[str, tuple[float, list[tuple[str, str]]]] = {}  # db -> (until, [(task, queue)])
_empty_until: dict[tuple[str, str], float] = {}  # (db, task) -> when its next token is due
_rows_made: set[tuple[str, str]] = set()


def forget_rated_tasks() -> None:
    """Look for rate-limited tasks' jobs again at the next claim (tests)."""
    _pairs.clear()
    _empty_until.clear()


def rated_pairs(db: str) -> list[tuple[str, str]]:
    """(task, queue) of the queued rows a rate holds, cached RATES_TTL seconds."""
    from ..models import Job

    cached = _pairs.get(db)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    connection = connections[db]
    qn = connection.ops.quote_name
    table = qn(Job._meta.db_table)
    task, queue = qn("task_path"), qn("queue_name")
    rated = f"FROM {table} WHERE {qn('hold')} = %s AND {qn('state')} = %s"
    if connection.vendor == "mysql":
        # A loose index scan of the index's prefix ("Using index for group-by").
        sql = f"SELECT DISTINCT {task}, {queue} {rated}"
        params: list[Any] = [Hold.RATE, State.QUEUED]
    else:
        # One step of the index per (task, queue), never per row of a backlog.
        def after(column: str, bound: str) -> str:
            order = f"{qn('hold')}, {task}, {queue}"
            return f"SELECT {column} {rated} {bound} ORDER BY {order} LIMIT 1"

        bound = f"AND ({task}, {queue}) > (pair.t, pair.q)"
        sql = f"""
            WITH RECURSIVE pair(t, q) AS (
                SELECT ({after(task, "")}), ({after(queue, "")})
                UNION ALL
                SELECT ({after(task, bound)}), ({after(queue, bound)}) FROM pair
                WHERE pair.t IS NOT NULL
            )
            SELECT t, q FROM pair WHERE t IS NOT NULL
        """
        params = [Hold.RATE, State.QUEUED] * 4
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = sorted((row[0], row[1]) for row in cursor.fetchall())
    _pairs[db] = (time.monotonic() + RATES_TTL, found)
    return found


def _lock(connection: BaseDatabaseWrapper, task: str) -> tuple[Any, ...] | None:
    """Lock `task`'s TaskRate row without waiting: its (rate, tokens, tokens_at), or None
    if another claimer holds it. SQLite: the transaction holds the write lock already."""
    from ..limits.fields import TaskRate

    qn = connection.ops.quote_name
    skip = "" if connection.vendor == "sqlite" else " FOR UPDATE SKIP LOCKED"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {qn('rate')}, {qn('tokens')}, {qn('tokens_at')} "
            f"FROM {qn(TaskRate._meta.db_table)} WHERE {qn('task_path')} = %s{skip}",
            [task],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return row[0], row[1], from_db(connection, TaskRate._meta.get_field("tokens_at"), row[2])


def refill(
    rate: str, held: str, tokens: float | None, since: datetime | None, now: datetime
) -> float:
    """The tokens of a bucket of `rate` at `now`: full when new or when its rate changed."""
    full = float(burst(rate))
    if tokens is None or since is None or held != rate:
        return full
    count, seconds = parse_rate(rate)
    return min(full, tokens + max(0.0, (now - since).total_seconds()) * count / seconds)


class RateClaim:
    if TYPE_CHECKING:  # claim.py's
        model: type[Job]

        def using(self, alias: str | None) -> Any: ...

    def _claim_rated(
        self,
        connection: BaseDatabaseWrapper,
        db: str,
        worker_id: str,
        task: str,
        queues: list[str],
        limit: int,
        limited: bool = False,
    ) -> list[Job]:
        """Claim up to `limit` due jobs of the rate-limited `task` in `queues`, as many as
        its bucket holds. `limited`: the queues' own limits are taken care of (the caller
        holds their lock, queue_claim.py); else a queue whose row sets limits is left out."""
        from ..limits.fields import TaskRate

        if _empty_until.get((db, task), 0.0) > time.monotonic():
            return []
        if (db, task) not in _rows_made:  # the row its lock is, made once
            TaskRate.objects.using(db).get_or_create(task_path=task)
            _rows_made.add((db, task))
        with transaction.atomic(using=db):
            bucket = _lock(connection, task)
            if bucket is None and not TaskRate.objects.using(db).filter(pk=task).exists():
                TaskRate.objects.using(db).get_or_create(task_path=task)  # deleted since
                bucket = _lock(connection, task)
            if bucket is None:
                return []  # another worker starts this task's jobs now
            now = self._db_now(connection)
            heads: list[tuple[Any, ...]] = []
            for queue in queues:
                heads += self._rated_heads(connection, task, queue, now, limit, limited)
            if not heads:  # none due yet (scheduled later): look again in a while
                _empty_until[(db, task)] = time.monotonic() + RATES_TTL
                return []
            heads.sort(key=lambda row: (-row[1], row[2], row[0]))
            rate = heads[0][3]  # the head's: a rate changed by a deploy applies from its jobs on
            tokens = refill(rate, bucket[0], bucket[1], bucket[2], now)
            take = min(limit, math.floor(tokens))
            ids = [row[0] for row in heads[:take]]
            jobs = self._start_rated(connection, db, worker_id, ids, now) if ids else []
            tokens -= len(jobs)
            TaskRate.objects.using(db).filter(task_path=task).update(
                rate=rate, tokens=tokens, tokens_at=now
            )
        if tokens < 1:  # the next token's time: until then, this task is not asked for
            count, seconds = parse_rate(rate)
            _empty_until[(db, task)] = time.monotonic() + (1 - tokens) * seconds / count
        return jobs

    def _db_now(self, connection: BaseDatabaseWrapper) -> datetime:
        from ..limits.fields import TaskRate

        sql, params = now_sql(connection)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)
            value = cursor.fetchone()[0]
        return from_db(connection, TaskRate._meta.get_field("tokens_at"), value)

    def _rated_heads(
        self,
        connection: BaseDatabaseWrapper,
        task: str,
        queue: str,
        now: datetime,
        limit: int,
        limited: bool,
    ) -> list[tuple[Any, ...]]:
        """(id, priority, run_after, rate_limit) of the first `limit` due rows of `task` in
        `queue`, in claim order: one range of the rated rows' index."""
        from ..models import JobQueue

        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        force = f" FORCE INDEX (`{RATED_INDEX}`)" if connection.vendor == "mysql" else ""
        lock = "" if connection.vendor == "sqlite" else " FOR UPDATE SKIP LOCKED"
        sql = f"""
            SELECT {qn("id")}, {qn("priority")}, {qn("run_after")}, {qn("rate_limit")}
            FROM {table}{force}
            WHERE {qn("hold")} = %s AND {qn("state")} = %s AND {qn("task_path")} = %s
                AND {qn("queue_name")} = %s AND {qn("run_after")} <= %s
                AND NOT EXISTS (SELECT 1 FROM {qn(JobQueue._meta.db_table)}
                    WHERE {qn("name")} = %s
                    AND ({qn("paused_at")} IS NOT NULL{"" if limited else limited_row(qn)}))
            ORDER BY {qn("priority")} DESC, {qn("run_after")}, {qn("id")} LIMIT %s{lock}
        """
        at = connection.ops.adapt_datetimefield_value(now)
        params = [Hold.RATE, State.QUEUED, task, queue, at, queue, limit]
        field = self.model._meta.get_field("run_after")
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [
                (pk, priority, from_db(connection, field, after), rate)
                for pk, priority, after, rate in cursor.fetchall()
            ]

    def _start_rated(
        self,
        connection: BaseDatabaseWrapper,
        db: str,
        worker_id: str,
        ids: list[int],
        now: datetime,
    ) -> list[Job]:
        """Move the rows `ids` (locked by this transaction) to running, fenced on their
        state and hold; return those moved."""
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        by_id = " FORCE INDEX (PRIMARY)" if connection.vendor == "mysql" else ""
        marks = ", ".join(["%s"] * len(ids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table}{by_id} SET {qn('state')} = %s, {qn('worker_id')} = %s, "
                f"{qn('started_at')} = %s, {qn('hold')} = NULL "
                f"WHERE {qn('id')} IN ({marks}) AND {qn('state')} = %s AND {qn('hold')} = %s",
                [
                    State.RUNNING,
                    worker_id,
                    connection.ops.adapt_datetimefield_value(now),
                    *ids,
                    State.QUEUED,
                    Hold.RATE,
                ],
            )
        return list(self.using(db).filter(pk__in=ids, state=State.RUNNING, worker_id=worker_id))


def rated_tasks(db: str | None = None) -> dict[str, list[str]]:
    """{task: [queues]} of the queued rows a rate holds (cached, as rated_pairs())."""
    from ..models import Job

    found: dict[str, list[str]] = {}
    for task, queue in rated_pairs(db or router.db_for_write(Job)):
        found.setdefault(task, []).append(queue)
    return found
