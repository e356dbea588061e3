"""A bulk enqueue on PostgreSQL with psycopg 3: every chunk's INSERT sent before any is read
back (pipeline mode), and the Jobs it returns built when first read.

enqueue_many() of 50,000 plain calls, sent and read one chunk after the other, spent a
third of its time waiting on the server (10-11 us a job: five index entries and the checks
per row), and another third building Jobs that its caller (bulk_enqueue(), whose results
are built when read too) seldom reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..built_on_read import BuiltOnRead
from .base import from_db
from .insert import Inserts, _chunks

if TYPE_CHECKING:
    from datetime import datetime

    from ..models import Job
    from .unique import Call, Row

# The calls whose rows are made and sent at a time: the server writes one chunk while the
# client makes the next. What nothing overlaps is the first chunk's making and the last
# one's writing (2,000 was the fastest of 250 to 5,000 for 50,000 calls).
PIPELINED_CHUNK = 2_000


def pipelined(connection: BaseDatabaseWrapper) -> bool:
    """Whether statements can be sent ahead of their results (_insert_pipelined())."""
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:  # psycopg2
        return False
    import psycopg

    return psycopg.Pipeline.is_supported()  # libpq 14 or later


class PipelinedInserts(Inserts):
    def _insert_pipelined(
        self,
        db: str,
        template: Job,
        calls: list[Call],
        rows_of: Callable[[list[Call]], list[Row]],
        build: Callable[[Row], Job],
        quiet: bool,
    ) -> Sequence[Job]:
        """enqueue_many() of plain `calls`: each chunk's INSERT is sent as soon as its rows
        are made, and the next chunk's rows are made while the server writes it. Each INSERT
        answers with one row (_insert_sql()'s `collected`): its clock and its ids in the
        order of its rows. With `quiet` (`build` sends no signal: prepared.py), the Jobs are
        built when first read (EnqueuedJobs); otherwise here, each chunk's after it is sent.

        Always in a transaction (one round trip more): rows or Jobs made after an earlier
        chunk was sent may raise, and must leave none written. The first cursor is made
        before the pipeline, so that Django's health check of a persistent connection is
        answered, not queued; psycopg's own errors, at the pipeline's start and end, come
        out as Django's."""
        connection = connections[db]
        clock = self.model._meta.get_field("enqueued_at")
        rows: list[Row] = []
        sent = []  # each chunk's cursor and how many rows it sent
        built: list[Job] = []
        ids: list[int] = []
        times: list[datetime] = []
        with transaction.atomic(using=db):
            cursor: Any = connection.cursor()
            with connection.wrap_database_errors, connection.connection.pipeline():
                for start in range(0, len(calls), PIPELINED_CHUNK):
                    for chunk in _chunks(rows_of(calls[start : start + PIPELINED_CHUNK])):
                        cursor = cursor or connection.cursor()
                        sql, params = self._insert_sql(connection, template, chunk, collected=True)
                        cursor.execute(sql, params)
                        sent.append((cursor, len(chunk)))
                        cursor = None
                        rows += chunk
                        if not quiet:
                            built += map(build, chunk)
                for cursor, count in sent:
                    with cursor:
                        [(now, written, _)] = cursor.fetchall()
                    if len(written) != count:  # a trigger's BEFORE INSERT skipped some
                        raise DatabaseError(
                            f"{len(written)} of {count} jobs were written: a trigger on "
                            f"{self.model._meta.db_table} skipped the others. Nothing was enqueued."
                        )
                    ids += written
                    times += [from_db(connection, clock, now)] * count
        if quiet:
            return EnqueuedJobs(build, rows, ids, times)
        return [_written(*job_written) for job_written in zip(built, ids, times, strict=True)]


class EnqueuedJobs(BuiltOnRead["Job"]):
    """The Jobs of a pipelined enqueue_many(), in the calls' order, each built when first
    read (built_on_read.py) from its row, its id and its clock."""

    __slots__ = ("_build_job", "_ids", "_rows", "_times")

    def __init__(
        self,
        build: Callable[[Row], Job],
        rows: list[Row],
        ids: list[int],
        times: list[datetime],
    ) -> None:
        super().__init__()
        self._build_job, self._rows, self._ids, self._times = build, rows, ids, times

    def __len__(self) -> int:
        return len(self._rows)

    def _build(self, i: int) -> Job:
        return _written(self._build_job(self._rows[i]), self._ids[i], self._times[i])

    def __repr__(self) -> str:
        return f"<EnqueuedJobs: {len(self)} jobs>"


def _written(job: Job, pk: int, now: datetime) -> Job:
    """`job` with the id and the times (its statement's clock) its row was written with."""
    job.id, job.run_after, job.enqueued_at = pk, now, now
    return job
