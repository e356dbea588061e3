"""Unique jobs: the key a call of a unique task is enqueued under, and the options' checks.

`@task(unique=True)` keys a call on the task and all its bound arguments (defaults
applied: `f(1)`, `f(x=1)` and `f(1, reason="")` are one key), `unique=["account_id"]` on
those parameters only, and `task.using(unique_key="...")` on an explicit key. The
database holds at most one live (or, with `unique_scope="queued"`, one queued) attempt
per key: two partial unique indexes on Job.unique_key (models.py), which the enqueue's
INSERT ... ON CONFLICT DO NOTHING and a retry's INSERT meet (managers/enqueue.py,
managers/outcomes.py).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .payload import ARGS, encode_payload
from .states import State
from .tasksapi import InvalidTask, Task


class UniqueScope(models.TextChoices):
    LIVE = "live", _("Live: at most one queued or running")
    QUEUED = "queued", _("Queued: at most one waiting; one more may run")


ON_DUPLICATE = ("return", "raise")

# The rows that hold a key, per scope: the conditions of the unique indexes, which an
# enqueue's ON CONFLICT clause and its look-up of the holder repeat (managers/enqueue.py).
# "Live" is "not finished", as models.py explains for jobstate_job_one_live_attempt.
HOLDS_KEY = {
    UniqueScope.LIVE: Q(unique_scope=UniqueScope.LIVE, finished_at=None),
    UniqueScope.QUEUED: Q(unique_scope=UniqueScope.QUEUED, state=State.QUEUED),
}
# The names of those indexes (models.py).
KEY_INDEX = {
    UniqueScope.LIVE: "jobstate_job_unique_live",
    UniqueScope.QUEUED: "jobstate_job_unique_queued",
}


def validate_unique(task: Task) -> None:
    """Refuse bad uniqueness options of `task`, naming it (InvalidTask, at import)."""
    unique = getattr(task, "unique", False)
    name = task.module_path
    if isinstance(unique, str) or not isinstance(unique, bool | Sequence):
        raise InvalidTask(
            f"unique of task {name!r} must be True, False or a list of its parameters' "
            f"names, not {unique!r}."
        )
    if not isinstance(unique, bool):
        if not unique:
            raise InvalidTask(
                f"unique of task {name!r} names no parameter: use unique=True to key on "
                f"the task alone with all its arguments."
            )
        refuse_unknown_parameters(task, "unique", unique)
    scope = getattr(task, "unique_scope", UniqueScope.LIVE)
    if scope not in UniqueScope.values:
        raise InvalidTask(
            f"unique_scope of task {name!r} must be one of {', '.join(UniqueScope.values)}, "
            f"not {scope!r}."
        )
    on_duplicate = getattr(task, "on_duplicate", "return")
    if on_duplicate not in ON_DUPLICATE:
        raise InvalidTask(
            f"on_duplicate of task {name!r} must be one of {', '.join(ON_DUPLICATE)}, "
            f"not {on_duplicate!r}."
        )
    key = getattr(task, "unique_key", None)
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidTask(f"unique_key of task {name!r} must be a non-empty string, not {key!r}.")


def is_unique(task: Task) -> bool:
    return bool(getattr(task, "unique", False)) or getattr(task, "unique_key", None) is not None


def unique_key(task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The stored key (a SHA-256 hex digest) of one call of a unique `task`.

    An explicit key is hashed apart from derived ones, so that the two never collide.
    """
    explicit = getattr(task, "unique_key", None)
    if explicit is not None:
        return _digest(f"explicit:{explicit}")
    func = task.func
    try:
        bound = inspect.signature(func).bind(
            *([None] if task.takes_context else []), *args, **kwargs
        )
    except TypeError as exc:
        raise TypeError(
            f"Cannot enqueue unique task {task.module_path!r}: its arguments do not match "
            f"{task.name}(): {exc}."
        ) from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if task.takes_context:
        del arguments[next(iter(arguments))]
    unique = getattr(task, "unique", True)
    if not isinstance(unique, bool):
        arguments = {name: arguments[name] for name in unique}
    material = {"task": task.module_path, "args": arguments}
    try:
        text = json.dumps(material, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        # Keys as the stored arguments read back (bytes as text, tuples as lists, ...), or
        # the payload's own error, which says what cannot be JSON.
        material["args"] = encode_payload(arguments, ARGS)[0]
        text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return _digest(text)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _parameters(task: Task) -> list[str]:
    names = list(inspect.signature(task.func).parameters)
    return names[1:] if task.takes_context else names


def refuse_unknown_parameters(task: Task, option: str, names: Sequence[str]) -> None:
    """InvalidTask if `option` (unique, concurrency_key) names a parameter `task` lacks."""
    known = _parameters(task)
    unknown = [p for p in names if p not in known]
    if unknown:
        raise InvalidTask(
            f"{option} of task {task.module_path!r} names {', '.join(map(repr, unknown))}, "
            f"which {'is not a parameter' if len(unknown) == 1 else 'are not parameters'} "
            f"of {task.name}(); its parameters are: {', '.join(known) or 'none'}."
        )
