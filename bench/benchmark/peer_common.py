"""What the two peers (Celery, Procrastinate) share in their own environments.

Neither peer keeps a row per finished job that the benchmark could count, so every task
body records itself: one RPUSH to a Redis list of "tag enqueued started finished" (epoch
seconds; one host clock), one round trip per job, for both peers alike. From that list the
benchmark counts jobs run twice and jobs missing (exactly-once), the drain's span, and
pickup latencies. Imports only `redis`: it runs under each peer's own interpreter, never
django-jobstate's.

`python -m bench.benchmark.peer_celery COMMAND [ARG...]` (or peer_procrastinate) prints one line of
JSON, like bench_helper: the commands are the functions in `commands()`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from bench.common import wait_for

LOG = "bench:log"
SLEEP = 0.1  # the I/O-bound job's wait, as django-jobstate's bench_tasks.io_sleep


def client() -> redis.Redis:
    return redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])


def line(tag: str, enqueued: float, started: float) -> str:
    return f"{tag} {enqueued:.6f} {started:.6f} {time.time():.6f}"


def records(prefix: str = "") -> list[tuple[str, float, float, float]]:
    out = []
    for raw in client().lrange(LOG, 0, -1):
        tag, enqueued, started, finished = raw.decode().split()
        if tag.startswith(prefix):
            out.append((tag, float(enqueued), float(started), float(finished)))
    return out


def tags(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


class Peer:
    """One peer's enqueue paths; the rest (checks, feeds) is common."""

    def reset(self) -> None:
        """Empty its queue (and the record): a fresh start for the next figure."""
        client().delete(LOG)

    def migrate(self) -> None:
        self.reset()

    def enqueue(self, task: str, items: list[tuple[str, float]], bulk: bool) -> str:
        """Enqueue one job of `task` per (tag, enqueued_at); return the path used."""
        raise NotImplementedError

    def queued(self) -> int:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {}


def seed(peer: Peer, n: str, task: str = "noop") -> dict[str, Any]:
    started = time.perf_counter()
    now = time.time()
    path = peer.enqueue(task, [(t, now) for t in tags(task, int(n))], bulk=True)
    return {"path": path, "seconds": time.perf_counter() - started}


def enqueue(peer: Peer, mode: str, n: str) -> dict[str, Any]:
    count = int(n)
    items = [(t, 0.0) for t in tags("noop", count)]
    started = time.perf_counter()
    path = peer.enqueue("noop", items, bulk=mode == "bulk")
    seconds = time.perf_counter() - started
    if peer.queued() != count:
        raise RuntimeError(f"{path}: {peer.queued()} jobs queued for {count} enqueues")
    return {"rate": count / seconds, "seconds": seconds, "n": count, "path": path}


def check(peer: Peer, expected: str, partial: str = "", task: str = "noop") -> dict[str, Any]:
    """Exactly-once from the bodies' own records: each tag once, none missing."""
    rows = records(task + "-")
    counts = Counter(tag for tag, *_ in rows)
    want = set(tags(task, int(expected)))
    reruns = sum(c - 1 for c in counts.values())
    missing = len(want - set(counts))
    strange = len(set(counts) - want)
    done = len(counts)
    problems = []
    if reruns:
        problems.append(f"{reruns} runs of jobs that had already run")
    if missing and not partial:
        problems.append(f"{missing} of {expected} jobs never ran")
    if strange:
        problems.append(f"{strange} runs of jobs never enqueued")
    first = min((s for _, _, s, _ in rows), default=None)
    last = max((f for *_, f in rows), default=None)
    return {
        "total": int(expected),
        "succeeded": done,
        "done": done,
        "reruns": reruns,
        "missing": missing,
        "first_start": first,
        "last_finish": last,
        "span": None if first is None or last is None else last - first,
        "problems": problems,
    }


def wait_done(peer: Peer, expected: str, timeout: str, task: str = "noop") -> dict[str, Any]:
    want = int(expected)
    r = client()
    finished = wait_for(lambda: r.llen(LOG) >= want, float(timeout), every=0.02)
    return {"finished": finished, "done": r.llen(LOG)}


def feed(peer: Peer, rate: str, seconds: str, wait: str) -> dict[str, Any]:
    """Enqueue at a steady rate to running workers; the bodies record their start."""
    r = client()
    peer.enqueue("noop", [("warmup-0", time.time())], bulk=False)
    if not wait_for(lambda: r.llen(LOG) >= 1, float(wait), every=0.02):
        raise RuntimeError(f"the worker did not run the warm-up job within {wait} s")
    time.sleep(1.0)
    count = int(float(rate) * float(seconds))
    started = time.perf_counter()
    for k in range(count):
        delay = started + k / float(rate) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        peer.enqueue("noop", [(f"lat-{k}", time.time())], bulk=False)
    fed_in = time.perf_counter() - started
    finished = wait_for(lambda: r.llen(LOG) >= count + 1, float(wait), every=0.02)
    return {"fed": count, "seconds": fed_in, "done": r.llen(LOG) - 1, "finished": finished}


def latencies(peer: Peer) -> dict[str, Any]:
    return {"ms": sorted((s - e) * 1000 for _, e, s, _ in records("lat-"))}


def info(peer: Peer) -> dict[str, Any]:
    return peer.info()


def reset(peer: Peer) -> dict[str, Any]:
    peer.reset()
    return {}


def migrate(peer: Peer) -> dict[str, Any]:
    peer.migrate()
    return {}


def commands() -> dict[str, Callable[..., dict[str, Any]]]:
    return {
        f.__name__: f
        for f in (migrate, reset, seed, enqueue, check, wait_done, feed, latencies, info)
    }


def main(peer: Peer, argv: list[str]) -> None:
    command, *args = argv
    print(json.dumps(commands()[command](peer, *args)))


if __name__ == "__main__":
    sys.exit("run bench.benchmark.peer_celery or bench.benchmark.peer_procrastinate")
