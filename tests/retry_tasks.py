"""Tasks of tests/test_retry_policies.py (retry_on, Snooze, DoNotRetry), exposed by
tests/tasks.py. Each run records itself in the Execution table."""

from django_jobstate.exceptions import DoNotRetry, Snooze
from django_jobstate.tasksapi import TaskContext, task
from tests.models import Execution


def _runs(label: str) -> int:
    """Record this run of `label`; return how many runs it has had, this one included."""
    Execution.objects.create(label=label)
    return Execution.objects.filter(label=label).count()


@task(takes_context=True)  # max_attempts 1: the snoozes must not use it up
def snoozes_twice(context: TaskContext, label: str, seconds: float) -> int:
    if _runs(label) <= 2:
        raise Snooze(seconds)
    return context.attempt


@task(max_snoozes=2)
def snoozes_forever(label: str) -> None:
    _runs(label)
    raise Snooze(0)


@task(takes_context=True, atomic=True)
def snoozes_atomically(context: TaskContext, label: str) -> int:
    """Write a row per attempt: the first one's rolls back with its snooze."""
    Execution.objects.create(label=f"{label}-{context.attempt}")
    if context.attempt == 1:
        raise Snooze(0)
    return context.attempt


@task(max_attempts=5, backoff=0, retry_on=(ConnectionError,))
def retries_on_connection_errors(label: str, kind: str) -> None:
    _runs(label)
    if kind == "connection":
        raise ConnectionRefusedError(f"{label}: refused")  # a subclass: retried
    raise ValueError(f"{label}: not retried")


@task(max_attempts=5, backoff=0)
def gives_up(label: str) -> None:
    _runs(label)
    try:
        int(label)
    except ValueError as exc:
        raise DoNotRetry(f"{label!r} will never be a number") from exc


class RateLimited(Exception):
    """What a client raises on a 429: the delay the server asked for, as `retry_after`."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited: retry after {retry_after:g} s")
        self.retry_after = retry_after


@task(max_attempts=2, backoff=3600)
def rate_limited_once(label: str, retry_after: float) -> str:
    """Without the exception's retry_after its retry would wait an hour's backoff."""
    if _runs(label) == 1:
        raise RateLimited(retry_after)
    return label
