"""What enqueue() works out once per task, not once per call.

A profile of one `task.enqueue()` showed half its Python time spent on answers that do not
change between calls of the same task: JOBSTATE_TASK_OPTIONS applied, the task's checks
(queue name, options, that a worker can load it), the options resolved against the
defaults. A task is a frozen dataclass, so a plan made for one task object holds as long
as the settings it was made under: get_settings() returns a new object after any
setting_changed (conf.reload_settings), which is how a plan knows it is stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..conf import Settings, get_settings
from ..limits.concurrency import concurrency_key, is_limited
from ..limits.rates import rate_limit
from ..tasksapi import Task
from ..uniqueness import UniqueScope, is_unique, unique_key

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# Plans kept per backend: `task.using(...)` makes a new task object per call, so a project
# that calls it with ever-new values must not grow the cache without end.
MAX_PLANS = 256


@dataclass(frozen=True, slots=True)
class Plan:
    task: Task  # with JOBSTATE_TASK_OPTIONS applied, checked
    options: dict[str, Any]  # Job.objects.enqueue_many()'s, the same for every call
    unique: bool
    limited: bool
    rate_limit: str | None  # limits/rates.py's stored form
    tracing: bool
    # enqueue_many()'s options when a call needs nothing but them (no unique or concurrency
    # key, rate limit, run_after, metadata, dependency or trace; the task's own backend):
    # JobStateBackend.enqueue()'s fast path. None otherwise.
    plain: dict[str, Any] | None
    # Job.objects.enqueue_one()'s prepared INSERT of `plain`, per database: found with the
    # plan, with no key built from the options at every call.
    statements: dict[str, Any] = field(default_factory=dict, compare=False)

    def per_call(self, calls: Sequence[tuple[Sequence[Any], dict[str, Any]]]) -> dict[str, Any]:
        """Job.objects.enqueue_many()'s options that depend on each call's arguments (a
        unique key, a concurrency key), with those of its limits."""
        task, options = self.task, dict[str, Any]()
        if self.unique:
            options["unique_keys"] = [unique_key(task, args, kwargs) for args, kwargs in calls]
            options["unique_scope"] = UniqueScope(getattr(task, "unique_scope", UniqueScope.LIVE))
            options["raise_duplicates"] = getattr(task, "on_duplicate", "return") == "raise"
        if self.limited:  # limits/concurrency.py
            options["concurrency_keys"] = [concurrency_key(task, a, k) for a, k in calls]
            options["concurrency_limit"] = task.concurrency  # type: ignore[attr-defined]
        if self.rate_limit is not None:  # limits/rates.py
            options["rate_limit"] = self.rate_limit
        return options


class Plans:
    """A backend's plans, by task object (the entry keeps the task alive, so its id is
    never another's)."""

    def __init__(self) -> None:
        self._plans: dict[int, tuple[Task, Settings, Plan]] = {}

    def get(self, task: Task, make: Callable[[Task, Settings], Plan]) -> Plan:
        settings = get_settings()
        entry = self._plans.get(id(task))
        if entry is not None and entry[0] is task and entry[1] is settings:
            return entry[2]
        plan = make(task, settings)  # raises, and caches nothing, for a task it refuses
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[id(task)] = (task, settings, plan)
        return plan


def make_plan(task: Task, settings: Settings, alias: str) -> Plan:
    """The plan of a task already checked (with settings applied, as `with_settings()`)."""
    options = {
        "queue_name": task.queue_name,
        "priority": task.priority,
        "run_after": task.run_after,
        "backend": alias,
        "max_attempts": _option(task, "max_attempts", settings.DEFAULT_MAX_ATTEMPTS),
        "backoff": _option(task, "backoff", settings.DEFAULT_BACKOFF),
        "timeout": _option(task, "timeout", settings.DEFAULT_TIMEOUT),
        "metadata": getattr(task, "metadata", None),
    }
    unique, limited, rate = is_unique(task), is_limited(task), rate_limit(task)
    # Metadata takes the general path: a dict the caller may still change, checked per call.
    general = any(
        [
            unique,
            limited,
            rate is not None,
            settings.TRACING,
            task.run_after is not None,
            options["metadata"] is not None,
            task.backend != alias,
            getattr(task, "depends_on", None) is not None,
        ]
    )
    return Plan(
        task=task,
        options=options,
        unique=unique,
        limited=limited,
        rate_limit=rate,
        tracing=bool(settings.TRACING),
        plain=None if general else {k: v for k, v in options.items() if k != "run_after"},
    )


def _option(task: Task, name: str, default: Any) -> Any:
    value = getattr(task, name, None)
    return default if value is None else value
