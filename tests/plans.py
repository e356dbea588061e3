"""What a query reads of the job table, by EXPLAIN on each database: for the tests that a
page stays off the history however much of it there is (the console's queries use indexes)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import CharField, DateTimeField, ExpressionWrapper, F, UUIDField, Value
from django.db.models.functions import MD5, Cast, Concat, Substr
from django.utils import timezone

from django_jobstate.models import Job
from django_jobstate.states import State


def finished_history(
    n: int = 20_000,
    *,
    every: timedelta = timedelta(minutes=1),
    vary: Callable[[int], dict[str, Any]] | None = None,
) -> None:
    """`n` attempts that finished over the last `n` x `every`, by worker "w": a few hundred
    made in Python, then copied inside the database, doubling each time, older by as long
    as the rows copied span (about 20 times faster than making them all in Python, and
    hundreds of times faster than enqueueing, claiming and finishing them). They
    succeeded, unless `vary(i)` gives the i-th of the first few hundred other fields
    (its copies keep them)."""
    now, made = timezone.now(), min(n, 500)
    Job.objects.bulk_create(
        Job(
            **{
                "result_id": uuid.uuid4(),
                "task_path": "tests.tasks.record",
                "args": [str(i)],
                "kwargs": {},
                "state": State.SUCCEEDED,
                "worker_id": "w",
                "enqueued_at": now - every * i - timedelta(seconds=2),
                "run_after": now - every * i - timedelta(seconds=2),
                "started_at": now - every * i - timedelta(seconds=1),
                "finished_at": now - every * i,
                "return_value": "done",
                **(vary(i) if vary else {}),
            }
        )
        for i in range(made)
    )
    while made < n:
        copied = min(made, n - made)  # the newest `copied` rows, `made` x `every` older
        _copy_history(copied, every * made)
        made += copied


def _uuid_from(text: Any, older: timedelta) -> Concat:
    """A version 4 UUID (MariaDB's UUID type takes no other) from an MD5 of `text` and
    `older`: dashed where the database has a UUID type, 32 hex digits where Django stores
    it as text."""
    md5 = MD5(Concat(text, Value(str(older))))
    dash = [Value("-")] if connection.features.has_native_uuid_field else []
    groups = [
        [Substr(md5, 1, 8)],
        [Substr(md5, 9, 4)],
        [Value("4"), Substr(md5, 14, 3)],
        [Value("8"), Substr(md5, 18, 3)],
        [Substr(md5, 21, 12)],
    ]
    parts = [part for i, group in enumerate(groups) for part in (dash if i else []) + group]
    return Concat(*parts, output_field=CharField())


def _copy_history(rows: int, older: timedelta) -> None:
    """INSERT ... SELECT: the newest `rows` of the history, `older` earlier, each with a
    result id of its own (an MD5 of the one it copies and the shift)."""
    columns, values = [], {}
    for field in Job._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        name = f"c_{field.column}"
        if field.attname == "result_id":
            values[name] = Cast(_uuid_from(Cast("result_id", CharField()), older), UUIDField())
        elif isinstance(field, DateTimeField):
            values[name] = ExpressionWrapper(F(field.attname) - older, DateTimeField())
        else:
            values[name] = F(field.attname)
    select = (
        Job.objects.filter(worker_id="w", finished_at__isnull=False)
        .order_by("-finished_at")
        .values(**values)[:rows]
    )
    sql, params = select.query.sql_with_params()
    table, names = Job._meta.db_table, ", ".join(map(connection.ops.quote_name, columns))
    with connection.cursor() as cursor:
        # MariaDB/MySQL read the table being inserted into through a derived table only.
        cursor.execute(f"INSERT INTO {table} ({names}) SELECT * FROM ({sql}) AS copied", params)


def analyze_job_table(table: str | None = None) -> None:
    """Fresh planner statistics of the job table, or of `table` (on MariaDB/MySQL this
    commits: use a transactional test)."""
    mysql = connection.vendor == "mysql"
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {'TABLE ' if mysql else ''}{table or Job._meta.db_table}")
        if mysql:
            cursor.fetchall()  # its report


def job_table_reads(
    sql: str, params: Any = None, table: str | None = None
) -> set[tuple[str, str | None]]:
    """{(how, index)} for each read of the job table (or `table`) in the plan of `sql`:
    PostgreSQL's node type and index name; MariaDB/MySQL's access type and key; SQLite's
    SEARCH or SCAN and the index it uses ("rowid" for a lookup by primary key, None for a
    walk of the table)."""
    table, reads = table or Job._meta.db_table, set()
    # A plan names a read by the table's alias, if any (Django's subqueries: U0).
    names = {table, *re.findall(rf'[`"]{table}[`"] [`"](\w+)[`"]', sql)}
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            for *_ids, detail in cursor.fetchall():
                if any(f" {name} " in f"{detail} " for name in names):
                    how = detail.split()[0]
                    index = detail.split(" INDEX ")[1].split()[0] if " INDEX " in detail else None
                    reads.add((how, index or ("rowid" if how == "SEARCH" else None)))
            return reads
        mysql = connection.vendor == "mysql"
        cursor.execute(f"EXPLAIN {'FORMAT=JSON' if mysql else '(FORMAT JSON)'} {sql}", params)
        found = cursor.fetchone()[0]
        stack = [json.loads(found) if mysql else found[0]["Plan"]]
        while stack:
            node = stack.pop()
            if mysql:
                children = node.values() if isinstance(node, dict) else node
                stack.extend(c for c in children if isinstance(c, dict | list))
                if isinstance(node, dict) and node.get("table_name") in names:
                    reads.add((node["access_type"], node.get("key")))
            else:
                stack.extend(node.get("Plans", []))
                if node.get("Relation Name") == table:
                    reads.add((node["Node Type"], node.get("Index Name")))
    return reads
