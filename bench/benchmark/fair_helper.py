"""The SQLite fairness figure's in-Django half (issue 28), run through bench_helper while
`runjobs --concurrency 2` drains a backlog of no-op jobs on the same SQLite file.

The writer is a Django view's write: in one `transaction.atomic()`, an application row
(the page a Wagtail editor publishes, say) and the job it enqueues, in a tight loop.
Rounds of three adjacent windows: the writer beside the drain, the drain alone, the writer alone
(the queue paused: the workers claim nothing, as with runjobs stopped). On a shared
machine the load moves from minute to minute: each ratio is taken within one round, and
the figure is the median round. After the last round the queue stays paused: the drain
ends there, and what is left of the backlog shows that it never ran out in a window.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.common import wait_for

PAGE_TABLE = "bench_fair_page"
SETTLE = 1.0  # seconds after the drain starts or resumes, before a window opens


def fair_rounds(rows: Any, seconds: str, rounds: str, wait: str = "120") -> dict[str, Any]:
    from django.db import connection
    from django.tasks import default_task_backend

    with connection.cursor() as cursor:  # the application's table (untimed)
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {PAGE_TABLE} "
            "(id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, saved_at TEXT NOT NULL)"
        )
    if not wait_for(lambda: rows.jobs().filter(rows.terminal_q).exists(), float(wait)):
        raise RuntimeError(f"the workers did not finish a job within {wait} s")
    time.sleep(SETTLE)
    backend: Any = default_task_backend
    out: list[dict[str, Any]] = []
    for n in range(int(rounds)):
        both = window(rows, float(seconds), write=True)  # first: any ramp after the resume
        drain = window(rows, float(seconds), write=False)  # counts against the ratios
        backend.pause_queue("default")
        running = rows.model._default_manager.filter(state=rows.State.RUNNING)
        if not wait_for(lambda running=running: not running.exists(), float(wait)):
            raise RuntimeError(f"the workers still ran jobs {wait} s after the pause")
        writer = window(rows, float(seconds), write=True)
        if n == int(rounds) - 1:  # the last: the drain stays paused, the backlog kept for `left`
            out.append(ratios(both, drain, writer))
            break
        backend.resume_queue("default")
        done = rows.model._default_manager.filter(rows.terminal_q)
        before = done.count()
        if not wait_for(lambda done=done, n=before: done.count() > n, float(wait)):
            raise RuntimeError(f"the workers did not resume within {wait} s")
        time.sleep(SETTLE)
        out.append(ratios(both, drain, writer))
    left = rows.jobs().exclude(rows.terminal_q).count()  # the backlog's, not the writer's
    return {
        "rounds": out,
        "writer_ratio": statistics.median(r["writer_ratio"] for r in out),
        "drain_ratio": statistics.median(r["drain_ratio"] for r in out),
        "writer_rate": statistics.median(r["writer"]["writer_rate"] for r in out),
        "drain_rate": statistics.median(r["drain"]["drain_rate"] for r in out),
        "writer_beside": statistics.median(r["both"]["writer_rate"] for r in out),
        "drain_beside": statistics.median(r["both"]["drain_rate"] for r in out),
        "writer_locked": sum(r[k]["writer_locked"] for r in out for k in ("both", "writer")),
        "left": left,
    }


def ratios(both: dict[str, Any], drain: dict[str, Any], writer: dict[str, Any]) -> dict[str, Any]:
    """A round: its three windows, and the two ratios they give."""
    return {
        "drain": drain,
        "both": both,
        "writer": writer,
        "writer_ratio": both["writer_rate"] / writer["writer_rate"],
        "drain_ratio": both["drain_rate"] / drain["drain_rate"],
    }


def window(rows: Any, seconds: float, *, write: bool) -> dict[str, Any]:
    """For `seconds`: run the writer, or only watch. Returns the writer's commits/s, the
    jobs/s finished meanwhile (any task), and the "database is locked" errors it met."""
    from django.db import OperationalError, connection, transaction
    from django.utils import timezone

    published = rows.task("published")
    commits = locked = 0
    longest = 0.0
    opened = timezone.now()
    started = time.perf_counter()
    end = started + seconds
    while write and (now := time.perf_counter()) < end:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"INSERT INTO {PAGE_TABLE} (title, saved_at) VALUES (%s, %s)",
                        [f"page {commits}", timezone.now().isoformat()],
                    )
                published.enqueue()
            commits += 1
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            locked += 1
        longest = max(longest, time.perf_counter() - now)
    if not write:
        time.sleep(seconds)
    elapsed = time.perf_counter() - started
    finished = rows.model._default_manager.filter(
        finished_at__gte=opened, finished_at__lt=timezone.now()
    ).count()
    return {
        "seconds": elapsed,
        "writer_rate": commits / elapsed,
        "writer_locked": locked,
        "writer_longest_ms": longest * 1000,
        "drain_rate": finished / elapsed,
    }
