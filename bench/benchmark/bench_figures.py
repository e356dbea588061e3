"""The benchmark's figures added for issue 17: the I/O-bound drain, a single enqueue in the
caller's transaction, a high-priority job behind a backlog, and many workers on one
PostgreSQL. A mixin of bench.Bench (its sizes, database, drain_in() and problems).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from bench.benchmark.bench_run import ROOT, Database, System, Workers, helper, pg_admin

# The task each system's I/O-bound drain runs: sync `time.sleep` for the Django runners
# and Celery's prefork pool, `asyncio.sleep` for Procrastinate's async workers.
IO_TASK = {"jobstate": "io_sleep", "tasksdb": "io_sleep"}
# Attempts at once per django-jobstate worker process in the I/O-bound drain (runjobs
# --in-flight), as Procrastinate's per-process concurrency there (bench_peers.py).
IO_IN_FLIGHT = 100


class Issue17Figures:
    sizes: Any
    db: Database
    problems: list[tuple[str, str, str]]

    def drain_in(
        self,
        system: System,
        env: dict[str, str],
        n: int,
        workers: int,
        budget: float | None = None,
        task: str = "noop",
        in_flight: int = 1,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def io(self, system: System) -> dict[str, Any]:
        """2,000 jobs that each wait 100 ms, drained for at most `io_budget` seconds. Ours
        with IO_IN_FLIGHT attempts at once per process (sync on threads, and async on the
        event loop), and one at a time, side by side: the baseline of the first target."""
        n, budget = self.sizes.io, self.sizes.io_budget
        task = IO_TASK.get(system.key, "io")
        flight = IO_IN_FLIGHT if system.key == "jobstate" else 1
        out = {}
        for w in self.sizes.workers:
            env = self.db.fresh(system)
            out[str(w)] = self.drain_in(system, env, n, w, budget, task, in_flight=flight)
        if system.key == "jobstate":
            env = self.db.fresh(system)
            out["1-async"] = self.drain_in(system, env, n, 1, budget, "io_async", flight)
            env = self.db.fresh(system)
            out["1-serial"] = self.drain_in(system, env, n, 1, budget, task)
        return out

    def txn(self, system: System) -> dict[str, Any]:
        return helper(self.db.fresh(system), "enqueue_txn", str(self.sizes.txn))

    def priority(self, system: System) -> dict[str, Any]:
        """Start latency of high-priority jobs enqueued while workers drain a backlog."""
        s = self.sizes
        env = self.db.fresh(system)
        helper(env, "seed", str(s.backlog), "backlog")
        procs = Workers(system, env, s.priority_workers, burst=False)
        try:
            rate, seconds = str(s.priority_rate), str(s.priority_seconds)
            fed = helper(env, "urgent", rate, seconds, "120")
            procs.stop()
        finally:
            procs.cleanup()
        ms = helper(env, "latencies", "urgent")["ms"]
        if not fed["finished"]:
            self.problems.append(
                (system.key, "priority", f"only {fed['done']} of {fed['fed']} ran")
            )
        if not fed["backlog_left"]:
            self.problems.append((system.key, "priority", "the backlog ran out: make it larger"))
        return {
            "fed": fed["fed"],
            "backlog_left": fed["backlog_left"],
            "p50": percentile(ms, 50),
            "p99": percentile(ms, 99),
            "max": ms[-1] if ms else None,
        }

    def many(self, system: System) -> dict[str, Any]:
        """Supervisors of many worker processes on one PostgreSQL: they start on an empty
        queue (and settle), then `many` no-op jobs are enqueued in bulk. Throughput from
        the jobs' own rows; each supervisor's connections (all its processes run under one
        PGAPPNAME) sampled from pg_stat_activity all along, the peak reported, and how
        many of them sit in LISTEN (their last statement)."""
        s = self.sizes
        env = self.db.fresh(system)
        sups = [
            Workers(system, {**env, "PGAPPNAME": f"bench-sup-{i}"}, s.many_processes, burst=False)
            for i in range(s.many_supervisors)
        ]
        peak: dict[str, int] = {}
        listeners: dict[str, int] = {}

        def sample() -> dict[str, int]:
            with pg_admin() as conn:
                rows = conn.execute(
                    "SELECT application_name, count(*), "
                    "count(*) FILTER (WHERE query ILIKE 'LISTEN%%') FROM pg_stat_activity "
                    "WHERE datname = %s AND application_name LIKE 'bench-sup-%%' GROUP BY 1",
                    [env["BENCH_DB_NAME"]],
                ).fetchall()
            for name, count, listening in rows:
                peak[name] = max(peak.get(name, 0), int(count))
                listeners[name] = max(listeners.get(name, 0), int(listening))
            return {name: int(count) for name, count, _ in rows}

        try:
            # Settled: every process connected (at least one connection each) and the
            # same counts for a second; or 120 s.
            deadline, last, stable_since = time.monotonic() + 120, None, time.monotonic()
            while time.monotonic() < deadline:
                now = sample()
                if now != last:
                    last, stable_since = now, time.monotonic()
                elif (
                    len(now) == s.many_supervisors
                    and min(now.values()) >= s.many_processes
                    and time.monotonic() - stable_since > 1.0
                ):
                    break
                time.sleep(0.1)
            idle = dict(last or {})
            feed = helper_process(env, "seed_and_wait", str(s.many), "600")
            while feed.poll() is None:
                sample()
                time.sleep(0.2)
            for sup in sups:
                sup.stop()
        finally:
            for sup in sups:
                sup.cleanup()
        checked = helper(env, "check", str(s.many))
        for problem in checked["problems"]:
            self.problems.append((system.key, "many", problem))
        span = checked["span"]
        return {
            "n": s.many,
            "supervisors": s.many_supervisors,
            "processes": s.many_processes,
            "rate": checked["succeeded"] / span if span else None,
            "connections_peak": peak,
            "connections_idle": idle,
            "listeners_peak": listeners,
            "max_per_supervisor": max(peak.values(), default=None),
            "problems": checked["problems"],
        }


def helper_process(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """A helper command running in the background (its output discarded)."""
    return subprocess.Popen(
        [env["BENCH_PYTHON"], "-m", env["BENCH_HELPER"], *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def percentile(values: list[float], pct: float) -> float | None:
    """Linear interpolation between closest ranks of sorted `values`."""
    if not values:
        return None
    k = (len(values) - 1) * pct / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median drain by jobs/s, with every run's jobs/s beside it."""
    runs = sorted(runs, key=lambda run: run["rate"] or 0)
    return {**runs[len(runs) // 2], "runs": [run["rate"] for run in runs]}
