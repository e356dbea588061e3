"""Where django-jobstate's worker spends its time, per job.

    python bench/benchmark/profile_worker.py [--db sqlite|postgres|mysql] [--n 5000] [--top 15]
        [--cprofile]
        [--workers 4]

On a fresh database holding `n` no-op jobs. With py-spy installed (pip install py-spy):
samples `manage.py runjobs --burst` (one worker process, as deployed; idle time included,
so database waits count) and prints the top functions of the worker's main thread by
inclusive and by own samples. Otherwise, or with --cprofile: cProfile of an in-process
`Worker(burst=True).run()` (Python 3.12+ profiles every thread into one set of stacks, so
the watchdog thread's entries are noise). PostgreSQL: the server in the PG* environment.
MariaDB (--db mysql): the server in JOBSTATE_MYSQL_*; the statements, commits, lock waits
and deadlocks per job are read from the server's counters (SHOW GLOBAL STATUS) around the
drain, and --workers N drains with `runjobs --concurrency N` (no py-spy) to count them
under contention.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the bench.* siblings, not bench.py
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.benchmark.bench_run import JOBSTATE, ROOT, Database, helper


def profile(n: int, top: int) -> None:
    """Inside the worker's settings: drain the jobs under cProfile, print the headline."""
    import django

    django.setup()
    from django_jobstate.runner.worker import Worker

    worker = Worker(burst=True)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    worker.run()
    profiler.disable()
    seconds = time.perf_counter() - started
    print(f"{n:,} no-op jobs in {seconds:.2f} s under cProfile: {n / seconds:,.0f} jobs/s")
    print(f"{seconds / n * 1000:.3f} ms per job (profiler overhead included)\n")
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order)
        stats.print_stats(top)
        print(f"--- top {top} by {order} ---")
        print(out.getvalue().split("\n\n", 1)[-1].strip(), "\n")


def py_spy() -> str | None:
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def spy(env: dict[str, str], n: int, top: int, workdir: Path) -> int:
    """Sample `runjobs --burst` with py-spy; print the worker main thread's headline."""
    rate, raw = 500, workdir / "py-spy.txt"
    command = [py_spy() or "py-spy", "record", "--subprocesses", "--idle", "--threads"]
    command += ["--nonblocking", "--function", "-r", str(rate), "--format", "raw"]
    command += ["-o", str(raw), "--", sys.executable, "manage.py", "runjobs", "--burst", "-v", "0"]
    code = subprocess.run(command, cwd=ROOT, env=env, capture_output=True).returncode
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(f.startswith("Worker.run (") for f in frames) or "MainThread" not in stack:
            continue  # the supervisor, start-up, or the watchdog thread
        frames = frames[next(i for i, f in enumerate(frames) if f.startswith("Worker.run (")) :]
        total += int(count)
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
    seconds = total / rate
    print(f"py-spy, {rate} Hz: the worker's main thread spent ~{seconds:.2f} s in Worker.run")
    print(f"for {n:,} no-op jobs: ~{seconds / n * 1000:.3f} ms per job\n")
    for title, counts in (("inclusive", inclusive), ("own", own)):
        print(f"--- top {top} by {title} samples (% of Worker.run, ms per job) ---")
        for frame, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            share = count / total if total else 0
            print(f"{share:6.1%} {count / rate / n * 1000:7.3f}  {frame}")
        print()
    return code


COUNTERS = [
    "Questions",
    "Com_select",
    "Com_update",
    "Com_insert",
    "Com_commit",
    "Com_rollback",
    "Handler_commit",
    "Handler_read_next",
    "Handler_read_key",
    "Innodb_row_lock_waits",
    "Innodb_row_lock_time",
    "Innodb_deadlocks",
    "Innodb_data_fsyncs",
    "Innodb_log_writes",
]


def server_counters() -> dict[str, int]:
    """MariaDB's global counters of what COUNTERS names (every session's, so the drain's
    when nothing else runs on the server)."""
    from bench.benchmark.bench_run import mysql_admin

    with mysql_admin() as cursor:
        marks = ", ".join(["%s"] * len(COUNTERS))
        cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({marks})", COUNTERS)
        return {name: int(value) for name, value in cursor.fetchall()}


def print_counters(before: dict[str, int], after: dict[str, int], n: int) -> None:
    print(f"--- MariaDB counters during the drain, per job ({n:,} jobs) ---")
    for name in COUNTERS:
        if name in after:
            delta = after[name] - before.get(name, 0)
            print(f"{name:24} {delta:10,}  {delta / n:8.3f}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], default="sqlite")
    parser.add_argument("--workers", type=int, default=1, help="MariaDB: runjobs --concurrency")
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--prefix", default="bench_profile")
    parser.add_argument("--cprofile", action="store_true", help="in-process cProfile")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        profile(args.n, args.top)
        return 0
    with tempfile.TemporaryDirectory(prefix="jobstate-profile-") as workdir:
        db = Database(args.db, args.prefix, Path(workdir))
        try:
            env = db.fresh(JOBSTATE)
            helper(env, "seed", str(args.n))
            before = server_counters() if args.db == "mysql" else {}
            if args.workers > 1:
                command = [sys.executable, "manage.py", "runjobs", "--burst", "-v", "0"]
                command += ["--concurrency", str(args.workers)]
                started = time.perf_counter()
                code = subprocess.run(command, cwd=ROOT, env=env).returncode
                took = time.perf_counter() - started
                print(f"runjobs --concurrency {args.workers}: {took:.2f} s, start-up included")
            elif py_spy() and not args.cprofile:
                code = spy(env, args.n, args.top, Path(workdir))
            else:
                command = [sys.executable, "-m", "bench.benchmark.profile_worker", "--inside"]
                command += ["--n", str(args.n), "--top", str(args.top)]
                code = subprocess.run(command, cwd=ROOT, env=env).returncode
            if before:
                print_counters(before, server_counters(), args.n)
            problems = helper(env, "check", str(args.n))["problems"]
            if problems:
                print("CHECK FAILED: " + "; ".join(problems))
                code = code or 1
        finally:
            db.drop_all()
    return code


if __name__ == "__main__":
    sys.exit(main())
