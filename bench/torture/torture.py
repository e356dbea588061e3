#!/usr/bin/env python
"""The torture run: real workers, forced crashes, and a count of what was lost or run twice.

    eval "$(scripts/pg start)"     # PostgreSQL: PG* variables and JOBSTATE_PG_CTL
    python bench/torture/torture.py --db postgres --jobs 5000 --supervisors 3 --concurrency 3 \\
        --duration 180 [--seed N]
    python bench/torture/torture.py --db sqlite --jobs 1500 --supervisors 2 --concurrency 2 \\
        --duration 90
    eval "$(scripts/pg stop)"
    eval "$(scripts/mysql start)"  # MariaDB: JOBSTATE_MYSQL_* and JOBSTATE_MYSQL_CTL
    python bench/torture/torture.py --db mysql --jobs 3000 --supervisors 3 --concurrency 2 \\
        --duration 120

It creates its own database (PostgreSQL or MariaDB: a new database on the PG* or
JOBSTATE_MYSQL_* server, dropped at the end; SQLite: a temporary file), enqueues --jobs
tasks (bench/torture/torture_tasks.py) due over the first 90% of the faults, and starts
--supervisors `manage.py runjobs --concurrency C` processes (settings:
bench/torture/torture_settings.py; heartbeat 0.5 s, lost after 4 s, every attempt with a timeout:
JOBSTATE_DEFAULT_TIMEOUT 12 s). They all get the same --worker-id,
and on PostgreSQL and MariaDB their clocks are skewed in turn by -/+/0 --skew seconds
(tests/clock_skew; SQLite uses the writing process's clock by design). For
--duration seconds it then:
- SIGKILLs random worker processes (the pids of the WorkerHeartbeat rows) and whole
  supervisors (killpg), starting a new supervisor for each one killed;
- SIGSTOPs worker processes (not their supervisors) for longer than the lost-after window
  (preferring one in an attempt whose deadline falls in the pause: its supervisor must
  kill it at the deadline, stopped or not) and for less: a paused worker is a slow
  attempt, never lost, since its supervisor heartbeats for it;
- takes the database away for longer than the lost-after window (PostgreSQL: `pg_ctl stop`,
  then `start`; MariaDB: `$JOBSTATE_MYSQL_CTL stop`, then `start`; SQLite: another
  connection holds the write lock with BEGIN IMMEDIATE, as a long bulk enqueue would), and
  restarts the server once (`$JOBSTATE_PG_CTL restart`, `$JOBSTATE_MYSQL_CTL restart`);
- on MariaDB, kills the supervisors' database connections (`KILL CONNECTION`) now and
  then: each side must reconnect, as after a server restart, and lose no attempt;
- on PostgreSQL and MariaDB, as root, runs one more supervisor on a worker host of its own
  (a network namespace reaching the server over a veth, tests/netns.py, through
  bench/torture/torture_proxy.py)
  and cuts that link for longer than the window, then restores it: its attempts are
  rescued by the others, its late outcomes refused. Not root: skipped, with a note.
- runs the workloads of bench/torture/torture_workloads.py, each drawn from the seed and
  switched off by its own --no-... flag: cancels at random moments, a schedule ticking
  every second, unique tasks enqueued while the workers drain, mixed batches (fast jobs
  and a slow one, its worker sometimes killed), rows locked by another connection, and
  the job table locked while attempts with a 1 s timeout run (one of the faults that
  take the database away). Their checks, and why each is sound, are in
  bench/torture/torture_check_workloads.py.
Those that take the database or the network away run one at a time, apart from each
other. Then, with no fault left, it waits until every logical task is terminal (bound: the
lost-after window plus --drain-margin), stops the supervisors, prints a table of figures
and exits 1 if a must-be-zero figure is not zero.

Every task body first inserts an Execution row keyed by (result id, attempt), stamped by
the database clock and holding the attempt's state as that INSERT saw it; then it sleeps
(some), fails (a hash of (seed, result id, attempt) decides) or overruns its timeout. So,
per attempt, the plan says what must happen. The mix: 1% `overrun` tasks (3 attempts,
timeout 1 s: the first sleeps 3 s), --gil-jobs tasks that hold the interpreter (ctypes
usleep, no other thread of the process runs) for the lost-after window plus 2 s on their
first attempt, half of them with a 1 s timeout that must stop them, half without (the
12 s default) that must succeed and not be taken for lost; 20% `once` tasks (one attempt,
the default), the rest `flaky` (5 attempts); 10% of them sleep 0.2-1.5 s; 2% (at least 2)
raise errors that are hard to store (a NUL, a lone surrogate, a str() that raises) in 3
of 4 attempts; any other attempt fails with probability --fail-rate. --seed fixes the mix
and the schedule of faults; the result ids, and so which attempts fail, and the timing
differ from run to run. --in-flight N runs N attempts at once per worker process (with
--in-flight-alternate, in every other supervisor only, a replacement running as the one
killed did), and --async-fraction makes that share of the tasks `async def` twins of the
same plans (with --in-flight, on the worker's event loop, where an overrun is cancelled
at its deadline).

Why each check is sound:
- Executions of an attempt after it was already failed: an Execution row whose attempt was
  failed before it was written (its recorded_at is after the attempt's finished_at, both by
  the database clock, or its INSERT saw the attempt no longer running). A body records at
  its start, so a body paused *after* recording writes nothing when resumed. One case no
  queue can rule out without the task fencing its own writes is listed apart: a worker
  host cut off between claiming an attempt and its body's first statement, taken for lost
  meanwhile, that starts the body once the link is back. A SIGSTOPped worker is no longer
  excused: its supervisor heartbeats for it, so its attempts are never taken for lost.
- A handed-back attempt that ran: an Execution row for an attempt failed as `released`
  (its supervisor took it back before the worker started it).
- Attempts run twice: two Execution rows for one (result id, attempt). The body never
  retries its INSERT, and a retry of the task is a new attempt number.
- More than one live attempt: sampled with a GROUP BY query about five times a second
  during the run, and once at the end (a partial unique constraint forbids it).
- Attempt chains: numbers without gaps, every attempt but the last failed, a retry after
  each failure while the task has attempts left; a released attempt's successor has one
  more max_attempts (released attempts do not use up the task's attempts).
- Tasks that should have succeeded and did not: a task whose plan lets some attempt that
  could run (not a released one, up to its max_attempts) succeed, that ended failed,
  unless each of its attempts that should have succeeded was failed by a fault (lost,
  interrupted, a timeout, a database outage): kills consume attempts (the `once` tasks
  have one, the default), so those are counted apart, as "failed only through faults".
- Attempts whose outcome contradicts their plan: a planned failure that succeeded, an
  overrun that was not stopped by its timeout (there is no exception left: the supervisor
  kills at the deadline even while the worker is SIGSTOPped), a planned failure stored
  with another error or message (the unstorable ones must be stored escaped).
- Timeouts not enforced: a body planned to overrun that was still alive after its sleep
  or hold (it marks its Execution row), or a timeout the worker found itself more than a
  second late (the supervisor should have killed it first).
- Attempts of healthy workers taken for lost: failed as lost, though their worker was
  never killed, its supervisor never killed, its host never cut off; reported by cause
  (during an outage, holding the interpreter, SIGSTOPped, on a skewed clock).
- Times off the database clock: an attempt started (claimed, or its body's first
  statement) before its run_after, or a start or finish time out of order with its
  enqueue time and the end of the run, by the database clock: a supervisor whose clock is
  an hour off must neither claim early nor write its own times.
- Kill -> rescue: the time from the SIGKILL (or the cut) to the finished_at of each
  attempt its worker was running, database clock (this script's clock plus the offset
  measured at the start; the database runs on the same host).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):  # run as a script: import bench.*, not bench/benchmark/bench.py
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import mysql_admin
from bench.torture import torture_workflows as workflows
from bench.torture import torture_workloads as workloads

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "bench.torture.torture_settings"
WINDOW_EXTRA = 2.0  # a long pause, an outage, a cut or a held interpreter: LOST_AFTER + this
SHORT_PAUSE = 1.0
UGLY_FAIL_RATE = 0.75  # planned failures per attempt of the tasks with unstorable errors
CUT_WAIT = 10.0  # seconds the cut may wait for the partitioned host to run an attempt
SPREAD = 0.9  # jobs are due over this fraction of --duration
WORKER_ID = "torture"  # every supervisor's --worker-id: the same, on purpose
# The server databases: the variable of their control script, their name, the script
# that starts a throwaway one (and sets that variable).
SERVER_CTL = {
    "postgres": ("JOBSTATE_PG_CTL", "PostgreSQL", "scripts/pg"),
    "mysql": ("JOBSTATE_MYSQL_CTL", "MariaDB", "scripts/mysql"),
}
T = TypeVar("T")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Torture django-jobstate's runjobs and count what was lost or run twice.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--db", choices=["postgres", "sqlite", "mysql"], required=True)
    parser.add_argument("--jobs", type=int, default=1000, help="logical tasks to enqueue")
    parser.add_argument("--supervisors", type=int, default=2, help="runjobs processes at once")
    parser.add_argument("--concurrency", type=int, default=2, help="workers per supervisor")
    parser.add_argument(
        "--in-flight", type=int, default=1, help="attempts at once per worker process"
    )
    parser.add_argument(
        "--in-flight-alternate",
        action="store_true",
        help="every other supervisor runs one attempt at a time (both modes in one run)",
    )
    parser.add_argument(
        "--async-fraction",
        type=float,
        default=0.0,
        help="jobs whose task is async (with --in-flight: on the worker's event loop)",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    parser.add_argument("--worker-kills", type=int, help="default: duration/15, at least 2")
    parser.add_argument("--supervisor-kills", type=int, help="default: duration/60, at least 1")
    parser.add_argument(
        "--pauses", type=int, help="long and short SIGSTOPs, each; default: duration/45, at least 1"
    )
    parser.add_argument(
        "--outages",
        type=int,
        help="database outages longer than the lost-after window; default: duration/90, at least 1",
    )
    parser.add_argument(
        "--no-restart", action="store_true", help="do not restart PostgreSQL or MariaDB"
    )
    parser.add_argument(
        "--no-partition",
        action="store_true",
        help="no partitioned worker host (PostgreSQL, MariaDB)",
    )
    parser.add_argument(
        "--connection-kills",
        type=int,
        help="MariaDB: KILL CONNECTION of the supervisors' connections; default: duration/30",
    )
    parser.add_argument(
        "--skew", type=float, default=3600.0, help="seconds of clock skew of some supervisors"
    )
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
        "--gil-jobs", type=int, help="jobs that hold the interpreter; default: jobs/250, at least 2"
    )
    parser.add_argument(
        "--ugly-fraction",
        type=float,
        default=0.02,
        help="jobs whose errors are hard to store (at least 2)",
    )
    parser.add_argument(
        "--drain-margin", type=float, default=30.0, help="seconds, beyond lost-after"
    )
    workloads.add_arguments(parser)
    workflows.add_arguments(parser)
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
    if options.outages is None:
        options.outages = max(1, round(d / 90))
    if options.gil_jobs is None:
        options.gil_jobs = max(2, round(options.jobs / 250))
    workloads.resolve(options)
    workflows.resolve(options)
    server = options.db in SERVER_CTL
    options.restart = server and not options.no_restart
    if options.connection_kills is None:
        options.connection_kills = max(2, round(d / 30)) if options.db == "mysql" else 0
    elif options.connection_kills and options.db != "mysql":
        parser.error("--connection-kills is for --db mysql")
    ctl = SERVER_CTL.get(options.db)
    if ctl and (options.restart or options.outages) and not os.environ.get(ctl[0]):
        parser.error(
            f"restarting and stopping {ctl[1]} needs {ctl[0]}: run under "
            f'`eval "$({ctl[2]} start)"`, or pass --no-restart --outages 0'
        )
    options.partition = server and not options.no_partition
    return options


@dataclass
class Supervisor:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    skew: float = 0.0  # seconds its clock is off
    host: str = ""  # the network namespace it runs in, if not this host's
    killed: bool = False
    base: str | None = None  # its worker ids' prefix (--worker-id plus a random part)
    in_flight: int = 1  # its --in-flight

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def prefix(self) -> str | None:
        return None if self.base is None else f"{self.base}/"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Database:
    """A fresh database for one run, on the PG* or JOBSTATE_MYSQL_* server, or in a
    temporary file."""

    def __init__(self, vendor: str, run_dir: Path) -> None:
        self.vendor = vendor
        if vendor == "sqlite":
            self.name = str(run_dir / "torture.sqlite3")
            return
        self.name = f"jobstate_torture_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        if vendor == "mysql":
            with mysql_admin() as cursor:
                cursor.execute(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))

    def drop(self) -> None:
        if self.vendor == "mysql":
            with mysql_admin() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
        if self.vendor != "postgres":
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )


class Partition:
    """A worker host of its own: a network namespace reaching the server over a veth pair,
    through a forwarder in the database host's namespace (bench/torture/torture_proxy.py)."""

    def __init__(self, run_dir: Path, vendor: str) -> None:
        from tests import netns

        self.network = netns.Network(tag=f"t{os.getpid()}")
        try:
            db = self.network.namespace("db")
            self.host = self.network.namespace("w1")
            self.link = self.network.link(db, self.host)
            if vendor == "mysql":
                port = os.environ["JOBSTATE_MYSQL_PORT"]
                socket_path = Path(os.environ["JOBSTATE_MYSQL_DIR"]) / "mysql.sock"
            else:
                port = os.environ["PGPORT"]
                socket_path = Path(os.environ["JOBSTATE_PG_DIR"]) / f".s.PGSQL.{port}"
            self.proxy = subprocess.Popen(
                db.exec_args(
                    sys.executable,
                    "-m",
                    "bench.torture.torture_proxy",
                    self.link.db_address,
                    port,
                    str(socket_path),
                ),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=(run_dir / "proxy.log").open("wb"),
            )
            assert self.proxy.stdout is not None
            if self.proxy.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"the forwarder did not start: see {run_dir / 'proxy.log'}")
        except BaseException:
            self.close()
            raise
        if vendor == "mysql":
            self.env = {"JOBSTATE_MYSQL_HOST": self.link.db_address, "JOBSTATE_MYSQL_PORT": port}
        else:
            self.env = {"PGHOST": self.link.db_address, "PGPORT": port}

    @staticmethod
    def unavailable(vendor: str) -> str | None:
        from tests import netns

        variable, script = (
            ("JOBSTATE_MYSQL_DIR", "mysql") if vendor == "mysql" else ("JOBSTATE_PG_DIR", "pg")
        )
        if not os.environ.get(variable):
            return f"no {variable} (the server's Unix socket): run under scripts/{script} start"
        return netns.unavailable()

    def close(self) -> None:
        self.network.close()  # kills what runs in the namespaces, the forwarder included


