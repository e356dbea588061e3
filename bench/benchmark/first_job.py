"""Start-up: how long `runjobs --concurrency 4` takes to start its first job, beside a plain
`manage.py check`, on the example project (SQLite).

    python bench/benchmark/first_job.py [--quick] [--concurrency N] [--rounds N]
        [--against CHECKOUT]

Each round: a fresh copy of a migrated example database with one job queued, then
`manage.py runjobs` started; the time from the moment before the process was started to
the job's started_at (written by the worker that claimed it, with this machine's clock:
SQLite's times are this process's). Beside it, the wall time of `manage.py check` (Django
set up, the checks run): what any manage.py command costs before it does its own work.
Prints the median of each and their difference. `--quick`: one round (a smoke test).
`--against`: another checkout of the repository (e.g. a worktree of main), measured in
rounds alternating with this one's, side by side: on a busy machine only a side-by-side
comparison means anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = """\
from example_project.settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": %r}}
TASKS["default"]["OPTIONS"] = {}  # noqa: F405  (no schedule: one job, the bench's)
"""


def manage(folder: Path, *args: str, root: Path = ROOT, **kwargs: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "first_job_settings",
        "PYTHONPATH": os.pathsep.join([str(folder), str(root)]),
    }
    return subprocess.Popen(
        [sys.executable, str(root / "manage.py"), *args], env=env, cwd=root, **kwargs
    )


def started_at(db: Path, timeout: float) -> float | None:
    """The job's started_at (epoch seconds) once a worker has started it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(db, timeout=5) as conn:
                row = conn.execute("SELECT started_at FROM django_jobstate_job").fetchone()
        except sqlite3.OperationalError:
            row = None  # locked for a moment: read again
        if row and row[0]:
            return datetime.fromisoformat(row[0]).timestamp()
        time.sleep(0.005)
    return None


def one_round(folder: Path, template: Path, concurrency: int, root: Path) -> tuple[float, float]:
    db = folder / "round.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(template, db)
    t0 = time.time()
    check = manage(folder, "check", root=root, stdout=subprocess.DEVNULL)
    check.wait()
    check_s = time.time() - t0
    t0 = time.time()
    proc = manage(
        folder,
        "runjobs",
        "--concurrency",
        str(concurrency),
        "--no-schedules",
        root=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        at = started_at(db, 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    if at is None:
        raise RuntimeError("runjobs did not start the job within 60 s")
    return at - t0, check_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path)
    options = parser.parse_args()
    roots = [ROOT, *([options.against.resolve()] if options.against else [])]
    rounds = 1 if options.quick else options.rounds
    with tempfile.TemporaryDirectory(prefix="jobstate-first-job-") as tmp:
        folder = Path(tmp)
        template = folder / "template.sqlite3"
        (folder / "first_job_settings.py").write_text(SETTINGS % str(folder / "round.sqlite3"))
        db = folder / "round.sqlite3"
        manage(folder, "migrate", "-v", "0").wait()
        code = "from example_project.tasks import add; add.enqueue(2, 3)"
        manage(folder, "shell", "-c", code).wait()
        shutil.copy(db, template)
        firsts: dict[Path, list[float]] = {root: [] for root in roots}
        checks: dict[Path, list[float]] = {root: [] for root in roots}
        for _ in range(rounds):
            for root in roots:
                first, check = one_round(folder, template, options.concurrency, root)
                firsts[root].append(first)
                checks[root].append(check)
    for root in roots:
        first, check = statistics.median(firsts[root]), statistics.median(checks[root])
        print(
            f"{root}: runjobs --concurrency {options.concurrency}: first job started "
            f"{first:.2f} s after start; manage.py check {check:.2f} s; difference "
            f"{first - check:.2f} s (median of {rounds}: "
            f"{', '.join(f'{f:.2f}' for f in firsts[root])})"
        )


if __name__ == "__main__":
    main()
