"""Periodic jobs: the definitions of TASKS[alias]["OPTIONS"]["SCHEDULES"] and their ticks.

A definition is data: `{"task": "app.tasks.f", "cron": "*/5 * * * *"}` (five fields, in
`timezone`, parsed by cronsim with Debian cron's daylight-saving rules) or `"every": 300`
(seconds, ticks anchored to the Unix epoch, so every process computes the same ones).
This module only computes: which ticks are due, which of them to enqueue by the catch-up
policy, and the tick after. scheduler.py writes them, once each, by the database clock.
"""

from __future__ import annotations

import hashlib
import json
import zoneinfo
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cronsim import CronSim, CronSimError

from ..conf import YEAR

if TYPE_CHECKING:
    from .model import Schedule

# "latest": of the ticks due, only the most recent; "all": every one, oldest first;
# "none": a tick only when none before it was missed. Each within max_lateness.
CATCH_UP = ("latest", "all", "none")
KEYS = {
    "task", "cron", "every", "args", "kwargs", "timezone", "queue", "priority", "unique",
    "catch_up", "max_lateness", "enabled",
}  # fmt: skip
DEFAULT_MAX_LATENESS = 3600.0
# A tick later than a year is not worth enqueueing; and `now - max_lateness` must stay a
# date (float("inf"), or some 6.4e10 s, would raise OverflowError at every tick).
MAX_LATENESS = YEAR
ALL_LIMIT = 100  # ticks enqueued per transaction under catch_up="all"
PRUNE_SCHEDULE = "jobstate.prune"  # the built-in schedule of JOBSTATE_RETENTION
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
MISSED_COUNT_LIMIT = 10_000  # ticks counted one by one as missed; past it, "at least"


