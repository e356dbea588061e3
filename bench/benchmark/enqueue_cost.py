"""What one `task.enqueue()` inside the caller's transaction costs beside the bare INSERT it
sends, side by side in one process; and the bulk enqueue rate.

    JOBSTATE_TEST_DB=sqlite|postgres|mysql [JOBSTATE_TEST_DB_NAME=...] \\
        python bench/benchmark/enqueue_cost.py [--quick] [N]

Runs against the database that tests.settings names (the script runs migrate). The bare
INSERT is the very statement an enqueue sends (caught once with an execute wrapper), sent
by hand with `cursor.execute()` and its rows fetched, a fresh result id each time: the
floor the database and the driver set. Both inside one transaction that the caller's own
first statement began, each call timed alone, the two interleaved call by call so that a
noisy machine hurts them alike; prints the medians and their ratio (the issue's target:
at most 1.5x). bench.py's `txn` figure reports the same (bench_helper.enqueue_txn()).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

_HEX = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def capture_insert(enqueue: Any) -> tuple[str, list[Any]]:
    """The INSERT statement and parameters one call of `enqueue()` sends."""
    from django.db import connection

    sent: list[tuple[str, list[Any]]] = []

    def catch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(catch):
        enqueue()
    inserts = [s for s in sent if s[0].lstrip().upper().startswith("INSERT")]
    if len(inserts) != 1:
        raise RuntimeError(f"expected one INSERT from an enqueue, saw: {sent}")
    return inserts[0]


def fresh(params: list[Any]) -> list[Any]:
    """`params` with every id (a UUID, or its hex) replaced by a new one, same form."""
    out: list[Any] = []
    for p in params:
        if isinstance(p, uuid.UUID):
            p = uuid.uuid4()
        elif isinstance(p, str) and _HEX.fullmatch(p):
            new = uuid.uuid4()
            p = new.hex if len(p) == 32 else str(new)
        out.append(p)
    return out


def in_transaction(enqueue: Any, n: int, rounds: int = 5) -> dict[str, Any]:
    """Median µs of one `enqueue()` and of its bare INSERT by hand, each inside a
    transaction already begun: `rounds` transactions of `n` pairs of calls, the two kinds
    interleaved call by call (a busy machine slows both alike)."""
    from django.db import connection, transaction

    sql, params = capture_insert(enqueue)
    ours: list[float] = []
    bare: list[float] = []
    for _ in range(rounds):
        prepared = [fresh(params) for _ in range(n)]  # by hand: values at the ready
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # the caller's own work began the transaction
            spent_ours = spent_bare = 0.0
            for i in range(n):
                t0 = time.perf_counter()
                enqueue()
                t1 = time.perf_counter()
                cursor.execute(sql, prepared[i])
                if cursor.description:  # RETURNING: read its rows, as enqueue() does
                    cursor.fetchall()
                t2 = time.perf_counter()
                spent_ours += t1 - t0
                spent_bare += t2 - t1
        ours.append(spent_ours / n * 1e6)
        bare.append(spent_bare / n * 1e6)
    us, bare_us = statistics.median(ours), statistics.median(bare)
    return {"n": n, "enqueue_us": us, "bare_insert_us": bare_us, "ratio": us / bare_us}


def bulk_rate(task: Any, n: int) -> float:
    """Jobs per second of one `bulk_enqueue()` of `n` calls, in its own transaction."""
    backend = task.get_backend()
    start = time.perf_counter()
    backend.bulk_enqueue(task, [(("x",), {})] * n)
    return n / (time.perf_counter() - start)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from django_jobstate.models import Job
    from tests.tasks import record

    args = [a for a in sys.argv[1:] if a != "--quick"]
    quick = "--quick" in sys.argv
    n = int(args[0]) if args else (100 if quick else 2000)
    call_command("migrate", verbosity=0)
    with transaction.atomic():
        Job.objects.all().delete()
    single = in_transaction(lambda: record.enqueue("x"), n, 2 if quick else 5)
    bulk = 2_000 if quick else 50_000
    rates = [bulk_rate(record, bulk) for _ in range(1 if quick else 3)]
    with transaction.atomic():
        Job.objects.all().delete()
    print(
        f"{connection.vendor:10} enqueue() in a transaction {single['enqueue_us']:7.1f} µs, "
        f"bare INSERT {single['bare_insert_us']:7.1f} µs, ratio {single['ratio']:.2f}; "
        f"bulk_enqueue x {bulk:,}: {statistics.median(rates):,.0f} jobs/s"
    )


if __name__ == "__main__":
    main()
