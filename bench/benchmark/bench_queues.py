"""Claims from one queue while other queues hold large backlogs, against an empty table.

    python bench/benchmark/bench_queues.py --db sqlite|postgres [--backlog 200000] [--claims 2000]

A benchmark, not a test (issue 15): it prints claims per second of a worker serving the
"small" queue (the claim statements' time; one job per claim, then its success), first
with nothing else queued, then
with `--backlog` jobs queued in each of two other queues, enqueued before them; and the
ratio. Before the per-queue claim, each claim for "small" walked the other queues'
backlogs in the runnable index. PostgreSQL: a database `bench_queues` on the server that
PG* names, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def configure(db: str, workdir: Path) -> None:
    from django.conf import settings

    if db == "sqlite":
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": workdir / "queues.sqlite3"}
    else:
        import psycopg

        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS bench_queues")
            c.execute("CREATE DATABASE bench_queues")
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "bench_queues",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", ""),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    settings.configure(
        INSTALLED_APPS=["django_jobstate"],
        DATABASES={"default": database},
        USE_TZ=True,
        TASKS={"default": {"BACKEND": "django_jobstate.backend.JobStateBackend", "QUEUES": []}},
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def claims_per_second(claims: int) -> float:
    """Claims per second of the claim statements alone (the successes between them are
    commits the backlog does not change): the median of three runs."""
    from django_jobstate.models import Job

    rates = []
    for _ in range(3):
        Job.objects.enqueue_many("bench.noop", [((), {})] * claims, queue_name="small")
        seconds, done = 0.0, 0
        while True:
            started = time.perf_counter()
            batch = Job.objects.claim("w", queues=["small"], limit=1)
            seconds += time.perf_counter() - started
            if not batch:
                break
            Job.objects.succeed_many("w", [(job, None) for job in batch])
            done += len(batch)
        assert done == claims, (done, claims)
        rates.append(claims / seconds)
    return sorted(rates)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--claims", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobstate-queues-") as workdir:
        configure(args.db, Path(workdir))
        from django.db import connection

        from django_jobstate.models import Job

        empty = claims_per_second(args.claims)
        for queue in ("big-a", "big-b"):
            for _ in range(0, args.backlog, 5000):
                Job.objects.enqueue_many("bench.noop", [((), {})] * 5000, queue_name=queue)
        with connection.cursor() as cursor:  # as after any bulk load, before measuring
            if args.db == "postgres":
                cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")
            else:
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        loaded = claims_per_second(args.claims)
        connection.close()
    print(
        f"{args.db}: claims from one queue per second: empty table {empty:,.0f}; "
        f"beside 2 x {args.backlog:,} queued in other queues {loaded:,.0f} "
        f"({loaded / empty:.0%} of empty)"
    )
    if args.db == "postgres":
        import psycopg

        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS bench_queues")
    return 0


if __name__ == "__main__":
    sys.exit(main())
