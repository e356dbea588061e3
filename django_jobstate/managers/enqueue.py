"""Enqueue: the first attempt of a task, queued; many in one statement."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.fields import NOT_PROVIDED

from ..limits import Hold
from ..notify import NOTIFY
from ..payload import encode_payload
from ..uniqueness import UniqueScope
from .base import PER_CALL, from_db, now_sql
from .limits import Limits
from .unique import EnqueueUnique, Row

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


# enqueue_many(): calls per INSERT.
ENQUEUE_CHUNK = 5000
# The times an INSERT takes from _now_sql() when not given, and reads back.
_CLOCKED = ("run_after", "enqueued_at")


class Enqueue(EnqueueUnique, Limits):
    def enqueue(
        self,
        task_path: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Create the first attempt of a task, queued. `options` as for enqueue_many()."""
        unique_key = options.pop("unique_key", None)
        if unique_key is not None:
            options["unique_keys"] = [unique_key]
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
        unique_keys: Sequence[str] | None = None,
        unique_scope: UniqueScope = UniqueScope.LIVE,
        raise_duplicates: bool = False,
        metadata: dict[str, Any] | None = None,
        trace_context: dict[str, Any] | None = None,
        schedule_name: str | None = None,
        scheduled_for: datetime | None = None,
        concurrency_keys: Sequence[str] | None = None,
        concurrency_limit: int | None = None,
    ) -> list[Job]:
        """Create the first attempts of several calls of one task: all of them, or none.

        One INSERT ... SELECT per ENQUEUE_CHUNK calls, whose rows differ only in result_id,
        args and kwargs: they travel as one JSON parameter, the rest as one parameter each
        (the ORM's INSERT would compile and adapt every field of every row, which the
        profile showed was most of an enqueue's time). On PostgreSQL, the INSERT also
        wakes listening workers (wakeup.py).

        With `unique_keys` (one per call), a call whose key is held (uniqueness.py) writes
        nothing: its place in the list is the holder, with `deduplicated` set, or with
        `raise_duplicates`, JobAlreadyEnqueued is raised and nothing is written at all.
        `schedule_name` and `scheduled_for` mark the jobs of a schedule's tick (schedules.py).
        With `concurrency_keys` (one per call) and `concurrency_limit`, each job enters held
        and takes a free slot of its key if there is one (limits.py).
        """
        calls = list(calls)
        keys: Sequence[str | None] = [None] * len(calls) if unique_keys is None else unique_keys
        if len(keys) != len(calls):
            raise ValueError(f"{len(keys)} unique keys for {len(calls)} calls: give one per call.")
        # Without run_after (and enqueued_at), the INSERT takes them from its clock.
        template = self.model(
            task_path=task_path,
            queue_name=queue_name,
            priority=priority,
            backend=backend,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
            unique_scope=None if unique_keys is None else unique_scope,
            metadata={} if metadata is None else metadata,
            trace_context=trace_context,
            schedule_name=schedule_name,
            scheduled_for=scheduled_for,
        )
        if run_after is not None:
            template.run_after = run_after
        rows: list[Row] = [
            (
                uuid7(),
                *encode_payload(list(args), "Task arguments"),
                *encode_payload(dict(kwargs), "Task keyword arguments"),
                key,
            )
            for (args, kwargs), key in zip(calls, keys, strict=True)
        ]
        db = router.db_for_write(self.model)
        # The Job objects, as if read back: positional, not keyword, construction is faster.
        fields = [f.attname for f in self.model._meta.concrete_fields]
        values = [getattr(template, name) for name in fields]
        at = [fields.index(name) for name in PER_CALL]
        jobs = []
        for result_id, args, _, kwargs, _, key in rows:
            for i, value in zip(at, (result_id, args, kwargs, key), strict=True):
                values[i] = value
            jobs.append(self.model.from_db(db, fields, values))
        if concurrency_keys is not None:
            if concurrency_limit is None or len(concurrency_keys) != len(calls):
                raise ValueError("Give a concurrency_limit and one concurrency key per call.")
            template.concurrency_limit = concurrency_limit
            template.hold = Hold.LIMIT
            return self._enqueue_limited(
                db,
                template,
                rows,
                jobs,
                concurrency_keys,
                unique_keys is not None,
                raise_duplicates,
            )
        if unique_keys is not None:
            return self._enqueue_unique(db, template, rows, jobs, raise_duplicates)
        # One statement is atomic on its own; a transaction would cost two round trips.
        with transaction.atomic(using=db) if len(rows) > ENQUEUE_CHUNK else nullcontext():
            self._insert_chunks(db, template, rows, jobs)
        return jobs

    def _insert_chunks(
        self, db: str, template: Job, rows: list[Row], jobs: list[Job], lock_held: bool = False
    ) -> dict[str, int]:
        """INSERT `rows` in chunks; give each of `jobs` (one per row) that was written its id
        and times. With `lock_held`, returns {unique key: id} of the live rows that held the
        keys of the rows that were not written (_on_conflict())."""
        by_result_id = {job.result_id.hex: job for job in jobs}
        holders = {}
        for start in range(0, len(rows), ENQUEUE_CHUNK):
            chunk = rows[start : start + ENQUEUE_CHUNK]
            written, held, times = self._insert(db, template, chunk, lock_held)
            for result_id, pk in written.items():
                job = by_result_id[result_id]
                job.pk = pk
                job.run_after, job.enqueued_at = times
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
        enqueued_at stored (the same for every row written by one statement). One row is a
        plain INSERT ... VALUES, which PostgreSQL plans faster; several are selected from
        one JSON array of [result_id, args, kwargs, unique key].
        """
        connection = connections[db]
        if connection.vendor == "mysql":
            return self._insert_mysql(db, template, rows, lock_held)
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
                f'["{r.hex}",{args},{kwargs},"{key}"]' if unique else f'["{r.hex}",{args},{kwargs}]'
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
        returned_names = ("id", "result_id", *_CLOCKED, *(["unique_key"] if unique else []))
        returning = ", ".join(qn(name) for name in returned_names)
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
