"""The benchmark's in-Django half: one command per call, under one runner's settings.

`python -m bench.benchmark.bench_helper COMMAND [ARG...]`, run by bench.py from the repository root
with DJANGO_SETTINGS_MODULE and BENCH_DB* set, prints one line of JSON. This module knows
each system's table (bench_rows.py); bench.py knows neither Django nor the systems.
"""

from __future__ import annotations

import bisect
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import django

from bench.benchmark.fair_helper import fair_rounds
from bench.common import wait_for


def seed(rows: Any, n: str, task: str = "noop") -> dict[str, Any]:
    """Enqueue `n` jobs of `task` (no-op by default) by the fastest path the system offers
    (setup, not timed)."""
    started = time.perf_counter()
    path = rows.seed(int(n), rows.task(task))
    return {"path": path, "seconds": time.perf_counter() - started}


def enqueue(rows: Any, mode: str, n: str) -> dict[str, Any]:
    """Time `n` enqueues: one `task.enqueue()` each, in autocommit, or one bulk call."""
    count = int(n)
    task = rows.noop
    started = time.perf_counter()
    if mode == "single":
        for _ in range(count):
            task.enqueue()
        path = "task.enqueue()"
    else:
        bulk = getattr(task.get_backend(), "bulk_enqueue", None)
        if bulk is None:
            return {"rate": None, "path": None}
        bulk_enqueue(bulk, task, count)
        path = "backend.bulk_enqueue()"
    seconds = time.perf_counter() - started
    if rows.jobs().count() != count:
        raise RuntimeError(f"{path}: {rows.jobs().count()} rows for {count} enqueues")
    return {"rate": count / seconds, "seconds": seconds, "n": count, "path": path}


def bulk_enqueue(bulk: Callable[..., Any], task: Any, count: int) -> Any:
    """The assumed bulk API: `backend.bulk_enqueue(task, [(args, kwargs), ...])`."""
    return bulk(task, [((), {})] * count)


def history(rows: Any, n: str, mode: str) -> dict[str, Any]:
    """Pre-fill `n` terminal rows: "inserted" directly, or "churned" through the queue."""
    started = time.perf_counter()
    rows.insert_history(int(n), churned=mode == "churned")
    return {"seconds": time.perf_counter() - started, "rows": int(n), "mode": mode}


def retire(rows: Any) -> dict[str, Any]:
    """Turn the drained no-op jobs into history (relabel them), so the next drain counts
    alone; jobs a stopped drain left unfinished are deleted."""
    return {"rows": rows.retire()}


def maintain(rows: Any) -> dict[str, Any]:
    """VACUUM ANALYZE (PostgreSQL) or ANALYZE (SQLite) the jobs table."""
    started = time.perf_counter()
    rows.maintain()
    return {"seconds": time.perf_counter() - started}


def table_stats(rows: Any) -> dict[str, Any]:
    return rows.table_stats()


def check(rows: Any, expected: str, partial: str = "", task: str = "noop") -> dict[str, Any]:
    """Did every no-op job succeed exactly once? And the span from first start to last end.

    `partial`: the workers were stopped early (a time budget), so unfinished jobs are
    expected; every finished one must still have succeeded, once.
    """
    jobs = rows.jobs(rows.task(task))
    total = jobs.count()
    succeeded = jobs.filter(rows.succeeded_q).count()
    done = jobs.filter(rows.terminal_q).count()
    reruns = rows.reruns(jobs.filter(rows.terminal_q))
    first, last = rows.span(jobs)
    problems = []
    if total != int(expected):
        problems.append(f"{total} rows for {expected} jobs")
    if succeeded != (done if partial else int(expected)):
        problems.append(f"{succeeded} of {expected} jobs succeeded ({done} finished)")
    if reruns:
        problems.append(f"{reruns} jobs ran more than once")
    return {
        "total": total,
        "succeeded": succeeded,
        "done": done,
        "reruns": reruns,
        "first_start": first,
        "last_finish": last,
        "span": None if first is None or last is None else last - first,
        "problems": problems,
    }


def feed(rows: Any, rate: str, seconds: str, wait: str) -> dict[str, Any]:
    """Enqueue at a steady `rate` for `seconds` to a running worker, then wait for the end.

    A warm-up job goes first: once it is done, the worker is up and polling.
    """
    rows.warmup.enqueue()
    if not wait_for(lambda: rows.done(rows.warmup) >= 1, float(wait)):
        raise RuntimeError(f"the worker did not run the warm-up job within {wait} s")
    time.sleep(1.0)  # a phase unrelated to the worker's last poll
    count, started = enqueue_steadily(rows.noop, rate, seconds)
    fed_in = time.perf_counter() - started
    finished = wait_for(lambda: rows.done(rows.noop) >= count, float(wait))
    return {"fed": count, "seconds": fed_in, "done": rows.done(rows.noop), "finished": finished}


def wait_done(rows: Any, expected: str, timeout: str, task: str = "noop") -> dict[str, Any]:
    job = rows.task(task)
    finished = wait_for(lambda: rows.done(job) >= int(expected), float(timeout))
    return {"finished": finished, "done": rows.done(job)}


