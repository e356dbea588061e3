"""Several attempts at once in one worker process (runjobs --in-flight N).

Most jobs wait on the network: one attempt at a time per process leaves the machine idle.
With --in-flight N a worker keeps up to N attempts running: async tasks on one event loop
(a thread of the worker), everything else on up to N threads. The rest is the worker's
usual loop (worker.py): claims as many jobs as it has free places, writes outcomes in
batches, fenced, and records each attempt in its ledger before it begins.

Deadlines (a timeout, or a cancel past JOBSTATE_CANCEL_GRACE): the event loop cancels an
async task at its deadline, and it fails as timed out (or cancelled); one that ignores the
cancellation, or holds the event loop, is stopped with its process ASYNC_GRACE seconds
later. The event loop watches the deadlines itself, not the worker's loop, which may wait
on the database for as long as a table is locked or the server is away. A thread cannot
be stopped: at a sync task's deadline the supervisor ends the process, as it does with one
attempt at a time, and the attempts in flight beside it fail as lost (and are retried if
they have attempts left). Give sync tasks that may run past their timeout a queue and
workers of their own.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from ..exceptions import JobCancelled, JobTimeout
from ..models import Job
from ..payload import encode_payload
from ..states import FailureReason
from ..tasksapi import Task, TaskResult
from ..telemetry.logs import job_fields
from .attempts import Outcome
from .flushing import FLUSH_AFTER

if TYPE_CHECKING:
    from .wakeup import Waiter
    from .worker import Worker

logger = logging.getLogger("django_jobstate.worker")

# How often the loop looks for new jobs and notifications while attempts run (a completion
# wakes it at once), and the event loop for async attempts past their deadline.
SLICE = 0.05


class InFlight:
    """Runs up to `limit` attempts of `worker` at once and hands back their outcomes."""

    def __init__(self, worker: Worker, limit: int) -> None:
        self.worker = worker
        self.limit = limit
        self.running: dict[int, Job] = {}  # {ledger place: job}
        self._done: queue.SimpleQueue[tuple[int, Outcome]] = queue.SimpleQueue()
        self._threads = ThreadPoolExecutor(limit, thread_name_prefix="jobstate-attempt")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        # The event loop's own (only its thread reads or writes them), by place: the tasks
        # running, and those it cancelled at their deadline.
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._stopped: set[int] = set()

    @property
    def free(self) -> int:
        return self.limit - len(self.running)

    def submit(self, job: Job, task: Task, result: TaskResult | None, index: int) -> None:
        """Run a started attempt's body beside the others."""
        self.running[index] = job
        if self.worker.on_loop(task):
            asyncio.run_coroutine_threadsafe(
                self._run_async(job, task, result, index), self._event_loop()
            )
        else:
            self._threads.submit(self._run_sync, job, task, result, index)

    def take(self, timeout: float) -> list[tuple[int, Outcome]]:
        """The outcomes of attempts that ended: wait up to `timeout` for the first."""
        taken = []
        try:
            taken.append(self._done.get(timeout=timeout))
            while True:
                taken.append(self._done.get_nowait())
        except queue.Empty:
            pass
        for index, _outcome in taken:
            del self.running[index]
        return taken

    def _stop_due(self) -> None:
        """On the event loop, every SLICE: cancel the async tasks past their deadline (once
        each). Here, not in the worker's loop, which may be waiting on the database."""
        assert self._loop is not None
        try:
            for index in self.worker.ledger.due(time.monotonic()):
                if index in self._tasks and index not in self._stopped:
                    self._stopped.add(index)
                    self._tasks[index].cancel()
        finally:  # whatever happened, the deadlines are kept from the next slice on
            self._loop.call_later(SLICE, self._stop_due)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(5)

    def _run_sync(self, job: Job, task: Task, result: TaskResult | None, index: int) -> None:
        try:
            outcome = self.worker.body(job, task, result, index)
        except BaseException as exc:  # body() returns the task's errors: this one is ours
            self.worker.ledger.finish(index)
            outcome = Outcome(job, time.monotonic(), time.monotonic(), error=exc)
        try:
            close_old_connections()  # this thread's, as the worker loop does its own
        finally:
            self._done.put((index, outcome))

    async def _run_async(self, job: Job, task: Task, result: TaskResult | None, index: int) -> None:
        worker = self.worker
        span, started = None, time.monotonic()
        try:
            span = worker.tracing.Attempt(job) if worker.tracing else None
            body = asyncio.ensure_future(
                task.func(*worker.arguments(job, task, result, index), *job.args, **job.kwargs)
            )
            self._tasks[index] = body
            value = encode_payload(await body, "The task's return value")[0]
        except asyncio.CancelledError:
            error = self._stop_error(job, index, started)
            outcome = Outcome(job, started, time.monotonic(), error=error)
            if isinstance(error, JobTimeout):  # a timeout, however soon after it was cancelled
                outcome.reason = FailureReason.TIMEOUT
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            outcome = Outcome(job, started, time.monotonic(), error=exc)
        else:
            outcome = Outcome(job, started, time.monotonic(), value=value)
        finally:
            worker.ledger.finish(index)
            self._tasks.pop(index, None)
            self._stopped.discard(index)
        # The async ORM's queries run on one thread of their own (asgiref's): drop its
        # connection there once broken or past CONN_MAX_AGE, as after a sync attempt, or
        # a database restart would fail every async attempt after it.
        try:
            await sync_to_async(close_old_connections)()
        finally:
            self._done.put((index, worker.judge(outcome, span)))

    def _stop_error(self, job: Job, index: int, started: float) -> BaseException:
        if index not in self._stopped:  # not ours: a task that cancelled itself
            return JobCancelled("the task was cancelled (asyncio.CancelledError)")
        if self.worker.ledger.cancel_requested(index):
            return JobCancelled("it was cancelled, and stopped at the end of its grace")
        took = time.monotonic() - started
        return JobTimeout(
            f"the attempt ran past its timeout of {job.timeout:g} seconds ({took:.1f} s) "
            "and was cancelled"
        )

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name="jobstate-event-loop", daemon=True
            )
            self._loop_thread.start()
            self._loop.call_soon_threadsafe(self._stop_due)
        return self._loop


