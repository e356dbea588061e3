"""Enqueue rate of unique tasks against ordinary ones, side by side in one process.

    JOBSTATE_TEST_DB=sqlite|postgres JOBSTATE_TEST_DB_NAME=... \\
        python bench/benchmark/unique_enqueue.py [N]

Runs against a scratch database that tests.settings names (it must be migrated: the
script runs migrate). Rounds alternate between the kinds so that a noisy machine hurts
them alike; prints the median rate of each and its ratio to ordinary enqueues.
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

from django_jobstate.models import Job  # noqa: E402
from tests.tasks import record, unique_record  # noqa: E402


def rate(n: int, enqueue: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(n):
        enqueue(i)
    return n / (time.perf_counter() - start)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    call_command("migrate", verbosity=0)
    kinds: dict[str, Callable[[int], object]] = {
        "ordinary": lambda i: record.enqueue(f"r{i}"),
        "unique, new key": lambda i: unique_record.enqueue(f"u{i}"),
        "unique, duplicate": lambda i: unique_record.enqueue("held"),
    }
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(5):
        for kind, enqueue in kinds.items():
            rates[kind].append(rate(n, enqueue))
        with transaction.atomic():
            Job.objects.all().delete()
    base = statistics.median(rates["ordinary"])
    for kind, values in rates.items():
        median = statistics.median(values)
        print(f"{kind:18} {median:8.0f} enqueues/s  {median / base:5.2f}x ordinary")


if __name__ == "__main__":
    main()
