"""Continuous load and vacuum pressure (issue 28): figures of bench.Bench (a mixin).

continuous: the package's no-op drain with the load's workers (the reference); the highest
rate of 1 ms jobs those workers sustain with a bounded queue, found by stepping a bulk
producer's rate up (x1.5 a step, then HALVINGS steps halving the gap); then runs of `duration`
seconds at 50% and 90% of it, fed one job at a time and in bulk, each in a fresh database:
pickup latency, queue depth, dead tuples and index sizes over time.
pressure: the one-by-one run at 50%, with vacuum held back from 20% of the run for 30% of
it (3 of 10 minutes), by an idle-in-transaction session, then by four REPEATABLE READ
readers: throughput and pickup latency before, during and after.
"""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

from bench.benchmark.bench_run import ROOT, Database, System, Workers, helper
from bench.benchmark.bench_watch import Pressure, Sampler, timeline, window
from bench.common import wait_for

RUNS = [("single", 0.5), ("single", 0.9), ("bulk", 0.5), ("bulk", 0.9)]
QUICK_RUNS = [("bulk", 0.9)]  # the pressure figure runs one by one
# Jobs one producer process is asked to enqueue one by one per second, at most (more: more
# processes). One did ~130/s beside 4 workers at load 4 on 2 cores, ~1,000/s when quiet.
PRODUCER_RATE = 200.0
# A step is sustained if the queue it leaves holds at most this many seconds of its rate
# (plus a claim's worth): a rate beyond the workers' leaves (rate - capacity) x step.
BOUNDED = 0.25
PRESSURES = ["idle_xact", "readers"]
# Steps halving the gap between the highest rate sustained and the lowest not, after the
# x1.5 steps: the top rate is then known within an eighth of a step (about 6%).
HALVINGS = 2


class LoadFigures:
    sizes: Any
    db: Database
    problems: list[tuple[str, str, str]]
    results: dict[str, dict[str, Any]]
    drain_in: Any

    def continuous(self, system: System) -> dict[str, Any]:
        s = self.sizes
        found = self.top_rate(system)
        top = found["max_rate"]
        runs = {}
        for mode, share in RUNS if s.duration >= 60 else QUICK_RUNS:
            if top:
                runs[f"{mode}-{share:.0%}"] = self.load_run(system, top * share, mode)
        shape = {"workers": s.load_workers, "in_flight": s.load_in_flight, "task": self.load_task}
        return {**shape, **found, "runs": runs}

    def pressure(self, system: System) -> dict[str, Any]:
        s = self.sizes
        top = (self.results.get("continuous", {}).get(system.key) or {}).get("max_rate")
        top = top or self.top_rate(system)["max_rate"]
        if not top:
            raise RuntimeError("no rate was sustained: nothing to put under pressure")
        start, hold = 0.2 * s.duration, 0.3 * s.duration
        out: dict[str, Any] = {"rate": top * 0.5, "start": start, "hold": hold}
        for kind in PRESSURES:
            run = self.load_run(system, top * 0.5, "single", Pressure, kind, start, hold)
            out[kind] = {**run, **verdict(run, start, hold, s.duration)}
        return out

    def top_rate(self, system: System) -> dict[str, Any]:
        """The no-op drain of the load's workers (as many jobs as the ceiling's), and the
        highest rate of 1 ms jobs they sustain: its ratio to the drain (--rate: given)."""
        s = self.sizes
        if s.top_rate:
            return {"drain": None, "steps": [], "max_rate": s.top_rate, "ratio": None}
        drain = self.drain_in(
            system, self.db.fresh(system), s.ceiling, s.load_workers, in_flight=s.load_in_flight
        )["rate"]
        steps = self.find_max(system, drain)
        top = max((step["rate"] for step in steps if step["sustained"]), default=None)
        ratio = top / drain if top and drain else None
        return {"drain": drain, "steps": steps, "max_rate": top, "ratio": ratio}

    def load_workers(self, system: System, env: dict[str, str]) -> Workers:
        s = self.sizes
        return Workers(system, env, s.load_workers, burst=False, in_flight=s.load_in_flight)

    @property
    def load_task(self) -> str:
        """The load's job: async where attempts run side by side, else sync."""
        return "work_1ms_async" if self.sizes.load_in_flight > 1 else "work_1ms"

    def find_max(self, system: System, drain: float) -> list[dict[str, Any]]:
        """Step the bulk producer's rate up from a tenth of the drain, x1.5 while the queue
        stays bounded, then HALVINGS times halfway between the highest rate sustained and the
        lowest not."""
        env = self.db.fresh(system)
        procs = self.load_workers(system, env)
        steps: list[dict[str, Any]] = []
        try:
            helper(env, "warm", "120")
            sampler = Sampler(env["BENCH_DB_NAME"], self.sizes.every)
            rate = max(20.0, round(drain / 10, -1))
            while len(steps) < self.sizes.steps:
                steps.append(self.step(env, sampler, rate))
                if not steps[-1]["sustained"]:
                    break
                rate = round(rate * 1.5, -1)
            good = [step["rate"] for step in steps if step["sustained"]]
            if good and not steps[-1]["sustained"]:
                bad = rate
                for _ in range(HALVINGS):
                    steps.append(self.step(env, sampler, round((max(good) + bad) / 2, -1)))
                    if steps[-1]["sustained"]:
                        good.append(steps[-1]["rate"])
                    else:
                        bad = steps[-1]["rate"]
            sampler.conn.close()
            procs.stop()
        finally:
            procs.cleanup()
        return steps

    def step(self, env: dict[str, str], sampler: Sampler, rate: float) -> dict[str, Any]:
        s = self.sizes
        fed = Producers(env, rate, s.step, "bulk", self.load_task, s.bulk_every).finish()
        depth = sampler.depth()
        bound = rate * BOUNDED + 100
        # Drain what is left before the next step (a rate far beyond: its backlog).
        drained = wait_for(lambda: sampler.depth() == 0, max(60.0, depth / rate * 3), 0.2)
        if not drained:
            self.problems.append(("jobstate", "continuous", f"{rate}/s: backlog never drained"))
        # Not sustained either if the producer could not enqueue at the rate (the machine's
        # limit, not the workers'): the search stops there.
        sustained = depth <= bound and fed["kept_up"]
        return {"rate": rate, **fed, "depth": depth, "sustained": sustained}

    def load_run(
        self, system: System, rate: float, mode: str, pressure: Any = None, *how: Any
    ) -> dict[str, Any]:
        """`duration` seconds at `rate` in a fresh database, sampled every `every` s. The
        run's clock starts at its first enqueue (the producers' start-up is not counted);
        a pressure, if any, starts `how[1]` seconds after it."""
        s = self.sizes
        env = self.db.fresh(system)
        name = env["BENCH_DB_NAME"]
        procs = self.load_workers(system, env)
        try:
            helper(env, "warm", "120")
            sampler = Sampler(name, s.every)
            producers = Producers(env, rate, s.duration, mode, self.load_task, s.bulk_every)
            if not wait_for(sampler.started, 120):
                raise RuntimeError("the producers enqueued nothing within 120 s")
            sampler.start()
            holder = pressure(how[0], name, *how[1:]) if pressure else None
            if holder:
                holder.start()
            fed = producers.finish()
            drained = wait_for(lambda: sampler.depth() == 0, max(60.0, s.duration), 0.2)
            if holder:
                holder.join()
            samples = sampler.finish()
            procs.stop()
        finally:
            procs.cleanup()
        if not drained:
            self.problems.append((system.key, "continuous", f"{mode} {rate:.0f}/s: not drained"))
        length = s.duration
        whole = window(name, sampler.origin, 0, length)
        phases = {}
        if holder:
            start, end = how[1], how[1] + how[2]
            bounds = {"before": (0, start), "during": (start, end), "after": (end, length)}
            phases = {phase: window(name, sampler.origin, *ab) for phase, ab in bounds.items()}
        return {
            "rate": rate,
            "mode": mode,
            "bulk_every": s.bulk_every,
            **fed,
            "fed_rate": fed["fed"] / length,
            "drained": drained,
            **{k: whole[k] for k in ("p50", "p99", "throughput")},
            "max_depth": max(sample["depth"] for sample in samples),
            "samples": samples,
            "timeline": timeline(name, sampler.origin, s.every),
            "origin": sampler.origin.isoformat(),
            "phases": phases,
            "pressure_error": holder and holder.error,
        }


