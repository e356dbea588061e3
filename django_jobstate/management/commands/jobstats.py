"""`manage.py jobstats`: what the queues and the workers are doing now."""

import argparse
import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand

from django_jobstate.conf import get_settings
from django_jobstate.models import Job
from django_jobstate.states import State


class Command(BaseCommand):
    help = (
        "Show job counts per queue and state, how long the oldest runnable job has waited, "
        "and the workers with their running attempts; a worker silent for "
        "JOBSTATE_LOST_AFTER seconds is lost. --json prints one object: "
        '{"queues": {QUEUE: {"queued": N, "running": N, "succeeded": N, "failed": N}}, '
        '"paused_queues": [QUEUE], "cancel_requested": N (running attempts asked to stop), '
        '"oldest_runnable_age_seconds": SECONDS or null (jobs of paused queues are not '
        'runnable: they are counted apart), "paused_due": N (due jobs waiting in paused '
        'queues), "oldest_paused_age_seconds": SECONDS or null, "held_by_limits": [{"task": '
        'PATH, "limit": N, "held": N}] (queued jobs waiting for a slot of a concurrency limit: '
        'not runnable, not stuck), "held_by_queue_limits": [{"queue": NAME, "limits": TEXT, '
        '"from": "settings" or "run time", "running": N, "due": N}] (limited queues with due '
        'jobs, which wait for room in the queue), "held_by_rates": [{"task": PATH, "rate": '
        'TEXT, "due": N}] (due jobs of rate-limited tasks, which start at that rate), '
        '"workers": [{"worker_id": ID, '
        '"host": HOST, "pid": PID, "last_seen_age_seconds": SECONDS, "lost": BOOL, '
        '"running": N}], "lost_workers": N}. A worker with running attempts but no '
        "heartbeat has host, pid and last_seen_age_seconds null, and is lost."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON, for machines.")

    def handle(self, *args: Any, **options: Any) -> None:
        stats = Job.objects.stats(get_settings().LOST_AFTER)
        if options["json"]:
            self.stdout.write(json.dumps(stats, indent=2))
            return
        paused = set(stats["paused_queues"])
        queues = [
            [queue, *(counts[state] for state in State.values), "PAUSED" if queue in paused else ""]
            for queue, counts in stats["queues"].items()
        ]
        header = ["queue", *State.values, ""]
        self.stdout.write(table(header, queues) if queues else "No jobs.")
        if quiet := paused - set(stats["queues"]):
            self.stdout.write(f"Paused queues without jobs: {', '.join(sorted(quiet))}.")
        if stats["cancel_requested"]:
            self.stdout.write(f"Running attempts asked to stop: {stats['cancel_requested']}.")
        oldest = stats["oldest_runnable_age_seconds"]
        self.stdout.write(
            "\nNo job is runnable."
            if oldest is None
            else f"\nThe oldest runnable job has waited {duration(oldest)}."
        )
        if stats["paused_due"]:
            self.stdout.write(
                f"Paused queues hold {stats['paused_due']} due jobs (not runnable); the oldest "
                f"has waited {duration(stats['oldest_paused_age_seconds'])}."
            )
        for held in stats["held_by_limits"]:
            self.stdout.write(
                f"{held['held']} jobs of {held['task']} wait for a slot of its concurrency "
                f"limit ({held['limit']} at once): not runnable until one of their key "
                f"finishes, not stuck."
            )
        for queue in stats["held_by_queue_limits"]:
            self.stdout.write(
                f"Queue {queue['queue']} is limited ({queue['limits']}, from the "
                f"{queue['from']}): {queue['running']} running, {queue['due']} due jobs wait "
                f"for room in it, not stuck."
            )
        for rated in stats["held_by_rates"]:
            self.stdout.write(
                f"{rated['due']} due jobs of {rated['task']} start at its rate limit "
                f"({rated['rate']}, across all workers): they wait for their turn, not stuck."
            )
        workers = [
            [
                worker["worker_id"],
                worker["host"] or "-",
                worker["pid"] or "-",
                last_seen(worker["last_seen_age_seconds"]),
                worker["running"],
                "LOST" if worker["lost"] else "ok",
            ]
            for worker in stats["workers"]
        ]
        header = ["worker", "host", "pid", "last seen", "running", "status"]
        self.stdout.write("\n" + (table(header, workers) if workers else "No workers."))
        if stats["lost_workers"]:
            self.stdout.write(self.style.WARNING(f"\nLost workers: {stats['lost_workers']}"))


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Align `rows` under `header`: numbers to the right, text to the left."""
    cells = [list(map(str, header)), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(isinstance(row[i], int) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ).rstrip()
        for row in cells
    )


def last_seen(age: float | None) -> str:
    return "never" if age is None else f"{duration(age)} ago"


def duration(seconds: float) -> str:
    """Say `seconds` the short way: 0.4s, 12s, 3m 20s, 2h 5m, 3d 4h."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in [
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ]:
        if whole >= size:
            return f"{whole // size}{unit} {whole % size // smaller_size}{smaller}"
    return f"{whole}s"
