"""Celery on Redis, as the benchmark runs it, in its own environment (.venv-peers/celery).

The app (`-A bench.benchmark.peer_celery`) and the benchmark's commands (`python -m
bench.benchmark.peer_celery COMMAND`, see peer_common). Configured as Celery's "Optimizing"
guide says for many short tasks, throughput first: no result backend
(`task_ignore_result`), a large prefetch (`worker_prefetch_multiplier = 64`, the guide's
"64 or 128" for short tasks), rate limits off, the prefork pool with `-O fair` (the
default), and none of the cluster chatter (`--without-gossip --without-mingle
--without-heartbeat`). `task_acks_late` comes from
BENCH_CELERY_ACKS_LATE (the benchmark reports both). JSON messages, Celery's default.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from celery import Celery

if __package__ in (None, ""):
    sys.exit("run as: python -m bench.benchmark.peer_celery COMMAND")

from bench.benchmark import peer_common

PREFETCH = 64
QUEUE = "celery"  # Celery's default queue: a Redis list of that name

app = Celery("bench_peer", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=os.environ.get("BENCH_CELERY_ACKS_LATE") == "1",
    worker_prefetch_multiplier=PREFETCH,
    worker_disable_rate_limits=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_redis: Any = None
_pid = 0


def record(tag: str, enqueued: float, started: float) -> None:
    global _redis, _pid
    if _pid != os.getpid():  # a client per prefork child, made after the fork
        _redis, _pid = peer_common.client(), os.getpid()
    _redis.rpush(peer_common.LOG, peer_common.line(tag, enqueued, started))


@app.task(name="noop")
def noop(tag: str, enqueued: float) -> None:
    record(tag, enqueued, time.time())


@app.task(name="io")
def io(tag: str, enqueued: float) -> None:
    started = time.time()
    time.sleep(peer_common.SLEEP)  # a sync task waiting on I/O: the prefork pool's case
    record(tag, enqueued, started)


TASKS = {"noop": noop, "io": io}


class CeleryPeer(peer_common.Peer):
    def reset(self) -> None:
        peer_common.client().flushdb()

    def enqueue(self, task: str, items: list[tuple[str, float]], bulk: bool) -> str:
        fn = TASKS[task]
        if not bulk:
            for tag, enqueued in items:
                fn.delay(tag, enqueued or time.time())
            return "task.delay()"
        # Celery has no bulk enqueue: one producer (one connection) for the whole loop.
        with app.producer_or_acquire() as producer:
            for tag, enqueued in items:
                fn.apply_async((tag, enqueued or time.time()), producer=producer)
        return "task.apply_async(producer=...) in a loop"

    def queued(self) -> int:
        return int(peer_common.client().llen(QUEUE))

    def info(self) -> dict[str, Any]:
        import celery
        import kombu
        import redis

        r = peer_common.client()
        config: dict[str, Any] = {}
        for key in ("appendonly", "appendfsync", "save"):
            config.update(r.config_get(key))
        return {
            "celery": celery.__version__,
            "kombu": kombu.__version__,
            "redis-py": redis.__version__,
            "redis_server": r.info("server")["redis_version"],
            "redis_durability": config,
            "settings": {
                "worker_prefetch_multiplier": PREFETCH,
                "task_ignore_result": True,
                "worker_disable_rate_limits": True,
                "pool": "prefork",
            },
        }


if __name__ == "__main__":
    peer_common.main(CeleryPeer(), sys.argv[1:])
