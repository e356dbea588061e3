"""Limits of a queue: at most N attempts running at once, and a rate of starts.

The settings give each queue its default, `TASKS[alias]["OPTIONS"]["QUEUE_LIMITS"] =
{"emails": {"concurrency": 4, "rate": "100/m"}}`; an operator's change at run time (the
admin's Queues page, `jobqueues limit`) is stored in the queue's JobQueue row and wins
until it is cleared, whatever a deploy says (the row's `limits_set_at` says it is set).
The claim enforces both (managers/queue_claim.py); this module only says what they are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# A SMALLINT column holds the limit (as Job.concurrency_limit does).
MAX_QUEUE_CONCURRENCY = 32767
WINDOWS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smhd])\s*$")
BACKEND = "django_jobstate.backend.JobStateBackend"


@dataclass(frozen=True)
class QueueLimits:
    concurrency: int | None = None
    rate: str = ""  # "" for none; else "count/unit", as parse_rate() reads it
    source: str = "settings"  # or "run time": the JobQueue row's

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or bool(self.rate)

    def describe(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"at most {self.concurrency} running")
        if self.rate:
            parts.append(f"rate {self.rate}")
        return ", ".join(parts) or "no limit"


def parse_rate(text: str) -> tuple[int, int]:
    """("count", seconds) of a rate such as "10/s", "100/m", "1000/h" or "5/d"."""
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is None or int(found.group(1)) < 1:
        raise ValueError(
            f"A rate is a positive whole number of starts per second, minute, hour or day, "
            f'such as "10/s", "100/m" or "1000/h"; not {text!r}.'
        )
    return int(found.group(1)), WINDOWS[found.group(2)]


def burst(rate: str) -> int:
    """How many tokens a queue's bucket holds at most: one second's worth, at least 1.
    So the starts in any window exceed the rate by at most that many (one claim batch),
    while a worker that claims once a poll interval can still keep up with the rate."""
    count, seconds = parse_rate(rate)
    return max(1, math.ceil(count / seconds))


def validate(queue: str, limits: Any) -> QueueLimits:
    """The QueueLimits of a QUEUE_LIMITS entry; ValueError saying what is wrong."""
    if not isinstance(limits, dict) or set(limits) - {"concurrency", "rate"}:
        raise ValueError(
            f'QUEUE_LIMITS[{queue!r}] must be a dict with "concurrency" and/or "rate", '
            f"not {limits!r}."
        )
    concurrency = limits.get("concurrency")
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_QUEUE_CONCURRENCY
    ):
        raise ValueError(
            f"QUEUE_LIMITS[{queue!r}]['concurrency'] must be a whole number from 1 to "
            f"{MAX_QUEUE_CONCURRENCY} (how many attempts of the queue may run at once), "
            f"not {concurrency!r}."
        )
    rate = limits.get("rate") or ""
    if rate:
        try:
            parse_rate(rate)
        except ValueError as exc:
            raise ValueError(f"QUEUE_LIMITS[{queue!r}]['rate']: {exc}") from None
    return QueueLimits(concurrency=concurrency, rate=rate.strip().replace(" ", ""))


_cache: tuple[int, dict[str, QueueLimits]] | None = None


def settings_limits() -> dict[str, QueueLimits]:
    """Each queue's limits from the settings of every JobStateBackend (the claim reads
    this for each batch: cached for as long as TASKS is the same object)."""
    global _cache
    tasks = getattr(settings, "TASKS", {})
    if _cache is not None and _cache[0] == id(tasks):
        return _cache[1]
    found: dict[str, QueueLimits] = {}
    for alias, backend in tasks.items():
        if backend.get("BACKEND") != BACKEND:
            continue
        for queue, limits in (backend.get("OPTIONS") or {}).get("QUEUE_LIMITS", {}).items():
            try:
                found[queue] = validate(queue, limits)
            except ValueError as exc:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: {exc}") from None
    _cache = (id(tasks), found)
    return found


def row_limits(row: Any) -> QueueLimits | None:
    """The run-time limits stored in a JobQueue row, or None when it sets none."""
    if row is None or row.limits_set_at is None:
        return None
    return QueueLimits(concurrency=row.concurrency, rate=row.rate or "", source="run time")


def effective(name: str, row: Any) -> QueueLimits:
    """What holds queue `name` now: its row's run-time limits, else the settings'."""
    return row_limits(row) or settings_limits().get(name) or QueueLimits()
