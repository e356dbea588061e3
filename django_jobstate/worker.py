"""The worker loop: claim runnable jobs, run each task, record the outcome."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Iterable

from django.db import DatabaseError, close_old_connections, connection
from django.tasks import TaskContext
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_finished, task_started

from .backend import JobStateBackend, load_task, to_task_result
from .conf import get_settings
from .exceptions import LostRace, WorkerInterrupted
from .managers import encode_payload
from .models import Job
from .states import FailureReason

logger = logging.getLogger("django_jobstate.worker")


def default_worker_id() -> str:
    host = socket.gethostname()[:40]
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def class_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class Worker:
    """Runs jobs in this process until stopped, or until --burst/--max-jobs says so."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        queues: Iterable[str] | None = None,
        poll_interval: float | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.queues = None if queues is None else sorted(set(queues))
        self.poll_interval = (
            get_settings().POLL_INTERVAL if poll_interval is None else poll_interval
        )
        self.burst = burst
        self.max_jobs = max_jobs
        self.jobs_done = 0
        self._stopping = threading.Event()
        self._in_task = False

    def stop(self) -> None:
        """Finish the attempt in hand, claim no more."""
        self._stopping.set()

    def interrupt(self, why: str) -> None:
        """Stop at once: from a signal handler, abort the task running in this thread.

        Only the task body is aborted (the attempt is then failed as interrupted); the
        worker's own database writes always run to completion.
        """
        self._stopping.set()
        if self._in_task:
            raise WorkerInterrupted(why)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        queues = ", ".join(self.queues) if self.queues else "all queues"
        logger.info("Worker %s started on %s", self.worker_id, queues)
        try:
            while not self.stopping and not self._reached_max_jobs():
                job = self._claim_one()
                if job is not None:
                    self.run_attempt(job)
                    self.jobs_done += 1
                elif self.burst:
                    break
                else:
                    self._stopping.wait(self.poll_interval)
        finally:
            logger.info("Worker %s stopped after %d jobs", self.worker_id, self.jobs_done)

    def _reached_max_jobs(self) -> bool:
        return self.max_jobs is not None and self.jobs_done >= self.max_jobs

    def _claim_one(self) -> Job | None:
        if not connection.in_atomic_block:  # a long-lived worker drops broken connections
            close_old_connections()
        try:
            jobs = Job.objects.claim(self.worker_id, queues=self.queues, limit=1)
        except DatabaseError:
            logger.exception("Worker %s could not claim jobs; retrying", self.worker_id)
            self._stopping.wait(self.poll_interval)
            return None
        return jobs[0] if jobs else None

    def run_attempt(self, job: Job) -> None:
        """Run one claimed attempt and record its outcome, fenced by state and worker."""
        started = time.monotonic()
        try:
            value = self._call(job)
        except WorkerInterrupted as exc:
            self._finish(job, started, error=exc, reason=FailureReason.INTERRUPTED)
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            self._finish(job, started, error=exc)
        else:
            self._finish(job, started, value=value)

    def _call(self, job: Job) -> object:
        task = load_task(job.task_path)  # a path that is not a Task fails here, running nothing
        result = to_task_result([*self._previous_attempts(job), job], task)
        task_started.send(JobStateBackend, task_result=result)
        self._in_task = True
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *job.args, **job.kwargs)
            else:
                value = task.call(*job.args, **job.kwargs)
        finally:
            self._in_task = False
        return encode_payload(value, "The task's return value")

    def _previous_attempts(self, job: Job) -> list[Job]:
        if job.attempt == 1:
            return []
        return list(Job.objects.attempts_of(job.result_id).filter(attempt__lt=job.attempt))

    def _finish(
        self,
        job: Job,
        started: float,
        *,
        value: object = None,
        error: BaseException | None = None,
        reason: FailureReason = FailureReason.ERROR,
    ) -> None:
        try:
            if error is None:
                Job.objects.succeed(job, value)
            else:
                Job.objects.fail(
                    job,
                    reason,
                    error_class=class_path(error),
                    error_message=str(error),
                    traceback="".join(traceback.format_exception(error)),
                )
        except LostRace as exc:
            logger.warning(
                "Worker %s: outcome of job %s discarded: %s", self.worker_id, job.pk, exc
            )
            return
        logger.log(
            logging.INFO if error is None else logging.WARNING,
            "Job %s %s attempt %d/%d %s in %.3fs",
            job.pk,
            job.task_path,
            job.attempt,
            job.max_attempts,
            job.state,
            time.monotonic() - started,
        )
        try:
            result = to_task_result([*self._previous_attempts(job), job])
        except InvalidTask:
            return  # the task cannot be imported: there is no Task to describe
        task_finished.send(JobStateBackend, task_result=result)
