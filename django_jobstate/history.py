"""The admin dashboard's reads: what finished in a window, and what waits now.

Every figure is an aggregate the database computes over an index: the finished attempts
of the window come from jobstate_job_by_finished (a range of finished_at), the waiting
ones from the claim's index (jobstate_job_runnable; jobstate_job_claim_order on
MariaDB/MySQL). Nothing loads rows into Python. Run times and pickup latencies are
counted into fixed buckets in SQL, and their percentiles estimated from those counts
(`quantile()`, as Prometheus' histogram_quantile does): exact to within a bucket's width
(the bounds step 1, 2, 3, 5, 7 per decade), portable, one pass over the window's rows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, models
from django.db.models import Count, Max, Min, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from .db.clock import Now
from .querysets import JobQuerySet
from .states import FailureReason, State

# Upper bounds (seconds) of the run-time and latency buckets: 1 ms to 28 hours. A value
# at or past the last bound counts in a last, open bucket.
BOUNDS: tuple[float, ...] = (
    *(round(step * 10.0**exp, 6) for exp in range(-3, 5) for step in (1, 2, 3, 5, 7)),
    100_000.0,
)
# The windows the dashboard switches between: (length, width of a chart's bar).
WINDOWS: dict[str, tuple[timedelta, timedelta]] = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
}
# Failures that do not count against a task (nor in a failure rate): an operator's
# cancel, an attempt handed back before it started (its next attempt runs it).
NOT_THE_TASKS = (FailureReason.CANCELLED, FailureReason.RELEASED)


class Seconds(models.Func):
    """`end - start` in seconds (a float), in each database's own arithmetic (SQLite's
    julianday() counts whole milliseconds)."""

    output_field = models.FloatField()

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:  # type: ignore[override]
        end, start = (compiler.compile(expr) for expr in self.get_source_expressions())
        params = [*end[1], *start[1]]
        if connection.vendor == "postgresql":
            return f"EXTRACT(EPOCH FROM ({end[0]} - {start[0]}))", params
        if connection.vendor == "mysql":
            params = [*start[1], *end[1]]
            return f"(TIMESTAMPDIFF(MICROSECOND, {start[0]}, {end[0]}) / 1000000.0)", params
        return f"((julianday({end[0]}) - julianday({start[0]})) * 86400.0)", params


def bucket_sql(column: str, low: int = 0, high: int = len(BOUNDS)) -> str:
    """SQL for the index of the first bound `column` is below (len(BOUNDS) past the last):
    a CASE that bisects, so a row costs a handful of comparisons, not one per bound."""
    if low == high:
        return str(low)
    middle = (low + high) // 2  # below BOUNDS[middle]: low..middle
    return (
        f"CASE WHEN {column} < {BOUNDS[middle]!r} THEN {bucket_sql(column, low, middle)} "
        f"ELSE {bucket_sql(column, middle + 1, high)} END"
    )


def quantile(counts: list[int], q: float) -> float | None:
    """The q-quantile of the values counted in BOUNDS' buckets, linear within a bucket;
    None without values. In the last, open bucket: its lower bound."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, n in enumerate(counts):
        if n and seen + n >= rank:
            low = BOUNDS[index - 1] if index else 0.0
            if index >= len(BOUNDS):
                return low
            return low + (BOUNDS[index] - low) * (rank - seen) / n
        seen += n
    return BOUNDS[-1]


@dataclass
class Figures:
    """What finished in the window for one queue (or all of them), and what waits now."""

    succeeded: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # by failure reason
    bars: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    run_time: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    pickup: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    waiting: int = 0
    oldest_age: float | None = None  # seconds the longest-waiting due job has been due

    @property
    def failing(self) -> int:
        return sum(n for reason, n in self.failed.items() if reason not in NOT_THE_TASKS)

    @property
    def failure_rate(self) -> float | None:
        judged = self.succeeded + self.failing
        return self.failing / judged if judged else None

    def add(self, other: Figures) -> None:
        self.succeeded += other.succeeded
        self.failed.update(other.failed)
        for slot, outcomes in other.bars.items():
            self.bars[slot].update(outcomes)
        self.run_time = [a + b for a, b in zip(self.run_time, other.run_time, strict=True)]
        self.pickup = [a + b for a, b in zip(self.pickup, other.pickup, strict=True)]
        self.waiting += other.waiting
        if other.oldest_age is not None:
            self.oldest_age = max(self.oldest_age or 0.0, other.oldest_age)


def db_now(using: str) -> datetime:
    """Now by the database's clock (SQLite: this machine's, as the writes use)."""
    connection = connections[using]
    if connection.vendor == "sqlite":
        return timezone.now()
    sql = "UTC_TIMESTAMP(6)" if connection.vendor == "mysql" else "STATEMENT_TIMESTAMP()"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}")
        now: datetime = cursor.fetchone()[0]
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def window(name: str, now: datetime) -> tuple[datetime, int]:
    """The window's start (bars end with the current minute's) and its number of bars."""
    length, width = WINDOWS[name]
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return end - length, int(length / width)