class Torture(workloads.Workloads, workflows.WorkflowLoad):
    def __init__(self, options: argparse.Namespace, run_dir: Path) -> None:
        self.options = options
        self.run_dir = run_dir
        self.rng = random.Random(options.seed)
        self.supervisors: list[Supervisor] = []
        self.paused: dict[int, tuple[float, Any]] = {}  # pid -> (monotonic resume time, Pause)
        from bench.torture.torture_check import Faults

        self.faults = Faults(one_write_lock=options.db == "sqlite")
        self.offset = 0.0  # database clock minus this process's clock, in seconds
        self.offset_error = 0.0  # how far off that may be, in seconds
        self.last_sample = 0.0
        self.last_learned = 0.0
        self.partition: Partition | None = None
        # A fault in progress that takes the database or the network away, and when it ends.
        self.away: tuple[float, Any] | None = None
        self.lock: sqlite3.Connection | None = None  # SQLite: holds the write lock
        self.cut_waits = 0
        self.database_name = ""
        self.own_connections: set[int] = set()  # MariaDB ids, spared by kill_connections
        self.init_workloads()

    # ---------------------------------------------------------------- set-up

    def setup(self) -> None:
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)
        self.lost_after = float(settings.JOBSTATE_LOST_AFTER)
        self.offset = self._measure_offset()
        self.faults.workload.mono_to_db = time.time() + self.offset - time.monotonic()
        if self.options.skew and self.options.db == "sqlite":
            print(
                "  NOTE: no skewed clocks on SQLite: the app writes the times of a job with "
                "the writing process's clock there (one machine, one clock; see _now_sql)"
            )
            self.options.skew = 0.0
        if self.options.partition:
            if reason := Partition.unavailable(self.options.db):
                print(f"  NOTE: no network partition in this run: {reason}")
                self.options.partition = False
            else:
                self.partition = Partition(self.run_dir, self.options.db)

    def _measure_offset(self) -> float:
        """The database clock minus this process's wall clock, from the quickest of 20
        readings: its error is at most half that reading's round trip. (One reading, taken
        on a busy machine, can be off by more than CLOCK_SLACK: stop 41's CI counted a
        limit overlap that may have been no more than that.)"""
        from django.db import connection

        if connection.vendor == "postgresql":
            query = "SELECT STATEMENT_TIMESTAMP()"
        elif connection.vendor == "mysql":
            query = "SELECT UTC_TIMESTAMP(6)"
        else:
            query = "SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'now')"
        readings = []
        with connection.cursor() as cursor:
            for _ in range(20):
                before = time.time()
                cursor.execute(query)
                after = time.time()
                readings.append((after - before, before, after, cursor.fetchone()[0]))
        self.offset_error, before, after, value = min(readings, key=lambda r: r[0])
        self.offset_error /= 2
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:  # SQLite's text, MariaDB's UTC_TIMESTAMP: UTC
            value = value.replace(tzinfo=UTC)
        return value.timestamp() - (before + after) / 2

    def db_now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self.offset, tz=UTC)

    def enqueue(self) -> None:
        from django.db import transaction
        from django.utils import timezone

        from bench.torture import torture_tasks as tt

        o, rng = self.options, self.rng
        held = self.lost_after + WINDOW_EXTRA
        n_overrun = max(1, round(o.jobs * o.overrun_fraction)) if o.overrun_fraction else 0
        n_gil = min(o.gil_jobs, o.jobs - n_overrun)
        n_ugly = min(max(2, round(o.jobs * o.ugly_fraction)), o.jobs - n_overrun - n_gil)
        n_once = round(o.jobs * o.once_fraction)
        specs = []
        # The limited jobs and the workflows' steps are part of --jobs.
        for i in range(o.jobs - o.limited_jobs - o.workflow_steps):
            if i < n_overrun:
                specs.append((tt.overrun, tt.OVERRUN, 3.0, o.fail_rate))
            elif i < n_overrun + n_gil:  # half past a 1 s timeout, half with none of its own
                if (i - n_overrun) % 2 == 0:
                    specs.append((tt.overrun, tt.GIL_OVERRUN, held, o.fail_rate))
                else:
                    specs.append((tt.flaky, tt.GIL_HOLD, held, o.fail_rate))
            elif i < n_overrun + n_gil + n_ugly:  # mostly failing, to raise those errors
                specs.append((tt.once if i % 2 else tt.flaky, tt.UGLY, 0, UGLY_FAIL_RATE))
            else:
                task = tt.once if i < n_overrun + n_gil + n_ugly + n_once else tt.flaky
                if rng.random() < o.sleep_fraction:
                    specs.append((task, tt.SLEEP, round(rng.uniform(0.2, 1.5), 2), o.fail_rate))
                else:
                    specs.append((task, tt.PLAIN, 0, o.fail_rate))
        if o.async_fraction:
            specs = [
                (tt.ASYNC_TWINS[task], *rest) if rng.random() < o.async_fraction else (task, *rest)
                for task, *rest in specs
            ]
        rng.shuffle(specs)
        now = timezone.now()
        for start in range(0, len(specs), 250):
            with transaction.atomic():
                for task, kind, seconds, fail_rate in specs[start : start + 250]:
                    run_after = now + timedelta(seconds=rng.uniform(0, SPREAD * o.duration))
                    result = task.using(run_after=run_after).enqueue(
                        o.seed, kind, seconds, fail_rate
                    )
                    self.enqueued_ids.add(str(result.id))
        if o.limited_jobs:
            self.enqueue_limited(now, SPREAD * o.duration)
        if o.workflow_steps:
            self.enqueue_workflows(now, SPREAD * o.duration)

    # ----------------------------------------------------------- supervisors

    def start_supervisor(self, *, host: str = "") -> Supervisor:
        index = len(self.supervisors)
        log = self.run_dir / f"runjobs-s{index}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        skew = 0.0
        if host:
            assert self.partition is not None
            env.update(self.partition.env)
        elif self.options.skew:  # in turn: an hour behind, an hour ahead, on time
            here = sum(not s.host for s in self.supervisors)
            skew = (-self.options.skew, self.options.skew, 0.0)[here % 3]
        if skew:
            clock = str(ROOT / "tests" / "clock_skew")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [clock, env.get("PYTHONPATH")]))
            env["JOBSTATE_TEST_CLOCK_SKEW"] = str(skew)
        # With --in-flight-alternate, every other supervisor runs one attempt at a time,
        # and one started for a killed one runs as it did (both modes until the end).
        in_flight = self.options.in_flight
        if self.options.in_flight_alternate:
            live = self.live_supervisors(here=True)
            one_at_a_time = sum(s.in_flight == 1 for s in live)
            if (index % 2 == 0) if host else one_at_a_time <= len(live) - one_at_a_time:
                in_flight = 1
        command = [
            sys.executable,
            str(ROOT / "manage.py"),
            "runjobs",
            "--concurrency",
            str(self.options.concurrency),
            "--in-flight",
            str(in_flight),
            "--worker-id",
            WORKER_ID,
            "--verbosity",
            "0",
        ]
        if host:
            assert self.partition is not None
            command = self.partition.host.exec_args(*command)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        supervisor = Supervisor(index, proc, log, skew, host, in_flight=in_flight)
        self.supervisors.append(supervisor)
        return supervisor

    def live_supervisors(self, *, here: bool = False) -> list[Supervisor]:
        """Ours, not killed; with `here`, only those on this host (not partitioned)."""
        return [s for s in self.supervisors if not s.killed and s.alive and not (here and s.host)]

    def wait_for_workers(self, count: int, timeout: float = 90.0) -> None:
        from django_jobstate.models import WorkerHeartbeat

        deadline = time.monotonic() + timeout
        while self.guarded(WorkerHeartbeat.objects.count, 0) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} workers did not start within {timeout:g} s")
            time.sleep(0.2)
        self.learn()

    def owner(self, pid: int) -> Supervisor | None:
        """The live supervisor of ours whose process group holds `pid`, if any."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        if self.frozen is not None and group == self.frozen[0]:
            return None  # stopped whole (kill_limited): no other fault picks its workers
        return next((s for s in self.live_supervisors() if s.pid == group), None)

    def learn(self) -> None:
        """Learn each supervisor's worker-id prefix from the WorkerHeartbeat rows.

        They were all started with the same --worker-id: runjobs adds a random part, and
        the pid of each row tells whose it is (its process group).
        """
        from django_jobstate.models import WorkerHeartbeat

        rows = self.guarded(
            lambda: list(WorkerHeartbeat.objects.values_list("worker_id", "pid")), []
        )
        for worker_id, pid in rows:
            supervisor = self.owner(pid)
            if supervisor is None or "/" not in worker_id:
                continue
            base = worker_id.rsplit("/", 1)[0]
            if supervisor.base is None:
                supervisor.base = base
                self.faults.supervisors[base] = (supervisor.index, supervisor.skew, supervisor.host)
                if supervisor.in_flight > 1:
                    self.faults.in_flight.add(base)
            elif supervisor.base != base:
                self.faults.id_clashes.add(f"s{supervisor.index}: {supervisor.base} and {base}")
        bases = [s.base for s in self.supervisors if s.base is not None]
        self.faults.id_clashes.update(f"{b} named twice" for b in bases if bases.count(b) > 1)

    # ---------------------------------------------------------------- faults

    def schedule(self) -> list[tuple[float, str]]:
        o, rng, d = self.options, self.rng, self.options.duration
        long_pause = self.lost_after + WINDOW_EXTRA
        events = [(rng.uniform(0.05, 0.85) * d, "kill_worker") for _ in range(o.worker_kills)]
        events += [
            (rng.uniform(0.1, 0.8) * d, "kill_supervisor") for _ in range(o.supervisor_kills)
        ]
        latest = max(0.05 * d, 0.9 * d - long_pause)
        events += [(rng.uniform(0.05 * d, latest), "pause_long") for _ in range(o.pauses)]
        events += [(rng.uniform(0.05, 0.85) * d, "pause_short") for _ in range(o.pauses)]
        events += [
            (rng.uniform(0.05, 0.85) * d, "kill_connections") for _ in range(o.connection_kills)
        ]
        # One at a time, each followed by a window with the database and network back (so
        # that judges are judges again): outages, the partition, the restart.
        away = ["outage"] * o.outages + ["cut"] * o.partition + ["restart"] * o.restart
        away += ["table_lock"] * o.table_lock
        rng.shuffle(away)
        length = {"outage": long_pause, "cut": long_pause, "restart": 2.0}
        length["table_lock"] = self.lost_after + 1.0  # and the wait for its deadlines
        # The connections of a table lock stay up: no window for judges to come back.
        gaps = {a: 1.0 if a == "table_lock" else self.lost_after + WINDOW_EXTRA for a in away}
        busy = sum(length[a] + gaps[a] for a in away)
        slack = max(0.0, 0.8 * d - busy)
        cuts = sorted(rng.uniform(0, slack) for _ in away)
        at = 0.05 * d
        for action, (before, after) in zip(away, itertools.pairwise([0.0, *cuts]), strict=True):
            at += after - before
            events.append((at, action))
            at += length[action] + gaps[action]
        events += self.workload_events(d) + self.workflow_events(d)
        return sorted(events)

    def run_faults(self) -> None:
        events = self.schedule()
        started = time.monotonic()
        self.start_uniques()
        while (elapsed := time.monotonic() - started) < self.options.duration:
            # While the database or the network is away, the other faults wait: each
            # figure then has one cause.
            while events and events[0][0] <= elapsed and self.away is None:
                action = events.pop(0)[1]
                # Not now (no worker to pick yet, on a slow start): a moment later.
                if self.act(action) is False:
                    events = sorted([*events, (elapsed + 0.25, action)])
            if self.pending_kills and self.away is None:
                self.kill_batches()
            self.tick()
            time.sleep(0.05)
        for _, action in [*events, (0.0, "kill_batches")]:  # a slow machine: run what is left
            for _attempt in range(40):
                self.wait_until_back()
                if self.act(action) is not False:
                    break
                self.tick()
                time.sleep(0.25)
        # The unique tasks' threads wait on a table lock: the lock ends first.
        self.wait_until_back()
        self.stop_threads()

    def act(self, action: str) -> Any:
        """Do one fault or workload action; say so when it held this loop up."""
        started = time.monotonic()
        result = getattr(self, action)()
        if (took := time.monotonic() - started) > 2.0:
            print(f"  {self.clock()} ({action} took {took:.1f} s)")
        return result

    def wait_until_back(self) -> None:
        """Wait while the database or the network is away (an outage, a cut, a lock)."""
        while self.away is not None:
            self.tick()
            time.sleep(0.05)

    def tick(self) -> None:
        """End faults that are due, replace dead supervisors, sample the invariant."""
        for pid, (until, _pause) in list(self.paused.items()):
            if time.monotonic() >= until:
                self.resume(pid)
        if self.away is not None and time.monotonic() >= self.away[0]:
            self.come_back()
        if self.frozen is not None and (
            time.monotonic() >= self.frozen[2] or (self.table_conn is None and self.thawed())
        ):
            self.thaw()  # (not read while the job table is locked: as sample())
        for supervisor in self.supervisors:
            if not supervisor.killed and not supervisor.alive:
                supervisor.killed = True  # not by us: count it, replace it
                self.faults.supervisors_died += 1
                print(f"  supervisor s{supervisor.index} exited {supervisor.proc.returncode}")
                if not supervisor.host:
                    self.start_supervisor()
        if time.monotonic() - self.last_learned >= 1.0:
            self.last_learned = time.monotonic()
            self.learn()
        # Not while the job table is locked: this loop would wait for itself.
        if time.monotonic() - self.last_sample >= 0.2 and self.table_conn is None:
            self.last_sample = time.monotonic()
            self.sample()

    def sample(self) -> None:
        from django.db.models import Count

        from django_jobstate.models import Job

        def query() -> list[str]:
            live = Job.objects.live().order_by().values("result_id")
            return [str(row["result_id"]) for row in live.annotate(n=Count("id")).filter(n__gt=1)]

        def keys() -> list[str]:
            live = Job.objects.live().filter(unique_key__isnull=False).order_by()
            rows = live.values("unique_key").annotate(n=Count("id")).filter(n__gt=1)
            return [row["unique_key"] for row in rows]

        multi = self.guarded(query, None)
        if multi is not None:
            self.faults.samples += 1
            self.faults.multi_live.update(multi)
            self.faults.workload.unique_multi.update(self.guarded(keys, []))
        if self.options.limited_jobs:
            self.sample_limits()

    def pick_worker(self, *, deadline_within: float | None = None) -> tuple[int, str] | None:
        """A worker of a live supervisor on this host, not paused: mid-body if any, else
        busy, else any. With `deadline_within`, first one whose attempt in hand (by its
        timeout) passes its deadline within that many seconds."""
        from bench.models import Execution
        from django_jobstate.models import Job, WorkerHeartbeat

        def query() -> tuple[list[tuple[str, int]], list[tuple[str, Any, int, Any]], set[Any]]:
            beats = list(WorkerHeartbeat.objects.values_list("worker_id", "pid"))
            running = list(
                Job.objects.running().values_list("worker_id", "result_id", "attempt", "timeout")
            )
            limited.update(
                Job.objects.running()
                .filter(concurrency_key__isnull=False)
                .values_list("result_id", "attempt")
            )
            started = set(
                Execution.objects.filter(result_id__in={r[1] for r in running}).values_list(
                    "result_id", "attempt"
                )
            )
            return beats, running, started

        limited: set[tuple[Any, int]] = set()
        found = self.guarded(query, None)
        if found is None:
            return None
        beats, running, started = found
        ours = [
            (pid, wid)
            for wid, pid in beats
            if pid not in self.paused
            and (s := self.owner(pid))
            and not s.host
            and s.prefix
            and wid.startswith(s.prefix)
        ]
        mid_body = {w for w, rid, attempt, _ in running if (rid, attempt) in started}
        busy = {w for w, _, _, _ in running}
        wanted_sets: list[set[str] | None] = [mid_body, busy, None]
        # Half of the time, one in the body of a limited task first: its slot must stay
        # taken until its attempt is rescued, and no longer.
        if self.options.limited_jobs and self.rng.random() < 0.5:
            wanted_sets.insert(
                0, {w for w, rid, attempt, _ in running if (rid, attempt) in started & limited}
            )
        if deadline_within is not None:
            short = {
                w
                for w, rid, attempt, timeout in running
                if (rid, attempt) in started and timeout is not None and timeout < deadline_within
            }
            wanted_sets.insert(0, short)
        for wanted in wanted_sets:
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
            failure_reason__in=[
                FailureReason.LOST,
                FailureReason.INTERRUPTED,
                FailureReason.RELEASED,
                FailureReason.TIMEOUT,
            ],
            finished_at__gte=at,
        )
        jobs = Job.objects.filter(**worker).filter(Q(state=State.RUNNING) | rescued)
        return self.retrying(lambda: list(jobs.values_list("pk", flat=True)))

    def kill_worker(self) -> bool:
        from bench.torture.torture_check import Kill

        picked = self.pick_worker()
        if picked is None:
            return False
        pid, worker_id = picked
        at = self.db_now()
        os.kill(pid, signal.SIGKILL)
        kill = Kill("worker", worker_id, at, self.victims(at, worker_id=worker_id))
        self.faults.kills.append(kill)
        print(f"  {self.clock()} SIGKILL worker {worker_id} ({len(kill.victims)} running)")
        return True

    def kill_supervisor(self) -> None:
        from bench.torture.torture_check import Kill

        self.learn()
        frozen = self.frozen and self.frozen[0]
        live = [s for s in self.live_supervisors(here=True) if s.prefix and s.pid != frozen]
        if not live:
            return
        # One running a limited body if any: its slot must stay taken until the attempt
        # is failed as lost (the lost-after window), and no longer.
        from django_jobstate.models import Job

        limited = Job.objects.running().filter(concurrency_key__isnull=False)
        busy = self.guarded(lambda: set(limited.values_list("worker_id", flat=True)), set())
        preferred = [s for s in live if any(w.startswith(s.prefix or "") for w in busy)]
        victim = self.rng.choice(preferred or live)
        assert victim.prefix is not None
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

    def pause_long(self) -> bool:
        return self.pause(long=True)

    def pause_short(self) -> bool:
        return self.pause(long=False)

    def pause(self, *, long: bool) -> bool:
        from bench.torture.torture_check import Pause

        seconds = self.lost_after + WINDOW_EXTRA if long else SHORT_PAUSE
        picked = self.pick_worker(deadline_within=seconds if long else None)
        if picked is None:
            return False
        pid, worker_id = picked
        at = self.db_now()
        os.kill(pid, signal.SIGSTOP)
        pause = Pause(pid, worker_id, long, at)
        pause.victims = self.victims(at, worker_id=worker_id)
        self.faults.pauses.append(pause)
        self.paused[pid] = (time.monotonic() + seconds, pause)
        # SIGCONT on time from a timer thread, not from this loop: an action of the loop
        # may wait on a lock the stopped process holds (SQLite's write lock), and would
        # wait until its busy timeout if the SIGCONT waited for the loop.
        timer = threading.Timer(seconds, self._continue, (pid, pause))
        timer.daemon = True
        timer.start()
        print(
            f"  {self.clock()} SIGSTOP worker {worker_id} for {seconds:g} s "
            f"({len(pause.victims)} running)"
        )
        return True

    def _continue(self, pid: int, pause: Any) -> None:
        if pause.continued is None:
            pause.continued = time.monotonic()
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile
                os.kill(pid, signal.SIGCONT)

    def resume(self, pid: int) -> None:
        _, pause = self.paused.pop(pid)
        self._continue(pid, pause)
        # When the SIGCONT was sent, on the database clock (this loop may come late).
        pause.resumed = self.db_now() - timedelta(seconds=time.monotonic() - pause.continued)

    def kill_connections(self) -> bool:
        """MariaDB: KILL CONNECTION of a few of the run database's connections that are not
        this process's own (the supervisors', their workers', the partitioned host's), as a
        proxy's idle timeout or a DBA would: each side must reconnect and lose nothing."""
        from bench.torture.torture_check import ConnectionKill

        def query() -> list[int]:
            with mysql_admin() as cursor:
                cursor.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s",
                    [self.database_name],
                )
                return sorted(row[0] for row in cursor.fetchall())

        theirs = [i for i in self.guarded(query, []) if i not in self.own_connections]
        if not theirs:
            return False
        victims = self.rng.sample(theirs, min(3, len(theirs)))
        at = self.db_now()
        with mysql_admin() as cursor:
            for victim in victims:
                with contextlib.suppress(Exception):  # gone meanwhile
                    cursor.execute(f"KILL CONNECTION {int(victim)}")
        self.faults.connection_kills.append(ConnectionKill(at, len(victims), len(theirs)))
        print(f"  {self.clock()} KILL CONNECTION of {len(victims)} of {len(theirs)} connections")
        return True

    def restart(self) -> None:
        from django.db import connection

        started = time.monotonic()
        print(f"  {self.clock()} restarting {SERVER_CTL[self.options.db][1]}")
        self.faults.restarted_at.append(self.db_now())
        server_ctl(self.options.db, "restart")
        connection.close()
        self.faults.restarts.append(time.monotonic() - started)

    def outage(self) -> None:
        """Take the database away for longer than the lost-after window."""
        from django.db import connection

        from bench.torture.torture_check import Outage

        seconds = self.lost_after + WINDOW_EXTRA
        at = self.db_now()
        if self.options.db in SERVER_CTL:
            server_ctl(self.options.db, "stop")
            connection.close()
            what = f"{SERVER_CTL[self.options.db][1]} stopped"
        else:  # the write lock, held by another connection as a long bulk enqueue would
            self.hold_sqlite_write_lock()
            at = self.db_now()
            what = "SQLite's write lock held"
        outage = Outage(what, at)
        self.faults.outages.append(outage)
        self.away = (time.monotonic() + seconds, outage)
        print(f"  {self.clock()} {what} for {seconds:g} s")

    def cut(self) -> bool:
        """Cut the partitioned host's link for longer than the lost-after window.

        Once its workers run an attempt (False until then, for up to CUT_WAIT seconds).
        """
        from bench.torture.torture_check import Cut
        from django_jobstate.models import Job

        assert self.partition is not None
        host = next((s for s in self.live_supervisors() if s.host and s.prefix), None)
        if host is None:
            print(f"  {self.clock()} no partitioned supervisor running: no cut")
            return True
        assert host.prefix is not None
        busy = Job.objects.running().filter(worker_id__startswith=host.prefix)
        self.cut_waits += 1
        if self.cut_waits * 0.25 < CUT_WAIT and not self.guarded(busy.exists, False):
            return False
        self.partition.link.cut()
        at = self.db_now()
        cut = Cut(host.prefix, at, self.victims(at, worker_id__startswith=host.prefix))
        self.faults.cuts.append(cut)
        seconds = self.lost_after + WINDOW_EXTRA
        self.away = (time.monotonic() + seconds, cut)
        print(
            f"  {self.clock()} link of s{host.index} (its own host) cut for {seconds:g} s "
            f"({len(cut.victims)} running)"
        )
        return True

    def come_back(self) -> None:
        """End the outage or the cut in progress."""
        assert self.away is not None
        _, fault = self.away
        if self.partition is not None and fault in self.faults.cuts:
            self.partition.link.restore()
            print(f"  {self.clock()} link restored")
        elif self.release_table_lock():
            pass
        elif self.lock is not None:
            self.lock.execute("ROLLBACK")
            self.lock.close()
            self.lock = None
            print(f"  {self.clock()} SQLite's write lock released")
        else:
            server_ctl(self.options.db, "start")
            print(f"  {self.clock()} {SERVER_CTL[self.options.db][1]} started")
        fault.ended = self.db_now()
        self.away = None

    # ---------------------------------------------------------------- the end

    def drain(self) -> tuple[float, float]:
        """Wait, with no fault left, until every logical task is terminal; return (took, bound)."""
        from bench.torture.torture_workloads import TICK_SCHEDULE
        from django_jobstate.models import Job
        from django_jobstate.schedules.model import Schedule

        for pid in list(self.paused):
            self.resume(pid)
        while self.frozen is not None:  # until its rescue and the key's next body, as before
            self.tick()
            time.sleep(0.05)
        self.wait_until_back()  # the last outage or cut lasts as long as the others
        while len(self.live_supervisors(here=True)) < self.options.supervisors:
            self.start_supervisor()
        started = time.monotonic()
        bound = self.lost_after + self.options.drain_margin
        # The schedule goes on ticking: its ticks from now on are past the run.
        until = self.faults.workload.ticks_until = self.db_now()
        live = Job.objects.live().exclude(scheduled_for__gte=until)
        # Ticks missed during the last outage are enqueued once a scheduler catches up
        # (catch_up "all"): the drain waits for that too, or they would be left queued.
        behind = Schedule.objects.filter(name=TICK_SCHEDULE, next_tick_at__lt=until)
        while time.monotonic() - started < bound:
            self.tick()
            if self.guarded(lambda: not live.exists() and not behind.exists(), False):
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
        self.stop_threads(every=True)
        for pid in list(self.paused):
            self.resume(pid)
        self.thaw()
        if self.away is not None:
            with contextlib.suppress(Exception):
                self.come_back()
        for supervisor in self.supervisors:
            if supervisor.alive:
                os.killpg(supervisor.pid, signal.SIGKILL)
                supervisor.proc.wait()
        if self.partition is not None:
            self.partition.close()

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


