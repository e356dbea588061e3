"""The benchmark's tasks. A no-op writes nothing: each system's own rows are the record."""

import asyncio
import time

from django_jobstate.tasksapi import task


@task
def noop() -> None:
    """Do nothing: the benchmark measures the runner, not the work."""


@task
def old_noop() -> None:
    """The task path of the pre-filled history rows, so counts can tell them apart."""


@task
def warmup() -> None:
    """Run once before the latency feed, to know the worker is up and polling."""


IO_SECONDS = 0.1  # the I/O-bound job's wait, as the peers' (peer_common.SLEEP)
BACKLOG_SECONDS = 0.005  # a backlog job's work, so that a backlog lasts while it is fed


@task
def io_sleep() -> None:
    """A sync task waiting on I/O (an HTTP call, say): `time.sleep`."""
    time.sleep(IO_SECONDS)


@task
async def io_async() -> None:
    """An async task waiting on I/O: `asyncio.sleep`."""
    await asyncio.sleep(IO_SECONDS)


@task
def backlog() -> None:
    """The backlog a high-priority job arrives behind: 5 ms of work each."""
    time.sleep(BACKLOG_SECONDS)


@task(priority=100)
def urgent() -> None:
    """The high-priority job (Django's highest priority) enqueued behind a backlog."""


@task
def published() -> None:
    """The job a web-like writer enqueues with each page it saves (the SQLite fairness figure)."""


LOAD_SECONDS = 0.001  # the continuous load's job (issue 28)


@task
def work_1ms() -> None:
    """A job of the continuous load: 1 ms of work."""
    time.sleep(LOAD_SECONDS)


@task
async def work_1ms_async() -> None:
    """The continuous load's job for workers with --in-flight: 1 ms waiting on I/O."""
    await asyncio.sleep(LOAD_SECONDS)
