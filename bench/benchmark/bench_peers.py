"""The peers as the benchmark runs them: Celery on Redis (acks_late off and on) and
Procrastinate, each under the interpreter of its own venv (scripts/bench makes them with
ensure_peer_venv and passes BENCH_CELERY_PYTHON, BENCH_PROCRASTINATE_PYTHON and
BENCH_REDIS_URL). Their in-process halves are peer_celery.py and peer_procrastinate.py.

Peers take part in the figures that compare like with like (drains, enqueue, pickup
latency, the I/O-bound drain) on PostgreSQL runs only: Procrastinate needs it, and Celery
keeps nothing in the database, so one set of its figures, beside PostgreSQL's, is enough.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bench.benchmark.bench_run import System

PEER_FIGURES = frozenset({"drain", "enqueue", "latency", "io"})
# Async tasks in flight per Procrastinate worker process (its --concurrency; its default
# is 1). Its documentation's advice for I/O-bound async tasks is to raise it; 100 is the
# per-process limit the I/O-bound figure reports for it (the no-op drains use it too).
PROCRASTINATE_CONCURRENCY = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "100"))


@dataclass(frozen=True)
class CelerySystem(System):
    def worker_commands(self, workers: int, *, burst: bool, in_flight: int = 1) -> list[list[str]]:
        """One `celery worker` with a prefork pool of `workers` processes (no burst mode)."""
        return [
            [
                self.python,
                "-m",
                "celery",
                "-A",
                "bench.benchmark.peer_celery",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                str(workers),
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-O",
                "fair",
                "--hostname",
                f"bench-{os.getpid()}@%h",
            ]
        ]

    def job_pids(self, procs: list[Any]) -> list[int]:
        from bench.benchmark.bench_run import children

        return [pid for p in procs for pid in children(p.pid)]


@dataclass(frozen=True)
class ProcrastinateSystem(System):
    def worker_commands(self, workers: int, *, burst: bool, in_flight: int = 1) -> list[list[str]]:
        """`workers` worker processes (Procrastinate has no supervisor of processes), each
        with PROCRASTINATE_CONCURRENCY async jobs at once; --one-shot exits once idle."""
        return [
            [
                self.python,
                "-m",
                "procrastinate",
                "--app=bench.benchmark.peer_procrastinate.app",
                "worker",
                "--concurrency",
                str(PROCRASTINATE_CONCURRENCY),
                "--name",
                f"bench-{os.getpid()}-{i}",
                *(["--one-shot"] if burst else ["--wait"]),
            ]
            for i in range(workers)
        ]

    def job_pids(self, procs: list[Any]) -> list[int]:
        return [p.pid for p in procs if p.poll() is None]


def peer_systems() -> list[System]:
    """The peers whose interpreter scripts/bench provided (none when run without them)."""
    redis = os.environ.get("BENCH_REDIS_URL", "")
    out: list[System] = []
    celery = os.environ.get("BENCH_CELERY_PYTHON")
    if celery and redis:
        for late in ("0", "1"):
            out.append(
                CelerySystem(
                    "celery" + ("_late" if late == "1" else ""),
                    "Celery" + (" acks_late" if late == "1" else ""),
                    "",
                    python=celery,
                    helper_module="bench.benchmark.peer_celery",
                    env=(("BENCH_CELERY_ACKS_LATE", late),),
                    burst=False,
                    database=False,
                    figures=PEER_FIGURES,
                )
            )
    procrastinate = os.environ.get("BENCH_PROCRASTINATE_PYTHON")
    if procrastinate and redis:
        out.append(
            ProcrastinateSystem(
                "procrastinate",
                "Procrastinate",
                "",
                python=procrastinate,
                helper_module="bench.benchmark.peer_procrastinate",
                figures=PEER_FIGURES,
            )
        )
    return out


PEER_KEYS = ["celery", "celery_late", "procrastinate"]
