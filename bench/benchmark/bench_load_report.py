"""The markdown of issue 28's figures: the ceiling, the continuous load and the vacuum
pressure, each ratio against its target, and the job table over time."""

from __future__ import annotations

from typing import Any

from bench.benchmark.bench_peers import PROCRASTINATE_CONCURRENCY
from bench.benchmark.bench_produce import BULK_EVERY
from bench.benchmark.bench_watch import RUNNABLE_INDEX

SERIES_ROWS = 12  # rows of a run's table over time (the JSON has every sample)
PRESSURE_NAMES = {
    "idle_xact": "an idle-in-transaction session holding an XID",
    "readers": "four REPEATABLE READ readers scanning the job table",
}


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else "met" if met else "**NOT MET**"


def num(value: Any, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def load_lines(results: dict[str, Any], sizes: Any) -> list[str]:
    """Issue 28's section of the report (empty if none of its figures ran)."""
    out: list[str] = []
    ceiling = (results.get("ceiling") or {}).get("jobstate")
    if ceiling and "error" not in ceiling:
        f = ceiling["fraction"]
        out += [
            "",
            f"Ceiling (issue 28): plain SQL on the same PostgreSQL, {ceiling['clients']} client "
            f"processes, a claim of {ceiling['batch']} rows (FOR UPDATE SKIP LOCKED) and a "
            f"conditional completion per batch, {ceiling['n']:,} jobs in the package's table: "
            f"{num(ceiling['sql']['rate'])} jobs/s (runs {runs(ceiling['sql'])}); "
            f"django-jobstate's no-op drain, {ceiling['clients']} workers, same N: "
            f"{num(ceiling['jobstate']['rate'])} jobs/s (runs {runs(ceiling['jobstate'])}), "
            f"{num(f, '{:.2f}')} of the ceiling (target >= 0.7): {verdict(f and f >= 0.7)}",
        ]
    load = (results.get("continuous") or {}).get("jobstate")
    if load and "error" not in load:
        out += continuous_lines(load, sizes)
        out.append(peer_line(load, results))
    pressure = (results.get("pressure") or {}).get("jobstate")
    if pressure and "error" not in pressure:
        out += pressure_lines(pressure, sizes)
    return out


def runs(result: dict[str, Any]) -> str:
    return " / ".join(num(rate) for rate in result.get("runs", []))


def step_note(step: dict[str, Any]) -> str:
    if not step["kept_up"]:
        return f" (the producer enqueued {step['fed']:,} of {step['due']:,})"
    return "" if step["sustained"] else f" (queue {step['depth']:,})"


def shape(load: dict[str, Any]) -> str:
    """The load's workers and job, as run."""
    flight = load.get("in_flight", 1)
    if flight == 1:
        return f"{load['workers']} worker processes, sync 1 ms jobs one at a time each"
    return f"{load['workers']} worker processes x {flight} in flight, async 1 ms jobs"


def continuous_lines(load: dict[str, Any], sizes: Any) -> list[str]:
    ratio = load["ratio"]
    steps = ", ".join(f"{step['rate']:,.0f}{step_note(step)}" for step in load["steps"])
    out = [
        "",
        f"Continuous load (issue 28): {shape(load)}. No-op "
        f"drain {num(load['drain'])} jobs/s; highest rate sustained with a bounded queue "
        f"{num(load['max_rate'])} jobs/s (bulk producer, a batch every "
        f"{sizes.bulk_every:g} s, {sizes.step:g} s a step: {steps}), "
        f"{num(ratio, '{:.2f}')} of the drain (target >= 0.5): "
        f"{verdict(ratio and ratio >= 0.5)}",
        "",
        "| run | asked (jobs/s) | enqueued (jobs/s) | producers | done (jobs/s) | pickup p50 (ms) "
        "| its floor (ms) | p99 (ms) | max queue | dead tuples at end "
        "| runnable index at end (KiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, run in load["runs"].items():
        end = run["samples"][-1]
        out.append(
            f"| {key} | {run['rate']:,.0f} | {run['fed_rate']:,.0f} | {run['producers']} | "
            f"{num(run['throughput'])} | {num(run['p50'], '{:.1f}')} | "
            f"{num(batch_floor(run, load['drain']), '{:.1f}')} | "
            f"{num(run['p99'], '{:.1f}')} | {run['max_depth']:,} | {end['dead']:,} | "
            f"{end['index_bytes'].get(RUNNABLE_INDEX, 0) / 1024:,.0f} |"
        )
    for key, run in load["runs"].items():
        if key.endswith("-50%"):  # the latency target, at half the rate sustained
            p50, p99 = run["p50"], run["p99"]
            met = None if p50 is None or p99 is None else p50 < 5 and p99 < 50
            floor = batch_floor(run, load["drain"])
            out.append(
                f"- {key}: pickup p50 < 5 ms and p99 < 50 ms: {verdict(met)}"
                + (f" (its batches allow p50 >= {floor:.1f} ms)" if floor else "")
            )
    for key, run in load["runs"].items():
        out += ["", f"{key} over time:", *series(run, sizes.every)]
    return out


def peer_line(load: dict[str, Any], results: dict[str, Any]) -> str:
    """The highest rate sustained against Procrastinate's no-op drain with the same workers
    (processes x async jobs in flight) in the same run: no steady producer can get more out
    of it than its drain, so that drain bounds the rate it sustains from above, and 5x it
    (the issue's target) is 5x its sustained rate at least."""
    workers, flight = load["workers"], load.get("in_flight", 1)
    drains = (results.get("drain") or {}).get("procrastinate") or {}
    peer = (drains.get(str(workers)) or {}).get("rate")
    what = f"highest rate sustained ÷ Procrastinate's no-op drain with {workers} x {flight}"
    # With --rate, the rate is the one given, not one found: nothing to compare.
    if not peer or flight != PROCRASTINATE_CONCURRENCY or not load.get("drain"):
        return (
            f"- {what}: not measured (target >= 5x; in one run: --systems "
            f"jobstate,procrastinate --only drain,continuous --workers {workers}, with "
            f"BENCH_PROCRASTINATE_CONCURRENCY={flight})"
        )
    ratio = load["max_rate"] / peer
    return (
        f"- {what} ({num(peer)} jobs/s; more than it can sustain): {ratio:.2f}x "
        f"(target >= 5x): {verdict(ratio >= 5)}"
    )


def batch_floor(run: dict[str, Any], drain: float | None) -> float | None:
    """The least pickup p50 (ms) a bulk run's batches allow: a batch of the rate enqueued x
    its producer's period (BULK_EVERY unless --bulk-every) jobs is due at once, and the
    workers take its jobs one after another at their no-op drain's rate at best, so the
    batch's middle job waits half the batch's length. None for jobs enqueued one by one
    (no such floor)."""
    if run["mode"] != "bulk" or not drain:
        return None
    return run["fed_rate"] * run.get("bulk_every", BULK_EVERY) / (2 * drain) * 1000


def pressure_lines(pressure: dict[str, Any], sizes: Any) -> list[str]:
    out = [
        "",
        f"Vacuum pressure (issue 28): {pressure['rate']:,.0f} jobs/s asked (half the highest "
        f"rate sustained), one by one, {sizes.duration:g} s; the pressure from "
        f"{pressure['start']:g} s for {pressure['hold']:g} s.",
        "",
        "| pressure | phase | enqueued | done (jobs/s) | pickup p50 (ms) | p99 (ms) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for kind, name in PRESSURE_NAMES.items():
        run = pressure.get(kind)
        if not run:
            continue
        for phase, got in run["phases"].items():
            out.append(
                f"| {name} | {phase} | {got['enqueued']:,} | {num(got['throughput'])} | "
                f"{num(got['p50'], '{:.1f}')} | {num(got['p99'], '{:.1f}')} |"
            )
    for kind, name in PRESSURE_NAMES.items():
        run = pressure.get(kind)
        if not run:
            continue
        back = run["recovered_after"]
        out += [
            "",
            f"- {name}: pickup p50 and p99 during within 2x of before: "
            f"{verdict(run['within_2x'])}; back within 2x (p50 per interval) "
            f"{num(back, '{:.0f} s')} after it ended (target <= 60 s): "
            f"{verdict(back is not None and back <= 60)}"
            + (f"; the pressure failed: {run['pressure_error']}" if run["pressure_error"] else ""),
            "",
            f"{name}, over time:",
            *series(run, sizes.every),
        ]
    return out


def series(run: dict[str, Any], every: float) -> list[str]:
    """The job table and the pickup latency over a run: at most SERIES_ROWS rows."""
    by_k = {round(row["t"] / every): row for row in run["timeline"]}
    samples = run["samples"]
    keep = samples[:: max(1, -(-len(samples) // SERIES_ROWS))]
    out = [
        "| t (s) | queue | dead tuples | live tuples | runnable index (KiB) | all indexes (KiB) "
        "| vacuums | pickup p50 (ms) | p99 (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for sample in keep:
        indexes = sample["index_bytes"] or {}
        # The pickup latency of the jobs enqueued in the interval before the sample.
        late = by_k.get(int(sample["t"] // every) - 1) or {}
        out.append(
            f"| {sample['t']:.0f} | {sample['depth']:,} | {sample['dead']:,} | "
            f"{sample['live']:,} | {indexes.get(RUNNABLE_INDEX, 0) / 1024:,.0f} | "
            f"{sum(indexes.values()) / 1024:,.0f} | {sample['vacuums']} | "
            f"{num(late.get('p50'), '{:.1f}')} | {num(late.get('p99'), '{:.1f}')} |"
        )
    return out
