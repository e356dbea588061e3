#!/usr/bin/env python
"""The torture run: real workers, forced crashes, and a count of what was lost or run twice.

    eval "$(scripts/pg start)"     # PostgreSQL: PG* variables and JOBSTATE_PG_CTL
    python bench/torture.py --db postgres --jobs 5000 --supervisors 3 --concurrency 3 \\
        --duration 180 [--seed N]
    python bench/torture.py --db sqlite --jobs 1000 --supervisors 2 --concurrency 2 --duration 60
    eval "$(scripts/pg stop)"

It creates its own database (PostgreSQL: a new database on the PG* server, dropped at the
end; SQLite: a temporary file), enqueues --jobs tasks (bench/torture_tasks.py) due over the
first 90% of the faults, and starts --supervisors `manage.py runjobs --concurrency C`
processes (settings: bench/torture_settings.py; heartbeat 0.5 s, lost after 4 s). For
--duration seconds it then SIGKILLs random worker processes (the pids of the
WorkerHeartbeat rows) and whole supervisors (killpg), starting a new supervisor for each
one killed; SIGSTOPs workers for longer than the lost-after window (they are rescued, and
their late outcomes must be refused) and for less (they must not be); and restarts
PostgreSQL once (`$JOBSTATE_PG_CTL restart -m fast -w`). Then, with no fault left, it
waits until every logical task is terminal (bound: the lost-after window plus
--drain-margin), stops the supervisors, prints a table of figures and exits 1 if a
must-be-zero figure is not zero.

Every task body first inserts an Execution row keyed by (result id, attempt), stamped by
the database clock and holding the attempt's state as that INSERT saw it; then it sleeps
(some), fails (a hash of (seed, result id, attempt) decides) or overruns its timeout (the
first attempt of an `overrun` task). So, per attempt, the plan says what must happen. The
mix: 1% `overrun` tasks (3 attempts, timeout 1 s), 20% `once` tasks (one attempt, the
default), the rest `flaky` (5 attempts); 10% of them sleep 0.2-1.5 s; each attempt fails
with probability --fail-rate. --seed fixes the mix and the schedule of faults; the result
ids (uuid4), and so which attempts fail, and the timing differ from run to run.

Why each check is sound:
- Executions of an attempt after it was already failed: an Execution row whose attempt was
  failed before it was written (its recorded_at is after the attempt's finished_at, both by
  the database clock, or its INSERT saw the attempt no longer running). A body records at
  its start, so a body paused *after* recording writes nothing when resumed. One legitimate
  case remains: a worker process SIGSTOPped between claiming an attempt and starting its
  body is taken for lost, its attempt failed; resumed, it starts the body. No queue can
  prevent that without the task fencing its own writes, so an execution written by a
  process that this script paused between the attempt's start and the execution is
  listed apart, not counted. Anything else (a worker running an attempt it no longer owns
  without having been paused) counts. (Workers claim in batches; a resumed worker checks
  which attempts of its batch are still its own before it starts them, so the window is
  that check to the body's first statement.)
- Attempts run twice: two Execution rows for one (result id, attempt). The body never
  retries its INSERT, and a retry of the task is a new attempt number.
- More than one live attempt: sampled with a GROUP BY query about five times a second
  during the run, and once at the end (a partial unique constraint forbids it).
- Tasks that should have succeeded and did not: a task whose plan lets some attempt up to
  max_attempts succeed, that ended failed, unless each of its attempts that should have
  succeeded was failed by a fault (lost, interrupted, a timeout, a database outage): kills
  consume attempts (the `once` tasks have one, the default), so those are counted apart,
  as "failed only through faults". An attempt whose outcome contradicts its plan (a
  planned failure that succeeded, an overrun that was not stopped) is counted too.
- Attempts whose outcome contradicts their plan: a planned failure that succeeded, or an
  overrun that was not stopped by its timeout. One case is listed apart: an overrun whose
  worker process was paused across its deadline, watchdog thread included; resumed, its
  body returns at once and its success races the late watchdog (a known bug, reproduced
  in tests/test_torture.py). On SQLite a paused process that holds the write lock stops
  every writer, rescuers included, until it is resumed.
- Kill -> rescue: the time from the SIGKILL (or SIGSTOP) to the finished_at of each attempt
  its worker was running, database clock (this script's clock plus the offset measured at
  the start; the database runs on the same host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):  # run as a script: import bench.*, not bench/bench.py
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "bench.torture_settings"
LONG_PAUSE_EXTRA = 2.0  # a long pause lasts LOST_AFTER + this
SHORT_PAUSE = 1.0
SPREAD = 0.9  # jobs are due over this fraction of --duration
T = TypeVar("T")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Torture django-jobstate's runjobs and count what was lost or run twice.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--db", choices=["postgres", "sqlite"], required=True)
    parser.add_argument("--jobs", type=int, default=1000, help="logical tasks to enqueue")
    parser.add_argument("--supervisors", type=int, default=2, help="runjobs processes at once")
    parser.add_argument("--concurrency", type=int, default=2, help="workers per supervisor")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    parser.add_argument("--worker-kills", type=int, help="default: duration/15, at least 2")
    parser.add_argument("--supervisor-kills", type=int, help="default: duration/60, at least 1")
    parser.add_argument(
        "--pauses", type=int, help="long and short SIGSTOPs, each; default: duration/45, at least 1"
    )
    parser.add_argument("--no-restart", action="store_true", help="do not restart PostgreSQL")
    parser.add_argument(
        "--fail-rate", type=float, default=0.25, help="planned failures per attempt"
    )
    parser.add_argument(
        "--sleep-fraction", type=float, default=0.1, help="jobs that sleep 0.2-1.5 s"
    )
    parser.add_argument("--once-fraction", type=float, default=0.2, help="jobs with one attempt")
    parser.add_argument(
        "--overrun-fraction", type=float, default=0.01, help="jobs that time out once"
    )
    parser.add_argument(
        "--drain-margin", type=float, default=30.0, help="seconds, beyond lost-after"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    options = parser.parse_args(argv)
    if options.jobs < 1 or options.supervisors < 1 or options.concurrency < 1:
        parser.error("--jobs, --supervisors and --concurrency must be at least 1")
    if options.duration <= 0:
        parser.error("--duration must be positive")
    d = options.duration
    if options.worker_kills is None:
        options.worker_kills = max(2, round(d / 15))
    if options.supervisor_kills is None:
        options.supervisor_kills = max(1, round(d / 60))
    if options.pauses is None:
        options.pauses = max(1, round(d / 45))
    options.restart = options.db == "postgres" and not options.no_restart
    if options.restart and not os.environ.get("JOBSTATE_PG_CTL"):
        parser.error(
            "restarting PostgreSQL needs JOBSTATE_PG_CTL: run under "
            '`eval "$(scripts/pg start)"`, or pass --no-restart'
        )
    return options


@dataclass
class Supervisor:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def prefix(self) -> str:
        return f"torture-s{self.index}/"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Database:
    """A fresh database for one run, on the PG* server or in a temporary file."""

    def __init__(self, vendor: str, run_dir: Path) -> None:
        self.vendor = vendor
        if vendor == "sqlite":
            self.name = str(run_dir / "torture.sqlite3")
            return
        import psycopg
        from psycopg import sql

        self.name = f"jobstate_torture_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))

    def drop(self) -> None:
        if self.vendor != "postgres":
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )


class Torture:
    def __init__(self, options: argparse.Namespace, run_dir: Path) -> None:
        self.options = options
        self.run_dir = run_dir
        self.rng = random.Random(options.seed)
        self.supervisors: list[Supervisor] = []
        self.paused: dict[int, tuple[float, Any]] = {}  # pid -> (monotonic resume time, Pause)
        from bench.torture_check import Faults

        self.faults = Faults()
        self.offset = 0.0  # database clock minus this process's clock, in seconds
        self.last_sample = 0.0

    # ---------------------------------------------------------------- set-up

    def setup(self) -> None:
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)
        self.lost_after = float(settings.JOBSTATE_LOST_AFTER)
        self.offset = self._measure_offset()

    def _measure_offset(self) -> float:
        from django.db import connection

        if connection.vendor == "postgresql":
            query = "SELECT STATEMENT_TIMESTAMP()"
        else:
            query = "SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'now')"
        with connection.cursor() as cursor:
            before = time.time()
            cursor.execute(query)
            after = time.time()
            value = cursor.fetchone()[0]
        if isinstance(value, str):
            value = datetime.fromisoformat(value).replace(tzinfo=UTC)
        return value.timestamp() - (before + after) / 2

    def db_now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self.offset, tz=UTC)

    def enqueue(self) -> None:
        from django.db import transaction
        from django.utils import timezone

        from bench import torture_tasks as tt

        o, rng = self.options, self.rng
        n_overrun = max(1, round(o.jobs * o.overrun_fraction)) if o.overrun_fraction else 0
        n_once = round(o.jobs * o.once_fraction)
        specs = []
        for i in range(o.jobs):
            if i < n_overrun:
                specs.append((tt.overrun, tt.OVERRUN, 3.0))
                continue
            sleeps = rng.random() < o.sleep_fraction
            kind, seconds = (tt.SLEEP, round(rng.uniform(0.2, 1.5), 2)) if sleeps else (tt.PLAIN, 0)
            specs.append((tt.once if i < n_overrun + n_once else tt.flaky, kind, seconds))
        rng.shuffle(specs)
        now = timezone.now()
        for start in range(0, len(specs), 250):
            with transaction.atomic():
                for task, kind, seconds in specs[start : start + 250]:
                    run_after = now + timedelta(seconds=rng.uniform(0, SPREAD * o.duration))
                    task.using(run_after=run_after).enqueue(o.seed, kind, seconds, o.fail_rate)

    # ----------------------------------------------------------- supervisors

    def start_supervisor(self) -> Supervisor:
        index = len(self.supervisors)
        log = self.run_dir / f"runjobs-s{index}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "manage.py"),
                    "runjobs",
                    "--concurrency",
                    str(self.options.concurrency),
                    "--worker-id",
                    f"torture-s{index}",
                    "--verbosity",
                    "0",
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        supervisor = Supervisor(index, proc, log)
        self.supervisors.append(supervisor)
        return supervisor

    def live_supervisors(self) -> list[Supervisor]:
        return [s for s in self.supervisors if not s.killed and s.alive]

    def wait_for_workers(self, count: int, timeout: float = 90.0) -> None:
        from django_jobstate.models import WorkerHeartbeat

        deadline = time.monotonic() + timeout
        while self.guarded(WorkerHeartbeat.objects.count, 0) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} workers did not start within {timeout:g} s")
            time.sleep(0.2)

    def owner(self, pid: int) -> Supervisor | None:
        """The live supervisor of ours whose process group holds `pid`, if any."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return next((s for s in self.live_supervisors() if s.pid == group), None)

    # ---------------------------------------------------------------- faults

    def schedule(self) -> list[tuple[float, str]]:
        o, rng, d = self.options, self.rng, self.options.duration
        long_pause = self.lost_after + LONG_PAUSE_EXTRA
        events = [(rng.uniform(0.05, 0.85) * d, "kill_worker") for _ in range(o.worker_kills)]
        events += [
            (rng.uniform(0.1, 0.8) * d, "kill_supervisor") for _ in range(o.supervisor_kills)
        ]
        latest = max(0.05 * d, 0.9 * d - long_pause)
        events += [(rng.uniform(0.05 * d, latest), "pause_long") for _ in range(o.pauses)]
        events += [(rng.uniform(0.05, 0.85) * d, "pause_short") for _ in range(o.pauses)]
        if o.restart:
            events.append((rng.uniform(0.3, 0.6) * d, "restart"))
        return sorted(events)

    def run_faults(self) -> None:
        events = self.schedule()
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < self.options.duration:
            while events and events[0][0] <= elapsed:
                getattr(self, events.pop(0)[1])()
            self.tick()
            time.sleep(0.05)
        for action in events:  # a slow machine: run what is left rather than skip it
            getattr(self, action[1])()

    def tick(self) -> None:
        """Resume pauses that are due, replace dead supervisors, sample the invariant."""
        for pid, (until, _pause) in list(self.paused.items()):
            if time.monotonic() >= until:
                self.resume(pid)
        for supervisor in self.supervisors:
            if not supervisor.killed and not supervisor.alive:
                supervisor.killed = True  # not by us: count it, replace it
                self.faults.supervisors_died += 1
                print(f"  supervisor s{supervisor.index} exited {supervisor.proc.returncode}")
                self.start_supervisor()
        if time.monotonic() - self.last_sample >= 0.2:
            self.last_sample = time.monotonic()
            self.sample()

    def sample(self) -> None:
        from django.db.models import Count

        from django_jobstate.models import Job

        def query() -> list[str]:
            live = Job.objects.live().order_by().values("result_id")
            return [str(row["result_id"]) for row in live.annotate(n=Count("id")).filter(n__gt=1)]

        multi = self.guarded(query, None)
        if multi is not None:
            self.faults.samples += 1
            self.faults.multi_live.update(multi)

    def pick_worker(self) -> tuple[int, str] | None:
        """A worker of a live supervisor, not paused: mid-body if any, else busy, else any."""
        from bench.models import Execution
        from django_jobstate.models import Job, WorkerHeartbeat

        def query() -> tuple[list[tuple[str, int]], list[tuple[str, Any, int]], set[Any]]:
            beats = list(WorkerHeartbeat.objects.values_list("worker_id", "pid"))
            running = list(Job.objects.running().values_list("worker_id", "result_id", "attempt"))
            started = set(
                Execution.objects.filter(result_id__in={r[1] for r in running}).values_list(
                    "result_id", "attempt"
                )
            )
            return beats, running, started

        found = self.guarded(query, None)
        if found is None:
            return None
        beats, running, started = found
        ours = [
            (pid, wid)
            for wid, pid in beats
            if pid not in self.paused and (s := self.owner(pid)) and wid.startswith(s.prefix)
        ]
        mid_body = {wid for wid, rid, attempt in running if (rid, attempt) in started}
        busy = {wid for wid, _, _ in running}
        for wanted in (mid_body, busy, None):
            candidates = [w for w in ours if wanted is None or w[1] in wanted]
            if candidates:
                return self.rng.choice(sorted(candidates))
        return None

    def victims(self, at: datetime, **worker: str) -> list[int]:
        """Attempts of the worker(s) that were running at `at` and are not finished since."""
        from django.db.models import Q

        from django_jobstate.models import Job
        from django_jobstate.states import FailureReason, State

        time.sleep(0.2)  # let a statement already sent by the process land
        rescued = Q(
            state=State.FAILED,
            failure_reason__in=[FailureReason.LOST, FailureReason.INTERRUPTED],
            finished_at__gte=at,
        )
        jobs = Job.objects.filter(**worker).filter(Q(state=State.RUNNING) | rescued)
        return self.retrying(lambda: list(jobs.values_list("pk", flat=True)))

    def kill_worker(self) -> None:
        from bench.torture_check import Kill

        picked = self.pick_worker()
        if picked is None:
            return
        pid, worker_id = picked
        at = self.db_now()
        os.kill(pid, signal.SIGKILL)
        kill = Kill("worker", worker_id, at, self.victims(at, worker_id=worker_id))
        self.faults.kills.append(kill)
        print(f"  {self.clock()} SIGKILL worker {worker_id} ({len(kill.victims)} running)")

    def kill_supervisor(self) -> None:
        from bench.torture_check import Kill

        live = self.live_supervisors()
        if not live:
            return
        victim = self.rng.choice(live)
        at = self.db_now()
        os.killpg(victim.pid, signal.SIGKILL)
        victim.killed = True
        victim.proc.wait()
        kill = Kill(
            "supervisor", victim.prefix, at, self.victims(at, worker_id__startswith=victim.prefix)
        )
        self.faults.kills.append(kill)
        for pid in [
            pid
            for pid, (_, pause) in self.paused.items()
            if pause.worker_id.startswith(victim.prefix)
        ]:
            self.resume(pid)
        replacement = self.start_supervisor()
        print(
            f"  {self.clock()} SIGKILL supervisor s{victim.index} and its workers "
            f"({len(kill.victims)} running); started s{replacement.index}"
        )

    def pause_long(self) -> None:
        self.pause(long=True)

    def pause_short(self) -> None:
        self.pause(long=False)

    def pause(self, *, long: bool) -> None:
        from bench.torture_check import Pause

        picked = self.pick_worker()
        if picked is None:
            return
        pid, worker_id = picked
        at = self.db_now()
        os.kill(pid, signal.SIGSTOP)
        pause = Pause(pid, worker_id, long, at)
        pause.victims = self.victims(at, worker_id=worker_id)
        self.faults.pauses.append(pause)
        seconds = self.lost_after + LONG_PAUSE_EXTRA if long else SHORT_PAUSE
        self.paused[pid] = (time.monotonic() + seconds, pause)
        print(
            f"  {self.clock()} SIGSTOP worker {worker_id} for {seconds:g} s "
            f"({len(pause.victims)} running)"
        )

    def resume(self, pid: int) -> None:
        _, pause = self.paused.pop(pid)
        pause.resumed = self.db_now()
        with contextlib.suppress(ProcessLookupError):  # killed meanwhile
            os.kill(pid, signal.SIGCONT)

    def restart(self) -> None:
        from django.db import connection

        started = time.monotonic()
        print(f"  {self.clock()} restarting PostgreSQL")
        subprocess.run(
            [os.environ["JOBSTATE_PG_CTL"], "restart", "-m", "fast", "-w"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        connection.close()
        self.faults.restarts.append(time.monotonic() - started)

    # ---------------------------------------------------------------- the end

    def drain(self) -> tuple[float, float]:
        """Wait, with no fault left, until every logical task is terminal; return (took, bound)."""
        from django_jobstate.models import Job

        for pid in list(self.paused):
            self.resume(pid)
        while len(self.live_supervisors()) < self.options.supervisors:
            self.start_supervisor()
        started = time.monotonic()
        bound = self.lost_after + self.options.drain_margin
        while time.monotonic() - started < bound:
            self.tick()
            if self.guarded(lambda: not Job.objects.live().exists(), False):
                break
            time.sleep(0.2)
        return time.monotonic() - started, bound

    def stop_supervisors(self) -> list[int | None]:
        codes = []
        for supervisor in self.live_supervisors():
            supervisor.proc.send_signal(signal.SIGTERM)
        for supervisor in self.supervisors:
            if supervisor.killed:
                continue
            try:
                codes.append(supervisor.proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                os.killpg(supervisor.pid, signal.SIGKILL)
                supervisor.proc.wait()
                codes.append(None)
        return codes

    def cleanup(self) -> None:
        for pid in list(self.paused):
            self.resume(pid)
        for supervisor in self.supervisors:
            if supervisor.alive:
                os.killpg(supervisor.pid, signal.SIGKILL)
                supervisor.proc.wait()

    def log_text(self) -> str:
        return "".join(s.log.read_text(errors="replace") for s in self.supervisors)

    # --------------------------------------------------------------- helpers

    def clock(self) -> str:
        return time.strftime("%H:%M:%S")

    def guarded(self, query: Callable[[], T], default: T) -> T:
        """Run a read; during an outage (the restart) return `default`."""
        from django.db import DatabaseError, connection

        try:
            return query()
        except DatabaseError:
            connection.close()
            return default

    def retrying(self, query: Callable[[], T], timeout: float = 60.0) -> T:
        from django.db import DatabaseError, connection

        deadline = time.monotonic() + timeout
        while True:
            try:
                return query()
            except DatabaseError:
                connection.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def command_line(argv: list[str], seed: int) -> str:
    args = list(argv)
    if "--seed" not in args and not any(a.startswith("--seed=") for a in args):
        args += ["--seed", str(seed)]
    return shlex.join(["python", "bench/torture.py", *args])


def print_report(header: list[str], figures: dict[str, Any]) -> None:
    width = max(len(f.label) for f in figures.values())
    print()
    for line in header:
        print(line)
    print()
    print(f"{'figure':<{width}}  must be  value")
    print(f"{'-' * width}  -------  -----")
    for figure in figures.values():
        must = "0" if figure.must_be_zero else ""
        line = f"{figure.label:<{width}}  {must:>7}  {figure.value}"
        if figure.bad:
            line += "  <-- FAIL"
        if figure.note:
            line += f"  ({figure.note})"
        print(line)
        if figure.value and figure.value != "-":
            for example in figure.examples[:5]:
                print(f"      e.g. {example}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options = parse_args(argv)
    if options.seed is None:
        options.seed = random.randrange(1_000_000)
    command = command_line(argv, options.seed)
    run_dir = Path(tempfile.mkdtemp(prefix="jobstate-torture-"))
    database = Database(options.db, run_dir)
    os.environ.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        JOBSTATE_TORTURE_DB=options.db,
        JOBSTATE_TORTURE_DB_NAME=database.name,
    )
    import django

    django.setup()
    from bench.torture_check import Figure, check

    torture = Torture(options, run_dir)
    failed: list[str] = []
    try:
        print(f"{command}\n  database {database.name}, logs in {run_dir}")
        torture.setup()
        for _ in range(options.supervisors):
            torture.start_supervisor()
        torture.wait_for_workers(options.supervisors * options.concurrency)
        torture.enqueue()
        print(
            f"  {torture.clock()} enqueued {options.jobs} jobs; faults for {options.duration:g} s"
        )
        torture.run_faults()
        print(f"  {torture.clock()} faults over; draining")
        took, bound = torture.drain()
        codes = torture.stop_supervisors()
        figures = check(options.jobs, torture.faults, torture.log_text(), torture.lost_after)
        figures["drain"] = Figure(
            "seconds from the last fault until every task was terminal",
            f"{took:.1f}",
            note=f"bound {bound:g} s",
        )
        figures["stopped"] = Figure(
            "supervisors stopped by SIGTERM (exit codes)", " ".join(map(str, codes))
        )
        failed = [key for key, figure in figures.items() if figure.bad]
        header = [
            f"django-jobstate torture run: {options.db}, {options.jobs} jobs, "
            f"{options.supervisors} supervisors x {options.concurrency} workers, "
            f"{options.duration:g} s of faults, seed {options.seed}",
            f"command: {command}",
            f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"Django {django.get_version()}, {torture_db_version()}",
        ]
        print_report(header, figures)
        if options.json:
            options.json.write_text(
                json.dumps(
                    {
                        "command": command,
                        "seed": options.seed,
                        "db": options.db,
                        "failed": failed,
                        "figures": {
                            key: {
                                "label": f.label,
                                "value": f.value,
                                "must_be_zero": f.must_be_zero,
                                "note": f.note,
                                "examples": f.examples,
                            }
                            for key, f in figures.items()
                        },
                    },
                    indent=2,
                )
            )
        print()
        print("FAILED: " + ", ".join(failed) if failed else "OK: every must-be-zero figure is 0")
    finally:
        torture.cleanup()
        from django.db import connections

        connections.close_all()
        if not options.keep:
            database.drop()
        if options.keep or failed:
            print(f"kept: logs{' and database' if options.keep else ''} in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if failed else 0


def torture_db_version() -> str:
    from django.db import connection

    if connection.vendor == "postgresql":
        return f"PostgreSQL {connection.pg_version // 10000}.{connection.pg_version % 10000}"
    import sqlite3

    return f"SQLite {sqlite3.sqlite_version}"


if __name__ == "__main__":
    sys.exit(main())
