"""The MariaDB/MySQL forms of the writes that PostgreSQL and SQLite make in one statement
with RETURNING, which neither has for an UPDATE (nor MySQL for an INSERT): each is a short
transaction that locks or writes rows by primary key, then reads back what it wrote. The
fences are the same: every write still names the state it expects (and the worker).

Migration 0009 gives these databases the indexes that models.py's partial and expression
indexes give the others (InnoDB has neither): the claim order, and the unique indexes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..payload import dumps
from ..states import State
from ..uniqueness import HOLDS_KEY, UniqueScope
from .base import PER_CALL, ClaimKey, Writes, claim_key, from_db, now_sql
from .queue_claim import limited_row

if TYPE_CHECKING:
    from ..models import Job
    from .unique import Row

# The index in claim order (migration 0009, which freezes the name).
CLAIM_ORDER = "jobstate_job_claim_order"
# For a locking read or an UPDATE of rows by id. InnoDB locks (or waits for) every row it
# reads on the way, matching or not: on a small table the optimizer may read an id list
# by a full scan, and wait for a row some other transaction holds (an application's
# select_for_update(), a claim), while the rows it wants are free. Read by the primary
# key, nothing else is touched.
BY_ID = "FORCE INDEX (PRIMARY)"
# Stand-ins, in an INSERT's template parameters, for each call's own: result id, args,
# kwargs, unique key (in PER_CALL's order).
_STAND_INS = tuple(object() for _ in PER_CALL)


class MySQLWrites(Writes):
    if TYPE_CHECKING:  # enqueue.py's

        def _values(
            self,
            connection: BaseDatabaseWrapper,
            template: Job,
            per_call: dict[str, tuple[str, list[Any]]],
            now: str,
            now_params: list[Any],
        ) -> tuple[list[str], list[str], list[Any]]: ...

    def _claim_mysql(
        self,
        connection: BaseDatabaseWrapper,
        db: str,
        worker_id: str,
        queues: list[str],
        limit: int,
        from_key: ClaimKey | None,
        limited: bool = False,
    ) -> list[Job]:
        """claim() on MariaDB/MySQL, which have no UPDATE ... RETURNING: one short
        transaction that locks the heads of the queues (SELECT ... FOR UPDATE SKIP LOCKED
        over the claim-order index, migration 0009: InnoDB locks every row it reads, so
        the read must walk that order and nothing else), moves them by primary key,
        still fenced on the state, and reads back the rows it moved (by id and worker:
        they are locked by this transaction until it commits, so nobody else changed them).
        A deadlock or a lock wait timeout ends the transaction having changed nothing; it
        is an OperationalError, which the worker's claim loop takes as a passing fault.
        """
        from ..models import JobQueue

        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        now, now_params = now_sql(connection)
        key, key_params = "", list[Any]()
        if from_key is not None:  # the claim order (priority DESC, run_after, id) from it
            rank, run_after, pk = from_key
            at = connection.ops.adapt_datetimefield_value(run_after)
            key = (
                "AND (`priority` < %s OR `priority` = %s AND (`run_after` > %s "
                "OR `run_after` = %s AND `id` >= %s))"
            )
            key_params = [-rank, -rank, at, at, pk]
        exclude = "" if limited else limited_row(qn)  # queue_claim.py
        head = f"""
            SELECT `id`, `priority`, `run_after` FROM {table} FORCE INDEX (`{CLAIM_ORDER}`)
            WHERE `state` = %s AND `queue_name` = %s AND `hold` IS NULL
                AND `run_after` <= {now} {key}
                AND NOT EXISTS (SELECT 1 FROM {qn(JobQueue._meta.db_table)}
                    WHERE `name` = %s AND (`paused_at` IS NOT NULL{exclude}))
            ORDER BY `priority` DESC, `run_after`, `id` LIMIT %s
            FOR UPDATE SKIP LOCKED
        """
        columns = ", ".join(qn(str(f.column)) for f in self.model._meta.concrete_fields)
        with transaction.atomic(using=db), connection.cursor() as cursor:
            heads = []
            for queue in queues:  # the rows of other queues' heads stay locked till COMMIT
                params = [State.QUEUED, queue, *now_params, *key_params, queue, limit]
                cursor.execute(head, params)
                heads += cursor.fetchall()
            heads.sort(key=lambda row: (-row[1], row[2], row[0]))
            ids = [row[0] for row in heads[:limit]]
            if not ids:
                return []
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(
                f"UPDATE {table} {BY_ID} SET `state` = %s, `worker_id` = %s, `started_at` = {now} "
                f"WHERE `id` IN ({marks}) AND `state` = %s",
                [State.RUNNING, worker_id, *now_params, *ids, State.QUEUED],
            )
            won = self.raw(
                f"SELECT {columns} FROM {table} WHERE `id` IN ({marks}) "
                f"AND `state` = %s AND `worker_id` = %s",
                [*ids, State.RUNNING, worker_id],
                using=db,
            )
            return sorted(won, key=claim_key)

    def _succeed_many_mysql(
        self, db: str, worker_id: str, outcomes: Sequence[tuple[Job, Any]], linked: bool
    ) -> set[int]:
        """succeed_many() without UPDATE ... RETURNING: lock the rows still running for
        `worker_id` (those are the ones this transaction writes: nobody can move them
        until it commits), then write each one's value by primary key. A row with
        dependents only if `linked` (deps.py), as on the other databases."""
        connection = connections[db]
        table = connection.ops.quote_name(self.model._meta.db_table)
        values = {job.pk: dumps(value) for job, value in outcomes}
        now, now_params = now_sql(connection)
        with transaction.atomic(using=db), connection.cursor() as cursor:
            marks = ", ".join(["%s"] * len(values))
            cursor.execute(
                f"SELECT `id` FROM {table} {BY_ID} WHERE `id` IN ({marks}) AND `state` = %s "
                f"AND `worker_id` = %s AND (NOT `has_dependents` OR %s) FOR UPDATE",
                [*values, State.RUNNING, worker_id, linked],
            )
            mine = [row[0] for row in cursor.fetchall()]
            if not mine:
                return set()
            marks = ", ".join(["%s"] * len(mine))
            cases = " ".join(["WHEN %s THEN %s"] * len(mine))
            cursor.execute(
                f"UPDATE {table} {BY_ID} SET `state` = %s, `finished_at` = {now}, "
                f"`return_value` = CASE `id` {cases} END "
                f"WHERE `id` IN ({marks}) AND `state` = %s AND `worker_id` = %s",
                [
                    State.SUCCEEDED,
                    *now_params,
                    *(p for pk in mine for p in (pk, values[pk])),
                    *mine,
                    State.RUNNING,
                    worker_id,
                ],
            )
        return set(mine)

    def _insert_mysql(
        self, db: str, template: Job, rows: list[Row], lock_held: bool
    ) -> tuple[dict[str, int], dict[str, int], tuple[datetime, datetime]]:
        """_insert() on MariaDB/MySQL: one multi-row INSERT, its rows' ids returned by
        MariaDB, or read back by result_id in the same transaction (MySQL has no INSERT
        ... RETURNING).

        A row whose unique key is held is not written: ON DUPLICATE KEY UPDATE with an
        update that changes nothing (INSERT IGNORE would also skip, silently, a row that a
        CHECK constraint refuses). InnoDB's duplicate check locks the holder's index entry
        until the transaction ends: unlike on PostgreSQL, a duplicate enqueued inside a
        longer transaction holds back the holder's outcome until that transaction commits.
        """
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        now, now_params = now_sql(connection)
        unique = template.unique_scope is not None
        names = PER_CALL if unique else PER_CALL[:3]
        # Every row's SQL is the template's, its values the template's but for the call's
        # own: the fields are walked once, and the template's values quoted once, not once
        # a row (mysqlclient quoting each row's seven parameters in Python was most of a
        # bulk enqueue's time). A multi-row VALUES, not an INSERT ... SELECT (from a
        # JSON_TABLE, as the other databases select theirs): an INSERT ... SELECT holds
        # InnoDB's table-wide AUTO-INC lock to its end under MariaDB's default
        # innodb_autoinc_lock_mode, stalling every other enqueue, and one JSON document
        # would have MariaDB's depth limit refuse arguments nested 30 or 31 deep.
        per_call = {n: ("%s", [s]) for n, s in zip(names, _STAND_INS, strict=False)}
        columns, selected, template_params = self._values(
            connection, template, per_call, now, now_params
        )
        connection.ensure_connection()
        literal = connection.connection.literal  # the driver's own quoting, as execute()'s
        quoted = iter(
            "%s" if any(p is s for s in _STAND_INS) else literal(p).decode().replace("%", "%%")
            for p in template_params
        )
        one_row = re.sub("%s", lambda _: next(quoted), f"({', '.join(selected)})")
        params = [
            value
            for result_id, _, args, _, kwargs, key in rows
            for value in (result_id.hex, args, kwargs, key)[: len(names)]
        ]
        sql = (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([one_row] * len(rows))}"
        )
        if unique:
            sql += f" ON DUPLICATE KEY UPDATE {qn('id')} = {qn('id')}"
        # Several rows' times are one clock reading (now_sql()): read once, from the first
        # row, not converted for each of thousands (measured: a fifth of the read back).
        times = "`run_after`, `enqueued_at`"
        read = f"`id`, `result_id`, {times}" if len(rows) == 1 else "`id`, `result_id`"
        # MariaDB returns the rows it wrote (RETURNING): no read back by result id, which
        # took an index lookup a row. Not with ON DUPLICATE KEY UPDATE, where it would
        # return a held key's holder too; nor on MySQL, which has no RETURNING.
        returning = not unique and connection.features.can_return_rows_from_bulk_insert
        if returning:
            sql += f" RETURNING {read}"
        with transaction.atomic(using=db), connection.cursor() as cursor:
            cursor.execute(sql, params)
            if not returning:
                field = self.model._meta.get_field("result_id")  # char(32), or MariaDB's uuid
                sent = [field.get_db_prep_value(row[0], connection) for row in rows]
                marks = ", ".join(["%s"] * len(sent))
                cursor.execute(f"SELECT {read} FROM {table} WHERE `result_id` IN ({marks})", sent)
            returned = cursor.fetchall()
            clock: Sequence[Any] = returned[0][2:] if returned else ()
            if returned and len(rows) > 1:
                cursor.execute(f"SELECT {times} FROM {table} WHERE `id` = %s", [returned[0][0]])
                clock = cursor.fetchone()
            held: dict[str, int] = {}
            if lock_held and len(returned) < len(rows):
                scope = UniqueScope(cast(str, template.unique_scope))
                keys = [row[5] for row in rows]
                holders = self.using(db).filter(HOLDS_KEY[scope], unique_key__in=keys)
                locked = holders.select_for_update().values_list("unique_key", "pk")
                held = {cast(str, key): pk for key, pk in locked}
        # result_id reads back as MariaDB's uuid text (with dashes), or MySQL's char(32) hex.
        written = {str(row[1]).replace("-", "").lower(): row[0] for row in returned}
        if not returned:  # every key was held: nothing read back to convert
            return written, held, (template.run_after, template.enqueued_at)
        meta = self.model._meta
        run_after = from_db(connection, meta.get_field("run_after"), clock[0])
        enqueued_at = from_db(connection, meta.get_field("enqueued_at"), clock[1])
        return written, held, (run_after, enqueued_at)
