"""Enqueue's fast path: the INSERT of a plain job prepared once per task and options.

A profile of one `task.enqueue()` inside a transaction (bench/benchmark/enqueue_cost.py)
found most of its Python time in work that is the same for every call of a task: a
template Job built field by field, its columns and values compiled into the INSERT, the
converters of the times read back, and a Job built through Model.__init__ (which walks
every field, twice per enqueue). Here that work is done once per (database, task path,
options) and kept; a call only fills in its result id, arguments and clock.

Only plain jobs take it: no unique key, no concurrency key, no run_after, trace context or
schedule (those vary by call or need the other paths' statements). Model instances are
built without Model.__init__ only while nothing listens to Job's pre_init or post_init
signals; with a receiver, through from_db() as before.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db.notify import NOTIFY
from ..db.sqlite_direct import direct_form, fetch_one
from ..payload import ARGS, KWARGS, encode_payload
from .base import PER_CALL, built_directly, instance, now_sql, process_now
from .bulk import EnqueuedJobs, pipelined
from .insert import Written, give
from .result_ids import uuid7
from .unique import Call, Row

if TYPE_CHECKING:
    from uuid import UUID

    from ..models import Job

# Prepared statements kept per manager: one per task and options (a bound against
# ever-new options, e.g. a priority computed per call).
MAX_PREPARED = 256
# Stand-ins, in the prepared parameters, for what each call fills in.
_RESULT_ID, _ARGS, _KWARGS, _NOW = _STAND_INS = tuple(object() for _ in range(4))

Builder = Callable[[Any, Any, Any, "str | None"], "Job"]


@dataclass(slots=True)
class Prepared:
    template: Job  # read only: the fields every job of these options shares
    build: Builder  # a Job as if read back, from (result_id, args, kwargs, unique_key)
    sql: str | None  # the one-row INSERT ... RETURNING; None where there is no RETURNING
    direct: str | None  # its form for SQLite's driver (db/sqlite_direct.py), or None
    params: list[Any]  # its parameters, with the stand-ins above
    at: dict[object, list[int]]  # where each stand-in is in params
    read_time: Callable[[Any], datetime]  # a time read back, as the ORM would give it
    quiet: bool  # `build` sends no signal and runs no code of the model's: may be put off


def job_builder(model: type[Job], db: str, template: Job) -> Builder:
    """A function that builds the Job of one call as if read back from the database."""
    fields = [f.attname for f in model._meta.concrete_fields]
    values = [getattr(template, name) for name in fields]
    per_call = [fields.index(name) for name in PER_CALL]
    # Each job gets its own copy of the metadata dict (the template is shared).
    at_metadata = fields.index("metadata")
    if not built_directly(model):

        def through_init(result_id: Any, args: Any, kwargs: Any, key: str | None) -> Job:
            row = list(values)
            for i, value in zip(per_call, (result_id, args, kwargs, key), strict=True):
                row[i] = value
            row[at_metadata] = copy.deepcopy(row[at_metadata])
            return model.from_db(db, fields, row)

        return through_init
    shared = dict(zip(fields, values, strict=True))
    metadata = shared["metadata"]
    at_result_id, at_args, at_kwargs, at_key = (fields[i] for i in per_call)

    def direct(result_id: Any, args: Any, kwargs: Any, key: str | None) -> Job:
        attrs = dict(shared)
        attrs["metadata"] = copy.deepcopy(metadata) if metadata else {}
        attrs[at_result_id], attrs[at_args], attrs[at_kwargs] = result_id, args, kwargs
        attrs[at_key] = key
        return instance(model, db, attrs)

    return direct


def time_reader(connection: BaseDatabaseWrapper, model: type[Job]) -> Callable[[Any], datetime]:
    """managers.base.from_db() for run_after and enqueued_at, its converters looked up once."""
    field = model._meta.get_field("run_after")
    column = field.get_col(model._meta.db_table)
    converters = connection.ops.get_db_converters(column) + field.get_db_converters(connection)

    def read(value: Any) -> datetime:
        for convert in converters:
            value = convert(value, column, connection)
        return value

    return read


def options_key(db: str, task_path: str, options: dict[str, Any]) -> tuple[Any, ...]:
    metadata = options["metadata"]
    return (
        db,
        task_path,
        *(options[name] for name in sorted(options) if name != "metadata"),
        json.dumps(metadata, sort_keys=True) if metadata else None,
    )


class PreparedInserts:
    """Job.objects' part that keeps the prepared INSERTs (a mixin of the manager)."""

    model: type[Job]
    _values: Callable[..., tuple[list[str], list[str], list[Any]]]
    _insert_all: Callable[[str, Job, list[Row]], list[Written]]
    _insert_pipelined: Callable[..., Sequence[Job]]
    _rows: Callable[[list[Call]], list[Row]]
    _row: Callable[[UUID, Sequence[Any], dict[str, Any], str | None], Row]

    def _prepared(self, db: str, task_path: str, options: dict[str, Any]) -> Prepared:
        cache: dict[tuple[Any, ...], Prepared] = self.__dict__.setdefault("_prepared_cache", {})
        key = options_key(db, task_path, options)
        prepared = cache.get(key)
        # A pre_init/post_init receiver connected or gone since: the other builder.
        if prepared is None or prepared.quiet != built_directly(self.model):
            if len(cache) >= MAX_PREPARED:
                cache.clear()
            prepared = cache[key] = self._prepare(db, task_path, options)
        return prepared

    def _prepare(self, db: str, task_path: str, options: dict[str, Any]) -> Prepared:
        metadata = options["metadata"]
        template = self.model(
            task_path=task_path,
            **{name: value for name, value in options.items() if name != "metadata"},
            # Its own already: enqueue_many() took it through check_metadata(), a new dict.
            metadata=metadata or {},
        )
        connection = connections[db]
        sql = None
        params: list[Any] = []
        if connection.features.can_return_columns_from_insert:  # MySQL 8 has no RETURNING
            now, now_params = now_sql(connection)
            stand_ins = (_RESULT_ID, _ARGS, _KWARGS)
            per_call = {n: ("%s", [s]) for n, s in zip(PER_CALL, stand_ins, strict=False)}
            columns, selected, params = self._values(
                connection, template, per_call, now, [_NOW] if now_params else []
            )
            qn = connection.ops.quote_name
            returning = ", ".join(qn(name) for name in ("id", "run_after", "enqueued_at"))
            if connection.vendor == "postgresql":
                returning += f", {NOTIFY}"  # as _insert(): wakes listening workers
            sql = (
                f"INSERT INTO {qn(self.model._meta.db_table)} ({', '.join(columns)}) "
                f"VALUES ({', '.join(selected)}) RETURNING {returning}"
            )
        at = {s: [i for i, p in enumerate(params) if p is s] for s in _STAND_INS}
        return Prepared(
            template=template,
            build=job_builder(self.model, db, template),
            sql=sql,
            direct=None if sql is None else direct_form(connection, sql),
            params=params,
            at=at,
            read_time=time_reader(connection, self.model),
            quiet=built_directly(self.model),
        )

    def enqueue_one(
        self,
        task_path: str,
        options: dict[str, Any],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        statements: dict[str, Prepared],
    ) -> tuple[UUID, list[Any], dict[str, Any], datetime] | None:
        """enqueue_many() of one plain call, without its Job: the result id, the arguments
        as they read back, and enqueued_at; JobStateBackend.enqueue()'s fast path. None,
        having written nothing, where it does not apply (no RETURNING; something hears
        Job's pre_init or post_init, which a Job built would send): use enqueue_many().
        `statements`: the prepared INSERT of `task_path` and `options` per database, kept by
        the caller with them (a task's plan: task_options/plan.py), so that none is looked
        up by a key built from the options at every call (a tenth of this call's Python)."""
        db = router.db_for_write(self.model)
        prepared = statements.get(db)
        # A pre_init/post_init receiver connected or gone since: the other builder.
        if prepared is None or prepared.quiet != built_directly(self.model):
            prepared = statements[db] = self._prepared(db, task_path, options)
        if prepared.sql is None or not prepared.quiet:
            return None
        read_args, args_json = encode_payload(list(args), ARGS)
        read_kwargs, kwargs_json = encode_payload(dict(kwargs), KWARGS)
        result_id = uuid7()
        *_, enqueued_at = self._insert_one(db, prepared, result_id, args_json, kwargs_json)
        return result_id, read_args, read_kwargs, enqueued_at

    def _enqueue_plain(
        self, db: str, task_path: str, options: dict[str, Any], calls: list[Call]
    ) -> Sequence[Job]:
        """enqueue_many() of jobs with no key, time or schedule."""
        prepared = self._prepared(db, task_path, options)
        make, template = prepared.build, prepared.template
        if len(calls) == 1 and prepared.sql is not None:
            [(result_id, args, args_json, kwargs, kwargs_json, key)] = self._rows(calls)
            job = make(result_id, args, kwargs, key)
            job.pk, job.run_after, job.enqueued_at = self._insert_one(
                db, prepared, result_id, args_json, kwargs_json
            )
            return [job]
        if pipelined(connections[db]):
            return self._insert_pipelined(db, template, calls, self._rows, make, prepared.quiet)
        rows = self._rows(calls)
        if prepared.quiet:
            return EnqueuedJobs(make, rows, self._insert_all(db, template, rows))
        # Built before the INSERT: a build that raises (a receiver's) leaves nothing written.
        jobs = [make(r, args, kwargs, key) for r, args, _, kwargs, _, key in rows]
        return give(jobs, self._insert_all(db, template, rows))

    def _insert_one(
        self, db: str, prepared: Prepared, result_id: Any, args: str, kwargs: str
    ) -> Any:
        """Send the prepared INSERT of one job: its (id, run_after, enqueued_at)."""
        connection = connections[db]
        params, at = list(prepared.params), prepared.at
        for i in at[_RESULT_ID]:
            params[i] = result_id.hex
        for i in at[_ARGS]:
            params[i] = args
        for i in at[_KWARGS]:
            params[i] = kwargs
        now = None
        if at[_NOW]:  # SQLite's clock is this process's (now_sql()), read once for both times
            now, written = process_now(connection)
            for i in at[_NOW]:
                params[i] = written
        sql = prepared.sql
        assert sql is not None
        pk, run_after, enqueued_at, *_ = fetch_one(connection, sql, prepared.direct, params)
        if now is not None and connection.timezone in (None, UTC):
            return pk, now, now  # the times written, as the ORM reads them back: no parse
        return pk, prepared.read_time(run_after), prepared.read_time(enqueued_at)
