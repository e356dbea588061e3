"""`manage.py canceljob RESULT_ID...`: cancel tasks from the command line."""

import argparse
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobstate.managers import CancelOutcome
from django_jobstate.models import Job

SAID = {
    CancelOutcome.CANCELLED: "cancelled: it was queued and will never run",
    CancelOutcome.REQUESTED: "running: asked to stop (stopped after JOBSTATE_CANCEL_GRACE)",
    CancelOutcome.FINISHED: "already finished: nothing to cancel",
}


class Command(BaseCommand):
    help = (
        "Cancel the live attempt of each task (the id enqueue() returned): a queued one "
        "fails as cancelled and never runs; a running one is asked to stop and stopped "
        "after JOBSTATE_CANCEL_GRACE seconds. A cancelled task is never retried."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("result_ids", nargs="+", metavar="RESULT_ID")

    def handle(self, *args: Any, **options: Any) -> None:
        missing = []
        for result_id in options["result_ids"]:
            try:
                outcome = Job.objects.cancel_task(uuid.UUID(result_id))
            except (ValueError, Job.DoesNotExist):
                missing.append(result_id)
                continue
            self.stdout.write(f"{result_id}: {SAID[outcome]}")
        if missing:
            raise CommandError(f"No task has the id {', '.join(missing)}.")
