"""System checks of the tasks: the task modules, the tasks workers would refuse, and
JOBSTATE_TASK_OPTIONS."""

import difflib
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning

from ..loading import (
    exposed_task,
    exposed_tasks,
    import_errors,
    is_task,
    is_task_module,
    load_task,
)
from ..task_options import SETTABLE, validate_options, with_settings
from ..tasksapi import InvalidTask, InvalidTaskBackend, task_backends
from .settings import JOBSTATE_BACKENDS, _raw


@register()
def check_task_modules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    listed = _raw("TASK_MODULES")
    if not isinstance(listed, list | tuple) or not all(isinstance(n, str) for n in listed):
        return [
            Error(
                f"JOBSTATE_TASK_MODULES must be a list of dotted module paths, not "
                f"{type(listed).__name__} {listed!r}.",
                hint='For example: JOBSTATE_TASK_MODULES = ["myproject.jobs"].',
                id="django_jobstate.E007",
            )
        ]
    messages: list[CheckMessage] = []
    for name in listed:
        try:
            found = importlib.util.find_spec(name) is not None  # imports its parents only
        except (ImportError, ValueError):
            found = False
        if not found:
            messages.append(
                Error(
                    f"JOBSTATE_TASK_MODULES lists {name!r}, which is not an importable module.",
                    hint="Workers import every listed module to find tasks: fix or remove it.",
                    id="django_jobstate.E008",
                )
            )
    if messages:
        return messages
    messages += [
        Error(
            f"The task module {name!r} cannot be imported: {error}",
            hint="Workers import every task module at start-up, and none of its tasks can be "
            "enqueued or run until it imports: fix the error in that module.",
            id="django_jobstate.E016",
        )
        for name, error in import_errors().items()
    ]
    return messages + _tasks_workers_would_refuse()


def _tasks_workers_would_refuse() -> list[CheckMessage]:
    """Warn of the tasks imported so far whose module no worker imports.

    Only the modules this process has imported (with the URLconf, that is most of them)
    can be seen; enqueue() refuses the others anyway. A task a task module imports (a
    third-party app's, re-exported) is exposed: workers find it.
    """
    messages: list[CheckMessage] = []
    for module_name, module in list(sys.modules.items()):
        for task in list(getattr(module, "__dict__", {}).values()):
            if (
                not is_task(task)
                or task.func.__module__ != module_name  # imported from elsewhere
                or is_task_module(module_name)
                or exposed_task(task.module_path, task.func) is not None
            ):
                continue
            try:
                backend = task_backends[task.backend]
            except InvalidTaskBackend:
                continue  # django.tasks reports a backend it cannot load
            if isinstance(backend, JOBSTATE_BACKENDS):
                messages.append(
                    CheckWarning(
                        f"Workers would refuse the task {task.module_path!r}, and enqueue() "
                        f"raises for it: {module_name!r} is not a task module of this "
                        f"project.",
                        hint=f"Define it in an installed app's `tasks` module (or import it "
                        f"there), or add {module_name!r} to JOBSTATE_TASK_MODULES.",
                        id="django_jobstate.W004",
                    )
                )
    return messages


@register()
def check_task_options(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """JOBSTATE_TASK_OPTIONS: known task paths, known options, values @task would take."""
    configured = _raw("TASK_OPTIONS")
    example = 'JOBSTATE_TASK_OPTIONS = {"app.tasks.name": {"max_attempts": 3}}'
    if not isinstance(configured, Mapping):
        return [_error(f"must be a dict of task paths, not {type(configured).__name__}", example)]
    if not configured or not apps.is_installed("django_jobstate"):
        return []
    messages: list[CheckMessage] = []
    for path, options in configured.items():
        if not isinstance(options, Mapping):
            messages.append(
                _error(f"[{path!r}] must be a dict of options, not {options!r}", example)
            )
            continue
        unknown = [name for name in options if name not in SETTABLE]
        for name in unknown:
            close = difflib.get_close_matches(str(name), SETTABLE, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            messages.append(
                _error(
                    f"[{path!r}] sets {name!r}, which is not an option it can set",
                    f"{hint}The options are: {', '.join(SETTABLE)}.",
                )
            )
        try:
            task = load_task(str(path))
        except InvalidTask as exc:
            close = difflib.get_close_matches(str(path), _known_paths(), n=1)
            hint = f"Did you mean {close[0]!r}?" if close else "Name a @task by its path."
            messages.append(_error(f"[{path!r}] names no task workers can run: {exc}", hint))
            continue
        if task.module_path != path:
            hint = f"Name it by its own path: {task.module_path!r}."
            problem = f"[{path!r}] names the task {task.module_path!r} by another path"
            messages.append(_error(problem, hint))
            continue
        if unknown:
            continue
        try:
            validate_options(with_settings(task))
        except InvalidTask as exc:
            messages.append(_error(f"[{path!r}]: {exc}", "Fix the value, as for @task(...)."))
    return messages


def _error(problem: str, hint: str) -> Error:
    separator = "" if problem.startswith("[") else " "
    return Error(
        f"JOBSTATE_TASK_OPTIONS{separator}{problem.rstrip('.')}.",
        hint=hint,
        id="django_jobstate.E015",
    )


def _known_paths() -> list[str]:
    return sorted(exposed_tasks())
