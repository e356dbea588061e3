"""`manage.py runjobs`: run a worker until stopped."""

import argparse
import logging
import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobstate.management.arguments import positive_float, positive_int, queue_name
from django_jobstate.supervisor import Supervisor

logger = logging.getLogger("django_jobstate.worker")


class Command(BaseCommand):
    help = (
        "Run background jobs in worker processes. SIGTERM or SIGINT finishes the jobs in hand "
        "and exits; a second one stops at once and fails the running attempts as interrupted."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=queue_name,
            metavar="NAME",
            help="Run jobs from this queue only (repeatable; default: all queues).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            metavar="N",
            help="Run N worker processes (default: 1).",
        )
        parser.add_argument("--burst", action="store_true", help="Exit once no job is runnable.")
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            metavar="N",
            help="Replace each worker process after it ran N jobs (a guard against leaks).",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            metavar="SECONDS",
            help="Seconds to wait when nothing is runnable (default: JOBSTATE_POLL_INTERVAL).",
        )
        parser.add_argument(
            "--worker-id",
            metavar="ID",
            help="Start worker names with ID (default: host:pid); a random part follows, so "
            "that two runjobs given the same ID never share a name.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        supervisor = Supervisor(
            concurrency=options["concurrency"],
            worker_id=options["worker_id"],
            queues=options["queues"],
            poll_interval=options["poll_interval"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
        )

        def on_signal(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if not supervisor.stopping:
                logger.warning(
                    "%s received: finishing the jobs in hand (send it again to stop at once)", name
                )
                supervisor.stop()
            else:
                logger.warning("%s received again: stopping at once", name)
                supervisor.interrupt()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        supervisor.run()
        if supervisor.unavailable:
            raise CommandError(
                "A worker could not reach the database, so the jobs left queued are not "
                "known to be done; see the errors above.",
                returncode=3,
            )


def configure_logging(verbosity: int) -> None:
    """-v 0: warnings only; -v 1 (default): a line per worker and per attempt; -v 2: debug."""
    package_logger = logging.getLogger("django_jobstate")
    package_logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    if not package_logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        package_logger.addHandler(handler)
