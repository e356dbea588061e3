"""What a query reads of the job table, by EXPLAIN on each database: for the tests that a
page stays off the history however much of it there is (the console's queries use indexes)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import connection

from django_jobstate.backend import JobStateBackend
from django_jobstate.models import Job
from tests import tasks


def finished_history(n: int = 20_000) -> None:
    """`n` succeeded attempts, written as workers write them."""
    JobStateBackend("default", {}).bulk_enqueue(tasks.record, [([str(i)], {}) for i in range(n)])
    while batch := Job.objects.claim("w", limit=1000):
        Job.objects.succeed_many("w", [(job, None) for job in batch])


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
