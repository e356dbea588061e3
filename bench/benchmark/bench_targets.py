"""What the benchmark's table says around its figures: the peers' versions and settings
(with Redis's durability), and issue 17's targets, each ratio met or not."""

from __future__ import annotations

from typing import Any

SHORT = {
    "jobstate": "django-jobstate",
    "tasksdb": "tasks-db",
    "celery": "Celery",
    "celery_late": "Celery acks_late",
    "procrastinate": "Procrastinate",
}


def peer_lines(peers: dict[str, Any]) -> list[str]:
    out = []
    celery = peers.get("celery") or peers.get("celery_late")
    if celery:
        d = celery["redis_durability"]
        out.append(
            f"Celery {celery['celery']} (kombu {celery['kombu']}) on Redis "
            f"{celery['redis_server']} (appendonly={d.get('appendonly')}, appendfsync="
            f'{d.get("appendfsync")}, save="{d.get("save")}": a stock Redis, which can '
            "lose the last seconds of enqueued jobs in a crash, where PostgreSQL here loses no "
            "commit); prefork pool, worker_prefetch_multiplier=64, task_ignore_result, rate "
            "limits off, -O fair, without gossip/mingle/heartbeat; task_acks_late off and on."
        )
    proc = peers.get("procrastinate")
    if proc:
        from bench.benchmark.bench_peers import PROCRASTINATE_CONCURRENCY

        out.append(
            f"Procrastinate {proc['procrastinate']} (psycopg {proc['psycopg']}) on the same "
            f"PostgreSQL: `async def` tasks, one `procrastinate worker --concurrency "
            f"{PROCRASTINATE_CONCURRENCY}` per worker process, LISTEN/NOTIFY on."
        )
    return out


def target_lines(results: dict[str, Any], sizes: Any) -> list[str]:
    """Issue 17's targets: each ratio, its target, met or not (n/a when not measured)."""

    def get(figure: str, system: str, *path: str) -> Any:
        node: Any = results.get(figure, {}).get(system)
        for key in path:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        return node if isinstance(node, int | float) else None

    def div(a: Any, b: Any) -> float | None:
        return a / b if a is not None and b else None

    def line(what: str, got: float | None, target: str, met: bool | None, unit: str = "x") -> str:
        if got is None:
            return f"- {what}: not measured (target {target})"
        verdict = "met" if met else "**NOT MET**"
        number = f"{got:,.0f}" if unit == "" else f"{got:,.2f}{unit}"
        return f"- {what}: {number} (target {target}): {verdict}"

    out = ["Targets (issue 17):"]
    ours4 = get("drain", "jobstate", "4", "rate")
    for key, target in (("celery_late", 10), ("celery", 3), ("procrastinate", 10)):
        r = div(ours4, get("drain", key, "4", "rate"))
        out.append(
            line(f"no-op drain, 4 workers, ÷ {SHORT[key]}", r, f">= {target}x", r and r >= target)
        )
    serial = get("io", "jobstate", "1-serial", "rate")
    for row, what in (("1", "sync task on threads"), ("1-async", "async task")):
        r = div(get("io", "jobstate", row, "rate"), serial)
        out.append(
            line(
                f"I/O-bound, 1 worker process, {what} ÷ one job at a time",
                r,
                ">= 20x",
                r and r >= 20,
            )
        )
    for w in sizes.workers:
        for key in ("celery", "celery_late"):
            r = div(get("io", "jobstate", str(w), "rate"), get("io", key, str(w), "rate"))
            what = f"I/O-bound, {w} worker process{'es' if w > 1 else ''}, ÷ {SHORT[key]} prefork"
            out.append(line(what, r, ">= 10x", r and r >= 10))
    p99 = get("priority", "jobstate", "p99")
    out.append(
        line(
            "high-priority job behind a backlog, start p99",
            p99,
            "<= 50 ms",
            p99 and p99 <= 50,
            " ms",
        )
    )
    r = get("txn", "jobstate", "ratio")
    out.append(
        line(
            "single enqueue in the caller's transaction ÷ with its own commit",
            r,
            "< 0.33",
            r and r < 1 / 3,
        )
    )
    r = get("txn", "jobstate", "insert_ratio")
    out.append(
        line(
            "single enqueue in the caller's transaction ÷ the bare INSERT it sends",
            r,
            "<= 1.5",
            r and r <= 1.5,
        )
    )
    bulk = get("enqueue", "jobstate", "bulk", "rate")
    out.append(line("bulk enqueue", bulk, ">= 50,000 jobs/s", bulk and bulk >= 50_000, ""))
    many = get("many", "jobstate", "rate")
    r = div(many, ours4)
    conns = get("many", "jobstate", "max_per_supervisor")
    listening = max(
        (results.get("many", {}).get("jobstate") or {}).get("listeners_peak", {}).values(),
        default=None,
    )
    if r is not None:
        out.append(
            f"- {sizes.many_supervisors} supervisors x {sizes.many_processes} processes: "
            f"{many:,.0f} jobs/s, {r:.2f}x the 4-worker drain (the issue: throughput holds); "
            f"peak {conns} database connections per supervisor"
        )
    out.append(line("LISTEN connections per supervisor", listening, "1", listening == 1, ""))
    return out
