"""The SQLite fairness figure (issue 28): one web-like writer and `runjobs --concurrency 2`
draining a backlog of no-op jobs share one SQLite file's single write lock.

One runjobs session on a fresh database, rounds of three adjacent windows (fair_helper.py):
the drain alone, both at once, the writer alone. Targets: beside the drain the writer
keeps at least 50% of its solo commits/s, and beside the writer the drain keeps at least
30% of its solo jobs/s (the median round of each). A mixin of bench.Bench.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from bench.benchmark.bench_run import Database, System, Workers, helper

FAIR_WORKERS = 2  # runjobs --concurrency, as the target names
WRITER_TARGET = 0.5
DRAIN_TARGET = 0.3
# The file lives in memory where it can: this machine's disk is shared, and its fsyncs took
# from 1 to 10 ms from one minute to the next, which would measure the neighbours, not how
# the writers share the lock. (The test suite's SQLite files live there too.)
SHM = Path("/dev/shm")


class FairFigures:
    sizes: Any
    db: Database
    problems: list[tuple[str, str, str]]

    def sqlite_fair(self, system: System) -> dict[str, Any]:
        seconds, rounds, backlog = (
            self.sizes.fair_seconds,
            self.sizes.fair_rounds,
            self.sizes.fair_backlog,
        )
        env = self.db.fresh(system)
        on_disk = env["BENCH_DB_NAME"]
        if SHM.is_dir() and os.access(SHM, os.W_OK):
            env["BENCH_DB_NAME"] = str(SHM / f"{Path(on_disk).name}-{os.getpid()}")
            shutil.copyfile(on_disk, env["BENCH_DB_NAME"])
        helper(env, "seed", str(backlog))
        procs = Workers(system, env, FAIR_WORKERS, burst=False)
        try:
            out = helper(env, "fair_rounds", str(seconds), str(rounds))
            procs.stop()
            if any(procs.exit_codes()):
                self.problems.append(
                    (system.key, "sqlite_fair", f"runjobs exit codes {procs.exit_codes()}")
                )
        finally:
            procs.cleanup()
            if env["BENCH_DB_NAME"] != on_disk:
                for path in SHM.glob(Path(env["BENCH_DB_NAME"]).name + "*"):
                    path.unlink()
        if out["writer_locked"]:
            what = f'{out["writer_locked"]} "database is locked" errors in the writer'
            self.problems.append((system.key, "sqlite_fair", what))
        if not out["left"]:
            what = f"the backlog of {backlog:,} ran out: raise fair_backlog"
            self.problems.append((system.key, "sqlite_fair", what))
        return {
            **out,
            "seconds": seconds,
            "workers": FAIR_WORKERS,
            "in_memory": env["BENCH_DB_NAME"] != on_disk,
            "writer_met": out["writer_ratio"] >= WRITER_TARGET,
            "drain_met": out["drain_ratio"] >= DRAIN_TARGET,
        }
