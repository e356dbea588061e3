"""`manage.py jobqueues list|pause NAME|resume NAME|limit NAME`: see, pause and limit
the queues."""

import argparse
import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobstate.limits.queues import effective
from django_jobstate.models import Job, JobQueue
from django_jobstate.queue_names import check_known, configured_queues
from django_jobstate.states import State

from .jobstats import table


class Command(BaseCommand):
    help = (
        "List the queues (every queue TASKS lists, and any other with jobs or paused: queued "
        "and running jobs, paused or not), or pause or resume one (a name no queue has is "
        "an error that lists the known ones). "
        "A paused queue's jobs are not claimed by any worker until it is resumed; running "
        "jobs finish. The pause is stored in the database: it holds across restarts. "
        "`limit NAME --concurrency N --rate 10/s` limits a queue at run time: stored in the "
        "database, it wins over the settings' QUEUE_LIMITS until `limit NAME --clear`."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="List the queues.")
        listing.add_argument("--json", action="store_true", help="Print JSON, for machines.")
        for action in ("pause", "resume"):
            one = sub.add_parser(action, help=f"{action.capitalize()} queue NAME.")
            one.add_argument("name", metavar="NAME")
            one.add_argument("--by", default="", help="Who asked (default: cli:<your login>).")

        limit = sub.add_parser(
            "limit",
            help="Limit queue NAME at run time (wins over QUEUE_LIMITS until --clear).",
        )
        limit.add_argument("name", metavar="NAME")
        limit.add_argument(
            "--concurrency",
            metavar="N",
            help='At most N of its attempts running at once, on every worker ("none": no limit).',
        )
        limit.add_argument(
            "--rate", help='At most this many starts, e.g. "10/s", "100/m", "1000/h" ("none").'
        )
        limit.add_argument(
            "--clear", action="store_true", help="Forget the run-time limits: the settings' apply."
        )
        limit.add_argument("--by", default="", help="Who asked (default: cli:<your login>).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            self.list(as_json=options["json"])
            return
        name, by = options["name"], options["by"] or f"cli:{getpass.getuser()}"
        if options["action"] == "limit":
            self.limit(name, by, options)
            return
        try:
            check_known(name)
            if options["action"] == "pause":
                JobQueue.objects.pause(name, by=by)
            else:
                JobQueue.objects.resume(name, by=by)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        done = "paused: no worker claims its jobs" if options["action"] == "pause" else "resumed"
        self.stdout.write(f"Queue {name!r} {done}.")

    def limit(self, name: str, by: str, options: dict[str, Any]) -> None:
        changes: dict[str, Any] = {}
        if options["concurrency"] is not None:
            text = options["concurrency"].strip().lower()
            if text == "none":
                changes["concurrency"] = None
            elif not text.isdigit():
                raise CommandError(
                    f"--concurrency is a whole number from 1 (or none), not {text!r}."
                )
            else:
                changes["concurrency"] = int(text)
        if options["rate"] is not None:
            changes["rate"] = "" if options["rate"].strip().lower() == "none" else options["rate"]
        if options["clear"] and changes:
            raise CommandError("--clear forgets the run-time limits: give it alone.")
        if not options["clear"] and not changes:
            raise CommandError("Say what to limit: --concurrency N, --rate 10/s, or --clear.")
        try:
            check_known(name)
            queue = JobQueue.objects.set_limits(name, clear=options["clear"], by=by, **changes)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        limits = queue.limits
        self.stdout.write(f"Queue {name!r}: {limits.describe()} (from the {limits.source}).")

    def list(self, *, as_json: bool) -> None:
        counts = Job.objects.live().counts_by_queue()
        rows = {queue.name: queue for queue in JobQueue.objects.all()}
        configured, _open_ended = configured_queues()
        queues = []
        for name in sorted(set(counts) | set(rows) | configured):
            row = rows.get(name)
            paused_at = row.paused_at if row is not None else None
            limits = effective(name, row)
            queues.append(
                {
                    "name": name,
                    "paused": paused_at is not None,
                    "paused_at": paused_at.isoformat() if paused_at else None,
                    "changed_by": row.changed_by if row is not None else "",
                    "queued": counts.get(name, {}).get(State.QUEUED, 0),
                    "running": counts.get(name, {}).get(State.RUNNING, 0),
                    "concurrency": limits.concurrency,
                    "rate": limits.rate or None,
                    "limits_from": limits.source if limits.limited else None,
                    "limits": limits.describe(),
                }
            )
        if as_json:
            self.stdout.write(json.dumps(queues, indent=2))
            return
        if not queues:
            self.stdout.write("No queues.")
            return
        header = ["queue", "status", "queued", "running", "limits", "changed by"]
        lines = [
            [
                q["name"],
                f"PAUSED since {q['paused_at']}" if q["paused"] else "running",
                q["queued"],
                q["running"],
                "-" if q["limits_from"] is None else f"{q['limits']} ({q['limits_from']})",
                q["changed_by"] or "-",
            ]
            for q in queues
        ]
        self.stdout.write(table(header, lines))
