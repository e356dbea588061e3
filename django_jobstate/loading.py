"""Which modules a job row may name: the project's task modules, and nothing else.

A row's task_path is data, and anyone who can write the table chooses it. Importing it
would run the top-level code of any importable module, in the worker and in any process
that reads the row's result, before anything could check that it names a @task. So the
only modules ever imported on a row's behalf are the project's task modules: every
installed app's `tasks` module (found as the admin finds `admin` modules) and the ones
listed in JOBSTATE_TASK_MODULES, all imported once per process, whatever the row says, and
the submodules of those that are packages (a `tasks/` package of several files). Any other
module is looked up only if this process imported it already: no code runs for it.

A third-party app's task may be defined elsewhere and reach the project through a task
module's import (Wagtail's search task lives in `modelsearch.tasks` and is re-exported
by `wagtail.search.tasks`). Such a task is *exposed*: a row may name it by its own path,
because the Task object is found in a project task module's namespace, after the task
modules were imported; never because the row names its module, which is not imported
for it.

A task module that fails to import is remembered with its error (checks.py reports it)
rather than raised from every caller: one broken app must not turn every command into a
bare traceback.
"""

import functools
import sys
import types
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, TypeGuard

from django.apps import apps
from django.utils.module_loading import module_has_submodule

from .conf import get_settings
from .tasksapi import InvalidTask, Task


def how_to_allow(module_name: str) -> str:
    return (
        f"define the task in an installed app's `tasks` module (or import it there), or "
        f"add {module_name!r} to the JOBSTATE_TASK_MODULES setting"
    )


def is_task(obj: object) -> TypeGuard[Task]:
    """isinstance(obj, Task), without asking `obj`: a lazy object answers isinstance() by
    setting itself up, which runs code and may raise (django.contrib.admin's `site` without
    the admin app: the backport's django_stubs_ext imports that module in every project)."""
    return issubclass(type(obj), Task)


def task_modules() -> frozenset[str]:
    """Import the project's task modules (the first time) and return their names."""
    return _discover(tuple(get_settings().TASK_MODULES))[0]


def import_errors() -> dict[str, str]:
    """The task modules that failed to import, each with its error ("ImportError: ...")."""
    return dict(_discover(tuple(get_settings().TASK_MODULES))[1])


# Keyed by the setting, so that a test's override_settings gets its modules imported too.
@functools.cache
def _discover(listed: tuple[str, ...]) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    names = [
        f"{config.name}.tasks"
        for config in apps.get_app_configs()
        if module_has_submodule(config.module, "tasks")
    ]
    names += listed
    failed = []
    for name in names:
        try:
            import_module(name)
        except Exception as exc:  # any error of the module's own code
            failed.append((name, f"{type(exc).__name__}: {exc}"))
    return frozenset(names), tuple(failed)


def exposed_task(path: str, func: Callable[..., Any] | None = None) -> Task | None:
    """The Task whose own path is `path` (and, given `func`, of that function), found in a
    project task module's namespace.

    Reads only modules already imported (the task modules and their imported
    submodules): nothing is imported on the path's behalf.
    """
    for fresh in (False, True):
        if fresh:  # a name rebound in place (a reload) keeps the key: never refuse on it
            _exposed_in.cache_clear()
        found = exposed_tasks().get(path)
        if found is not None and (func is None or found.func is func):
            return found
    return None


def exposed_tasks() -> Mapping[str, Task]:
    """Every Task the project's task modules define or expose, by its own path.

    Built again only when the imported task modules change: enqueue() of an exposed task
    and a worker's load ask for it each time, and reading every task module's namespace
    costs more than the enqueue's own work. The key holds each module and the size of its
    namespace: a module imported since (a `tasks/` package's submodule), re-imported, or
    that grew (it was still being imported) makes a new map.
    """
    modules = tuple(_imported_task_modules())
    return _exposed_in(modules, tuple(len(getattr(m, "__dict__", ())) for m in modules))


@functools.lru_cache(maxsize=1)
def _exposed_in(
    modules: tuple[types.ModuleType, ...], sizes: tuple[int, ...]
) -> Mapping[str, Task]:
    return types.MappingProxyType(
        {
            obj.module_path: obj
            for module in modules
            for obj in list(getattr(module, "__dict__", {}).values())
            if is_task(obj)
        }
    )


def _imported_task_modules() -> list[types.ModuleType]:
    names = task_modules()
    packages = [f"{name}." for name in names if hasattr(sys.modules.get(name), "__path__")]
    found = [sys.modules[name] for name in names if name in sys.modules]
    if packages:  # a `tasks/` package: its submodules imported so far
        found += [
            module for name, module in list(sys.modules.items()) if name.startswith(tuple(packages))
        ]
    return found


def is_task_module(name: str) -> bool:
    """Whether `name` is one of the project's task modules, or inside one."""
    return any(name == m or name.startswith(f"{m}.") for m in task_modules())


def load_task(path: str) -> Task:
    """Return the Task at `path`, refusing anything that is not a Task object.

    Imports no module other than the project's task modules; see the module's docstring.
    """
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    if module is None and is_task_module(module_name):
        try:
            module = import_module(module_name)
        except Exception as exc:  # its own code's error, whatever it is
            raise InvalidTask(
                f"Cannot import the task {path!r}: {type(exc).__name__}: {exc}"
            ) from None
    if module is None and module_name and (exposed := exposed_task(path)) is not None:
        return exposed
    if module is None:
        why = (
            f"{module_name!r} is not a task module of this project, and workers import "
            f"no other (importing a module runs its code); {how_to_allow(module_name)}"
            if module_name
            else "it is not a dotted path to a task"
        )
        raise InvalidTask(f"Cannot import the task {path!r}: {why}.")
    # Not getattr(): a module's __getattr__ (PEP 562) may import more.
    obj = getattr(module, "__dict__", {}).get(name)
    if obj is None:
        raise InvalidTask(
            f"Cannot import the task {path!r}: module {module_name!r} has no {name!r}."
        )
    if not is_task(obj):
        raise InvalidTask(
            f"{path!r} is a {type(obj).__name__}, not a Task: only functions decorated "
            f"with @task can be run."
        )
    return obj


def check_loadable(task: Task) -> None:
    """Raise InvalidTask unless a worker would find `task` by its path."""
    module_name = task.module_path.rpartition(".")[0]
    if not is_task_module(module_name):
        if exposed_task(task.module_path, task.func) is not None:
            return  # a third-party app's task, imported by a task module
        raise InvalidTask(
            f"A worker would refuse the task {task.module_path!r}: its module "
            f"{module_name!r} is not a task module of this project, and workers import no "
            f"other; {how_to_allow(module_name)}."
        )
    try:
        importable = load_task(task.module_path).func is task.func
    except InvalidTask:
        importable = False
    if not importable:
        raise InvalidTask(
            f"A worker could not find the task {task.module_path!r} by its path: define it "
            f"with @task at the top level of a module, under the function's own name."
        )
