"""The retention prune on a large table, with and without its index on finished_at.

    JOBSTATE_TEST_DB=postgres JOBSTATE_TEST_DB_NAME=... python bench/benchmark/prune_index.py [N]

Runs against a scratch PostgreSQL database that tests.settings names (migrated by the
script; its jobs are deleted). Writes N finished jobs (default 1,000,000) with one
generate_series INSERT, 1% of them old, then times what the hourly retention schedule
runs: Job.objects.prune() of the old ones, and the pass that finds nothing left to prune
(every later hour's). Each with jobstate_job_by_finished, then without it (dropped inside
a transaction that is rolled back). Prints the times and their ratio.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from django_jobstate.models import Job  # noqa: E402

TABLE = Job._meta.db_table


def fill(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")
        cursor.execute(
            f"""INSERT INTO {TABLE} (result_id, attempt, task_path, args, kwargs, run_after,
                state, enqueued_at, started_at, finished_at, worker_id)
            SELECT md5(i::text)::uuid, 1, 'tests.tasks.noop', '[]', '{{}}', t, 'succeeded',
                t, t, t, 'w'
            FROM generate_series(1, %s) AS i,
                LATERAL (SELECT now() - CASE WHEN i %% 100 = 0 THEN interval '30 days'
                                             ELSE interval '1 hour' END AS t) AS times""",
            [n],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def timed(label: str) -> tuple[int, float]:
    start = time.perf_counter()
    deleted = Job.objects.prune(timedelta(days=7))
    seconds = time.perf_counter() - start
    print(f"  {label:34} {deleted:8d} deleted in {seconds:7.3f} s")
    return deleted, seconds


def run(n: int, *, index: bool) -> tuple[float, float]:
    fill(n)
    print(f"{n} finished jobs, 1% older than 7 days; index on finished_at: {index}")
    with transaction.atomic():
        if not index:
            with connection.cursor() as cursor:
                cursor.execute("DROP INDEX jobstate_job_by_finished")
        _, first = timed("prune the old ones")
        _, nothing = timed("the next hour's prune (nothing)")
        transaction.set_rollback(True)
    return first, nothing


def main() -> None:
    if connection.vendor != "postgresql":
        sys.exit("Run with JOBSTATE_TEST_DB=postgres: the planner is what is measured.")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    call_command("migrate", verbosity=0)
    with_index = run(n, index=True)
    without = run(n, index=False)
    print(
        f"without the index / with it: prune {without[0] / with_index[0]:.1f}x, "
        f"empty prune {without[1] / with_index[1]:.1f}x"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")


if __name__ == "__main__":
    main()
