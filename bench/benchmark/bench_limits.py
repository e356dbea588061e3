"""What the limits cost, and whether a queue limit holds under a drain (issue 26).

    bench/benchmark/bench_limits.py --db sqlite|postgres|mysql [--n 3000] [--repeat 3]
        [--tree NAME=PATH ...]

Each run gets a fresh database and drains `--n` jobs with one `runjobs --burst
--concurrency 4`, timed from the first start to the last finish (the rows' own times, so
that process start-up is left out). Scenarios:

- `none`: no-op jobs, no limit anywhere (the drain as before limits existed);
- `idle`: the same, with a concurrency limit set on another queue, which has no jobs;
- `limit4`: jobs that wait 20 ms each, in a queue limited to 4, drained by 8 worker
  processes, while this process samples the running rows of the queue every 5 ms; it
  reports the most it saw at once.

With several `--tree`s (source trees, e.g. today's main and a branch), each run is made
once per tree, in turn, with the tree first on PYTHONPATH: a side by side on one machine
and server. PostgreSQL: the server of PG*; MariaDB: of JOBSTATE_MYSQL_*. A benchmark, not a
test: no number fails it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "bench.benchmark.bench_settings_jobstate"
SCENARIOS = ["none", "idle", "limit4"]


def child(scenario: str, n: int) -> dict[str, object]:
    """In a process whose PYTHONPATH starts with the tree measured: one drain."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db.models import Max, Min

    from django_jobstate.models import Job, JobQueue
    from django_jobstate.states import State

    call_command("migrate", verbosity=0)
    task = "bench.benchmark.bench_tasks." + ("io_sleep" if scenario == "limit4" else "noop")
    Job.objects.enqueue_many(task, [((), {})] * n, queue_name="default")
    if scenario == "idle":
        JobQueue.objects.set_limits("other", concurrency=1, by="bench")
    if scenario == "limit4":
        JobQueue.objects.set_limits("default", concurrency=4, by="bench")
    workers = "8" if scenario == "limit4" else "4"
    command = [sys.executable, "-m", "django", "runjobs", "-v", "0", "--burst"]
    proc = subprocess.Popen([*command, "--concurrency", workers], env=os.environ.copy())
    peak, samples = 0, 0
    running = Job.objects.filter(queue_name="default", state=State.RUNNING)
    while proc.poll() is None:
        if scenario == "limit4":
            peak, samples = max(peak, running.count()), samples + 1
            time.sleep(0.005)
        else:
            time.sleep(0.05)
    done = Job.objects.filter(state=State.SUCCEEDED)
    times = done.aggregate(first=Min("started_at"), last=Max("finished_at"))
    seconds = (times["last"] - times["first"]).total_seconds()
    return {
        "succeeded": done.count(),
        "seconds": seconds,
        "jobs_per_second": n / seconds,
        "peak_running": peak,
        "samples": samples,
        "exit": proc.returncode,
    }


def fresh(vendor: str, name: str, workdir: Path) -> str:
    """A new empty database; its BENCH_DB_NAME."""
    if vendor == "sqlite":
        path = workdir / f"{name}.sqlite3"
        path.unlink(missing_ok=True)
        return str(path)
    if vendor == "postgres":
        import psycopg

        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
            c.execute(f"CREATE DATABASE {name}")
        return name
    from bench.common import mysql_admin

    with mysql_admin() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], default="sqlite")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(ROOT)]]
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.repeat):
            for scenario in args.only.split(","):
                for tree, path in trees:
                    name = fresh(args.db, "bench_limits", Path(workdir))
                    env = {
                        **os.environ,
                        "PYTHONPATH": f"{path}{os.pathsep}{ROOT}",
                        "DJANGO_SETTINGS_MODULE": SETTINGS,
                        "BENCH_DB": args.db,
                        "BENCH_DB_NAME": name,
                    }
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", scenario, "--n", str(args.n)],
                        env=env,
                        cwd=path,  # `python -m` puts the working directory first
                        check=True,
                        stdout=subprocess.PIPE,
                        text=True,
                    ).stdout
                    result = json.loads(out.strip().splitlines()[-1])
                    results.setdefault((tree, scenario), []).append(result)
                    print(tree, scenario, result, flush=True)
    # The best run as well as the median: on a shared machine, other load only slows a
    # run down, so the best is the figure least disturbed by it.
    print(f"\n{args.db}, {args.n} jobs, {args.repeat} runs each:")
    print("| tree | scenario | jobs/s, median | jobs/s, best | most running at once |")
    print("|---|---|---:|---:|---:|")
    for (tree, scenario), runs in results.items():
        rates = [float(r["jobs_per_second"]) for r in runs]  # type: ignore[arg-type]
        peak = max(int(r["peak_running"]) for r in runs)  # type: ignore[call-overload]
        shown = peak if scenario == "limit4" else ""
        print(
            f"| {tree} | {scenario} | {statistics.median(rates):,.0f} | {max(rates):,.0f} "
            f"| {shown} |"
        )


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: import bench.* from the tree measured
        sys.path[0] = str(ROOT)
        if os.environ.get("PYTHONPATH"):
            sys.path[:0] = os.environ["PYTHONPATH"].split(os.pathsep)
    main()
