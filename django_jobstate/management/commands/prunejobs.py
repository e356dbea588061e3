"""`manage.py prunejobs`: delete old finished attempts."""

import argparse
import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

from django_jobstate.management.arguments import positive_int
from django_jobstate.models import Job
from django_jobstate.states import TERMINAL_STATES

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# A larger age is surely a typo, and would overflow the database's date arithmetic.
MAX_AGE_DAYS = 36500
AGE_FORMAT = "a number and a unit: 30s, 15m, 12h, 7d or 2w (a bare number is days)"


def age(text: str) -> timedelta:
    """Parse `30s`, `15m`, `12h`, `7d` or `2w`; a bare number is days."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age; use {AGE_FORMAT}")
    seconds = float(match[1]) * UNIT_SECONDS[match[2] or "d"]
    if seconds > MAX_AGE_DAYS * UNIT_SECONDS["d"]:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {MAX_AGE_DAYS} days")
    return timedelta(seconds=seconds)


class Command(BaseCommand):
    help = (
        "Delete the job attempts that finished (succeeded or failed) more than --older-than "
        "ago, in batches. Never deletes a queued or running attempt, nor any attempt of a "
        "task that still has one (a task being retried keeps its history). The next "
        "attempt of a deleted one stays, without its link to it."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            type=age,
            required=True,
            metavar="AGE",
            help=f"Delete attempts that finished more than AGE ago; AGE is {AGE_FORMAT}.",
        )
        parser.add_argument(
            "--state",
            choices=sorted(state.value for state in TERMINAL_STATES),
            help="Delete only attempts in this state (default: both).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count the attempts that would be deleted, delete nothing.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            metavar="N",
            help="Delete N attempts per transaction (default: 1000).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        states = None if options["state"] is None else [options["state"]]
        count = Job.objects.prune(
            options["older_than"],
            states=states,
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
        )
        if options["verbosity"] > 0:
            what = f"{count} job attempt{'' if count == 1 else 's'}"
            self.stdout.write(f"Would delete {what}." if options["dry_run"] else f"Deleted {what}.")
