"""A bulk enqueue of plain jobs: on PostgreSQL with psycopg 3, every chunk's INSERT sent
before any is read back (pipeline mode); on every database, the Jobs it returns built
when first read.

enqueue_many() of 50,000 plain calls, sent and read one chunk after the other, spent a
third of its time waiting on the server (10-11 us a job: five index entries and the checks
per row), and another third building Jobs that its caller (bulk_enqueue(), whose results
are built when read too) seldom reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..built_on_read import BuiltOnRead
from .base import from_db
from .insert import Inserts, Written, _chunks, give

if TYPE_CHECKING:
    from ..models import Job
    from .prepared import Builder
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
        make: Builder,
        quiet: bool,
    ) -> Sequence[Job]:
        """enqueue_many() of plain `calls`: each chunk's INSERT is sent as soon as its rows
        are made, and the next chunk's rows are made while the server writes it. Each INSERT
        answers with one row (_insert_sql()'s `collected`): its clock and its ids in the
        order of its rows. The Jobs are built by `make`: when first read with `quiet`
        (EnqueuedJobs), else here, after every chunk was read back.

        Always in a transaction (one round trip more): rows or Jobs made after an earlier
        chunk was sent may raise, and must leave none written. The transaction also saw to
        Django's health check of a persistent connection (set_autocommit(), or the caller's
        savepoint), which must not be queued in the pipeline. psycopg's own errors, at the
        pipeline's start and end, come out as Django's."""
        connection = connections[db]
        clock = self.model._meta.get_field("enqueued_at")
        rows: list[Row] = []
        sent = []  # each chunk's cursor and how many rows it sent
        done: list[Written] = []
        with transaction.atomic(using=db):
            with connection.wrap_database_errors, connection.connection.pipeline():
                for start in range(0, len(calls), PIPELINED_CHUNK):
                    for chunk in _chunks(rows_of(calls[start : start + PIPELINED_CHUNK])):
                        cursor = connection.cursor()
                        cursor.execute(
                            *self._insert_sql(connection, template, chunk, collected=True)
                        )
                        sent.append((cursor, len(chunk)))
                        rows += chunk
                for cursor, count in sent:
                    with cursor:
                        [(now, ids, _)] = cursor.fetchall()
                    ids = ids or []  # array_agg() of no row is NULL
                    if len(ids) != count:  # a trigger's BEFORE INSERT skipped some
                        raise DatabaseError(
                            f"{len(ids)} of {count} jobs were written: a trigger on "
                            f"{self.model._meta.db_table} skipped the others. Nothing was enqueued."
                        )
                    now = from_db(connection, clock, now)
                    done += [(pk, now, now) for pk in ids]
            if quiet:
                return EnqueuedJobs(make, rows, done)
            return give([make(r, a, k, key) for r, a, _, k, _, key in rows], done)


class EnqueuedJobs(BuiltOnRead["Job"]):
    """The Jobs of a plain enqueue_many(), in the calls' order, each built when first read
    (built_on_read.py) by `make` from its call and how it was written. Only while `make`
    sends no signal (prepared.py's `quiet`): a pre_init or post_init receiver connected
    after the enqueue does not hear these Jobs built."""

    __slots__ = ("_calls", "_make", "_written")

    def __init__(self, make: Builder, rows: list[Row], written: list[Written]) -> None:
        super().__init__()
        self._make, self._written = make, written
        # What a Job is built from; not the arguments' JSON, written and no longer needed.
        self._calls = [(r, args, kwargs, key) for r, args, _, kwargs, _, key in rows]

    def __len__(self) -> int:
        return len(self._calls)

    def _build(self, i: int) -> Job:
        job = self._make(*self._calls[i])
        job.id, job.run_after, job.enqueued_at = self._written[i]
        return job

    def __repr__(self) -> str:
        return f"<EnqueuedJobs: {len(self)} jobs>"
