"""Enqueue of unique tasks: write the call whose key is free, else find the key's holder,
locking nothing (enqueue.py writes the rows)."""

from __future__ import annotations

import copy
import random
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

from django.db import OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql import Query

from ..exceptions import JobAlreadyEnqueued, LostRace
from ..uniqueness import HOLDS_KEY, UniqueScope
from .conflicts import lock_conflict
from .mysql import MySQLWrites

if TYPE_CHECKING:
    from ..models import Job

# _on_conflict()'s clause, per database vendor, scope and whether it returns the holder.
_ON_CONFLICT: dict[tuple[str, UniqueScope, bool], str] = {}
# Rounds of a unique enqueue (_write_or_find()): generous, as each round lost means the
# key's holder finished between two statements; the last round locks the holder.
UNIQUE_ROUNDS = 50
# Tries of a unique enqueue that InnoDB rolled back for a lock conflict (_enqueue_unique()).
LOCK_CONFLICT_TRIES = 10

# One call of a task: its arguments and keyword arguments.
Call = tuple[Sequence[Any], dict[str, Any]]
# One call to insert: result_id, args, args as JSON, kwargs, kwargs as JSON, unique key.
Row = tuple[uuid.UUID, Any, str, Any, str, str | None]


class EnqueueUnique(MySQLWrites):
    if TYPE_CHECKING:  # enqueue.py's, which writes the rows

        def _insert_chunks(
            self,
            db: str,
            template: Job,
            rows: list[Row],
            jobs: list[Job],
            lock_held: bool = False,
        ) -> dict[str, int]: ...

    def _enqueue_unique(
        self, db: str, template: Job, rows: list[Row], jobs: list[Job], raise_duplicates: bool
    ) -> list[Job]:
        """enqueue_many() of calls with unique keys: the first call of each key is written
        unless a live row holds the key, which is returned instead (_write_or_find()).

        On MariaDB/MySQL, InnoDB's duplicate-key check locks the key's index entry, and
        enqueuers racing for keys with the holders' workers can deadlock (1213): InnoDB
        then rolls the whole transaction back. When that transaction is this call's own,
        nothing was written and the enqueue is tried again; inside the caller's
        transaction the error is the caller's to retry (its work was rolled back too).
        """
        connection = connections[db]
        own = connection.vendor == "mysql" and not connection.in_atomic_block
        for attempt in range(1, LOCK_CONFLICT_TRIES + 1):
            try:
                return self._enqueue_unique_once(db, template, rows, jobs, raise_duplicates)
            except OperationalError as exc:
                if not (own and lock_conflict(exc)) or attempt == LOCK_CONFLICT_TRIES:
                    raise
                for job in jobs:  # written by the transaction rolled back
                    job.pk = None
                time.sleep(random.uniform(0, 0.005 * attempt))  # out of step with the other
        raise AssertionError("unreachable")

    def _enqueue_unique_once(
        self, db: str, template: Job, rows: list[Row], jobs: list[Job], raise_duplicates: bool
    ) -> list[Job]:
        first: dict[str, tuple[Row, Job]] = {}
        for row, job in zip(rows, jobs, strict=True):
            first.setdefault(cast(str, job.unique_key), (row, job))
        # Several keys in one transaction are written in key order, so that two such
        # enqueues on PostgreSQL wait for each other's keys in one order, never in a cycle.
        todo = [first[key] for key in sorted(first)]
        with transaction.atomic(using=db) if len(rows) > 1 else nullcontext():
            holders = self._write_or_find(db, template, todo)
            results = []
            for job in jobs:
                key = cast(str, job.unique_key)
                winner = holders.get(key) or first[key][1]
                if winner is not job and not winner.deduplicated:
                    winner = copy.copy(winner)  # a repeat, within this call, of a new job
                    winner.deduplicated = True
                if winner.deduplicated and raise_duplicates:
                    where = (
                        f"as {winner.result_id} (job {winner.pk}, {winner.state})"
                        if key in holders
                        else "by another call of this bulk_enqueue()"
                    )
                    raise JobAlreadyEnqueued(
                        f"Task {template.task_path} is already enqueued with this unique key "
                        f"{where}: nothing was enqueued.",
                        result_id=str(winner.result_id),
                    )
                results.append(winner)
        return results

    def _write_or_find(self, db: str, template: Job, todo: list[tuple[Row, Job]]) -> dict[str, Job]:
        """Write each of `todo` whose key is free; return {key: holder} of the others.

        A duplicate locks nothing: the INSERT does nothing on a held key (ON CONFLICT DO
        NOTHING) and a plain read finds the holder, so the holder's worker can claim it and
        write its outcome while the caller's transaction goes on. A holder that finishes
        between the two statements frees its key: the next round inserts, or finds the
        next holder. Each round ends with every call written or its holder found unless a
        key changed hands in between; the last of UNIQUE_ROUNDS, which only keys churned
        that fast reach, returns the holder from the INSERT itself (DO UPDATE): it always
        answers, and locks that holder until the transaction ends.

        (SQLite has no row locks; its transactions take the write lock at BEGIN, as
        receivers.py sets them, so a duplicate adds nothing to what the caller holds.)
        """
        scope = UniqueScope(cast(str, template.unique_scope))
        holders: dict[str, Job] = {}
        # On MariaDB/MySQL the INSERT of a held key locks the holder's index entry (and
        # racing ones deadlock), so a plain read looks for the holders first.
        read_first = connections[db].vendor == "mysql"
        for round_ in range(UNIQUE_ROUNDS):
            if round_ > 0 or read_first:
                keys = [cast(str, job.unique_key) for _, job in todo]
                for holder in self.using(db).filter(HOLDS_KEY[scope], unique_key__in=keys):
                    holder.deduplicated = True
                    holders[cast(str, holder.unique_key)] = holder
                todo = [(row, job) for row, job in todo if job.unique_key not in holders]
                if not todo:
                    break
            last = round_ == UNIQUE_ROUNDS - 1
            held = self._insert_chunks(
                db, template, [r for r, _ in todo], [j for _, j in todo], lock_held=last
            )
            todo = [(row, job) for row, job in todo if job.pk is None]
            if held:  # the last round's: returned by the INSERT
                found_rows = self.using(db).filter(pk__in=held.values())
                if connections[db].vendor == "mysql" and connections[db].in_atomic_block:
                    # Locked already; a locking read sees them under REPEATABLE READ too.
                    found_rows = found_rows.select_for_update()
                found = list(found_rows)
                if len(found) != len(held):  # finished and deleted within the enqueue
                    raise LostRace(
                        f"Enqueueing {template.task_path}: the job that held a unique key "
                        f"was deleted before it could be read. Nothing was enqueued; try again."
                    )
                for holder in found:
                    holder.deduplicated = True
                    holders[cast(str, holder.unique_key)] = holder
                todo = []
            if not todo:
                break
        return holders

    def _on_conflict(
        self, connection: BaseDatabaseWrapper, scope: UniqueScope, lock_held: bool
    ) -> str:
        """ON CONFLICT on the unique index of `scope`: a row whose key is held is not written.

        DO NOTHING, which locks nothing; with `lock_held`, the holder of the key is returned
        instead: its "update" writes the key that the row already has, only to make the
        INSERT return the holder it met in the same statement (a holder that finishes
        within it is waited for, and PostgreSQL then inserts), at the cost of locking the
        holder until the transaction ends. The condition is the index's, compiled from
        HOLDS_KEY with its values written out: the database picks the index by matching
        the two when it parses the statement, before parameters have values.
        """
        cached = _ON_CONFLICT.get((connection.vendor, scope, lock_held))
        if cached is not None:
            return cached
        query = Query(self.model, alias_cols=False)
        where, params = query.build_where(HOLDS_KEY[scope]).as_sql(
            query.get_compiler(connection=connection), connection
        )
        literals = tuple("'{}'".format(str(p).replace("'", "''")) for p in params)
        column = connection.ops.quote_name("unique_key")
        action = f"DO UPDATE SET {column} = EXCLUDED.{column}" if lock_held else "DO NOTHING"
        sql = f" ON CONFLICT ({column}) WHERE {where % literals} {action}"
        _ON_CONFLICT[connection.vendor, scope, lock_held] = sql
        return sql