class ScheduleError(ValueError):
    """A definition that cannot be scheduled; `kind` is "definition", "timezone", "task"
    or "options" (a key of TASKS[alias]["OPTIONS"]); `key`, the definition's key that is
    wrong, if one is (the admin's form shows the error beside its field)."""

    def __init__(self, message: str, kind: str = "definition", key: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.key = key


@dataclass(frozen=True)
class Plan:
    """What one due row becomes: the ticks to enqueue, the ticks missed, the next tick."""

    enqueue: list[datetime]
    missed: int
    next_tick_at: datetime


@dataclass(frozen=True)
class Definition:
    name: str
    task_path: str
    cron: str = ""
    every: float | None = None
    timezone: str = "UTC"
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue_name: str = "default"
    priority: int = 0
    unique: bool = False
    catch_up: str = "latest"
    max_lateness: float = DEFAULT_MAX_LATENESS
    enabled: bool = True
    backend: str = "default"

    @property
    def hash(self) -> str:
        """SHA-256 of the definition: the version a scheduler may tick with."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def expression(self) -> str:
        if self.every is not None:
            return f"every {self.every:g} s"
        return f"{self.cron} ({self.timezone})"

    def fields(self) -> dict[str, Any]:
        """The Schedule columns that store this definition."""
        values = asdict(self)
        del values["name"]
        return {**values, "definition_hash": self.hash}

    @classmethod
    def from_row(cls, row: Schedule) -> Definition:
        names = set(cls.__dataclass_fields__) - {"name"}
        return cls(name=row.name, **{n: getattr(row, n) for n in names})

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after `after` (aware), in UTC."""
        if self.every is not None:
            step = round(self.every * 1_000_000)
            elapsed = (after - EPOCH) // MICROSECOND
            return EPOCH + MICROSECOND * ((elapsed // step + 1) * step)
        ticks = CronSim(self.cron, after.astimezone(zoneinfo.ZoneInfo(self.timezone)))
        # A start in the second pass of a repeated hour may give a tick before it (cronsim
        # works on the wall clock there): the next ones are after it.
        for _ in range(3):
            tick = next(ticks).astimezone(UTC)
            if tick > after:
                return tick
        raise ScheduleError(f"Schedule {self.name!r}: no tick after {after.isoformat()}.")

    def plan(self, due: datetime, now: datetime) -> Plan:
        """The ticks from `due` (the row's next_tick_at) to `now` (the database's clock)."""
        floor = now - timedelta(seconds=self.max_lateness)
        missed, tick = 0, due
        if tick < floor:  # too late under every policy: count them, enqueue none
            first = self.next_tick(floor - MICROSECOND)
            while tick < first and missed < MISSED_COUNT_LIMIT:
                missed, tick = missed + 1, self.next_tick(tick)
            tick = max(tick, first)
        ticks = []
        while tick <= now:
            ticks.append(tick)
            tick = self.next_tick(tick)
            if self.catch_up == "all" and len(ticks) > ALL_LIMIT:
                return Plan(ticks[:ALL_LIMIT], missed, ticks[ALL_LIMIT])
        if self.catch_up == "all" or not ticks:
            return Plan(ticks, missed, tick)
        if self.catch_up == "none" and (missed or len(ticks) > 1):
            return Plan([], missed + len(ticks), tick)
        return Plan(ticks[-1:], missed + len(ticks) - 1, tick)


def relative(value: datetime | None, now: datetime) -> str:
    """'in 4 minutes', 'in 35 s', '2 hours ago': a tick's time from `now`, for people."""
    from django.utils.timesince import timesince, timeuntil

    if value is None:
        return "never"
    seconds = (value - now).total_seconds()
    if abs(seconds) < 60:
        text = f"{abs(seconds):.0f} s"
    else:
        text = timeuntil(value, now) if seconds > 0 else timesince(value, now)
    return f"in {text}" if seconds > 0 else f"{text} ago"


def parse(
    name: str, raw: Any, *, alias: str, queues: list[str], time_zone: str, where: str = ""
) -> Definition:
    """The Definition of SCHEDULES[name] (or of the admin's form), or ScheduleError saying
    what is wrong with it; `where` starts its messages."""
    where = where or f"Schedule {name!r} of TASKS[{alias!r}]"
    if not isinstance(raw, dict):
        raise ScheduleError(f"{where} must be a dict, not {type(raw).__name__}.")
    if unknown := sorted(set(raw) - KEYS):
        raise ScheduleError(
            f"{where} has unknown key(s) {', '.join(unknown)}; the keys are: "
            f"{', '.join(sorted(KEYS))}."
        )
    task_path = raw.get("task")
    if not isinstance(task_path, str) or "." not in task_path:
        raise ScheduleError(
            f'{where} needs "task": the dotted path of a @task, not {task_path!r}.', key="task"
        )
    if ("cron" in raw) == ("every" in raw):
        raise ScheduleError(f'{where} needs exactly one of "cron" and "every".')
    zone = raw.get("timezone", time_zone)
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(
            f"{where}: unknown time zone {zone!r}.", "timezone", "timezone"
        ) from None
    cron, every = raw.get("cron", ""), raw.get("every")
    if "cron" in raw:
        fields_ = cron.split() if isinstance(cron, str) else []
        try:
            if len(fields_) != 5:
                raise CronSimError("it needs five fields: minute hour day month weekday")
            CronSim(cron, datetime.now(UTC))
        except CronSimError as exc:
            raise ScheduleError(
                f"{where}: invalid cron expression {cron!r}: {exc}.", key="cron"
            ) from None
    elif isinstance(every, bool) or not isinstance(every, int | float) or not 1 <= every <= YEAR:
        raise ScheduleError(
            f'{where}: "every" must be a number of seconds from 1 to a year, not {every!r}.',
            key="every",
        )
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        raise ScheduleError(f'{where}: "args" must be a list and "kwargs" a dict.', key="args")
    queue = raw.get("queue", "default" if not queues or "default" in queues else queues[0])
    if not isinstance(queue, str) or (queues and queue not in queues):
        raise ScheduleError(
            f"{where}: queue {queue!r} is not one of its QUEUES {queues}.", key="queue"
        )
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ScheduleError(
            f'{where}: "priority" must be a whole number from -100 to 100, not {priority!r}.',
            key="priority",
        )
    catch_up = raw.get("catch_up", "latest")
    if catch_up not in CATCH_UP:
        raise ScheduleError(
            f'{where}: "catch_up" must be one of {", ".join(CATCH_UP)}.', key="catch_up"
        )
    lateness = raw.get("max_lateness", DEFAULT_MAX_LATENESS)
    if (
        isinstance(lateness, bool)
        or not isinstance(lateness, int | float)
        or not 1 <= lateness <= MAX_LATENESS
    ):
        raise ScheduleError(
            f'{where}: "max_lateness" must be a number of seconds from 1 to a year '
            f"({MAX_LATENESS}), not {lateness!r}.",
            key="max_lateness",
        )
    for key in ("unique", "enabled"):
        if not isinstance(raw.get(key, False), bool):
            raise ScheduleError(f'{where}: "{key}" must be True or False.', key=key)
    try:
        json.dumps([args, kwargs], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{where}: its arguments are not JSON: {exc}.", key="args") from None
    return Definition(
        name=name,
        task_path=task_path,
        cron=cron if "cron" in raw else "",
        every=float(every) if every is not None else None,
        timezone=zone,
        args=list(args),
        kwargs=dict(kwargs),
        queue_name=queue,
        priority=priority,
        unique=raw.get("unique", False),
        catch_up=catch_up,
        max_lateness=float(lateness),
        enabled=raw.get("enabled", True),
        backend=alias,
    )
