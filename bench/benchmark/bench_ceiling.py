"""The plain-SQL ceiling of claim + complete on the benchmark's PostgreSQL (issue 28).

Client processes (psycopg, as little Python as a loop can have), each looping: one claim
statement (a CTE picking `batch` queued rows FOR UPDATE SKIP LOCKED, in the claim order of
the package's runnable index, updating them to running) and one conditional completion
UPDATE of the batch, each its own commit. Over the package's own job table, indexes and
constraints, in a database seeded as the drain's: what PostgreSQL alone can do with the
package's rows, beside which the package's no-op drain is reported as a fraction.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from bench.benchmark.bench_figures import median_run
from bench.benchmark.bench_run import Database, System, helper

TABLE = "django_jobstate_job"
CEILING_BATCH = 50  # rows per claim statement (the package's worker takes up to 100)
# The package's claim, minus what only a worker needs (every column returned, the paused
# queues' test): the same index range, lock and fence.
CLAIM = f"""
    WITH picked AS MATERIALIZED (
        SELECT id FROM {TABLE}
        WHERE state = 'queued' AND hold IS NULL AND queue_name = 'default'
            AND run_after <= statement_timestamp()
        ORDER BY (priority * -1), run_after, id LIMIT %s FOR UPDATE SKIP LOCKED
    )
    UPDATE {TABLE} SET state = 'running', worker_id = %s, started_at = statement_timestamp()
    FROM picked WHERE {TABLE}.id = picked.id AND {TABLE}.state || '' = 'queued'
    RETURNING {TABLE}.id
"""
COMPLETE = f"""
    UPDATE {TABLE} SET state = 'succeeded', finished_at = statement_timestamp()
    WHERE id = ANY(%s) AND state = 'running' AND worker_id = %s
"""


def client(dbname: str, index: int, batch: int, start: Any, out: Any) -> None:
    """One client: claim and complete until the queue is empty; put (jobs, last end)."""
    import psycopg

    worker_id = f"ceiling-{os.getpid()}-{index}"
    done = 0
    with psycopg.connect(dbname=dbname, autocommit=True) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT 1")
        start.wait()  # every client connected
        while True:
            ids = [row[0] for row in cursor.execute(CLAIM, (batch, worker_id))]
            if not ids:
                break
            cursor.execute(COMPLETE, (ids, worker_id))
            if cursor.rowcount != len(ids):
                raise RuntimeError(f"{worker_id}: completed {cursor.rowcount} of {len(ids)}")
            done += len(ids)
    out.put((done, time.perf_counter()))


def run_ceiling(dbname: str, clients: int, batch: int) -> dict[str, Any]:
    """Drain the queued rows of `dbname` with `clients` processes: the jobs done, and the
    wall time from every client connected to the last one's end (the figure's jobs/s is
    taken from the rows, as the drain's: bench.py)."""
    context = multiprocessing.get_context("spawn")
    start, out = context.Barrier(clients + 1), context.Queue()
    procs = [
        context.Process(target=client, args=(dbname, i, batch, start, out)) for i in range(clients)
    ]
    for proc in procs:
        proc.start()
    start.wait(timeout=120)
    started = time.perf_counter()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    if any(proc.exitcode for proc in procs):
        raise RuntimeError(f"ceiling clients exited {[p.exitcode for p in procs]}")
    jobs = sum(done for done, _ in results)
    seconds = max(end for _, end in results) - started
    return {"jobs": jobs, "wall": seconds, "wall_rate": jobs / seconds if seconds else None}


class CeilingFigure:
    """bench.Bench's ceiling figure (a mixin: its sizes, database, drain_in, problems)."""

    sizes: Any
    db: Database
    problems: list[tuple[str, str, str]]
    drain_in: Any

    def ceiling(self, system: System) -> dict[str, Any]:
        """The plain-SQL ceiling and the package's no-op drain, same N, same number of
        processes, in alternation (`repeat` of each, the medians): the package's jobs/s as
        a fraction of the ceiling's."""
        s = self.sizes
        n, clients = s.ceiling, s.ceiling_clients
        plain, ours = [], []
        for _ in range(s.repeat):
            env = self.db.fresh(system)
            helper(env, "seed", str(n))
            wall = run_ceiling(env["BENCH_DB_NAME"], clients, CEILING_BATCH)
            checked = helper(env, "check", str(n))
            for problem in checked["problems"]:
                self.problems.append(("plain SQL", "ceiling", problem))
            span = checked["span"]
            plain.append({**wall, "rate": checked["succeeded"] / span if span else None})
            ours.append(self.drain_in(system, self.db.fresh(system), n, clients))
        sql, drain = median_run(plain), median_run(ours)
        fraction = drain["rate"] / sql["rate"] if drain["rate"] and sql["rate"] else None
        return {
            "n": n,
            "clients": clients,
            "batch": CEILING_BATCH,
            "sql": sql,
            "jobstate": drain,
            "fraction": fraction,
        }
