"""Side-by-side benchmark: django-jobstate against django-tasks-db (issue 6).

    bench/bench.py [--quick] [--db sqlite|postgres|both] [--only drain,enqueue,...]

Each runner gets its own fresh database (a copy of a migrated template) and its own
settings module, on the same server and machine, with the same N and worker count.
PostgreSQL is the server in the PG* environment (scripts/bench starts a durable one).
Prints a markdown table per database and writes artifacts/bench-<db>.json.

A benchmark, not a test: no number fails it. It exits non-zero only when it could not run,
or when django-jobstate broke a check (every job must succeed exactly once).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: import the bench.* siblings, not this file
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.bench_figures import Issue17Figures, percentile
from bench.bench_peers import PEER_KEYS, peer_systems
from bench.bench_report import render_table
from bench.bench_run import ROOT, SYSTEMS, Database, System, Workers, helper

FIGURES = [
    "drain",
    "enqueue",
    "txn",
    "latency",
    "priority",
    "io",
    "many",
    "history",
    "memory",
]
# Figures only some systems can take part in (the peers' own list is in bench_peers).
ONLY = {"txn": {"jobstate", "tasksdb"}, "priority": {"jobstate", "tasksdb"}, "many": {"jobstate"}}
POSTGRES_ONLY = {"many"}  # connections per supervisor are read from pg_stat_activity


@dataclass(frozen=True)
class Sizes:
    drain: int = 5_000  # no-op jobs per drain
    workers: tuple[int, ...] = (1, 4)
    enqueue: int = 5_000  # one-by-one enqueues
    bulk: int = 20_000  # jobs in one bulk enqueue
    latency_rate: float = 20.0  # jobs/s
    latency_seconds: float = 10.0
    history: int = 1_000_000  # terminal rows already in the table
    history_workers: int = 4
    history_budget: float = 120.0  # seconds per history drain; then the jobs done count
    # History drains are longer and more: a 5,000-job drain lasts ~0.3 s here, and its runs
    # spread by +-15%, more than the 10% the history figure must resolve.
    history_drain: int = 20_000
    history_repeat: int = 5
    memory: int = 100_000  # jobs run by one worker while its RSS is sampled
    memory_early: int = 1_000  # ... compared with its RSS after this many
    repeat: int = 3  # drains per drain and history figure; the median counts
    txn: int = 2_000  # enqueues inside a transaction, and as many with their own commit
    # The I/O-bound drain: jobs that each wait 100 ms, drained for at most io_budget
    # seconds (one job at a time per process needs 200 s for 2,000): jobs/s of those done.
    io: int = 2_000
    io_budget: float = 12.0
    # A high-priority job every 1/priority_rate s for priority_seconds, while
    # priority_workers drain a backlog of 5 ms jobs.
    backlog: int = 20_000
    priority_workers: int = 4
    priority_rate: float = 10.0
    priority_seconds: float = 5.0
    # Many workers: supervisors x processes on one PostgreSQL, many no-op jobs.
    many: int = 50_000
    many_supervisors: int = 2
    many_processes: int = 16


FULL = Sizes()
QUICK = Sizes(
    drain=500,
    enqueue=500,
    bulk=2_000,
    latency_seconds=3.0,
    history=10_000,
    memory=2_000,
    memory_early=500,
    repeat=1,
    history_budget=20.0,
    history_drain=500,
    history_repeat=1,
    txn=200,
    io=200,
    io_budget=2.0,
    backlog=2_000,
    priority_seconds=1.0,
    many=2_000,
    many_processes=2,
)


class Bench(Issue17Figures):
    def __init__(self, db: Database, systems: list[System], sizes: Sizes) -> None:
        self.db = db
        self.systems = systems
        self.sizes = sizes
        self.results: dict[str, dict[str, Any]] = {}  # figure -> system key -> result
        self.problems: list[tuple[str, str, str]] = []  # (system, figure, what)

    def run(self, figures: list[str]) -> None:
        for figure in figures:
            for system in self.systems:  # each figure for all, back to back
                if not self.takes_part(system, figure):
                    continue
                print(f"  {figure}: {system.label} ...", file=sys.stderr, flush=True)
                started = time.perf_counter()
                try:
                    result = getattr(self, figure)(system)
                except Exception as exc:
                    traceback.print_exc()
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                    self.problems.append((system.key, figure, result["error"]))
                result["bench_seconds"] = time.perf_counter() - started
                self.results.setdefault(figure, {})[system.key] = result

    def takes_part(self, system: System, figure: str) -> bool:
        if system.figures is not None and figure not in system.figures:
            return False
        if figure in POSTGRES_ONLY and self.db.vendor != "postgres":
            return False
        return system.key in ONLY.get(figure, {system.key})

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
        """Enqueue `n` jobs of `task` (bulk, untimed), run `workers` worker processes
        until all are terminal, check each succeeded exactly once. With a `budget`
        (seconds), stop the workers then and count the jobs done so far. A system whose
        workers cannot exit once idle (Celery) is stopped when its record shows `n` runs."""
        seeded = helper(env, "seed", str(n), task)
        procs = Workers(system, env, workers, burst=True, in_flight=in_flight)
        try:
            timeout = budget or max(300.0, n / 10)
            if system.burst:
                wall = procs.wait(timeout=timeout)
            else:
                waited = helper(env, "wait_done", str(n), str(timeout), task)
                wall = time.perf_counter() - procs.started if waited["finished"] else None
                if wall is None:
                    procs.kill()
                else:
                    procs.stop()
            partial = wall is None and budget is not None
            checked = helper(env, "check", str(n), "partial" if partial else "", task)
            problems = list(checked.pop("problems"))
            stopped = partial and checked["done"] < n
            if wall is None and budget is None:
                problems.append("timed out; killed")
            elif wall is not None and any(procs.exit_codes()):
                problems.append(f"worker exit codes {procs.exit_codes()}")
            if problems:
                print(f"    {system.label}: {'; '.join(problems)}\n{procs.tail()}", file=sys.stderr)
        finally:
            procs.cleanup()
        span = checked["span"]
        for problem in problems:
            self.problems.append((system.key, f"drain n={n} w={workers}", problem))
        return {
            "n": n,
            "workers": workers,
            "rate": checked["succeeded"] / span if span else None,
            "wall_rate": n / wall if wall else None,
            "span": span,
            "wall": wall,
            "stopped": {"budget": budget, "done": checked["done"]} if stopped else None,
            "seed": seeded["path"],
            "problems": problems,
        }

    def drain(self, system: System) -> dict[str, Any]:
        out = {str(w): self.median_drain(system, {}, w) for w in self.sizes.workers}
        if not system.peer:
            # Django's default CONN_MAX_AGE=0 instead of persistent connections.
            out["1-conn0"] = self.median_drain(system, {"BENCH_CONN_MAX_AGE": "0"}, 1)
        return out

    def median_drain(
        self, system: System, env: dict[str, str], workers: int, history: bool = False
    ) -> dict[str, Any]:
        """The median run (by jobs/s) of `repeat` drains, each in a fresh database."""
        n, repeat = self.drain_size(history)
        return median_run(
            [
                self.drain_in(system, {**self.db.fresh(system), **env}, n, workers)
                for _ in range(repeat)
            ]
        )

    def drain_size(self, history: bool) -> tuple[int, int]:
        """Jobs per drain, and drains per figure."""
        if history:
            return self.sizes.history_drain, self.sizes.history_repeat
        return self.sizes.drain, self.sizes.repeat

    def median_in(self, system: System, env: dict[str, str], workers: int) -> dict[str, Any]:
        """The median run of `repeat` drains in this database, each stopped after the
        history budget; each drain's jobs are then relabelled as history (an UPDATE, as
        real history would leave), so that the next drain counts its own."""
        runs = []
        n, repeat = self.drain_size(history=True)
        for _ in range(repeat):
            budget = self.sizes.history_budget
            runs.append(self.drain_in(system, env, n, workers, budget))
            helper(env, "retire")
            if runs[-1]["stopped"]:
                break  # this state is slow enough: once is enough
        return median_run(runs)

    def enqueue(self, system: System) -> dict[str, Any]:
        single = helper(self.db.fresh(system), "enqueue", "single", str(self.sizes.enqueue))
        bulk = helper(self.db.fresh(system), "enqueue", "bulk", str(self.sizes.bulk))
        return {"single": single, "bulk": bulk}

    def latency(self, system: System) -> dict[str, Any]:
        """One worker, default poll interval, a steady trickle of jobs."""
        env = self.db.fresh(system)
        procs = Workers(system, env, 1, burst=False)
        try:
            rate, seconds = self.sizes.latency_rate, self.sizes.latency_seconds
            fed = helper(env, "feed", str(rate), str(seconds), "60")
            procs.stop()
        finally:
            procs.cleanup()
        ms = helper(env, "latencies")["ms"]
        if not fed["finished"]:
            self.problems.append((system.key, "latency", f"only {fed['done']} of {fed['fed']} ran"))
        return {
            "rate": rate,
            "fed": fed["fed"],
            "feed_seconds": fed["seconds"],
            "p50": percentile(ms, 50),
            "p99": percentile(ms, 99),
            "mean": sum(ms) / len(ms) if ms else None,
            "max": ms[-1] if ms else None,
        }

    def history(self, system: System) -> dict[str, Any]:
        w, rows = self.sizes.history_workers, str(self.sizes.history)
        out: dict[str, Any] = {"rows": self.sizes.history}
        out["empty"] = self.median_drain(system, {}, w, history=True)

        env = self.db.fresh(system)
        out["insert"] = helper(env, "history", rows, "inserted")
        out["inserted"] = self.median_in(system, env, w)
        out["inserted"]["table"] = helper(env, "table_stats")  # did autovacuum run meanwhile?
        out["maintain"] = helper(env, "maintain")
        out["vacuumed"] = self.median_in(system, env, w)
        out["vacuumed"]["table"] = helper(env, "table_stats")  # autovacuum is back on

        env = self.db.fresh(system)
        out["churn"] = helper(env, "history", rows, "churned")
        out["churned"] = self.median_in(system, env, w)
        out["churned"]["table"] = helper(env, "table_stats")
        return out

    def memory(self, system: System) -> dict[str, Any]:
        """RSS of one worker's job-running process, sampled while it runs `memory` jobs."""
        n, early = self.sizes.memory, self.sizes.memory_early
        env = self.db.fresh(system)
        helper(env, "seed", str(n))
        procs = Workers(system, env, 1, burst=True)
        samples: list[tuple[float, int]] = []
        try:
            deadline = time.monotonic() + max(600.0, n / 20)
            while procs.alive() and time.monotonic() < deadline:
                kib = procs.rss_kib()
                if kib is not None:
                    samples.append((time.time(), kib))
                time.sleep(0.02)
            procs.wait(timeout=30)
        finally:
            procs.cleanup()
        checked = helper(env, "check", str(n))
        if checked["problems"]:
            self.problems.extend((system.key, "memory", p) for p in checked["problems"])
        done = helper(env, "progress", stdin=json.dumps([t for t, _ in samples]))["done"]
        at_early = next(
            ((d, k) for d, (_, k) in zip(done, samples, strict=True) if d >= early), None
        )
        at_end = (done[-1], samples[-1][1]) if samples else None
        return {
            "jobs": n,
            "early_jobs": at_early and at_early[0],
            "early_mib": at_early and at_early[1] / 1024,
            "end_jobs": at_end and at_end[0],
            "end_mib": at_end and at_end[1] / 1024,
            "peak_mib": max(k for _, k in samples) / 1024 if samples else None,
            "growth": at_early and at_end and at_end[1] / at_early[1] - 1,
            "samples": len(samples),
        }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median drain by jobs/s, with every run's jobs/s beside it."""
    runs = sorted(runs, key=lambda run: run["rate"] or 0)
    return {**runs[len(runs) // 2], "runs": [run["rate"] for run in runs]}


def machine_info() -> dict[str, Any]:
    import django

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "django": django.get_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "platform": platform.platform(),
    }
    # Which engine was measured: the commit, and a digest of the package's source as it is.
    source = b"".join(p.read_bytes() for p in sorted((ROOT / "django_jobstate").rglob("*.py")))
    info["jobstate_source_sha256"] = hashlib.sha256(source).hexdigest()[:12]
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    info["git_head"] = git.stdout.decode().strip() or None
    try:
        from importlib.metadata import version

        info["django-tasks-db"] = version("django-tasks-db")
    except Exception:
        info["django-tasks-db"] = None
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def names(choices: list[str]) -> Callable[[str], list[str]]:
        def parse(text: str) -> list[str]:
            picked = [s.strip() for s in text.split(",") if s.strip()]
            if not picked or set(picked) - set(choices):
                raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}")
            return picked

        return parse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes (CI)")
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--only", type=names(FIGURES), default=FIGURES, metavar="FIGURES")
    parser.add_argument(
        "--systems",
        type=names([s.key for s in SYSTEMS] + PEER_KEYS),
        help="default: all of them; with --quick, django-jobstate and django-tasks-db only",
    )
    parser.add_argument(
        "--peers", action="store_true", help="with --quick: Celery and Procrastinate too"
    )
    parser.add_argument("--n", type=int, help="jobs per drain (default 5,000; quick 500)")
    parser.add_argument("--history-rows", type=int, help="default 1,000,000; quick 10,000")
    parser.add_argument(
        "--history-budget", type=float, help="seconds per history drain (default 120; quick 20)"
    )
    parser.add_argument("--memory-jobs", type=int, help="default 100,000; quick 2,000")
    parser.add_argument(
        "--repeat", type=int, help="drains per drain and history figure (default 3 and 5)"
    )
    parser.add_argument("--prefix", default="bench", help="PostgreSQL database name prefix")
    parser.add_argument("--output", type=Path, default=ROOT / "artifacts", help="JSON directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Killed (scripts/bench's trap, a CI timeout): unwind, so that workers and databases go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = QUICK if args.quick else FULL
    for field, value in [
        ("drain", args.n),
        ("history", args.history_rows),
        ("history_budget", args.history_budget),
        ("memory", args.memory_jobs),
        ("repeat", args.repeat),
        ("history_repeat", args.repeat),
    ]:
        if value is not None:
            sizes = replace(sizes, **{field: value})
    if args.systems is None:
        args.systems = [s.key for s in SYSTEMS]
        if args.peers or not args.quick:
            args.systems += PEER_KEYS
    peers = [p for p in peer_systems() if p.key in args.systems]
    wanted = set(args.systems) & set(PEER_KEYS)
    if wanted - {p.key for p in peers}:
        print(
            f"{', '.join(sorted(wanted - {p.key for p in peers}))}: run through scripts/bench, "
            "which makes their environments and starts Redis (BENCH_REDIS_URL, "
            "BENCH_CELERY_PYTHON, BENCH_PROCRASTINATE_PYTHON), or leave them out "
            "(--systems jobstate,tasksdb).",
            file=sys.stderr,
        )
        return 2
    systems = [s for s in SYSTEMS if s.key in args.systems]
    if "tasksdb" in args.systems and importlib.util.find_spec("django_tasks_db") is None:
        print(
            "django-tasks-db is not installed: install the bench dependency group "
            "(pip install --group bench, or django-tasks-db==0.13.0), or pass --systems jobstate.",
            file=sys.stderr,
        )
        return 2
    vendors = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if "postgres" in vendors and not os.environ.get("PGHOST"):
        print("PostgreSQL: set PG* (scripts/bench starts a server for you).", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="jobstate-bench-") as workdir:
        for vendor in vendors:
            db = Database(vendor, args.prefix, Path(workdir))
            meta = {**machine_info(), **db.server_info(), "sizes": asdict(sizes)}
            ran = systems + (peers if vendor == "postgres" else [])
            meta["peers"] = {p.key: helper(db.env(p, "postgres"), "info") for p in ran if p.peer}
            meta["commits_per_second"] = db.calibrate(1 if args.quick else 5)
            print(f"== {vendor}: {json.dumps(meta)}", file=sys.stderr, flush=True)
            bench = Bench(db, ran, sizes)
            try:
                bench.run([f for f in FIGURES if f in args.only])
            finally:
                db.drop_all()
            meta["load_average_after"] = os.getloadavg()
            table = render_table(vendor, meta, sizes, ran, bench.results, bench.problems)
            print(table, flush=True)
            path = args.output / f"bench-{vendor}.json"
            record = {"db": vendor, "meta": meta, "results": bench.results, "table": table}
            path.write_text(
                json.dumps({**record, "problems": bench.problems}, indent=2, default=str)
            )
            print(f"(written to {path})\n", flush=True)
            failed |= any(system == "jobstate" for system, _, _ in bench.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
