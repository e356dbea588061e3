"""Tasks started by hand: `manage.py enqueue` and the admin's "Start a task" page.

Both take text (a task path, arguments as JSON, a queue, a priority, a run-after) and share
this module, so that they refuse the same things with the same words. The task is found
as a worker would find it (loading.py: only the project's task modules, nothing imported
for the path's sake), and enqueued through its own `.using(...).enqueue(...)`, so every
check of enqueue() applies: the queue's name, the priority's range, the payload's limits,
unique keys.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from .conf import UNIT_SECONDS, age
from .exceptions import InvalidPayload, JobAlreadyEnqueued
from .loading import check_loadable, exposed_tasks, load_task
from .tasksapi import InvalidTask, Task, TaskResult, task_enqueued

RUN_AFTER_FORMAT = (
    "a delay with a unit (30s, 5m, 2h, 1d) or an ISO 8601 date and time "
    "(2026-12-24T18:00:00+01:00; without an offset, in the current time zone)"
)


class NotStarted(ValueError):
    """Why a task was not enqueued; `field` names the input at fault (None: several)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Call:
    """A task and its arguments, checked, ready to enqueue."""

    task: Task
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the admin log: what was started, with what."""
        when = f", run after {self.task.run_after.isoformat()}" if self.task.run_after else ""
        return (
            f"Started {self.task.module_path} by hand with args {_dump(self.args)} and "
            f"kwargs {_dump(self.kwargs)} (queue {self.task.queue_name!r}, priority "
            f"{self.task.priority}{when})."
        )


@dataclass(frozen=True)
class Started:
    result: TaskResult
    # False when a unique task's live job already held the key: nothing was written, and
    # `result` is that job's (enqueue() returns it).
    new: bool


def find_task(path: str) -> Task:
    """The @task at `path`, as a worker would load it; NotStarted otherwise."""
    path = path.strip()
    if not path:
        raise NotStarted("Name a task: its dotted path, e.g. myapp.tasks.send_report.", "task")
    try:
        task = load_task(path)
        check_loadable(task)
    except InvalidTask as exc:
        raise NotStarted(f"{exc} {_suggest(path)}", "task") from None
    return task


def _suggest(path: str) -> str:
    known = sorted(exposed_tasks())
    if close := difflib.get_close_matches(path, known, n=3):
        return f"Did you mean {' or '.join(close)}?"
    listed = ", ".join(known[:10]) or "none"
    return f"The project's tasks: {listed}" + (f" ({len(known)} in all)." if known[10:] else ".")


def project_tasks() -> list[tuple[str, str]]:
    """(path, "path(signature)") of every task the project's task modules define or expose."""
    return [(path, f"{path}{signature(task)}") for path, task in sorted(exposed_tasks().items())]


def signature(task: Task) -> str:
    """The parameters a caller gives (without a takes_context task's `context`)."""
    sig = inspect.signature(task.func)
    params = list(sig.parameters.values())[1 if task.takes_context else 0 :]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def parse_args(text: str | None) -> list[Any]:
    value = _json(text, "args", "[]")
    if not isinstance(value, list):
        raise NotStarted(
            f'The arguments must be a JSON list (e.g. [1, "two"]), not a {_kind(value)}.', "args"
        )
    return value


def parse_kwargs(text: str | None) -> dict[str, Any]:
    value = _json(text, "kwargs", "{}")
    if not isinstance(value, dict):
        raise NotStarted(
            f'The keyword arguments must be a JSON object (e.g. {{"to": "ops"}}), not a '
            f"{_kind(value)}.",
            "kwargs",
        )
    return value


def parse_run_after(text: str | None) -> datetime | None:
    """A delay from now ("30s", "5m") or an ISO 8601 date and time; None when empty."""
    text = (text or "").strip()
    if not text:
        return None
    if re.fullmatch(r"\d+(\.\d+)?", text):
        raise NotStarted(f"{text!r} has no unit: use {RUN_AFTER_FORMAT}.", "run_after")
    if text[-1:] in UNIT_SECONDS and text[:1].isdigit():
        try:
            return timezone.now() + age(text)
        except argparse.ArgumentTypeError as exc:
            raise NotStarted(f"{exc}.", "run_after") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise NotStarted(f"{text!r} is not {RUN_AFTER_FORMAT}.", "run_after") from None
    if settings.USE_TZ and timezone.is_naive(when):
        return timezone.make_aware(when)
    if not settings.USE_TZ and timezone.is_aware(when):
        return timezone.make_naive(when)
    return when


def prepare(
    path: str,
    *,
    args: str | None = None,
    kwargs: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_after: str | None = None,
) -> Call:
    """Check every input as enqueue() would, and say which one is wrong (NotStarted)."""
    task = find_task(path)
    call = Call(task, parse_args(args), parse_kwargs(kwargs))
    bind(task, call.args, call.kwargs)
    options: list[tuple[str, str, Any]] = [
        ("queue", "queue_name", queue or None),
        ("priority", "priority", priority),
        ("run_after", "run_after", parse_run_after(run_after)),
    ]
    for name, option, value in options:
        if value is None:
            continue
        try:  # using() runs the backend's validate_task(): the queue, the range, ...
            call.task = call.task.using(**{option: value})
        except InvalidTask as exc:
            raise NotStarted(str(exc), name) from None
    return call


def bind(task: Task, args: list[Any], kwargs: dict[str, Any]) -> None:
    """NotStarted unless the arguments fit the function's parameters: a worker would
    otherwise run the task only to fail it with a TypeError."""
    try:
        inspect.signature(task.func).bind(*([None] if task.takes_context else []), *args, **kwargs)
    except TypeError as exc:
        raise NotStarted(
            f"The arguments do not fit {task.name}{signature(task)}: {exc}.", "args"
        ) from None


def start(call: Call) -> Started:
    """Enqueue the call through the task's own enqueue(); NotStarted for what it refuses."""
    with _announced() as new:
        try:
            result = call.task.enqueue(*call.args, **call.kwargs)
        except (InvalidTask, InvalidPayload, JobAlreadyEnqueued) as exc:
            raise NotStarted(str(exc)) from None
    return Started(result, str(result.id) in new)


@contextmanager
def _announced() -> Iterator[set[str]]:
    """The ids of the results task_enqueued announces meanwhile: enqueue() sends it for a
    new job only, never for the live job of a unique key that it returns instead."""
    ids: set[str] = set()

    def receiver(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        ids.add(str(task_result.id))

    hook: Callable[..., None] = receiver
    task_enqueued.connect(hook, weak=False)
    try:
        yield ids
    finally:
        task_enqueued.disconnect(hook)


WHAT = {"args": "arguments", "kwargs": "keyword arguments"}


def _json(text: str | None, name: str, empty: str) -> Any:
    text = (text or "").strip() or empty
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotStarted(f"The {WHAT[name]} are not valid JSON: {exc}.", name) from None
    except RecursionError:
        raise NotStarted(f"The {WHAT[name]} are nested too deep to read.", name) from None


def _kind(value: Any) -> str:
    kinds = {dict: "JSON object", list: "JSON list", str: "string", bool: "boolean"}
    return kinds.get(type(value), "null" if value is None else "number")


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
