"""Concurrency limits of a task: the key a call is limited under, and the options' checks.

`@task(concurrency=N)` lets at most N attempts of the task run at once across every
worker and host; with `concurrency_key=["customer_id"]`, at most N per value of those
bound arguments. A per-task limit is a key limit whose key is the task path alone: one
mechanism for both. The database enforces it with slots: a live keyed row holds one of
its key's slots 1..N (a unique index on (key, slot) over live rows, and a CHECK that the
slot is within the limit), or waits for one, held (`hold = "limit"`) out of the claim's
index. Enqueue gives a new row the lowest free slot or holds it; a row that finishes
gives its slot to the oldest held row of its key in claim order (managers/limits.py).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..payload import ARGS, encode_payload
from ..states import State
from ..tasksapi import InvalidTask, Task
from ..uniqueness import _digest, refuse_unknown_parameters

# A SMALLINT column holds the limit and the slot.
MAX_CONCURRENCY = 32767


class Hold(models.TextChoices):
    LIMIT = "limit", _("Waiting for a slot of its concurrency limit")
    # Claimable, but only by the claim of its task's rate (limits/rates.py), apart.
    RATE = "rate", _("Started at its task's rate")
    # A step of a workflow, or a task enqueued with depends_on: it waits until every task
    # it depends on succeeded (managers/deps.py releases it).
    DEPS = "deps", _("Waiting for the tasks it depends on")


# The rows that hold a slot of their key: the condition of the unique index on
# (concurrency_key, concurrency_slot). "Live" is "not finished", as models.py explains for
# jobstate_job_one_live_attempt.
HOLDS_SLOT = Q(finished_at=None, concurrency_slot__isnull=False)
# The rows that wait for a slot: not claimable (not in the runnable index).
HELD = Q(state=State.QUEUED, hold=Hold.LIMIT)


def validate_concurrency(task: Task) -> None:
    """Refuse bad concurrency options of `task`, naming it (InvalidTask, at import)."""
    name = task.module_path
    limit = getattr(task, "concurrency", None)
    params = getattr(task, "concurrency_key", None)
    if limit is None:
        if params is not None:
            raise InvalidTask(
                f"concurrency_key of task {name!r} needs concurrency=N too: how many may "
                f"run at once per key (e.g. concurrency=1 for one at a time)."
            )
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CONCURRENCY:
        raise InvalidTask(
            f"concurrency of task {name!r} must be a whole number from 1 to {MAX_CONCURRENCY} "
            f"(how many attempts may run at once), not {limit!r}."
        )
    if params is None:
        return
    if isinstance(params, str) or not isinstance(params, Sequence) or not params:
        raise InvalidTask(
            f"concurrency_key of task {name!r} must be a non-empty list of its parameters' "
            f"names, not {params!r} (leave it out to limit the task as a whole)."
        )
    refuse_unknown_parameters(task, "concurrency_key", params)


def is_limited(task: Task) -> bool:
    return getattr(task, "concurrency", None) is not None


def concurrency_key(task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The stored key (a SHA-256 hex digest) of one call of a limited `task`: the task
    path, with the bound values of the concurrency_key parameters (defaults applied)."""
    material: dict[str, Any] = {"concurrency": task.module_path}
    params = getattr(task, "concurrency_key", None)
    if params:
        try:
            bound = inspect.signature(task.func).bind(
                *([None] if task.takes_context else []), *args, **kwargs
            )
        except TypeError as exc:
            raise TypeError(
                f"Cannot enqueue task {task.module_path!r}: its arguments do not match "
                f"{task.name}(): {exc}."
            ) from None
        bound.apply_defaults()
        material["args"] = {name: bound.arguments[name] for name in params}
    try:
        text = json.dumps(material, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        material["args"] = encode_payload(material["args"], ARGS)[0]
        text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return _digest(text)
