"""`manage.py schedules`: list the periodic jobs, store their definitions, run one now."""

import argparse
import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import router, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.definitions import Definition, relative
from django_jobstate.schedules.model import Origin
from django_jobstate.schedules.settings import load
from django_jobstate.schedules.writes import db_now, enqueue_tick, sync

from ...tasksapi import InvalidTask


class Command(BaseCommand):
    help = (
        "List the periodic jobs (TASKS[alias]['OPTIONS']['SCHEDULES'] and JOBSTATE_RETENTION, "
        "and those made in the admin) as the database holds them (origin, enabled, next tick, "
        "last tick and its job's state), and the settings' not stored yet."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON, one object each.")
        parser.add_argument(
            "--sync",
            action="store_true",
            help="Store the settings' definitions first (runjobs does it when it starts): "
            "for a deploy step.",
        )
        parser.add_argument(
            "--run",
            metavar="NAME",
            help="Enqueue a job of schedule NAME now, besides its ticks.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["sync"]:
            definitions, errors = load()
            if errors:
                raise CommandError("\n".join(str(e) for e in errors))
            for name in sync(definitions.values()):
                self.stderr.write(
                    f"Schedule {name!r} of the settings is not stored: a schedule made in the "
                    f"admin has that name (check E018)."
                )
        if options["run"]:
            self.run_now(options["run"])
            return
        rows = self.rows()
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("No schedules stored, and none in the settings.")
        now = timezone.now()
        for row in rows:
            status = "removed" if row["removed"] else "enabled" if row["enabled"] else "disabled"
            if not row["stored"]:
                status = "not scheduled" if row.get("clash") else "not stored yet"
            self.stdout.write(
                f"{row['name']}  [{status}]  {row['task']}  {row['schedule']}  "
                f"(from the {row['origin']})"
            )
            if row.get("clash"):
                self.stdout.write(
                    "    not scheduled: a schedule made in the admin has its name (E018)"
                )
                continue
            if not row["stored"]:
                self.stdout.write(
                    "    next tick: once stored (by runjobs when it starts, or schedules --sync)"
                )
                continue
            self.stdout.write(f"    next tick: {self.when(row['next_tick'], now)}")
            last = self.when(row["last_tick"], now)
            if row["last_job_state"]:
                last += f", job {row['last_job']} {row['last_job_state']}"
            self.stdout.write(f"    last tick: {last}")
            self.stdout.write(f"    skipped: {row['skipped']}, missed: {row['missed']}")

    def rows(self) -> list[dict[str, Any]]:
        """The stored schedules, and the settings' not stored yet (before the first sync)."""
        newest = Job.objects.filter(result_id=OuterRef("last_result_id")).order_by("-attempt")
        schedules = Schedule.objects.order_by("name").annotate(
            last_state=Subquery(newest.values("state")[:1]),
            last_job=Subquery(newest.values("pk")[:1]),
        )
        rows = [
            {
                "name": s.name,
                "origin": s.origin,
                "stored": True,
                "task": s.task_path,
                "schedule": s.expression,
                "cron": s.cron or None,
                "every": s.every,
                "timezone": s.timezone,
                "enabled": s.enabled,
                "removed": s.removed_at is not None,
                "next_tick": s.next_tick_at.isoformat(),
                "last_tick": s.last_tick_at.isoformat() if s.last_tick_at else None,
                "last_job": s.last_job,
                "last_job_state": s.last_state,
                "skipped": s.skipped,
                "last_skipped": s.last_skipped_at.isoformat() if s.last_skipped_at else None,
                "missed": s.missed,
                "queue": s.queue_name,
                "catch_up": s.catch_up,
                "unique": s.unique,
            }
            for s in schedules
        ]
        stored = {row["name"]: row for row in rows}
        for d in load()[0].values():
            if d.name not in stored:
                rows.append(self.not_stored(d))
            elif stored[d.name]["origin"] == Origin.ADMIN:  # E018: the admin's keeps it
                rows.append({**self.not_stored(d), "clash": True})
        return sorted(rows, key=lambda row: row["name"])

    def not_stored(self, d: Definition) -> dict[str, Any]:
        return {
            "name": d.name,
            "origin": Origin.SETTINGS.value,
            "stored": False,
            "task": d.task_path,
            "schedule": d.expression,
            "cron": d.cron or None,
            "every": d.every,
            "timezone": d.timezone,
            "enabled": d.enabled,
            "removed": False,
            "next_tick": None,
            "last_tick": None,
            "last_job": None,
            "last_job_state": None,
            "skipped": 0,
            "last_skipped": None,
            "missed": 0,
            "queue": d.queue_name,
            "catch_up": d.catch_up,
            "unique": d.unique,
        }

    def when(self, value: str | None, now: datetime) -> str:
        if value is None:
            return "never"
        return f"{value} ({relative(datetime.fromisoformat(value), now)})"

    def run_now(self, name: str) -> None:
        try:
            schedule = Schedule.objects.get(name=name, removed_at=None)
        except Schedule.DoesNotExist:
            known = ", ".join(
                Schedule.objects.filter(removed_at=None)
                .order_by("name")
                .values_list("name", flat=True)
            )
            raise CommandError(
                f"No schedule {name!r}; the schedules are: {known or 'none'}."
            ) from None
        db = router.db_for_write(Schedule)
        try:
            with transaction.atomic(using=db):
                job = enqueue_tick(
                    db,
                    Definition.from_row(schedule),
                    db_now(db),
                    last_result_id=schedule.last_result_id,
                )
        except (InvalidTask, TypeError, ValueError) as exc:  # its task, its arguments
            raise CommandError(f"Schedule {name!r}: nothing enqueued: {exc}") from None
        if job.deduplicated:
            self.stdout.write(
                f"Not enqueued: job {job.pk}, with the same unique key, is still live "
                f"({job.state}): the last run of {name}, or another job of its task."
            )
        else:
            self.stdout.write(f"Enqueued job {job.pk} of schedule {name}.")