def run_in_flight(worker: Worker, waiter: Waiter) -> None:
    """The worker loop with up to worker.in_flight attempts running at once."""
    pool = InFlight(worker, worker.in_flight)
    done: list[Outcome] = []
    places: list[int] = []
    look = True  # claim at the next turn: jobs may be waiting
    last_look = 0.0
    try:
        while True:
            claiming = not (worker.stopping or worker.reached_max_jobs or worker.orphaned())
            # Outcomes not yet written keep their places in the ledger, which holds a batch
            # of them beside the attempts in flight: claim no more than fit beside those.
            # (A run of claimed jobs not to be run, whose outcomes are known at once, would
            # fill it otherwise: they take no place in the pool.)
            room = worker.max_batch - len(places)
            wanted = min(pool.free, room, worker.claim_limit(in_flight=len(pool.running)))
            if claiming and look and wanted > 0:
                jobs = worker.claim(wanted)
                last_look = time.monotonic()
                look = len(jobs) == wanted  # a full claim: more may wait
                if jobs:
                    worker.listen()
                for job, index in zip(jobs, worker.ledger.hold([j.pk for j in jobs]), strict=True):
                    begun = worker.begin(job, index)
                    if isinstance(begun, tuple):
                        pool.submit(job, *begun, index)
                    elif begun is not None:  # not to be run: its outcome is known
                        worker.jobs_done += 1
                        done.append(begun)
                        places.append(index)
                    else:
                        worker.ledger.free([index])
                        logger.info(
                            "Worker %s handed job %s back unstarted",
                            worker.worker_id,
                            job.pk,
                            extra=job_fields(job, "job.handed_back"),
                        )
                if jobs:
                    continue
            if not pool.running and not done:
                if not claiming or (worker.burst and not look and worker.burst_done()):
                    break
                if not look:
                    waiter.wait(worker.look_again_in(last_look))
                    look = True
                continue
            for index, outcome in pool.take(SLICE if pool.running else 0):
                worker.learn(outcome)
                worker.jobs_done += 1
                done.append(outcome)
                places.append(index)
            # Outcomes not yet written keep their places in the ledger: at most a batch.
            if done and (
                not pool.running
                or time.monotonic() - done[0].finished > FLUSH_AFTER
                or done[-1].error
                or len(done) >= worker.max_batch
            ):
                worker.record(done)
                worker.ledger.free(places)
                done, places = [], []
            if not look and (waiter.heard() or worker.look_again_in(last_look) == 0):
                look = True
    finally:
        if done:
            worker.record(done)
            worker.ledger.free(places)
        pool.close()
