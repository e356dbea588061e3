"""The INSERT of an enqueue: many calls in one statement, their rows selected from one JSON
parameter (enqueue.py builds the template they share; unique.py and limits.py add to it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.fields import NOT_PROVIDED

from ..db.notify import NOTIFY
from ..uniqueness import UniqueScope
from .base import PER_CALL, from_db, now_sql
from .mysql import MySQLWrites

if TYPE_CHECKING:
    from ..models import Job
    from .unique import Row

# enqueue_many(): calls per INSERT, at most, and bytes of their arguments' JSON: a group of
# 10,000 small steps is one statement, and no statement nears MariaDB's default
# max_allowed_packet (16 MiB) however large the arguments.
ENQUEUE_CHUNK = 10_000
ENQUEUE_CHUNK_BYTES = 4 << 20
# A row as written: its id (None if a trigger of the project's skipped it), run_after and
# enqueued_at.
Written = tuple["int | None", datetime, datetime]
# The times an INSERT takes from _now_sql() when not given, and reads back.
_CLOCKED = ("run_after", "enqueued_at")


class Inserts(MySQLWrites):
    if TYPE_CHECKING:  # unique.py's

        def _on_conflict(
            self, connection: BaseDatabaseWrapper, scope: UniqueScope, lock_held: bool
        ) -> str: ...

    def _insert_all(self, db: str, template: Job, rows: list[Row]) -> list[Written]:
        """INSERT `rows` like `template`, all or none: how each was written, in their order."""
        chunks = _chunks(rows)
        done: list[Written] = []
        # One statement is atomic on its own; a transaction would cost two round trips.
        with nullcontext() if len(chunks) == 1 else transaction.atomic(using=db):
            for chunk in chunks:
                written, _, (run_after, enqueued_at) = self._insert(db, template, chunk)
                done += [(written.get(row[0].hex), run_after, enqueued_at) for row in chunk]
        return done

    def _insert_chunks(
        self, db: str, template: Job, rows: list[Row], jobs: list[Job], lock_held: bool = False
    ) -> dict[str, int]:
        """INSERT `rows` in chunks; give each of `jobs` (one per row) that was written its id
        and times. With `lock_held`, returns {unique key: id} of the live rows that held the
        keys of the rows that were not written (_on_conflict())."""
        by_result_id = {job.result_id.hex: job for job in jobs}
        holders = {}
        for chunk in _chunks(rows):
            written, held, times = self._insert(db, template, chunk, lock_held)
            _give(by_result_id, written, times)
            holders.update(held)
        return holders

    def _values(
        self,
        connection: BaseDatabaseWrapper,
        template: Job,
        per_call: dict[str, tuple[str, list[Any]]],
        now: str,
        now_params: list[Any],
    ) -> tuple[list[str], list[str], list[Any]]:
        """The columns an INSERT like `template` writes, their SQL values and parameters:
        `per_call`'s for the fields that differ between calls, the clock for the times
        not given, and the database's defaults left out."""
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
            columns.append(connection.ops.quote_name(str(field.column)))
            selected.append(expr)
            params += expr_params
        return columns, selected, params

    def _insert(
        self, db: str, template: Job, rows: list[Row], lock_held: bool = False
    ) -> tuple[dict[str, int], dict[str, int], tuple[datetime, datetime]]:
        """INSERT `rows` like `template`; a row whose unique key is held is not written.

        Returns {result_id hex: id} of the rows written, {unique key: id} of the live rows
        that held the others' keys (with `lock_held` only), and the run_after and
        enqueued_at stored (the same for every row written by one statement).
        """
        connection = connections[db]
        if connection.vendor == "mysql":
            return self._insert_mysql(db, template, rows, lock_held)
        with connection.cursor() as cursor:
            cursor.execute(*self._insert_sql(connection, template, rows, lock_held))
            returned = cursor.fetchall()
        return self._returned(connection, template, rows, returned)

    def _insert_sql(
        self,
        connection: BaseDatabaseWrapper,
        template: Job,
        rows: list[Row],
        lock_held: bool = False,
        collected: bool = False,
    ) -> tuple[str, list[Any]]:
        """_insert()'s statement and parameters on PostgreSQL and SQLite. One row is a plain
        INSERT ... VALUES, which PostgreSQL plans faster; several are selected from one JSON
        array of [result_id, args, kwargs, unique key].

        `collected` (PostgreSQL, a plain job's template, `rows` in ascending result_id): the
        statement answers with one row: the clock the rows took their times from, the ids in
        the order of the rows, and the wake-up's result."""
        qn = connection.ops.quote_name
        now, now_params = now_sql(connection)
        unique = template.unique_scope is not None
        names = PER_CALL if unique else PER_CALL[:3]
        per_call: dict[str, tuple[str, list[Any]]]
        if len(rows) == 1:
            [(result_id, _, args, _, kwargs, key)] = rows
            values = [result_id.hex, args, kwargs, key]
            per_call = {name: ("%s", [value]) for name, value in zip(names, values, strict=False)}
            source, source_params = "", []
        else:
            calls = ",".join(
                f'["{r.hex}",{args},{kwargs},{json.dumps(key)}]'
                if unique
                else f'["{r.hex}",{args},{kwargs}]'
                for r, _, args, _, kwargs, key in rows
            )
            source_params = [f"[{calls}]"]
            if connection.vendor == "postgresql":
                exprs = ["(value ->> 0)::uuid", "value -> 1", "value -> 2", "value ->> 3"]
                source = "FROM jsonb_array_elements(%s::jsonb) AS call(value)"
            else:
                exprs = [f"json_extract(value, '$[{i}]')" for i in range(4)]
                # SQLite reads "ON" after a SELECT's FROM as a join without the WHERE.
                source = "FROM json_each(%s) AS call" + (" WHERE true" if unique else "")
            per_call = {name: (expr, []) for name, expr in zip(names, exprs, strict=False)}
        columns, selected, params = self._values(connection, template, per_call, now, now_params)
        row = (
            f"SELECT {', '.join(selected)} {source}"
            if source
            else f"VALUES ({', '.join(selected)})"
        )
        if unique:
            scope = UniqueScope(cast(str, template.unique_scope))
            row += self._on_conflict(connection, scope, lock_held)
        table = qn(self.model._meta.db_table)
        if collected:
            # One template and one clock: every row's wake-up (wakeup.py) would be the same
            # notification, so the statement sends it once (per row, it cost 1-3 us of the
            # server's 10-13 us a row). The rows' times are this statement's clock (_values()).
            # Their ids in the rows' order: the rows go in ascending result_id (uuid7s()).
            notified = ("id", "result_id", "queue_name", "priority", "run_after")
            sql = (
                f"WITH written AS (INSERT INTO {table} ({', '.join(columns)}) {row} RETURNING "
                f"{', '.join(qn(name) for name in notified)})"
                f" SELECT {now}, (SELECT array_agg(id ORDER BY result_id) FROM written),"
                f" (SELECT {NOTIFY} FROM written LIMIT 1)"
            )
            return sql, [*params, *source_params, *now_params]
        returned_names = ("id", "result_id", *_CLOCKED, *(["unique_key"] if unique else []))
        returning = ", ".join(qn(name) for name in returned_names)
        if connection.vendor == "postgresql":
            # Wake listening workers when this commits (wakeup.py). Per row, but PostgreSQL
            # sends one notification per transaction for identical ones.
            returning += f", {NOTIFY}"
        sql = f"INSERT INTO {table} ({', '.join(columns)}) {row} RETURNING {returning}"
        return sql, [*params, *source_params]

    def _returned(
        self, connection: BaseDatabaseWrapper, template: Job, rows: list[Row], returned: Any
    ) -> tuple[dict[str, int], dict[str, int], tuple[datetime, datetime]]:
        """_insert()'s answer from the rows its statement returned."""
        # result_id reads back as a UUID on PostgreSQL, as its hex on SQLite.
        written, held, times = {}, {}, (template.run_after, template.enqueued_at)
        sent = {row[0].hex for row in rows}
        for pk, result_id, run_after, enqueued_at, *rest in returned:
            if (result_id := getattr(result_id, "hex", result_id)) in sent:
                written[result_id] = pk
                times = (run_after, enqueued_at)
            else:
                held[rest[0]] = pk
        meta = self.model._meta
        run_after = from_db(connection, meta.get_field("run_after"), times[0])
        enqueued_at = from_db(connection, meta.get_field("enqueued_at"), times[1])
        return written, held, (run_after, enqueued_at)


def give(jobs: list[Job], written: Iterable[Written]) -> list[Job]:
    """`jobs` with the ids and times their rows were written with (`written`, in order)."""
    for job, (pk, run_after, enqueued_at) in zip(jobs, written, strict=True):
        job.id, job.run_after, job.enqueued_at = pk, run_after, enqueued_at
    return jobs


def _give(by_result_id: dict[str, Job], written: dict[str, int], times: tuple[Any, Any]) -> None:
    """Give the Jobs of the rows written their ids and the times stored."""
    for result_id, pk in written.items():
        job = by_result_id[result_id]
        job.pk = pk
        job.run_after, job.enqueued_at = times


def _chunks(rows: list[Row]) -> list[list[Row]]:
    """`rows` in runs of at most ENQUEUE_CHUNK rows and about ENQUEUE_CHUNK_BYTES of JSON."""
    chunks: list[list[Row]] = [[]]
    size = 0
    for row in rows:
        weight = len(row[2]) + len(row[4])  # the arguments' and keyword arguments' JSON
        if chunks[-1] and (len(chunks[-1]) >= ENQUEUE_CHUNK or size + weight > ENQUEUE_CHUNK_BYTES):
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += weight
    return chunks
