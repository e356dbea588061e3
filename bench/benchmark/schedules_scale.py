"""How long one scheduler takes to enqueue the ticks of many schedules due at once.

    JOBSTATE_TEST_DB=sqlite|postgres JOBSTATE_TEST_DB_NAME=... \\
        python bench/benchmark/schedules_scale.py [N]

Runs against a scratch database that tests.settings names (migrated by the script; its
jobs and schedules are deleted). Stores N schedules `every: 60` (default 1,000), makes them
all due, and times the wake-ups of one in-process Scheduler until every tick is enqueued:
the queries per wake-up and the time from the first to the last tick written.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import F  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from django_jobstate.models import Job, Schedule  # noqa: E402
from django_jobstate.schedules.definitions import Definition  # noqa: E402
from django_jobstate.schedules.scheduler import Scheduler  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    call_command("migrate", verbosity=0)
    Job.objects.all().delete()
    Schedule.objects.all().delete()
    definitions = {
        f"s{i}": Definition(name=f"s{i}", task_path="tests.tasks.noop", every=60) for i in range(n)
    }
    scheduler = Scheduler("bench", definitions)
    scheduler.run_once()  # stores them
    Schedule.objects.update(next_tick_at=F("next_tick_at") - timedelta(seconds=60))
    start = time.perf_counter()
    wakeups = 0
    while scheduler.run_once() == 0:
        wakeups += 1
    seconds = time.perf_counter() - start
    with CaptureQueriesContext(connection) as idle:
        wait = scheduler.run_once()
    enqueued = Job.objects.filter(schedule_name__isnull=False).count()
    print(
        f"{connection.vendor}: {n} schedules due at once: {enqueued} ticks enqueued in "
        f"{seconds:.2f} s ({wakeups} wake-ups, {seconds / max(enqueued, 1) * 1000:.2f} ms a "
        f"tick); an idle wake-up: {len(idle)} query, next in {wait:.1f} s"
    )
    Job.objects.all().delete()
    Schedule.objects.all().delete()


if __name__ == "__main__":
    main()
