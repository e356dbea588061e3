"""Concurrency limits (limits/concurrency.py): handing out the slots of a key.

A limited row enters held (enqueue.py, and a retry in outcomes.py), and then, in the same
transaction, its key's free slots go to the oldest held rows of the key in claim order
(_release_slots). A row that leaves the live set (succeeded, failed: by its worker, a
rescue, a timeout, a cancel) frees its slot by that write alone, and the same
transaction hands it on (Writes._transition calls _release_slots). Whoever hands out a
key's slots holds that key's lock until the transaction ends, so two of them never give
out one slot twice; the unique index on (key, slot) would refuse it anyway. A dead
worker's slot stays taken until its attempt is rescued (failed as lost): a limit of 1
never becomes 2 while a worker is merely silent.

Held rows are not in the claim's index: the claim needs no per-key logic, and a key with
a backlog of held rows costs the claim nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from django.db import IntegrityError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

from ..db import notify
from ..limits.concurrency import HELD, HOLDS_SLOT, Hold
from ..states import State
from .base import Writes

if TYPE_CHECKING:
    from datetime import datetime

    from ..models import Job
    from .unique import Row

# MariaDB/MySQL: the virtual column of the unique slot index (migration 0015), the key of a
# row that holds a live slot, else NULL. Their optimizer cannot match the condition to it.
MYSQL_SLOT_KEY = "mysql_concurrency_slot_key"
# The unique index on (key, slot) of live rows (limits/fields.py), named in its errors.
SLOT_INDEX = "jobstate_job_concurrency_slot"
# The claim order of held rows (the index jobstate_job_held).
_CLAIM_ORDER = ("-priority", "run_after", "id")


def lock_key(connection: BaseDatabaseWrapper, key: str) -> None:
    """Hold `key`'s lock until the transaction ends: whoever hands out its slots. Taken
    again by the same transaction, it is already held: nothing waits.

    PostgreSQL: an advisory lock on the key's first 64 bits. SQLite: nothing, as its
    writers already hold the database's write lock. MariaDB/MySQL: the key's
    ConcurrencyLock row, locked by a read FOR UPDATE of its primary key (a record lock,
    which a second read of the same transaction finds held); made by the first to need it
    with an upsert, which waits for another first one and locks the row either way (an
    INSERT IGNORE would take a shared lock that the FOR UPDATE must upgrade: two of them
    would deadlock). Never the upsert for a row that exists: its lock, of another kind,
    would queue behind a waiter of this transaction's own lock, a deadlock.
    """
    if connection.vendor == "postgresql":
        number = int(key[:16], 16) - (1 << 63)  # a signed bigint
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [number])
    elif connection.vendor == "mysql":
        from ..models import ConcurrencyLock

        table = connection.ops.quote_name(ConcurrencyLock._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT `key` FROM {table} WHERE `key` = %s FOR UPDATE", [key])
            if cursor.fetchone() is None:
                cursor.execute(
                    f"INSERT INTO {table} (`key`) VALUES (%s) "
                    f"ON DUPLICATE KEY UPDATE `key` = `key`",
                    [key],
                )


class Limits(Writes):
    if TYPE_CHECKING:  # enqueue.py's and unique.py's, which write the rows

        def _insert_chunks(
            self, db: str, template: Job, rows: list[Row], jobs: list[Job], lock_held: bool = False
        ) -> dict[str, int]: ...

        def _enqueue_unique(
            self,
            db: str,
            template: Job,
            rows: list[Row],
            jobs: list[Job],
            raise_duplicates: bool,
        ) -> list[Job]: ...

    def _enqueue_limited(
        self,
        db: str,
        template: Job,
        rows: list[Row],
        jobs: list[Job],
        keys: Sequence[str],
        unique: bool,
        raise_duplicates: bool,
    ) -> list[Job]:
        """enqueue_many() of a limited task: every row enters held, one INSERT per key (the
        key is a column of the statement's template), then each key's free slots go to its
        oldest held rows (_release_slots), all in one transaction."""
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        results: list[Job | None] = [None] * len(jobs)
        with transaction.atomic(using=db):
            for key, at in sorted(groups.items()):
                keyed = copy.copy(template)
                keyed.concurrency_key = key
                group = [jobs[i] for i in at]
                for job in group:
                    job.concurrency_key, job.concurrency_limit = key, template.concurrency_limit
                    job.hold = template.hold
                if unique:
                    got = self._enqueue_unique(
                        db, keyed, [rows[i] for i in at], group, raise_duplicates
                    )
                else:
                    self._insert_chunks(db, keyed, [rows[i] for i in at], group)
                    got = group
                for i, job in zip(at, got, strict=True):
                    results[i] = job
            self._release_slots(db, groups)
            # What the release gave the rows just written.
            written = {job.pk: job for job in jobs if job.pk is not None}
            slots = (
                self.using(db).filter(pk__in=written).values_list("pk", "hold", "concurrency_slot")
            )
            for pk, hold, slot in slots:
                written[pk].hold, written[pk].concurrency_slot = hold, slot
        return cast(list["Job"], results)

    def _lock_key(self, db: str, key: str) -> None:
        lock_key(connections[db], key)

    def _release_slots(self, db: str, keys: Iterable[str]) -> int:
        """Give the free slots of each of `keys` to its oldest held rows; return how many
        rows got one. Must run in a transaction (the keys' locks last until it ends)."""
        connection = connections[db]
        released = 0
        woken: list[tuple[str, int, datetime]] = []
        # In key order, so that two callers with several keys never wait in a cycle.
        for key in sorted(set(keys)):
            lock_key(connection, key)
            live: QuerySet[Job] = self.using(db).filter(HOLDS_SLOT, concurrency_key=key)
            if connection.vendor == "mysql":  # read from the slot index (migration 0015)
                live = live.extra(where=[f"`{MYSQL_SLOT_KEY}` = %s"], params=[key])
            used = set(live.values_list("concurrency_slot", flat=True))
            held = self.using(db).filter(HELD, concurrency_key=key).order_by(*_CLAIM_ORDER)
            head = held.values_list("concurrency_limit", flat=True).first()
            if head is None:
                continue
            # The newest rows' limit: a limit changed by a deploy applies from its jobs on.
            free = [slot for slot in range(1, head + 1) if slot not in used]
            if not free:
                continue
            rows = held.values_list("pk", "queue_name", "priority", "run_after", "rate_limit")
            for pk, queue, priority, run_after, rate in rows[: len(free)]:
                # Conditional: a held row cancelled meanwhile keeps its place out of this.
                try:
                    given = (
                        self.using(db)
                        .filter(pk=pk, state=State.QUEUED, hold=Hold.LIMIT)
                        # A rate-limited row goes on to wait for its rate (rates.py).
                        .update(hold=Hold.RATE if rate else None, concurrency_slot=free[0])
                    )
                except IntegrityError as exc:
                    if SLOT_INDEX not in str(exc) and "concurrency_slot" not in str(exc):
                        raise
                    raise IntegrityError(
                        f"Job {pk} could not take slot {free[0]} of its concurrency key: a "
                        f"transaction that committed after this transaction's snapshot holds "
                        f"it (REPEATABLE READ or SERIALIZABLE isolation, where this "
                        f"transaction read before). Retry the whole transaction, or enqueue "
                        f"limited tasks under READ COMMITTED, Django's default. ({exc})"
                    ) from exc
                if given == 1:
                    free.pop(0)
                    released += 1
                    woken.append((queue, priority, run_after))
        notify.send(connection, woken)
        return released

    def release_held(self) -> int:
        """The safety net: give free slots to held rows of keys that have some (a crash
        between two statements, a limit raised by a deploy); return how many got one.

        One statement finds those keys: a loose scan of the held rows' index, one step
        per key (never per held row, however long a key's backlog), with each key's
        head limit and live slots read from their indexes. Each is then handed out as a
        finish would, under the key's lock.
        """
        db = router.db_for_write(self.model)
        connection = connections[db]
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        key, hold, state = qn("concurrency_key"), qn("hold"), qn("state")
        held = f"FROM {table} WHERE {hold} = %s AND {state} = %s"

        holds_slot = (
            f"`{MYSQL_SLOT_KEY}` = held_key.k"  # the slot index's virtual column
            if connection.vendor == "mysql"
            else f"{key} = held_key.k AND {qn('finished_at')} IS NULL "
            f"AND {qn('concurrency_slot')} IS NOT NULL"
        )

        def after(bound: str) -> str:
            return f"SELECT {key} {held} {bound} ORDER BY {hold}, {key} LIMIT 1"

        sql = f"""
            WITH RECURSIVE held_key(k) AS (
                SELECT ({after("")})
                UNION ALL
                SELECT ({after(f"AND {key} > held_key.k")}) FROM held_key
                WHERE held_key.k IS NOT NULL
            )
            SELECT k FROM held_key WHERE k IS NOT NULL
                AND (SELECT {qn("concurrency_limit")} {held} AND {key} = held_key.k
                     ORDER BY {hold}, {key}, {qn("priority")} DESC, {qn("run_after")},
                        {qn("id")} LIMIT 1)
                > (SELECT COUNT(*) FROM {table} WHERE {holds_slot})
        """
        marks = [Hold.LIMIT, State.QUEUED]
        with connection.cursor() as cursor:
            cursor.execute(sql, marks * 3)
            keys = [row[0] for row in cursor.fetchall()]
        released = 0
        for found in keys:
            with transaction.atomic(using=db):
                released += self._release_slots(db, [found])
        return released
