"""A rate per task: `@task(rate_limit="10/s")` starts at most that many attempts of the task
per second (minute, hour, day) across every worker and host.

The rate is written as a queue's is, and read by the same parser (queues.parse_rate). The
database enforces it with a token bucket per task (limits/fields.TaskRate: one small row
per rate-limited task), refilled at the rate and holding at most one second's worth
(queues.burst): the starts of any window exceed the rate by at most that many, one claim
batch. A rate-limited task's queued rows wait out of the claim's index (`hold = "rate"`),
so a backlog of them never slows the claim of other jobs; a worker takes them apart,
under the bucket row's lock, at most as many as the bucket holds (managers/rate_claim.py).
The rate counts starts, not running attempts: a retry's start spends a token too.
"""

from __future__ import annotations

from ..tasksapi import InvalidTask, Task
from .queues import parse_rate

# Enough for "32767/d" and the like; the column that keeps it on each row (fields.py).
MAX_RATE_LENGTH = 16


def normalized(rate: str) -> str:
    """The stored form of a rate: "10 / s" is "10/s"."""
    return rate.strip().replace(" ", "")


def validate_rate_limit(task: Task) -> None:
    """Refuse a bad rate_limit of `task`, naming it (InvalidTask, at import)."""
    rate = getattr(task, "rate_limit", None)
    if rate is None:
        return
    try:
        parse_rate(rate)
    except ValueError as exc:
        raise InvalidTask(f"rate_limit of task {task.module_path!r}: {exc}") from None
    if len(normalized(rate)) > MAX_RATE_LENGTH:
        raise InvalidTask(
            f"rate_limit of task {task.module_path!r} is longer than {MAX_RATE_LENGTH} "
            f"characters: {rate!r}."
        )


def rate_limit(task: Task) -> str | None:
    """The stored form of `task`'s rate_limit, or None when it has none."""
    rate = getattr(task, "rate_limit", None)
    return None if rate is None else normalized(rate)