def seed_and_wait(rows: Any, n: str, timeout: str) -> dict[str, Any]:
    """Enqueue `n` no-op jobs in bulk to running workers, then wait until all have run."""
    seed(rows, n)
    return wait_done(rows, n, timeout)


def urgent(rows: Any, rate: str, seconds: str, wait: str) -> dict[str, Any]:
    """While workers drain a backlog: enqueue high-priority jobs at a steady `rate` for
    `seconds`, then wait until they have all run (the backlog may still be going)."""
    job, backlog = rows.task("urgent"), rows.task("backlog")
    if not wait_for(lambda: rows.done(backlog) >= 1, float(wait)):
        raise RuntimeError(f"the workers did not start on the backlog within {wait} s")
    time.sleep(0.5)  # well into the backlog
    count, _ = enqueue_steadily(job, rate, seconds)
    finished = wait_for(lambda: rows.done(job) >= count, float(wait))
    left = rows.jobs(backlog).exclude(rows.terminal_q).count()
    return {"fed": count, "done": rows.done(job), "finished": finished, "backlog_left": left}


def enqueue_txn(rows: Any, n: str) -> dict[str, Any]:
    """A single enqueue inside the caller's transaction, the way Django code enqueues
    (in a view under ATOMIC_REQUESTS, a service function in `atomic()`): the time of the
    `enqueue()` call alone, once the transaction has begun (the caller's first statement,
    untimed: the driver sends BEGIN with it, and the caller pays it with or without an
    enqueue); its COMMIT (the caller's own, shared with its other writes) untimed too.
    Against it: one enqueue in autocommit, timed with its own COMMIT. Also: the enqueue as
    the transaction's first statement, BEGIN included."""
    from django.db import connection, transaction

    count, task = int(n), rows.noop
    inside = first = own = 0.0
    for _ in range(count):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # the caller's own work began the transaction
            t0 = time.perf_counter()
            task.enqueue()
            inside += time.perf_counter() - t0
        with transaction.atomic():
            t0 = time.perf_counter()
            task.enqueue()
            first += time.perf_counter() - t0
        t0 = time.perf_counter()
        task.enqueue()
        own += time.perf_counter() - t0
    if rows.jobs().count() != 3 * count:
        raise RuntimeError(f"{rows.jobs().count()} rows for {3 * count} enqueues")
    # Beside the bare INSERT that enqueue() sends, sent by hand (issue 28's target).
    from bench.benchmark.enqueue_cost import in_transaction

    bare = in_transaction(task.enqueue, count)
    return {
        "n": count,
        "in_transaction_us": inside / count * 1e6,
        "first_in_transaction_us": first / count * 1e6,
        "own_commit_us": own / count * 1e6,
        "ratio": inside / own,
        "bare_insert_us": bare["bare_insert_us"],
        "beside_insert_us": bare["enqueue_us"],
        "insert_ratio": bare["ratio"],
    }


def latencies(rows: Any, task: str = "noop") -> dict[str, Any]:
    """Milliseconds from each `task` job's enqueued_at to its started_at."""
    pairs = (
        rows.jobs(rows.task(task)).exclude(started_at=None).values_list("enqueued_at", "started_at")
    )
    return {"ms": sorted((s - e).total_seconds() * 1000 for e, s in pairs)}


def progress(rows: Any) -> dict[str, Any]:
    """For each epoch time on stdin (a JSON list): how many no-op jobs had finished by then."""
    times = json.loads(sys.stdin.read())
    ends = sorted(
        t.timestamp()
        for t in rows.jobs().exclude(finished_at=None).values_list("finished_at", flat=True)
    )
    return {"done": [bisect.bisect_right(ends, t) for t in times]}


def enqueue_steadily(task: Any, rate: str, seconds: str) -> tuple[int, float]:
    """Enqueue `task` at a steady `rate` per second for `seconds`: how many, and when the
    feed started (perf_counter)."""
    count = int(float(rate) * float(seconds))
    started = time.perf_counter()
    for k in range(count):
        delay = started + k / float(rate) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        task.enqueue()
    return count, started


def migrate(rows: Any) -> dict[str, Any]:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    rows.prepare_database()
    return {}


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    f.__name__: f
    for f in (
        migrate,
        seed,
        enqueue,
        history,
        retire,
        maintain,
        table_stats,
        check,
        feed,
        wait_done,
        seed_and_wait,
        urgent,
        enqueue_txn,
        latencies,
        progress,
        fair_rounds,
    )
}


def main(argv: list[str]) -> None:
    django.setup()
    from django.db import connections

    from bench.benchmark.bench_produce import produce, warm  # the load's (issue 28)

    COMMANDS.update({"produce": produce, "warm": warm})
    from bench.benchmark.bench_rows import rows_for_settings

    command, *args = argv
    try:
        result = COMMANDS[command](rows_for_settings(), *args)
    finally:
        connections.close_all()  # on SQLite, checkpoints the WAL into the file
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
