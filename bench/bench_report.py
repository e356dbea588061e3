"""The benchmark's markdown table: one row per figure, both systems, and their ratio."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
            f"enqueue one by one, `task.enqueue()` x {sizes.enqueue:,} (jobs/s)",
            lambda r: r["single"]["rate"],
            "{:,.0f}",
        ),
        (
            "enqueue",
            f"enqueue in bulk, `backend.bulk_enqueue()` x {sizes.bulk:,} (jobs/s)",
            lambda r: r["bulk"]["rate"],
            "{:,.0f}",
        ),
        (
            "latency",
            f"pickup latency p50, {sizes.latency_rate:g} jobs/s, 1 worker (ms)",
            lambda r: r["p50"],
            "{:,.1f}",
        ),
        ("latency", "pickup latency p99 (ms)", lambda r: r["p99"], "{:,.1f}"),
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
    return out


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
    pg = meta.get("postgresql")
    if pg:
        server = (
            f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, "
            f"synchronous_commit={pg['synchronous_commit']}, autovacuum={pg['autovacuum']})"
        )
    else:
        server = f"SQLite {meta.get('sqlite')} (WAL)"
    load = ", ".join(f"{x:.2f}" for x in meta["load_average"])
    commits = meta.get("commits_per_second") or {}
    tool = "pgbench" if pg else "sqlite3, WAL"
    machine = " / ".join(f"{commits[c]:,.0f}" for c in sorted(commits))
    clients = " / ".join(sorted(commits))
    lines = [
        f"### {server}",
        "",
        f"{meta['cpus']} CPUs, Python {meta['python']}, Django {meta['django']}, "
        f"django-tasks-db {meta.get('django-tasks-db')}; load average at start {load}; "
        f"single-row UPDATE commits/s ({tool}, {clients} client(s)): {machine or 'n/a'}; "
        f"django-jobstate at {meta.get('git_head')}, source digest "
        f"{meta.get('jobstate_source_sha256')}",
        "",
        "| figure | django-jobstate | django-tasks-db | ratio |",
        "|---|---:|---:|---:|",
    ]
    for figure, label, getter, fmt in rows(sizes):
        if figure not in results:
            continue
        ours, ours_problem = value(results, figure, "jobstate", getter)
        theirs, theirs_problem = value(results, figure, "tasksdb", getter)
        lines.append(
            f"| {label} | {cell(ours, ours_problem, fmt, results[figure].get('jobstate'))} "
            f"| {cell(theirs, theirs_problem, fmt, results[figure].get('tasksdb'))} "
            f"| {ratio(ours, theirs, fmt)} |"
        )
    lines += [
        "",
        "ratio = django-jobstate ÷ django-tasks-db: above 1 is better for jobs/s, below 1 "
        "for latency and memory. Drain jobs/s = N ÷ (last finished_at - first started_at) "
        'from each system\'s own rows; "wall clock" adds process start-up and exit. '
        "Figures with several runs: the median. History rows: (%) of the empty-table figure; "
        "on PostgreSQL autovacuum is held off for the table until the VACUUM ANALYZE row. "
        "Latency = started_at - enqueued_at of each job (one host clock: enqueued_at is the "
        "enqueuer's; started_at is the claim's STATEMENT_TIMESTAMP on PostgreSQL for "
        "django-jobstate, the worker's clock otherwise).",
    ]
    history = results.get("history", {})
    if any(isinstance(v, dict) and v.get("stopped") for r in history.values() for v in r.values()):
        lines.append(
            f"\n† stopped at the history time budget ({sizes.history_budget:g} s per drain): "
            "jobs/s of the jobs done by then (JSON: `stopped`); no further runs in that state."
        )
    if problems:
        lines.append("")
        lines += [f"- PROBLEM {system} / {figure}: {what}" for system, figure, what in problems]
    else:
        ran = " and ".join(s.label for s in systems)
        lines.append(f"\nChecks passed ({ran}): every job succeeded exactly once, in every drain.")
    return "\n".join(lines)
