"""Exceptions raised by django-jobstate, and the ones it records as a failed attempt's error."""

import math
import traceback
from datetime import timedelta
from typing import TypedDict

from .conf import YEAR
from .states import InvalidTransition
from .tasksapi import InvalidTask

__all__ = [
    "DoNotRetry",
    "InvalidPayload",
    "InvalidTask",
    "InvalidTransition",
    "JobAlreadyEnqueued",
    "JobCancelled",
    "JobTimeout",
    "LostRace",
    "Snooze",
    "SnoozeLimitReached",
    "WorkerInterrupted",
    "WorkerLost",
]


class LostRace(Exception):
    """A conditional write matched no row: another writer moved the job first."""


class JobAlreadyEnqueued(Exception):
    """A unique task's key is held by another live (or queued) task: nothing was enqueued.

    Raised by `enqueue()` of a task with `on_duplicate="raise"`, and by a retry of a failed
    attempt whose key another task took meanwhile. `result_id` names the holder (None when
    a retry's holder moved on before it could be named).
    """

    def __init__(self, message: str, *, result_id: str | None) -> None:
        super().__init__(message)
        self.result_id = result_id


class InvalidPayload(TypeError, ValueError):
    """Task arguments or a return value that cannot be stored as JSON.

    A TypeError, as Django documents (and its backends raise) for arguments that are not
    JSON; a ValueError too, as it was first.
    """


# Raised by a task to choose what happens next (retries.py decides, the worker writes it).
class Snooze(Exception):
    """Raised by a task: end this attempt and run the task again in `seconds` (a number
    or a timedelta), without counting it as a failure or as one of its max_attempts.

    `raise Snooze(60)` when the remote side said "come back in 60 s" (a Retry-After). A
    task may snooze at most its `max_snoozes` times; past that it fails for good with
    SnoozeLimitReached.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = delay_seconds(seconds, "Snooze()")
        super().__init__(f"the task asked to run again in {self.seconds:g} seconds")


class DoNotRetry(Exception):
    """Raised by a task: fail for good now, with no further attempt, whatever its
    max_attempts. `raise DoNotRetry("card declined") from exc` records both."""

    def __str__(self) -> str:
        if not self.args and self.__cause__ is not None:  # `raise DoNotRetry() from exc`
            return f"{class_path(self.__cause__)}: {self.__cause__}"
        return super().__str__()


class SnoozeLimitReached(Exception):
    """Recorded as the error of an attempt that snoozed past its task's max_snoozes."""


def delay_seconds(value: object, what: str) -> float:
    """`value` (seconds, or a timedelta) as seconds: a finite number from 0 to a year."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(
            f"{what} takes a delay in seconds (a number) or a timedelta, not {value!r}."
        )
    if not math.isfinite(seconds) or not 0 <= seconds <= YEAR:
        raise ValueError(
            f"{what} takes a delay from 0 to {YEAR:.0f} seconds (a year), not {value!r}."
        )
    return float(seconds)


# Recorded as the error of an attempt that failed without its task raising.
class JobTimeout(Exception):
    """The attempt ran past its task's timeout and was stopped."""


class WorkerLost(Exception):
    """The attempt's worker stopped heartbeating; the attempt was failed by another worker."""


class WorkerInterrupted(Exception):
    """The worker was told to stop at once while the attempt was running."""


class JobCancelled(Exception):
    """Someone cancelled the attempt: it never started, or it was asked to stop.

    A task that takes the context raises it with `context.raise_if_cancelled()`.
    """


# How an error is stored on a failed attempt (describe_error()).


class UpstreamFailed(Exception):
    """A task this one depends on failed for good: it never started (upstream_failed)."""


class UpstreamCancelled(JobCancelled):
    """A task this one depends on was cancelled: it was cancelled too, never started."""


class UnknownDependency(ValueError):
    """depends_on names a result id that no job has."""


def class_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class ErrorFields(TypedDict):
    """The error fields of a failed attempt (fail()'s keyword arguments)."""

    error_class: str
    error_message: str
    traceback: str


def describe_error(exc: BaseException) -> ErrorFields:
    """The error fields of a failed attempt, for any exception.

    Its str() may raise (the traceback module says so instead), and PostgreSQL stores no
    NUL character and no lone surrogate in text: both are written as escapes.
    """
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the error failed>"
    return {
        "error_class": storable_text(class_path(exc))[:255],
        "error_message": storable_text(message),
        "traceback": storable_text("".join(traceback.format_exception(exc))),
    }


def storable_text(text: str) -> str:
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
