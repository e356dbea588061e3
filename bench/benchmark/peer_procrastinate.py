"""Procrastinate, as the benchmark runs it, in its own environment (.venv-peers/procrastinate).

The app (`--app=bench.benchmark.peer_procrastinate.app`) and the benchmark's commands (`python -m
bench.benchmark.peer_procrastinate COMMAND`, see peer_common), on the same PostgreSQL server as
django-jobstate (a fresh database per drain, its schema applied by `migrate`). Its tasks
are `async def`, as Procrastinate's documentation recommends for I/O: a worker process
runs up to `--concurrency` of them at once on its event loop (bench_peers picks it). Its
enqueue paths are the synchronous ones a Django view would call: `task.defer()` one by one
and `task.batch_defer()` in bulk.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import procrastinate
import psycopg
import redis.asyncio

if __package__ in (None, ""):
    sys.exit("run as: python -m bench.benchmark.peer_procrastinate COMMAND")

from bench.benchmark import peer_common

BATCH = 5_000  # jobs per batch_defer() call, like django-jobstate's bulk_enqueue chunks


def conninfo() -> str:
    return psycopg.conninfo.make_conninfo(dbname=os.environ.get("BENCH_DB_NAME", "postgres"))


app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo()))

_redis: dict[int, Any] = {}


async def record(tag: str, enqueued: float, started: float) -> None:
    loop = id(asyncio.get_running_loop())
    if loop not in _redis:
        _redis[loop] = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    await _redis[loop].rpush(peer_common.LOG, peer_common.line(tag, enqueued, started))


@app.task(name="noop")
async def noop(tag: str, enqueued: float) -> None:
    await record(tag, enqueued, time.time())


@app.task(name="io")
async def io(tag: str, enqueued: float) -> None:
    started = time.time()
    await asyncio.sleep(peer_common.SLEEP)  # an async task waiting on I/O
    await record(tag, enqueued, started)


TASKS = {"noop": noop, "io": io}


class ProcrastinatePeer(peer_common.Peer):
    def migrate(self) -> None:
        with app.open():
            app.schema_manager.apply_schema()
        super().migrate()

    def enqueue(self, task: str, items: list[tuple[str, float]], bulk: bool) -> str:
        fn = TASKS[task]
        with app.open():
            if not bulk:
                for tag, enqueued in items:
                    fn.defer(tag=tag, enqueued=enqueued or time.time())
                return "task.defer()"
            for i in range(0, len(items), BATCH):
                fn.batch_defer(
                    *({"tag": tag, "enqueued": e or time.time()} for tag, e in items[i : i + BATCH])
                )
        return "task.batch_defer()"

    def queued(self) -> int:
        with psycopg.connect(conninfo()) as conn:
            row = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")
            return int(row.fetchone()[0])  # type: ignore[index]

    def info(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"procrastinate": version("procrastinate"), "psycopg": psycopg.__version__}


if __name__ == "__main__":
    peer_common.main(ProcrastinatePeer(), sys.argv[1:])
