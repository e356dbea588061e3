"""Exceptions raised by django-jobstate, and the ones it records as a failed attempt's error."""

import traceback
from typing import TypedDict

from .states import InvalidTransition
from .tasksapi import InvalidTask

__all__ = [
    "InvalidPayload",
    "InvalidTask",
    "InvalidTransition",
    "JobAlreadyEnqueued",
    "JobCancelled",
    "JobTimeout",
    "LostRace",
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
