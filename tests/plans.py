"""What a query reads of the job table, by EXPLAIN on each database: for the tests that a
page stays off the history however much of it there is (the console's queries use indexes)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from django_jobstate.models import Job
from django_jobstate.states import State


def finished_history(n: int = 20_000) -> None:
    """`n` attempts that succeeded over the last `n` minutes, by worker "w" (in one bulk
    insert: several times faster than enqueueing, claiming and finishing them)."""
    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(
                result_id=uuid.uuid4(),
                task_path="tests.tasks.record",
                args=[str(i)],
                kwargs={},
                state=State.SUCCEEDED,
                worker_id="w",
                enqueued_at=now - timedelta(minutes=i, seconds=2),
                run_after=now - timedelta(minutes=i, seconds=2),
                started_at=now - timedelta(minutes=i, seconds=1),
                finished_at=now - timedelta(minutes=i),
                return_value="done",
            )
            for i in range(n)
        ),
        batch_size=2000,
    )


def analyze_job_table() -> None:
    """Fresh planner statistics (on MariaDB/MySQL this commits: use a transactional test)."""
    mysql = connection.vendor == "mysql"
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {'TABLE ' if mysql else ''}{Job._meta.db_table}")
        if mysql:
            cursor.fetchall()  # its report


def job_table_reads(sql: str, params: Any = None) -> set[tuple[str, str | None]]:
    """{(how, index)} for each read of the job table in the plan of `sql`: PostgreSQL's node
    type and index name; MariaDB/MySQL's access type and key; SQLite's SEARCH or SCAN and
    the index it uses ("rowid" for a lookup by primary key, None for a walk of the table)."""
    table, reads = Job._meta.db_table, set()
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
