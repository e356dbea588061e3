"""The options of a task: JobStateTask's fields, their checks, and JOBSTATE_TASK_OPTIONS.

JOBSTATE_TASK_OPTIONS gives options by task path, for tasks you do not own (a third-party
app's): `{"wagtail.search.tasks.x": {"unique": True}}`. A value there wins over the
task's own `@task(...)` value, as Celery's task annotations do: the setting is the
deployer's, changed without touching the task's code. It is applied at enqueue (the row
keeps max_attempts, backoff, timeout and the unique key) and by workers (atomic).

Beside it: retries.py, the retry policies (what follows an attempt whose task raised), and
plan.py, what enqueue() works out once per task from these options.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from numbers import Real
from typing import Any, cast

from django.utils.module_loading import import_string

from ..conf import LIMIT_NAMES, YEAR, get_settings
from ..exceptions import InvalidPayload
from ..limits.concurrency import validate_concurrency
from ..limits.rates import validate_rate_limit
from ..tasksapi import BaseTaskBackend, InvalidTask, Task, task_backends
from ..uniqueness import UniqueScope, validate_unique
from .retries import DEFAULT_MAX_SNOOZES, from_setting, validate_retry_options

# The options JOBSTATE_TASK_OPTIONS may set: JobStateTask's, save the per-call ones
# (unique_key, metadata) and Django's own (a queue or a priority is chosen per call).
SETTABLE = (
    "max_attempts",
    "backoff",
    "timeout",
    "atomic",
    "unique",
    "unique_scope",
    "on_duplicate",
    "retry_on",
    "max_snoozes",
    "concurrency",
    "concurrency_key",
    "rate_limit",
)
DEFAULT_SETTING = {
    "max_attempts": "JOBSTATE_DEFAULT_MAX_ATTEMPTS",
    "backoff": "JOBSTATE_DEFAULT_BACKOFF",
    "timeout": "JOBSTATE_DEFAULT_TIMEOUT",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStateTask(Task):
    """A Task with retry and timeout options: `@task(max_attempts=3, backoff=5, timeout=60)`.

    None means the project default (JOBSTATE_DEFAULT_MAX_ATTEMPTS, ..._BACKOFF, ..._TIMEOUT).
    With `atomic=True` the body runs in a transaction on the jobs' database that also
    writes the attempt's success, fenced: if the attempt stopped being this worker's (its
    worker was taken for lost, it timed out), the body's writes roll back with it.
    """

    max_attempts: int | None = None  # attempts in all, including the first
    backoff: float | None = None  # seconds before the second attempt; doubles after
    timeout: float | None = None  # seconds an attempt may run before it is stopped
    atomic: bool = False
    # Retry only on these exceptions and their subclasses (others fail at once); None: on
    # every exception. Snooze and DoNotRetry choose for themselves (retries.py).
    retry_on: tuple[type[Exception], ...] | None = None
    max_snoozes: int = DEFAULT_MAX_SNOOZES  # times in all the task may raise Snooze
    # At most one live job per key (uniqueness.py): True keys on every argument, a list of
    # parameter names on those; unique_key (given per call with .using()) is the key itself.
    unique: bool | Sequence[str] = False
    unique_scope: str = UniqueScope.LIVE  # or "queued": one waiting, while one may run
    on_duplicate: str = "return"  # or "raise": JobAlreadyEnqueued
    unique_key: str | None = None
    # At most `concurrency` attempts running at once, per task, or per value of the
    # `concurrency_key` parameters (limits.py).
    concurrency: int | None = None
    concurrency_key: Sequence[str] | None = None
    # At most this many starts per second, minute, hour or day across every worker:
    # "10/s", "100/m" (limits/rates.py).
    rate_limit: str | None = None
    # The job's metadata at enqueue, per call: task.using(metadata={...}). Not hashed: a dict.
    metadata: dict[str, Any] | None = field(default=None, hash=False)
    # Result ids of the tasks that must succeed first, per call: task.using(depends_on=[...]).
    depends_on: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.unique, list):  # hashable, as the rest of a Task
            object.__setattr__(self, "unique", tuple(self.unique))
        if isinstance(self.concurrency_key, list):
            object.__setattr__(self, "concurrency_key", tuple(self.concurrency_key))
        if isinstance(self.retry_on, list):
            object.__setattr__(self, "retry_on", tuple(self.retry_on))
        Task.__post_init__(self)

    def get_backend(self) -> BaseTaskBackend:
        # Task's own, without the import it makes at every call: a few µs of each enqueue()
        # (bench/benchmark/enqueue_cost.py).
        return task_backends[self.backend]

    if not hasattr(Task, "_reconstruct"):  # pragma: no cover - the backport pairs run this
        # Django 6.1's Task pickles by the module path of its function; the backport's does
        # not pickle at all (its function is not the module's attribute: the Task is).
        # Ours pickles on every supported version, as a TaskResult in a cache needs.
        @classmethod
        def _reconstruct(cls, kwargs: dict[str, Any]) -> JobStateTask:
            path = kwargs["func"]
            try:
                kwargs["func"] = import_string(path).func
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"Expected {path!r} to point to a Task instance.") from exc
            return cls(**kwargs)

        def __reduce__(self) -> tuple[Any, ...]:
            kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
            kwargs["func"] = self.module_path
            return (type(self)._reconstruct, (kwargs,))

    def using(
        self,
        *,
        unique_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        depends_on: Iterable[Any] | None = None,
        **options: Any,
    ) -> JobStateTask:
        """Django's using(), plus `unique_key` (this call's key for uniqueness),
        `metadata` (the dict stored with each job enqueued) and `depends_on` (result ids,
        or TaskResults, of the tasks that must succeed before it runs)."""
        # Task.using, not super(): zero-argument super() fails in a slots dataclass.
        task = cast(JobStateTask, Task.using(self, **options))
        ours: dict[str, Any] = {"unique_key": unique_key, "metadata": metadata}
        if depends_on is not None:
            from ..managers.deps import as_result_ids

            ours["depends_on"] = tuple(str(up) for up in as_result_ids(depends_on))
        ours = {name: value for name, value in ours.items() if value is not None}
        return replace(task, **ours) if ours else task


def _check_option(
    task: Task, name: str, *, minimum: float, maximum: float | None = None, allow_none: bool = True
) -> None:
    value = getattr(task, name, None)
    if value is None and allow_none:
        return
    # typeshed gives numbers.Real no __ge__; `not >=` also refuses NaN.
    if isinstance(value, bool) or not isinstance(value, Real) or not value >= minimum:  # type: ignore[operator]
        raise InvalidTask(
            f"{name} of task {task.module_path!r} must be a number of at least {minimum}, "
            f"not {value!r}."
        )
    if maximum is not None and value > maximum:  # type: ignore[operator]
        # Beyond it, the datetime arithmetic of a retry or a deadline overflows.
        raise InvalidTask(
            f"{name} of task {task.module_path!r} must be at most {maximum:g} seconds "
            f"({LIMIT_NAMES[maximum]}), not {value!r}."
        )


def validate_options(task: Task) -> None:
    """Refuse bad values of the options JobStateTask adds, naming the task."""
    _check_option(task, "max_attempts", minimum=1)
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and (isinstance(max_attempts, float) or max_attempts > 1000):
        raise InvalidTask(
            f"max_attempts of task {task.module_path!r} must be a whole number from 1 to "
            f"1000, not {max_attempts!r}."
        )
    _check_option(task, "backoff", minimum=0, maximum=YEAR)
    _check_option(task, "timeout", minimum=0.001, maximum=YEAR)
    if (metadata := getattr(task, "metadata", None)) is not None:
        from ..managers.progress import check_metadata

        try:
            check_metadata(metadata)
        except InvalidPayload as exc:
            raise InvalidTask(f"metadata of task {task.module_path!r}: {exc}") from None
    if not isinstance(atomic := getattr(task, "atomic", False), bool):
        raise InvalidTask(
            f"atomic of task {task.module_path!r} must be True or False, not {atomic!r}."
        )
    validate_unique(task)
    validate_concurrency(task)
    validate_rate_limit(task)
    validate_retry_options(task)


def validate_queue(backend: BaseTaskBackend, task: Task) -> None:
    """Django's own check, with the valid names in its message."""
    if backend.queues and task.queue_name not in backend.queues:
        raise InvalidTask(
            f"Queue {task.queue_name!r} is not valid for backend {backend.alias!r}; "
            f"its QUEUES are: {', '.join(sorted(backend.queues))}."
        )


