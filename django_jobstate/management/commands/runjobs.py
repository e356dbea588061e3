"""`manage.py runjobs`: run a worker until stopped."""

import argparse
import logging
import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand

from django_jobstate.exceptions import WorkerInterrupted
from django_jobstate.worker import Worker

logger = logging.getLogger("django_jobstate.worker")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def queue_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a queue name cannot be empty")
    return text


class Command(BaseCommand):
    help = (
        "Run background jobs. SIGTERM or SIGINT finishes the jobs in hand and exits; a second "
        "one stops at once and fails the running attempts as interrupted."
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
        parser.add_argument("--burst", action="store_true", help="Exit once no job is runnable.")
        parser.add_argument(
            "--max-jobs", type=positive_int, metavar="N", help="Exit after running N jobs."
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            metavar="SECONDS",
            help="Seconds to wait when nothing is runnable (default: JOBSTATE_POLL_INTERVAL).",
        )
        parser.add_argument(
            "--worker-id", metavar="ID", help="Name this worker (default: host:pid:random)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        worker = Worker(
            worker_id=options["worker_id"],
            queues=options["queues"],
            poll_interval=options["poll_interval"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
        )

        def on_signal(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if not worker.stopping:
                logger.info(
                    "Worker %s: %s received; finishing the job in hand (send it again to "
                    "stop at once)",
                    worker.worker_id,
                    name,
                )
                worker.stop()
            else:
                worker.interrupt(f"{name} received twice: the worker stopped at once")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            worker.run()
        except WorkerInterrupted:
            logger.warning("Worker %s stopped at once", worker.worker_id)
