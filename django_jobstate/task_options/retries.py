"""Retry policies: what follows an attempt whose task raised, and the options that say so.

A task's exception leads to one of three things (decide()): a snooze (Snooze: the next
attempt runs after the delay asked for and does not count this one), a retry within
max_attempts (after the task's backoff, or the delay the exception carries as
`retry_after`), or no further attempt (DoNotRetry, an exception retry_on does not name,
or a snooze past max_snoozes). The worker writes it through JobManager.fail().
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils.module_loading import import_string

from ..exceptions import DoNotRetry, Snooze, SnoozeLimitReached, delay_seconds
from ..states import FailureReason
from ..tasksapi import InvalidTask, Task

DEFAULT_MAX_SNOOZES = 20
MAX_SNOOZES_LIMIT = 1000


@dataclass(frozen=True)
class Next:
    """How to record a failed attempt: its reason and error, and its next attempt."""

    reason: FailureReason
    error: BaseException
    retry: bool = True  # within max_attempts (a snooze: always)
    delay: float | None = None  # seconds before the next attempt; None: the task's backoff


def decide(
    task: Task | None, error: BaseException, reason: FailureReason, snoozes: Callable[[], int]
) -> Next:
    """What follows an attempt that ended with `error` (`task` is None if it cannot be
    loaded). `snoozes()` counts the task's earlier snoozed attempts (read only on a
    snooze). Timeouts, lost or interrupted workers are not the task's choice: they retry
    within max_attempts, as before, whatever retry_on says."""
    if reason != FailureReason.ERROR:
        return Next(reason, error)
    if isinstance(error, Snooze):
        cap = getattr(task, "max_snoozes", DEFAULT_MAX_SNOOZES)
        done = snoozes()
        if done < cap:
            return Next(FailureReason.SNOOZED, error, delay=error.seconds)
        limit = SnoozeLimitReached(
            f"The task snoozed {done} times, its max_snoozes, and then asked again ({error}): "
            f"it failed for good. Raise max_snoozes if it must wait longer."
        )
        limit.__cause__ = error
        return Next(FailureReason.ERROR, limit, retry=False)
    if isinstance(error, DoNotRetry):
        return Next(FailureReason.ERROR, error, retry=False)
    retry_on = getattr(task, "retry_on", None)
    if retry_on is not None and not isinstance(error, retry_on):
        return Next(FailureReason.ERROR, error, retry=False)
    return Next(FailureReason.ERROR, error, delay=retry_after(error))


def retry_after(error: BaseException) -> float | None:
    """The delay `error` asks for before a retry (its `retry_after`: seconds or a
    timedelta, on the class or the instance), or None (the task's backoff, or a value
    that is not a delay: a library's attribute of another meaning)."""
    value = getattr(error, "retry_after", None)
    if value is None or not isinstance(value, int | float | timedelta):
        return None
    try:
        return delay_seconds(value, "retry_after")
    except (TypeError, ValueError):
        return None


def validate_retry_options(task: Task) -> None:
    """Refuse a retry_on that is not a tuple of exception classes, and a bad max_snoozes."""
    path = task.module_path
    retry_on = getattr(task, "retry_on", None)
    if retry_on is not None:
        if not isinstance(retry_on, tuple):
            hint = f" (write retry_on=({retry_on.__name__},))" if _is_class(retry_on) else ""
            raise InvalidTask(
                f"retry_on of task {path!r} must be a tuple of exception classes, not "
                f"{retry_on!r}{hint}."
            )
        for item in retry_on:
            if not _is_class(item) or not issubclass(item, Exception):
                raise InvalidTask(
                    f"retry_on of task {path!r} must hold exception classes (subclasses of "
                    f"Exception), not {item!r}."
                )
            if issubclass(item, Snooze | DoNotRetry):
                raise InvalidTask(
                    f"retry_on of task {path!r} names {item.__name__}, which is never "
                    f"retried as an error: Snooze always runs the task again, DoNotRetry "
                    f"never does. Remove it."
                )
    snoozes = getattr(task, "max_snoozes", DEFAULT_MAX_SNOOZES)
    if isinstance(snoozes, bool) or not isinstance(snoozes, int):
        snoozes = None
    if snoozes is None or not 0 <= snoozes <= MAX_SNOOZES_LIMIT:
        raise InvalidTask(
            f"max_snoozes of task {path!r} must be a whole number from 0 to "
            f"{MAX_SNOOZES_LIMIT}, not {getattr(task, 'max_snoozes', None)!r}."
        )


def from_setting(path: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """JOBSTATE_TASK_OPTIONS' options for the task at `path`, with retry_on's dotted
    paths imported (a list there, as settings hold no classes)."""
    value = options.get("retry_on")
    if isinstance(value, str):
        raise InvalidTask(
            f"retry_on of task {path!r} must be a list of exception classes' dotted paths, "
            f"not {value!r} (write [{value!r}])."
        )
    if not isinstance(value, list | tuple):
        return dict(options)  # None, or a value validate_retry_options() refuses
    classes = []
    for item in value:
        if not isinstance(item, str):
            classes.append(item)
            continue
        try:
            classes.append(import_string(item))
        except ImportError as exc:
            raise InvalidTask(
                f"retry_on of task {path!r} names {item!r}, which cannot be imported: {exc}. "
                f"Name exception classes by their dotted paths, e.g. "
                f"'requests.exceptions.ConnectionError'."
            ) from None
    return {**options, "retry_on": tuple(classes)}


def _is_class(value: object) -> bool:
    return isinstance(value, type)
