"""What the continuous-load figures watch and do on PostgreSQL (issue 28), beside the
workers: the job table sampled over time, the pickup latency and throughput per interval,
and the sessions that hold vacuum back. psycopg straight to the run's database: these
figures are the package's and PostgreSQL's only."""

from __future__ import annotations

import threading
import time
from typing import Any

TABLE = "django_jobstate_job"
RUNNABLE_INDEX = "jobstate_job_runnable"
# The continuous load's jobs: 1 ms of sync work, or of async waiting (workers with
# --in-flight); a run enqueues one of them.
LOAD_TASKS = [
    "bench.benchmark.bench_tasks.work_1ms",
    "bench.benchmark.bench_tasks.work_1ms_async",
]


def connect(dbname: str) -> Any:
    import psycopg

    return psycopg.connect(dbname=dbname, autocommit=True)


class Sampler(threading.Thread):
    """Every `every` seconds: the queue's depth, the table's live and dead tuples, its
    (auto)vacuums, and each index's size. `origin` is the server's clock at the start:
    the timeline's intervals count from it."""

    def __init__(self, dbname: str, every: float) -> None:
        super().__init__(daemon=True)
        self.conn = connect(dbname)
        self.every = every
        self.origin = self.conn.execute("SELECT clock_timestamp()").fetchone()[0]
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()

    def sample(self) -> dict[str, Any]:
        row = self.conn.execute(
            f"""
            SELECT extract(epoch FROM clock_timestamp() - %s),
                (SELECT count(*) FROM {TABLE} WHERE state = 'queued' AND hold IS NULL),
                n_live_tup, n_dead_tup, vacuum_count + autovacuum_count,
                pg_table_size(relid),
                (SELECT json_object_agg(indexrelname, pg_relation_size(indexrelid))
                 FROM pg_stat_user_indexes i WHERE i.relid = t.relid)
            FROM pg_stat_user_tables t WHERE relname = %s
            """,
            [self.origin, TABLE],
        ).fetchone()
        keys = ["t", "depth", "live", "dead", "vacuums", "table_bytes", "index_bytes"]
        return {**dict(zip(keys, row, strict=True)), "t": float(row[0])}

    def started(self) -> bool:
        """Whether a load job is in the table; then the run's clock starts at its enqueue."""
        first = self.conn.execute(
            f"SELECT min(enqueued_at) FROM {TABLE} WHERE task_path = ANY(%s)", [LOAD_TASKS]
        ).fetchone()[0]
        if first is not None:
            self.origin = first
        return first is not None

    def depth(self) -> int:
        return int(self.sample()["depth"])

    def run(self) -> None:
        while not self._stop.wait(self.every - time.monotonic() % self.every):
            self.samples.append(self.sample())

    def finish(self) -> list[dict[str, Any]]:
        self._stop.set()
        self.join(timeout=30)
        self.samples.append(self.sample())
        self.conn.close()
        return self.samples


def timeline(dbname: str, origin: Any, every: float) -> list[dict[str, Any]]:
    """Per interval of `every` seconds from `origin`: the load jobs enqueued in it, their
    pickup latency (enqueued to started) p50 and p99 in ms, and the jobs finished in it."""
    with connect(dbname) as conn:
        enqueued = conn.execute(
            f"""
            SELECT floor(extract(epoch FROM enqueued_at - %s) / %s)::int AS k, count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - enqueued_at),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - enqueued_at)
            FROM {TABLE} WHERE task_path = ANY(%s) GROUP BY k
            """,
            [origin, every, LOAD_TASKS],
        ).fetchall()
        finished = dict(
            conn.execute(
                f"""
                SELECT floor(extract(epoch FROM finished_at - %s) / %s)::int AS k, count(*)
                FROM {TABLE} WHERE task_path = ANY(%s) AND finished_at IS NOT NULL GROUP BY k
                """,
                [origin, every, LOAD_TASKS],
            ).fetchall()
        )
    ms = lambda delta: delta and delta.total_seconds() * 1000  # noqa: E731
    rows = {
        k: {"t": k * every, "enqueued": n, "p50": ms(p50), "p99": ms(p99), "finished": 0}
        for k, n, p50, p99 in enqueued
    }
    for k, n in finished.items():
        rows.setdefault(k, {"t": k * every, "enqueued": 0, "p50": None, "p99": None})
        rows[k]["finished"] = n
    return [rows[k] for k in sorted(rows)]


def window(dbname: str, origin: Any, start: float, end: float) -> dict[str, Any]:
    """The load jobs enqueued from `start` to `end` seconds after `origin`: how many,
    pickup p50/p99 (ms), and the jobs/s finished in that window."""
    with connect(dbname) as conn:
        row = conn.execute(
            f"""
            SELECT count(*),
                extract(epoch FROM percentile_cont(0.5) WITHIN GROUP
                    (ORDER BY started_at - enqueued_at)) * 1000,
                extract(epoch FROM percentile_cont(0.99) WITHIN GROUP
                    (ORDER BY started_at - enqueued_at)) * 1000,
                (SELECT count(*) FROM {TABLE} WHERE task_path = ANY(%s)
                    AND finished_at >= %s + make_interval(secs => %s)
                    AND finished_at < %s + make_interval(secs => %s))
            FROM {TABLE} WHERE task_path = ANY(%s)
                AND enqueued_at >= %s + make_interval(secs => %s)
                AND enqueued_at < %s + make_interval(secs => %s)
            """,
            [LOAD_TASKS, origin, start, origin, end, LOAD_TASKS, origin, start, origin, end],
        ).fetchone()
    n, p50, p99, finished = row
    return {
        "start": start,
        "end": end,
        "enqueued": n,
        "p50": p50 and float(p50),
        "p99": p99 and float(p99),
        "throughput": finished / (end - start) if end > start else None,
    }


class Pressure(threading.Thread):
    """What holds vacuum back, from `start` seconds for `hold` seconds: an idle session
    in a transaction that has an XID ("idle_xact"), or four REPEATABLE READ readers each
    scanning the whole job table once a second in one snapshot ("readers")."""

    READERS = 4

    def __init__(self, kind: str, dbname: str, start: float, hold: float) -> None:
        super().__init__(daemon=True)
        self.kind, self.dbname, self.start_at, self.hold = kind, dbname, start, hold
        self.scans = 0
        self.error: str | None = None

    def run(self) -> None:
        time.sleep(self.start_at)
        try:
            if self.kind == "idle_xact":
                with connect(self.dbname) as conn:
                    conn.execute("BEGIN")
                    conn.execute("SELECT txid_current()")
                    time.sleep(self.hold)
                    conn.execute("ROLLBACK")
                return
            ends = time.monotonic() + self.hold
            readers = [threading.Thread(target=self.read, args=(ends,)) for _ in range(4)]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
        except Exception as exc:  # reported with the figure, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"

    def read(self, ends: float) -> None:
        with connect(self.dbname) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            while time.monotonic() < ends:
                conn.execute(f"SELECT count(*), max(finished_at) FROM {TABLE}").fetchone()
                self.scans += 1
                time.sleep(min(1.0, max(0.0, ends - time.monotonic())))
            conn.execute("COMMIT")
