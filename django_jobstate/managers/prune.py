"""Prune: delete whole finished tasks, never a live attempt, never half a task."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta

from django.db import connections, router, transaction

from ..querysets import never_released
from ..states import TERMINAL_STATES
from .base import Writes
from .conflicts import retries_conflicts
from .deps import _edges


class Prune(Writes):
    def prune(
        self,
        older_than: timedelta,
        *,
        states: Iterable[str] | None = None,
        batch_size: int = 1000,
        dry_run: bool = False,
    ) -> int:
        """Delete the prunable() attempts, whole tasks of about `batch_size` attempts per
        batch; return how many. With `dry_run`, count them instead.

        A retry may commit while a batch runs. So each batch is one short transaction that
        deletes a task only if, by a snapshot taken after it locked the rows, all of the
        task's attempts are among them (no new attempt, live or not) and terminal. On
        PostgreSQL it locks them first (FOR UPDATE): a retry locks its predecessor too
        (retry()), so either the retry committed first and the re-check sees it, or it
        waits and then finds its predecessor gone. On SQLite the one DELETE does it all
        under the write lock. Not QuerySet.delete(): its SET_NULL of `previous` would keep
        such a retry, unlinked from the deleted attempt.
        """
        if batch_size < 1:
            raise ValueError(f"prune() batch_size must be at least 1, not {batch_size}.")
        db = router.db_for_write(self.model)
        candidates = self.using(db).prunable(older_than, states).order_by("result_id", "attempt")
        if dry_run:
            return candidates.count()
        deleted, last = 0, None
        while True:
            after = candidates if last is None else candidates.filter(result_id__gt=last)
            rows = list(after.values_list("pk", "result_id")[: batch_size + 1])
            if not rows:
                return deleted
            if len(rows) > batch_size:  # the task of the extra row may go on past it
                split = rows[-1][1]
                rows = [row for row in rows if row[1] != split] or list(
                    after.filter(result_id=split).values_list("pk", "result_id")
                )
            last = rows[-1][1]
            deleted += self._delete_tasks(db, [pk for pk, _ in rows])

    @retries_conflicts  # a retry of a dependent locks it, then its upstreams: a deadlock
    def _delete_tasks(self, db: str, ids: list[int]) -> int:
        """Delete the tasks all of whose attempts are among `ids`, and terminal, and whose
        results no task may still be given (never_released()); and the dependency edges
        into those deleted."""
        connection = connections[db]
        with transaction.atomic(using=db):
            if connection.vendor != "sqlite":  # SQLite: one writer at a time
                locked = self.using(db).filter(pk__in=ids).select_for_update().order_by("pk")
                ids = list(locked.values_list("pk", flat=True))  # any deleted meanwhile: gone
                if not ids:
                    return 0
            # The tasks that depend on others (pending_deps is NULL for any other).
            dependents = set(
                self.using(db)
                .filter(pk__in=ids, pending_deps__isnull=False)
                .values_list("result_id", flat=True)
            )
            if connection.vendor == "mysql":
                deleted = self._delete_tasks_mysql(db, ids)
            else:
                deleted = self._delete_tasks_sql(db, ids)
            # The edges into the dependents deleted: nothing reads them again (those out of
            # a task go with the task they lead to, once that is pruned).
            if dependents:
                kept = self.using(db).filter(result_id__in=dependents).values("result_id")
                _edges().using(db).filter(downstream__in=dependents).exclude(
                    downstream__in=kept
                ).delete()
            return deleted

    def _delete_tasks_sql(self, db: str, ids: list[int]) -> int:
        """_delete_tasks() on PostgreSQL and SQLite: one statement that judges each task by
        a snapshot taken after the rows were locked."""
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        edges = qn(_edges().model._meta.db_table)
        marks = ", ".join(["%s"] * len(ids))
        terminal = sorted(TERMINAL_STATES)
        with connection.cursor() as cursor:
            cursor.execute(
                f"""DELETE FROM {table}
                WHERE {qn("id")} IN ({marks}) AND NOT EXISTS (
                    SELECT 1 FROM {table} AS other
                    WHERE other.{qn("result_id")} = {table}.{qn("result_id")} AND (
                        other.{qn("id")} NOT IN ({marks})
                        OR other.{qn("state")} NOT IN ({", ".join(["%s"] * len(terminal))})
                    )
                ) AND NOT EXISTS (
                    SELECT 1 FROM {edges} AS edge
                    JOIN {table} AS dependent
                        ON dependent.{qn("result_id")} = edge.{qn("downstream")}
                    WHERE edge.{qn("upstream")} = {table}.{qn("result_id")}
                        AND dependent.{qn("pending_deps")} > 0
                )
                """,
                [*ids, *ids, *terminal],
            )
            return cursor.rowcount

    def _delete_tasks_mysql(self, db: str, ids: list[int]) -> int:
        """_delete_tasks() on MariaDB/MySQL, in the transaction that locked `ids`.

        MySQL refuses a DELETE whose subquery reads its own table, so the tasks are judged
        from a locking read of all their attempts (a locking read sees the latest commits,
        under REPEATABLE READ too, and holds any attempt a retry committed meanwhile).
        InnoDB checks the foreign key `previous` row by row, not at the statement's end:
        later attempts, which have the higher ids, go first.
        """
        by_task: dict[uuid.UUID, list[tuple[int, str]]] = {}
        attempts = self.using(db).filter(
            result_id__in=self.using(db).filter(pk__in=ids).values("result_id")
        )
        for pk, result_id, state in attempts.select_for_update().values_list(
            "pk", "result_id", "state"
        ):
            by_task.setdefault(result_id, []).append((pk, state))
        # Read after the locks: whoever makes a task depend on these locks them first.
        waiting = never_released(self.using(db))
        edges = _edges().using(db).filter(upstream__in=list(by_task), downstream__in=waiting)
        waited_for = set(edges.values_list("upstream", flat=True))
        chosen, doomed = set(ids), []
        for result_id, rows in by_task.items():
            if result_id in waited_for:
                continue
            if all(pk in chosen and state in TERMINAL_STATES for pk, state in rows):
                doomed += [pk for pk, _ in rows]
        if not doomed:
            return 0
        table = connections[db].ops.quote_name(self.model._meta.db_table)
        marks = ", ".join(["%s"] * len(doomed))
        with connections[db].cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE `id` IN ({marks}) ORDER BY `id` DESC", doomed
            )
            return cursor.rowcount
