"""Enqueue: the first attempt of a task, queued; many in one statement."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, router, transaction
from django.db.models.fields import NOT_PROVIDED

from ..payload import encode_payload
from ..wakeup import NOTIFY
from .base import Writes, from_db, now_sql

if TYPE_CHECKING:
    from ..models import Job


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


# enqueue_many(): calls per INSERT, and the fields that differ between its rows.
ENQUEUE_CHUNK = 5000
_PER_CALL = ("result_id", "args", "kwargs")
# The times an INSERT takes from _now_sql() when not given, and reads back.
_CLOCKED = ("run_after", "enqueued_at")


class Enqueue(Writes):
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
        metadata: dict[str, Any] | None = None,
        trace_context: dict[str, Any] | None = None,
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
            metadata={} if metadata is None else metadata,
            trace_context=trace_context,
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
        now, now_params = now_sql(connection)
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
        run_after = from_db(connection, meta.get_field("run_after"), times[0])
        enqueued_at = from_db(connection, meta.get_field("enqueued_at"), times[1])
        # result_id reads back as a UUID on PostgreSQL, as its hex on SQLite.
        return {getattr(r, "hex", r): pk for pk, r, *_ in returned}, (run_after, enqueued_at)
