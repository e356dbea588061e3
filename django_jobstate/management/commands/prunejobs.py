"""`manage.py prunejobs`: delete old finished tasks, every attempt of each."""

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from django_jobstate.conf import AGE_FORMAT, age
from django_jobstate.management.arguments import positive_int
from django_jobstate.models import Job
from django_jobstate.states import TERMINAL_STATES


class Command(BaseCommand):
    help = (
        "Delete whole tasks, in batches: every attempt of a task whose newest attempt "
        "finished (succeeded or failed) more than --older-than ago. Never part of a task, "
        "so a task's result never reads differently (it is there as it was, or gone), and "
        "never a task with a queued or running attempt."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            type=age,
            required=True,
            metavar="AGE",
            help=f"Delete tasks that finished more than AGE ago; AGE is {AGE_FORMAT}.",
        )
        parser.add_argument(
            "--state",
            choices=sorted(state.value for state in TERMINAL_STATES),
            help="Delete only tasks whose final attempt is in this state (default: both).",
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
            help="Delete up to N attempts per transaction, whole tasks only (default: 1000).",
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
