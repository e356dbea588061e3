"""The Tasks framework's names: Django's own (6.1+) or the django-tasks backport's (5.2, 6.0).

Every module of the package imports them from here, never from django.tasks or django_tasks:
the choice is made once, at import, by the installed Django's version. On 6.1 a project may
also have the backport (Wagtail pulls it in): tasks declared with either decorator land on
the same backend (both build the backend's task_class), and send() sends the backport's
signals beside Django's.
"""

import logging
import sys
import types
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings
from django.core.checks.registry import registry
from django.core.exceptions import ImproperlyConfigured
from django.dispatch import Signal
from django.utils.log import RequireDebugFalse, RequireDebugTrue

# Django 6.0 has django.tasks too, but its @task drops the options of the backend's
# task_class (max_attempts, unique, ...): 6.0 goes through the backport, as 5.2 does.
if TYPE_CHECKING or django.VERSION >= (6, 1):
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.dummy import DummyBackend
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import TASK_REFRESH_ATTRS, TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"  # the package (and logger) name of the framework in use
    OTHER_SIGNALS = "django_tasks.signals"
else:  # pragma: no cover - the backport pairs of the test matrix run this branch
    try:
        import django_tasks  # noqa: F401
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"django-jobstate needs the django-tasks backport on Django "
            f"{django.get_version()} (Django 6.1 has the Tasks framework built in): "
            f"pip install 'django-jobstate[backport]'."
        ) from exc
    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.backends.dummy import DummyBackend
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.base import TASK_REFRESH_ATTRS, Task, TaskError

    # The backport's names for Django's InvalidTask and InvalidTaskBackend.
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK = "django_tasks"
    OTHER_SIGNALS = "django.tasks.signals"

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "TASK_REFRESH_ATTRS",
    "BaseTaskBackend",
    "DummyBackend",
    "ImmediateBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "audible",
    "default_task_backend",
    "normalize_json",
    "reported_by_the_backport",
    "send",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

_NAMES = {id(task_enqueued): "task_enqueued", id(task_started): "task_started"}
_NAMES[id(task_finished)] = "task_finished"
# Django's logging filters that read the settings, not the record: the DEBUG each passes.
_DEBUG_FILTERS: dict[type, bool] = {RequireDebugFalse: False, RequireDebugTrue: True}


def send(signal: Signal, sender: type, **kwargs: Any) -> list[tuple[Any, Any]]:
    """Send one of the framework's signals, and the other framework's namesake when that one
    is in use: on Django 6.1, the backport's, once anything imported django_tasks.signals
    (its app, or an app that connects receivers to it); with the backport, Django's.

    A module nobody imported has no receivers: looking in sys.modules (not importing it)
    costs nothing and leaves a project without the other framework untouched.
    """
    responses = []
    for each in _namesakes(signal):
        responses += each.send(sender, **kwargs)
    return responses


def _namesakes(signal: Signal) -> list[Signal]:
    """`signal`, and the other framework's signal of its name if that one is in use (never
    the same receivers twice)."""
    other = getattr(sys.modules.get(OTHER_SIGNALS), _NAMES[id(signal)], signal)
    return [signal] if other is signal else [signal, other]


def audible(signal: Signal, sender: type, level: int = logging.INFO) -> bool:
    """Whether send(signal, sender, ...) could do anything: False only when each framework's
    namesake has no receiver but the framework's own log receiver, and no handler would
    emit that receiver's record at `level`.

    Django's default LOGGING enables the `django` logger at INFO with handlers that drop
    such a record unless DEBUG: a worker would build a TaskResult and a log record per
    attempt for nothing (a sixth of a no-op drain's time). Anything not known to drop (a
    receiver of the project's, a filter of its own) counts as audible.
    """
    for each in _namesakes(signal):
        try:
            sync, asynchronous = each._live_receivers(sender)
        except Exception:  # pragma: no cover - a Django whose Signal differs: send
            return True
        for receiver in [*sync, *asynchronous]:
            module = sys.modules.get(getattr(receiver, "__module__", ""))
            if getattr(module, "log_" + _NAMES[id(signal)], None) is not receiver:
                return True
            if not _drops(getattr(module, "logger", None), level):
                return True
    return False


def _drops(logger: Any, level: int) -> bool:
    """Whether a record of `logger` at `level` reaches no handler that may emit it."""
    if not isinstance(logger, logging.Logger):
        return False
    if not logger.isEnabledFor(level):
        return True
    if logger.filters or not _stock(type(logger), _LOGGER_METHODS):
        return False  # e.g. Sentry's breadcrumbs, which patch Logger.callHandlers
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return False
    found = False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            found = True
            if level < handler.level or type(handler) is logging.NullHandler:
                continue
            if not _stock(type(handler), ("handle", "filter")):
                return False
            passes = [_DEBUG_FILTERS.get(type(f)) for f in handler.filters]
            if all(debug == settings.DEBUG for debug in passes):
                return False  # it emits (no filter, or DEBUG as its filters want)
            if None in passes:
                return False  # a filter of the project's may let the record through
        current = current.parent if current.propagate else None
    last = logging.lastResort
    return found or last is None or level < last.level


# What a Logger does with a record on its way to the handlers: a project's override or patch
# of any of them may read records that no handler emits.
_LOGGER_METHODS = (
    *("debug", "info", "log", "error", "exception"),
    *("_log", "makeRecord", "handle", "callHandlers"),
)


def _stock(kind: type, names: tuple[str, ...]) -> bool:
    """Whether `kind`'s methods `names` are the logging module's own functions: their code
    is in its file (a wrapper that copies the wrapped one's name and module is not)."""
    for name in names:
        method = getattr(kind, name, None)
        if type(method) is not types.FunctionType:
            return False
        if method.__code__.co_filename != logging.__file__:
            return False
    return True


def reported_by_the_backport(backend: BaseTaskBackend) -> bool:
    """Whether `backend` is django.tasks' instance of an alias that the backport's check of
    TASKS reports too: then this one stays quiet, so that `manage.py check` lists each error
    once (Django 6.1 with the django_tasks app; 6.0 where something imported django.tasks).

    Each framework checks every alias with an instance of its own. The backport's app
    registers its check at start-up, so it runs in every pass; Django's runs only if
    django.tasks was imported before the pass began (importing our backend, during the
    backport's check, is too late). So the backport's instance is the one that reports.
    """
    backport_checks = sys.modules.get("django_tasks.checks")
    django_tasks = sys.modules.get("django.tasks")
    if backport_checks is None or django_tasks is None:
        return False
    if backport_checks.check_tasks not in registry.get_checks():
        return False
    held = django_tasks.task_backends.all(initialized_only=True)
    return any(instance is backend for instance in held)
