"""Enqueue rate of a third-party app's task (exposed by a task module's import) against a
task of the project's own task module, and the rate of the exposed tasks' lookup alone.

    JOBSTATE_TEST_DB=sqlite|postgres JOBSTATE_TEST_DB_NAME=... \
        python bench/benchmark/exposed_enqueue.py [N]

Runs against a scratch database that tests.settings names (it must be migrated: the
script runs migrate). An exposed task is checked at each enqueue() by looking it up among
the tasks the task modules expose (loading.exposed_tasks()); a task of a task module is
found by its module directly. Rounds alternate between the kinds, so that a noisy machine
hurts them alike; prints the median rate of each. The enqueues of a round share one
transaction.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from django_jobstate.loading import exposed_task  # noqa: E402
from django_jobstate.models import Job  # noqa: E402
from tests.searchapp.tasks import index_page  # noqa: E402
from tests.tasks import record  # noqa: E402


def rate(n: int, call: Callable[[int], object]) -> float:
    # In one transaction: the commit of each enqueue (an fsync on SQLite) would hide the
    # work this measures.
    with transaction.atomic():
        start = time.perf_counter()
        for i in range(n):
            call(i)
        return n / (time.perf_counter() - start)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    call_command("migrate", verbosity=0)
    kinds: dict[str, Callable[[int], object]] = {
        "own task, enqueue": lambda i: record.enqueue(f"r{i}"),
        "exposed task, enqueue": lambda i: index_page.enqueue(f"e{i}"),
        "exposed task, lookup": lambda i: exposed_task("tests.searchlib.tasks.index_page"),
    }
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(5):
        for kind, call in kinds.items():
            rates[kind].append(rate(n * 10 if "lookup" in kind else n, call))
        with transaction.atomic():
            Job.objects.all().delete()
    for kind, values in rates.items():
        median = statistics.median(values)
        print(f"{kind:22} {median:10.0f} /s  ({1e6 / median:7.1f} µs each)")


if __name__ == "__main__":
    main()