def settings_options(path: str) -> dict[str, Any]:
    """JOBSTATE_TASK_OPTIONS' options of the task at `path` (the settable ones only;
    the system checks report the rest)."""
    configured = get_settings().TASK_OPTIONS
    options = configured.get(path) if isinstance(configured, Mapping) else None
    if not isinstance(options, Mapping):
        return {}
    return from_setting(path, {name: value for name, value in options.items() if name in SETTABLE})


def with_settings(task: Task) -> Task:
    """`task` with JOBSTATE_TASK_OPTIONS' options for its path applied (they win)."""
    options = settings_options(task.module_path)
    if not options:
        return task
    if isinstance(task, JobStateTask):
        return replace(task, **options)
    # A Task of another task class (a backend's that adds none of these options).
    own = {f.name: getattr(task, f.name) for f in fields(task) if f.init}
    return JobStateTask(**own, **options)


def option_sources(task: Task) -> dict[str, str]:
    """Where each option of `task` comes from today: the setting, @task, or a default."""
    from_settings = settings_options(task.module_path)
    sources = {}
    for name in SETTABLE:
        default = JobStateTask.__dataclass_fields__[name].default
        if name in from_settings:
            sources[name] = "JOBSTATE_TASK_OPTIONS"
        elif getattr(task, name, default) != default:
            sources[name] = "@task"
        else:
            sources[name] = DEFAULT_SETTING.get(name, "default")
    return sources