def server_ctl(vendor: str, action: str) -> None:
    """Stop, start or restart the run's PostgreSQL or MariaDB server, and wait until done
    (scripts/mysql's control script waits on its own)."""
    if vendor == "postgres":
        command = [
            os.environ["JOBSTATE_PG_CTL"],
            action,
            *(["-m", "fast"] * (action != "start")),
            "-w",
        ]
    else:
        command = [os.environ["JOBSTATE_MYSQL_CTL"], action]
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def command_line(argv: list[str], seed: int) -> str:
    args = list(argv)
    if "--seed" not in args and not any(a.startswith("--seed=") for a in args):
        args += ["--seed", str(seed)]
    return shlex.join(["python", "bench/torture/torture.py", *args])


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
    if options.ticks:  # the supervisors' settings then have the schedule
        os.environ["JOBSTATE_TORTURE_TICKS"] = str(options.seed)
    import django

    django.setup()
    from bench.torture.torture_check import Figure, check

    torture = Torture(options, run_dir)
    torture.database_name = database.name
    if options.db == "mysql":  # this process's own connections are no victims of a kill
        from django.db.backends.signals import connection_created

        def remember(sender: Any, connection: Any, **kwargs: Any) -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                torture.own_connections.add(cursor.fetchone()[0])

        connection_created.connect(remember, weak=False)
    failed: list[str] = []
    try:
        print(f"{command}\n  database {database.name}, logs in {run_dir}")
        torture.setup()
        for _ in range(options.supervisors):
            torture.start_supervisor()
        if torture.partition is not None:
            torture.start_supervisor(host=torture.partition.host.name)
        torture.wait_for_workers(len(torture.supervisors) * options.concurrency)
        torture.enqueue()
        print(
            f"  {torture.clock()} enqueued {options.jobs} jobs; faults for {options.duration:g} s"
        )
        torture.run_faults()
        print(f"  {torture.clock()} faults over; draining")
        took, bound = torture.drain()
        codes = torture.stop_supervisors()
        torture.faults.workload.ticks = options.ticks
        figures = check(
            options.jobs,
            torture.enqueued_ids,
            torture.faults,
            torture.log_text(),
            torture.lost_after,
        )
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
            f"{options.duration:g} s of faults, seed {options.seed}"
            + (", plus 1 supervisor on a partitioned host" if torture.partition else ""),
            f"command: {command}",
            f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"Django {django.get_version()}, {torture_db_version()}",
            f"database clock: {torture.offset * 1000:+.1f} ms from this process's, to within "
            f"{torture.offset_error * 1000:.1f} ms (half the quickest reading's round trip)",
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
        for key in failed:  # again at the end, where a log cut short in the middle shows them
            for example in figures[key].examples[:5]:
                print(f"  {key}: {example}")
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
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT VERSION()")
            return f"MariaDB/MySQL {cursor.fetchone()[0]}"
    import sqlite3

    return f"SQLite {sqlite3.sqlite_version}"


if __name__ == "__main__":
    sys.exit(main())