class Producers:
    """Enqueue at `rate` for `seconds`: one bulk producer, or enough one-by-one producers
    (processes) to reach the rate if the machine lets them."""

    def __init__(
        self, env: dict[str, str], rate: float, seconds: float, mode: str, task: str, every: float
    ) -> None:
        count = 1 if mode == "bulk" else max(1, math.ceil(rate / PRODUCER_RATE))
        command = [env["BENCH_PYTHON"], "-m", env["BENCH_HELPER"], "produce"]
        args = [str(rate / count), str(seconds), mode, task, str(every)]
        self.procs = [
            subprocess.Popen(
                [*command, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
            )
            for _ in range(count)
        ]

    def finish(self) -> dict[str, Any]:
        """Wait for the producers: jobs enqueued and due, whether they kept up (90%: a bulk
        producer leaves out its last tenth of a second), how many producers."""
        outs = [proc.communicate()[0].strip().splitlines() for proc in self.procs]
        if any(proc.returncode for proc in self.procs):
            codes = [p.returncode for p in self.procs]
            raise RuntimeError(f"a producer failed: exit codes {codes}")
        results = [json.loads(out[-1]) for out in outs]
        fed, due = sum(r["fed"] for r in results), sum(r["due"] for r in results)
        return {"fed": fed, "due": due, "kept_up": fed >= 0.9 * due, "producers": len(results)}


def verdict(run: dict[str, Any], start: float, hold: float, length: float) -> dict[str, Any]:
    """Whether the pickup latency stayed within 2x of before the pressure during it (p50 and
    p99 of the windows), and how long after it ended the intervals' p50 stayed back within
    2x of before's for good (None: not within the run). The intervals of the run's `length`
    only: the last jobs of producers that ran a little longer are a few, not a p50."""
    before, during = run["phases"]["before"], run["phases"]["during"]
    within = None
    if before["p50"] and during["p50"] is not None and during["p99"] is not None:
        within = during["p50"] <= 2 * before["p50"] and during["p99"] <= 2 * before["p99"]
    ended, recovered = start + hold, None
    if before["p50"]:
        after = [
            row for row in run["timeline"] if ended <= row["t"] < length and row["p50"] is not None
        ]
        for i, row in enumerate(after):
            if all(later["p50"] <= 2 * before["p50"] for later in after[i:]):
                recovered = max(0.0, row["t"] - ended)
                break
    return {"within_2x": within, "recovered_after": recovered}
