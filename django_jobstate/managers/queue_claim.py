"""The claim of a queue with limits (queue_limits.py): at most N running, a rate of starts.

A queue without limits is claimed as before, by one statement for every such queue; its
cost does not change (the statement's test of the JobQueue row, which excluded a paused
queue, also excludes a queue whose row sets a limit, from the first claim after it
commits). A limited queue is claimed apart, in a short transaction of its own that first
takes the queue's lock without waiting (PostgreSQL: pg_try_advisory_xact_lock; MariaDB/
MySQL: its JobQueue row, SELECT ... FOR UPDATE SKIP LOCKED; SQLite: the write lock every
claim takes): a worker that finds it taken skips that queue this round and claims the
others, so a full queue never stops a worker from claiming other queues' jobs. Under the
lock it counts the queue's running rows and takes at most N minus that many, and at most
the tokens of the queue's bucket, which it spends in the same transaction. A running row
of a dead worker stays running until the rescue fails it as lost: its place is freed
then, never earlier.

Which queues are limited: the settings' (in this process), and those whose row sets limits
at run time, read once per LIMITS_TTL seconds per process (one small query; a change
reaches every worker within that, polling on every database).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..limits.queues import QueueLimits, burst, effective, parse_rate, row_limits, settings_limits
from ..states import State
from .base import ClaimKey, from_db, now_sql

if TYPE_CHECKING:
    from ..models import Job, JobQueue

LIMITS_TTL = 1.0
# The first key of the two-key advisory locks of queues (the one-key form, which
# managers/limits.py takes per concurrency key, is another space of locks).
ADVISORY_CLASS = 0x6A6F6271  # "jobq"

_run_time: dict[str, tuple[float, dict[str, JobQueue]]] = {}
_rows_made: set[tuple[str, str]] = set()


def limited_row(qn: Any) -> str:
    """The condition, added to "paused", of a JobQueue row whose run-time limits hold its
    queue: the claim of unlimited queues leaves that queue out."""
    return f" OR {qn('concurrency')} IS NOT NULL OR {qn('rate')} <> ''"


def forget_run_time_limits() -> None:
    """Read the JobQueue rows' limits again at the next claim (tests, set_limits)."""
    _run_time.clear()


def run_time_rows(db: str) -> dict[str, JobQueue]:
    """The JobQueue rows that set limits at run time, cached LIMITS_TTL seconds."""
    from ..models import JobQueue

    cached = _run_time.get(db)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    rows = {q.name: q for q in JobQueue.objects.using(db).filter(limits_set_at__isnull=False)}
    _run_time[db] = (time.monotonic() + LIMITS_TTL, rows)
    return rows


def limited_queues(db: str, queues: list[str]) -> dict[str, QueueLimits]:
    rows = run_time_rows(db)
    configured = settings_limits()
    if not rows and not configured:
        return {}
    found = {}
    for queue in queues:
        limits = row_limits(rows.get(queue)) or configured.get(queue)
        if limits is not None and limits.limited:
            found[queue] = limits
    return found


def _try_lock(connection: BaseDatabaseWrapper, db: str, queue: str) -> bool:
    """Take `queue`'s claim lock until the transaction ends, without waiting."""
    if connection.vendor == "postgresql":
        number = int.from_bytes(hashlib.sha256(queue.encode()).digest()[:4], "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [ADVISORY_CLASS, number])
            return bool(cursor.fetchone()[0])
    if connection.vendor == "mysql":
        from ..models import JobQueue

        table = connection.ops.quote_name(JobQueue._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT `name` FROM {table} WHERE `name` = %s FOR UPDATE SKIP LOCKED", [queue]
            )
            return cursor.fetchone() is not None
    return True  # SQLite: the transaction holds the database's write lock (BEGIN IMMEDIATE)


class QueueClaim:
    if TYPE_CHECKING:  # claim.py's
        model: type[Job]

        def using(self, alias: str | None) -> Any: ...

        def _claim_rows(
            self,
            connection: BaseDatabaseWrapper,
            db: str,
            worker_id: str,
            queues: list[str],
            limit: int,
            from_key: ClaimKey | None,
            limited: bool = False,
        ) -> list[Job]: ...

        def _claim_rated(
            self,
            connection: BaseDatabaseWrapper,
            db: str,
            worker_id: str,
            task: str,
            queues: list[str],
            limit: int,
            limited: bool = False,
        ) -> list[Job]: ...

    def _claim_limited(
        self,
        connection: BaseDatabaseWrapper,
        db: str,
        worker_id: str,
        queue: str,
        limit: int,
        from_key: ClaimKey | None,
    ) -> list[Job]:
        """Claim up to `limit` jobs of the limited `queue`, within its limits (nothing if
        another claimer holds its lock now)."""
        from ..models import JobQueue
        from .rate_claim import rated_pairs  # which imports this module

        if connection.vendor == "mysql" and (db, queue) not in _rows_made:
            JobQueue.objects.using(db).get_or_create(name=queue)  # the row its lock is
            _rows_made.add((db, queue))
        with transaction.atomic(using=db):
            if not _try_lock(connection, db, queue):
                return []
            row = JobQueue.objects.using(db).filter(name=queue).first()
            limits = effective(queue, row)
            cap = limit
            if limits.concurrency is not None:
                running = self.using(db).filter(queue_name=queue, state=State.RUNNING).count()
                cap = min(cap, limits.concurrency - running)
            tokens = now = None
            if limits.rate and cap > 0:
                tokens, now = self._tokens(connection, row, limits.rate)
                cap = min(cap, math.floor(tokens))
            if cap <= 0:
                return []
            jobs = self._claim_rows(connection, db, worker_id, [queue], cap, from_key, True)
            for task, rated_queue in rated_pairs(db) if len(jobs) < cap else []:
                if rated_queue == queue and len(jobs) < cap:  # within the queue's limits too
                    jobs += self._claim_rated(
                        connection, db, worker_id, task, [queue], cap - len(jobs), True
                    )
            if tokens is not None and jobs:
                if row is None:
                    row, _ = JobQueue.objects.using(db).get_or_create(name=queue)
                JobQueue.objects.using(db).filter(name=queue).update(
                    tokens=tokens - len(jobs), tokens_at=now
                )
        return jobs

    def _tokens(
        self, connection: BaseDatabaseWrapper, row: JobQueue | None, rate: str
    ) -> tuple[float, Any]:
        """The tokens of the queue's bucket now (the database's clock), and that now."""
        from ..models import JobQueue

        sql, params = now_sql(connection)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)
            now = from_db(connection, JobQueue._meta.get_field("tokens_at"), cursor.fetchone()[0])
        full = float(burst(rate))
        if row is None or row.tokens is None or row.tokens_at is None:
            return full, now
        count, seconds = parse_rate(rate)
        elapsed = max(0.0, (now - row.tokens_at).total_seconds())
        return min(full, row.tokens + elapsed * count / seconds), now
