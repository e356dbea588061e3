"""The benchmark still runs: `bench/benchmark/bench.py --quick` (smaller) on the database
under test.

A smoke test, not a benchmark: it checks the exit status and that the table was printed,
never a number. bench.py exits non-zero when it cannot run, or when a django-jobstate job
did not succeed exactly once.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_interruptible

ROOT = Path(__file__).resolve().parent.parent


# bench.py's figures, split between the passes (a figure's code is the same on each database).
FIGURES_ON = {
    "sqlite": ["drain", "enqueue", "txn", "io", "memory", "sqlite_fair"],
    "postgres": [
        "drain",
        "latency",
        "priority",
        "many",
        "history",
        # Issue 28's, PostgreSQL's only: a few seconds each in --quick.
        "ceiling",
        "continuous",
        "pressure",
    ],
}


@pytest.mark.slow
def test_bench_quick_runs(tmp_path: Path) -> None:
    if importlib.util.find_spec("django_tasks_db") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must install django-tasks-db (the bench dependency group).")
        pytest.skip("django-tasks-db is not installed: install the bench dependency group.")
    db = os.environ.get("JOBSTATE_TEST_DB", "sqlite")
    if db == "postgres" and not os.environ.get("PGHOST"):
        pytest.skip('PostgreSQL: PGHOST is not set (eval "$(scripts/pg start)").')
    if db == "mysql" and not os.environ.get("JOBSTATE_MYSQL_PORT"):
        pytest.skip('MariaDB: JOBSTATE_MYSQL_PORT is not set (eval "$(scripts/mysql start)").')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # bench.py sets one per runner
    returncode, out = run_interruptible(
        [
            sys.executable,
            str(ROOT / "bench" / "benchmark" / "bench.py"),
            "--quick",
            # Smaller still than --quick where bench.py lets us say so: every figure, system
            # and code path still runs, on fewer jobs.
            "--n",
            "200",
            "--history-rows",
            "2000",
            "--memory-jobs",
            "1000",
            "--fair-rounds",
            "1",
            # One drain per system and figure, of several processes: a drain of one
            # process runs the same code, and each drain costs its processes' start.
            "--workers",
            "2",
            "--db",
            db,
            # Each figure runs on one database, django-tasks-db's runner (the same code on
            # every database) on SQLite only: together the passes run every figure and
            # system, in half the time of each pass running all (CI's 20 minutes).
            "--systems",
            "jobstate,tasksdb" if db == "sqlite" else "jobstate",
            "--only",
            ",".join(FIGURES_ON.get(db, FIGURES_ON["postgres"])),
            "--prefix",
            f"bench_smoke_{os.getpid()}",  # its own databases on a shared server
            "--output",
            str(tmp_path),
        ],
        # A loaded shared machine: the quick run took ~4 min at load 8, before issue 28's three
        # figures (about 2 more minutes at load 14).
        timeout=720,
        cwd=ROOT,
        env=env,
    )
    assert returncode == 0, out[-8000:]
    if db == "sqlite":
        assert "| figure | django-jobstate | tasks-db | ÷ tasks-db |" in out
    else:
        assert "| figure | django-jobstate |" in out
    assert "| drain 200 no-op jobs, 2 workers (jobs/s) |" in out
    if db == "sqlite":
        assert "| I/O-bound: 200 jobs waiting 100 ms each, 2 worker processes" in out
        assert "| worker RSS after 1,000 jobs (MiB) |" in out
        assert "... side by side: drain ÷ its solo rate (target ≥ 0.3) |" in out
    else:
        assert "| pickup latency p50, 20 jobs/s, 1 worker (ms) |" in out
        assert "same rows after VACUUM ANALYZE" in out
        assert "Ceiling (issue 28): plain SQL" in out
        assert "Continuous load (issue 28)" in out
        assert "four REPEATABLE READ readers scanning the job table, over time:" in out
    assert "Targets (issue 17):" in out
    assert (tmp_path / f"bench-{db}.json").exists()


def test_the_passes_smoke_every_figure_between_them() -> None:
    from bench.benchmark.bench import FIGURES

    assert sorted({f for figures in FIGURES_ON.values() for f in figures}) == sorted(FIGURES)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_enqueue_cost_script_runs_quick() -> None:
    """bench/benchmark/enqueue_cost.py (issue 28) on the test database."""
    from django.db import connection

    env = {**os.environ, "JOBSTATE_TEST_DB_NAME": str(connection.settings_dict["NAME"])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    script = ROOT / "bench" / "benchmark" / "enqueue_cost.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "bare INSERT" in proc.stdout


@pytest.mark.slow
def test_the_first_job_script_runs_quick() -> None:
    """bench/benchmark/first_job.py (issue 28): the example project, on SQLite whatever the
    database under test."""
    if os.environ.get("JOBSTATE_TEST_DB", "sqlite") != "sqlite":
        pytest.skip("the example project runs on SQLite: measured in the SQLite pass")
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    script = ROOT / "bench" / "benchmark" / "first_job.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "first job started" in proc.stdout


def test_the_continuous_report_gives_the_latency_verdict_and_the_floor_of_bulk_batches() -> None:
    """At half the rate sustained, a bulk run's batch (0.1 s of jobs at once) taken at the
    no-op drain's rate puts its middle job rate x 0.1 / (2 x drain) behind the first."""
    from bench.benchmark.bench_load_report import continuous_lines

    def run(mode: str, p50: float) -> dict:
        sample = {"t": 10, "depth": 0, "dead": 0, "live": 0, "vacuums": 0, "index_bytes": {}}
        return {
            "rate": 1_000.0, "mode": mode, "fed_rate": 1_000.0, "producers": 1,
            "throughput": 1_000.0, "p50": p50, "p99": 20.0, "max_depth": 0,
            "samples": [sample], "timeline": [],
        }  # fmt: skip

    load = {
        "ratio": 0.5, "drain": 2_000.0, "max_rate": 2_000.0, "steps": [],
        "workers": 2, "in_flight": 8,
        "runs": {"single-50%": run("single", 3.0), "bulk-50%": run("bulk", 30.0)},
    }  # fmt: skip
    sizes = type("Sizes", (), {"step": 20, "every": 10, "bulk_every": 0.1})()

    lines = continuous_lines(load, sizes)

    assert "| bulk-50% | 1,000 | 1,000 | 1 | 1,000 | 30.0 | 25.0 | 20.0 |" in "\n".join(lines)
    assert "- single-50%: pickup p50 < 5 ms and p99 < 50 ms: met" in lines
    assert (
        "- bulk-50%: pickup p50 < 5 ms and p99 < 50 ms: **NOT MET** "
        "(its batches allow p50 >= 25.0 ms)" in lines
    )
    assert "a batch every 0.1 s" in lines[1]

    # Batches ten times as frequent (--bulk-every 0.01): a tenth of the floor.
    load["runs"] = {"bulk-50%": {**run("bulk", 3.0), "bulk_every": 0.01}}
    lines = continuous_lines(load, sizes)
    assert (
        "- bulk-50%: pickup p50 < 5 ms and p99 < 50 ms: met (its batches allow p50 >= 2.5 ms)"
        in lines
    )


def test_the_continuous_report_sets_the_rate_sustained_against_procrastinates_drain() -> None:
    """Against Procrastinate's no-op drain with the load's workers in the same run (an upper
    bound of the rate it sustains), and only with the same jobs in flight per process."""
    from bench.benchmark.bench_load_report import peer_line
    from bench.benchmark.bench_peers import PROCRASTINATE_CONCURRENCY

    load = {
        "workers": 2, "in_flight": PROCRASTINATE_CONCURRENCY, "max_rate": 2_100.0, "drain": 3e3
    }  # fmt: skip
    drains = {"drain": {"procrastinate": {"2": {"rate": 400.0}}}}

    assert peer_line(load, drains).endswith(
        "(400 jobs/s; more than it can sustain): 5.25x (target >= 5x): met"
    )
    assert "**NOT MET**" in peer_line({**load, "max_rate": 1_900.0}, drains)
    assert "not measured" in peer_line({**load, "workers": 4}, drains)
    assert "not measured" in peer_line({**load, "drain": None}, drains)  # --rate: given
    assert "not measured" in peer_line({**load, "in_flight": PROCRASTINATE_CONCURRENCY + 1}, drains)
