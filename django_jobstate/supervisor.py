"""The supervisor behind `runjobs`: N worker processes, replaced when they end.

Each worker is a child process (spawned, so it shares nothing with the supervisor but the
settings). The supervisor knows each child's worker id, so when a child dies it fails that
child's running attempts at once instead of waiting for the lost-after window.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from django.db import DatabaseError, close_old_connections

from .exceptions import WorkerInterrupted, WorkerLost
from .states import FailureReason

# Nothing here imports models at import time: a spawned child imports this module to find
# run_child before Django is set up.

logger = logging.getLogger("django_jobstate.worker")

EXIT_RECYCLE = 3  # the worker ran --max-jobs jobs: replace it
EXIT_TIMEOUT = 4  # the worker ended itself to stop an attempt past its timeout


@dataclass
class Child:
    worker_id: str
    process: BaseProcess
    started: float


class Supervisor:
    def __init__(self, *, concurrency: int = 1, worker_id: str | None = None, **options: Any):
        self.concurrency = concurrency
        from .worker import default_worker_id

        self.base_id = worker_id or default_worker_id()
        self.options = options  # Worker(...) arguments: queues, poll_interval, burst, max_jobs
        self.stopping = False
        self.interrupted = False
        self._spawned = 0
        self._children: dict[int, Child] = {}
        self._context = multiprocessing.get_context("spawn")

    def run(self) -> None:
        queues = ", ".join(sorted(self.options.get("queues") or [])) or "all queues"
        logger.info(
            "Supervisor %s started %d worker(s) on %s", self.base_id, self.concurrency, queues
        )
        for slot in range(self.concurrency):
            self._children[slot] = self._spawn(slot)
        while self._children:
            wait([c.process.sentinel for c in self._children.values()], timeout=0.5)
            for slot, child in list(self._children.items()):
                if child.process.is_alive():
                    continue
                child.process.join()
                self._reap(child)
                if self._should_replace(child):
                    self._children[slot] = self._spawn(slot)
                else:
                    del self._children[slot]
        logger.info("Supervisor %s stopped", self.base_id)

    def stop(self) -> None:
        """Let each worker finish its attempt in hand, then exit."""
        self.stopping = True
        self._signal_children(signal.SIGTERM)

    def interrupt(self) -> None:
        """Stop now: kill the workers; their running attempts fail as interrupted."""
        self.stopping = self.interrupted = True
        self._signal_children(signal.SIGKILL)

    def _signal_children(self, signum: int) -> None:
        for child in self._children.values():
            if child.process.pid is not None and child.process.is_alive():
                os.kill(child.process.pid, signum)

    def _spawn(self, slot: int) -> Child:
        self._spawned += 1
        worker_id = f"{self.base_id}/{slot}.{self._spawned}"[-64:]
        process = self._context.Process(
            target=run_child,
            args=({**self.options, "worker_id": worker_id}, logger.getEffectiveLevel()),
            name=f"runjobs worker {worker_id}",
        )
        process.start()
        return Child(worker_id, process, time.monotonic())

    def _reap(self, child: Child) -> None:
        from .models import Job, WorkerHeartbeat

        code = child.process.exitcode
        assert code is not None  # run() reaps a child only after join()
        if code in (0, EXIT_RECYCLE):
            return
        if self.interrupted:
            reason = FailureReason.INTERRUPTED
            error: Exception = WorkerInterrupted(
                "runjobs was told twice to stop, and stopped at once"
            )
        else:
            if code == EXIT_TIMEOUT:
                how = "ended itself to stop an attempt past its timeout"
            elif code < 0:
                how = f"was killed by {signal.Signals(-code).name}"
            else:
                how = f"exited {code}"
            reason, error = FailureReason.LOST, WorkerLost(f"its worker process {how}")
            logger.warning("Worker %s %s", child.worker_id, how)
        try:
            close_old_connections()
            Job.objects.fail_running(child.worker_id, reason, error)
            WorkerHeartbeat.objects.forget(child.worker_id)
        except DatabaseError:
            logger.exception(
                "Could not fail the attempts of worker %s; they fail as lost once "
                "JOBSTATE_LOST_AFTER has passed",
                child.worker_id,
            )

    def _should_replace(self, child: Child) -> bool:
        code = child.process.exitcode
        if self.stopping or code == 0:
            return False
        if code != EXIT_RECYCLE and time.monotonic() - child.started < 1.0:
            time.sleep(1.0)  # a worker that dies at once (e.g. no database): do not spin
        return not self.stopping  # a stop may have come during the sleep


def run_child(options: dict[str, Any], log_level: int) -> None:
    """The body of a worker process."""
    import django

    django.setup()
    from .worker import Worker

    logging.getLogger("django_jobstate").setLevel(log_level)
    # Ctrl-C reaches the whole process group: the supervisor alone decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = Worker(**options, on_timeout=lambda job: os._exit(EXIT_TIMEOUT))
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
    worker.run()
    sys.exit(EXIT_RECYCLE if worker.reached_max_jobs and not worker.stopping else 0)
