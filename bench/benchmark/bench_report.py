"""The benchmark's markdown table: one row per figure, a column per system, and the ratio
of django-jobstate to each other system; then issue 17's targets, met or not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.benchmark.bench_load_report import load_lines
from bench.benchmark.bench_targets import SHORT, peer_lines, target_lines

Getter = Callable[[dict[str, Any]], Any]


def rows(sizes: Any) -> list[tuple[str, str, Getter, str]]:
    """(figure, label, value getter, number format) for each table row."""
    n, hw = sizes.drain, sizes.history_workers
    out: list[tuple[str, str, Getter, str]] = []
    for w in sizes.workers:
        workers = f"{w} worker{'s' if w > 1 else ''}"
        out.append(
            (
                "drain",
                f"drain {n:,} no-op jobs, {workers} (jobs/s)",
                lambda r, w=w: r[str(w)]["rate"],
                "{:,.0f}",
            )
        )
    for w in sizes.workers:
        workers = f"{w} worker{'s' if w > 1 else ''}"
        out.append(
            (
                "drain",
                f"drain {n:,}, {workers}, wall clock incl. process start (jobs/s)",
                lambda r, w=w: r[str(w)]["wall_rate"],
                "{:,.0f}",
            )
        )
    out += [
        (
            "drain",
            f"drain {n:,}, 1 worker, Django's default CONN_MAX_AGE=0 (jobs/s)",
            lambda r: r["1-conn0"]["rate"],
            "{:,.0f}",
        ),
        (
            "enqueue",
            f"enqueue one by one (`task.enqueue()`; peers: `delay()`, `defer()`) "
            f"x {sizes.enqueue:,} (jobs/s)",
            lambda r: r["single"]["rate"],
            "{:,.0f}",
        ),
        (
            "enqueue",
            f"enqueue in bulk (`backend.bulk_enqueue()`; peers: one producer, "
            f"`batch_defer()`) x {sizes.bulk:,} (jobs/s)",
            lambda r: r["bulk"]["rate"],
            "{:,.0f}",
        ),
        (
            "txn",
            f"single enqueue inside the caller's transaction, once begun, COMMIT not timed "
            f"(µs), x {sizes.txn:,}",
            lambda r: r["in_transaction_us"],
            "{:,.0f}",
        ),
        (
            "txn",
            "... as the transaction's first statement, BEGIN included (µs)",
            lambda r: r.get("first_in_transaction_us"),
            "{:,.0f}",
        ),
        (
            "txn",
            "single enqueue with its own commit, autocommit (µs)",
            lambda r: r["own_commit_us"],
            "{:,.0f}",
        ),
        ("txn", "... in the transaction ÷ with its own commit", lambda r: r["ratio"], "{:.2f}"),
        (
            "txn",
            "the bare INSERT it sends, by hand in the transaction, interleaved with enqueues (µs)",
            lambda r: r.get("bare_insert_us"),
            "{:,.0f}",
        ),
        (
            "txn",
            "... enqueue() beside it ÷ the bare INSERT (target: <= 1.5)",
            lambda r: r.get("insert_ratio"),
            "{:.2f}",
        ),
        (
            "latency",
            f"pickup latency p50, {sizes.latency_rate:g} jobs/s, 1 worker (ms)",
            lambda r: r["p50"],
            "{:,.1f}",
        ),
        ("latency", "pickup latency p99 (ms)", lambda r: r["p99"], "{:,.1f}"),
        (
            "priority",
            f"high-priority job behind a backlog of 5 ms jobs, {sizes.priority_workers} "
            f"workers, {sizes.priority_rate:g}/s: start latency p50 (ms)",
            lambda r: r["p50"],
            "{:,.1f}",
        ),
        ("priority", "... p99 (ms)", lambda r: r["p99"], "{:,.1f}"),
    ]
    budget = f"{sizes.io_budget:g} s"
    for key, what in [
        (str(w), f"{w} worker process{'es' if w > 1 else ''}") for w in sizes.workers
    ]:
        out.append(
            (
                "io",
                f"I/O-bound: {sizes.io:,} jobs waiting 100 ms each, {what}, at most {budget} "
                "(jobs/s)",
                lambda r, k=key: r[k]["rate"],
                "{:,.1f}",
            )
        )
    out += [
        (
            "io",
            "... 1 worker process, `async def` task (`asyncio.sleep`) (jobs/s)",
            lambda r: r["1-async"]["rate"],
            "{:,.1f}",
        ),
        (
            "io",
            "... 1 worker process, one job at a time (jobs/s)",
            lambda r: r["1-serial"]["rate"],
            "{:,.1f}",
        ),
        (
            "many",
            f"{sizes.many_supervisors} supervisors x {sizes.many_processes} worker processes, "
            f"{sizes.many:,} no-op jobs (jobs/s)",
            lambda r: r["rate"],
            "{:,.0f}",
        ),
        (
            "many",
            "... database connections per supervisor (peak)",
            lambda r: r["max_per_supervisor"],
            "{:,.0f}",
        ),
        (
            "many",
            "... of them in LISTEN (peak)",
            lambda r: max(r["listeners_peak"].values()),
            "{:,.0f}",
        ),
    ]
    history = [
        ("empty", "empty table"),
        ("inserted", f"{sizes.history:,} terminal rows just inserted, no VACUUM/ANALYZE yet"),
        ("vacuumed", "same rows after VACUUM ANALYZE (SQLite: ANALYZE)"),
        ("churned", f"{sizes.history:,} rows churned queued→running→succeeded, no VACUUM yet"),
    ]
    for key, what in history:
        out.append(
            (
                "history",
                f"drain {sizes.history_drain:,}, {hw} workers, {what} (jobs/s)",
                lambda r, k=key: r[k]["rate"],
                f"history:{key}",
            )
        )
    early, end = f"{sizes.memory_early:,}", f"{sizes.memory:,}"
    out += [
        ("memory", f"worker RSS after {early} jobs (MiB)", lambda r: r["early_mib"], "{:,.1f}"),
        ("memory", f"worker RSS after {end} jobs (MiB)", lambda r: r["end_mib"], "{:,.1f}"),
        ("memory", f"RSS growth, {early} → {end} jobs", lambda r: r["growth"] * 100, "{:+.1f}%"),
    ]
    return out + fair_rows(sizes)


def fair_rows(sizes: Any) -> list[tuple[str, str, Getter, str]]:
    """The SQLite fairness figure (bench_fair.py): solo rates, then side by side."""
    window = f"median of {sizes.fair_rounds} rounds of {sizes.fair_seconds:g} s windows"
    return [
        (
            "sqlite_fair",
            f"SQLite, web-like writer (row + enqueue per `atomic()`) alone, {window} (commits/s)",
            lambda r: r["writer_rate"],
            "{:,.0f}",
        ),
        (
            "sqlite_fair",
            "... `runjobs --concurrency 2` draining no-op jobs alone (jobs/s)",
            lambda r: r["drain_rate"],
            "{:,.0f}",
        ),
        (
            "sqlite_fair",
            "... side by side: writer ÷ its solo rate (target ≥ 0.5)",
            lambda r: r["writer_ratio"],
            "{:.2f}",
        ),
        (
            "sqlite_fair",
            "... side by side: drain ÷ its solo rate (target ≥ 0.3)",
            lambda r: r["drain_ratio"],
            "{:.2f}",
        ),
    ]


def value(results: dict[str, Any], figure: str, system: str, getter: Getter) -> tuple[Any, str]:
    """The number and its problem ("" if fine, "not run", "error: ...")."""
    result = results.get(figure, {}).get(system)
    if result is None:
        return None, "not run"
    if "error" in result:
        return None, "error"
    try:
        return getter(result), ""
    except (KeyError, TypeError):
        return None, ""


def cell(number: Any, problem: str, fmt: str, result: dict[str, Any] | None) -> str:
    if problem:
        return problem
    if number is None:
        return "n/a"
    if fmt.startswith("history:"):
        result = result or {}
        empty = result.get("empty", {}).get("rate")
        share = f" ({number / empty:.0%})" if empty else ""
        stopped = result.get(fmt.partition(":")[2], {}).get("stopped")
        return f"{number:,.0f}{share}" + (" †" if stopped else "")
    return fmt.format(number)


def ratio(ours: Any, theirs: Any, fmt: str) -> str:
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float):
        return "n/a"
    if fmt.endswith("%"):  # a growth: the difference, not a ratio, says more
        return "n/a"
    if theirs == 0:
        return "n/a"
    return f"{ours / theirs:.2f}x"


def render_table(
    vendor: str,
    meta: dict[str, Any],
    sizes: Any,
    systems: list[Any],
    results: dict[str, Any],
    problems: list[tuple[str, str, str]],
) -> str:
    pg, my = meta.get("postgresql"), meta.get("mysql")
    if pg:
        server = (
            f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, "
            f"synchronous_commit={pg['synchronous_commit']}, autovacuum={pg['autovacuum']})"
        )
    elif my:
        server = (
            f"MariaDB {my['version']} (innodb_flush_log_at_trx_commit="
            f"{my['innodb_flush_log_at_trx_commit']}; READ COMMITTED, Django's default)"
        )
    else:
        server = f"SQLite {meta.get('sqlite')} (WAL)"
    load = ", ".join(f"{x:.2f}" for x in meta["load_average"])
    commits = meta.get("commits_per_second") or {}
    tool = "pgbench" if pg else "mysqlclient" if my else "sqlite3, WAL"
    machine = " / ".join(f"{commits[c]:,.0f}" for c in sorted(commits))
    clients = " / ".join(sorted(commits))
    keys = [s.key for s in systems]
    others = [k for k in keys if k != "jobstate"]
    lines = [
        f"### {server}",
        "",
        f"{meta['cpus']} CPUs, Python {meta['python']}, Django {meta['django']}, "
        f"django-tasks-db {meta.get('django-tasks-db')}; load average at start {load}; "
        f"single-row UPDATE commits/s ({tool}, {clients} client(s)): {machine or 'n/a'}; "
        f"django-jobstate at {meta.get('git_head')}, source digest "
        f"{meta.get('jobstate_source_sha256')}",
        *peer_lines(meta.get("peers") or {}),
        "",
        "| figure | "
        + " | ".join(SHORT.get(k, k) for k in keys)
        + " | "
        + " | ".join(f"÷ {SHORT.get(k, k)}" for k in others)
        + " |",
        "|---|" + "---:|" * (len(keys) + len(others)),
    ]
    for figure, label, getter, fmt in rows(sizes):
        if figure not in results:
            continue
        got = {k: value(results, figure, k, getter) for k in keys}
        cells = [cell(*got[k], fmt, results[figure].get(k)) for k in keys]
        if "jobstate" in got:
            ratios = [ratio(got["jobstate"][0], got[k][0], fmt) for k in others]
        else:
            ratios = ["n/a"] * len(others)
        lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    lines += [
        "",
        "÷ X = django-jobstate ÷ X: above 1 is better for jobs/s, below 1 for times and "
        'memory; "not run": the system has no such feature or mode here. Drain jobs/s = '
        "jobs done ÷ (last finish - first start), from each Django runner's own rows and "
        "from the record each peer's task body writes (a Redis RPUSH per job, for both "
        'peers); "wall clock" adds process start-up and exit. Figures with several runs: '
        "the median. I/O-bound drains stop at the time budget; jobs/s of the jobs done by "
        "then. History rows: (%) of the empty-table figure; on PostgreSQL autovacuum is "
        "held off for the table until the VACUUM ANALYZE row. Latency = start - enqueue "
        "time of each job on one host clock (django-jobstate's started_at is the claim's "
        "STATEMENT_TIMESTAMP on PostgreSQL).",
    ]
    history = results.get("history", {})
    if any(isinstance(v, dict) and v.get("stopped") for r in history.values() for v in r.values()):
        lines.append(
            f"\n† stopped at the history time budget ({sizes.history_budget:g} s per drain): "
            "jobs/s of the jobs done by then (JSON: `stopped`); no further runs in that state."
        )
    lines += ["", *target_lines(results, sizes), *load_lines(results, sizes)]
    if problems:
        lines.append("")
        lines += [f"- PROBLEM {system} / {figure}: {what}" for system, figure, what in problems]
    else:
        ran = ", ".join(s.label for s in systems)
        lines.append(
            f"\nChecks passed ({ran}): every job ran exactly once (none twice, none missing), "
            "in every drain."
        )
    return "\n".join(lines)