def finished_figures(jobs: models.QuerySet[Any], start: datetime, width: timedelta) -> Any:
    """{queue: Figures} of the attempts that finished since `start`: two grouped reads."""
    figures: dict[str, Figures] = defaultdict(Figures)
    finished = jobs.filter(finished_at__gte=start).order_by()
    since = Seconds("finished_at", Value(start, output_field=models.DateTimeField()))
    outcomes = finished.values_list("queue_name", "state", "failure_reason").annotate(since=since)
    connection = connections[jobs.db]
    # Which bar: whole widths since the start (>= 0: SQLite has no FLOOR without its math
    # functions, and CAST truncates, which is the same here).
    slot = f"(outcomes.since / {width.total_seconds()!r})"
    slot = f"CAST({slot} AS INTEGER)" if connection.vendor == "sqlite" else f"FLOOR({slot})"
    keys = ["outcomes.queue_name", "outcomes.state", "outcomes.failure_reason", slot]
    for queue, state, reason, bar, n in _grouped(outcomes, "outcomes", keys):
        outcome = state if state == State.SUCCEEDED else reason
        figures[queue].bars[int(bar)][outcome] += n
        if state == State.SUCCEEDED:
            figures[queue].succeeded += n
        else:
            figures[queue].failed[reason] += n
    # Only attempts that started have a run time and a pickup latency (queued to started:
    # from enqueued_at or run_after, whichever is later).
    spans = finished.filter(started_at__isnull=False).values_list("queue_name")
    spans = spans.annotate(
        ran=Seconds("finished_at", "started_at"),
        waited=Seconds("started_at", Greatest("enqueued_at", "run_after")),
    )
    keys = ["spans.queue_name", bucket_sql("spans.ran"), bucket_sql("spans.waited")]
    for queue, ran, waited_for, n in _grouped(spans, "spans", keys):
        figures[queue].run_time[int(ran)] += n
        figures[queue].pickup[int(waited_for)] += n
    return figures


def _grouped(rows: models.QuerySet[Any], alias: str, keys: list[str]) -> list[tuple[Any, ...]]:
    """SELECT keys, COUNT(*) FROM (rows) AS alias GROUP BY keys (SQL over alias' columns).

    The values to group by (seconds, then a bar or a bucket) are computed in a subquery,
    and grouped over it: each is computed once per row, and PostgreSQL, which cannot tell
    how many groups an expression over the table's columns makes, would take every row
    for a group of its own and sort the whole window (5 s for a million rows); over the
    subquery's columns it expects a few thousand and hashes them. OFFSET 0 keeps
    PostgreSQL from merging the subquery back; the others need no fence (and refuse
    OFFSET alone).
    """
    connection = connections[rows.db]
    sql, params = rows.query.get_compiler(connection=connection).as_sql()
    fence = " OFFSET 0" if connection.vendor == "postgresql" else ""
    groups = ", ".join(str(i) for i in range(1, len(keys) + 1))  # by position
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(keys)}, COUNT(*) FROM ({sql}{fence}) AS {alias} GROUP BY {groups}",
            params,
        )
        return list(cursor.fetchall())


def waiting_figures(jobs: JobQuerySet) -> dict[str, tuple[int, float]]:
    """{queue: (due jobs, seconds the oldest has been due)}, paused queues' included."""
    due = jobs.due().order_by().values("queue_name")
    rows = due.annotate(n=Count("pk"), age=Now() - Min("run_after"))
    return {row["queue_name"]: (row["n"], max(0.0, row["age"].total_seconds())) for row in rows}


def failing_tasks(
    jobs: models.QuerySet[Any], start: datetime, queue: str | None = None, limit: int = 10
) -> list[dict[str, Any]]:
    """The tasks with the most failures since `start` (cancels and hand-backs aside), each
    with its attempts finished, failures, and the last failure's error."""
    finished = jobs.filter(finished_at__gte=start).order_by()
    if queue is not None:
        finished = finished.filter(queue_name=queue)
    failing = Q(state=State.FAILED) & ~Q(failure_reason__in=NOT_THE_TASKS)
    rows = list(
        finished.values("task_path")
        .annotate(
            failed=Count("pk", filter=failing),
            finished=Count("pk"),
            last_id=Max("pk", filter=failing),
        )
        .filter(failed__gt=0)
        .order_by("-failed", "task_path")[:limit]
    )
    errors = jobs.filter(pk__in=[row["last_id"] for row in rows]).values_list(
        "pk", "error_class", "error_message", "failure_reason", "finished_at"
    )
    last = {pk: rest for pk, *rest in errors}
    for row in rows:
        error_class, message, reason, at = last.get(row["last_id"], ("", "", "", None))
        row.update(error_class=error_class, error_message=message, reason=reason, last_at=at)
    return rows
