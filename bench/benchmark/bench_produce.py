"""The continuous load's producer and warm-up (issue 28), commands of bench_helper.

A producer enqueues a 1 ms load job (sync, or async for --in-flight workers) at a fixed
rate for a number of seconds: one `enqueue()` per job (autocommit), or `bulk_enqueue()` of
what is due every BULK_EVERY seconds (bench.py --bulk-every). It reports how many it
enqueued and how many were due (a producer that cannot keep up says so rather than
lowering the rate unseen).
"""

from __future__ import annotations

import time
from typing import Any

from bench.benchmark.bench_helper import bulk_enqueue
from bench.common import wait_for

BULK_EVERY = 0.1  # seconds between a bulk producer's batches


def produce(
    rows: Any, rate: str, seconds: str, mode: str, name: str, every: str = str(BULK_EVERY)
) -> dict[str, Any]:
    """Enqueue at `rate` per second until `seconds` have passed: what is due, one by one or
    every `every` s in bulk. A producer that falls behind (a loaded machine) enqueues
    fewer, never for longer: how many it enqueued, and how many were due. `name`: the
    load's task (bench_tasks)."""
    task, per_second, length, period = rows.task(name), float(rate), float(seconds), float(every)
    bulk = task.get_backend().bulk_enqueue
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < length:
        due = int(per_second * elapsed) + 1 - count
        if due <= 0:
            time.sleep((count - per_second * elapsed) / per_second)
        elif mode == "single":
            task.enqueue()
            count += 1
        else:
            bulk_enqueue(bulk, task, due)
            count += due
            time.sleep(max(0.0, period - (time.perf_counter() - started) % period))
    return {"fed": count, "due": int(per_second * length), "seconds": length}


def warm(rows: Any, wait: str) -> dict[str, Any]:
    """Enqueue the warm-up job and wait until it has run: the workers are up and polling."""
    rows.warmup.enqueue()
    if not wait_for(lambda: rows.done(rows.warmup) >= 1, float(wait)):
        raise RuntimeError(f"the workers did not run the warm-up job within {wait} s")
    return {}
