"""The benchmark's plumbing: fresh databases, the two runners' worker processes, RSS.

Nothing here imports Django: every database read or write goes through a
`python -m bench.benchmark.bench_helper` subprocess under the runner's own settings module.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import mysql_admin

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class System:
    key: str  # "jobstate", "tasksdb", a peer's key: database names, JSON keys
    label: str
    settings: str  # the Django settings module ("" for a peer, which has no Django)
    # A peer runs under its own interpreter (its own venv) and its own helper module.
    python: str = sys.executable
    helper_module: str = "bench.benchmark.bench_helper"
    env: tuple[tuple[str, str], ...] = ()
    burst: bool = True  # its workers can exit once the queue is empty
    database: bool = True  # it keeps its jobs in the database (Celery: in Redis)
    figures: frozenset[str] | None = None  # the figures it takes part in (None: all)

    @property
    def peer(self) -> bool:
        return self.helper_module != "bench.benchmark.bench_helper"

    def worker_commands(self, workers: int, *, burst: bool, in_flight: int = 1) -> list[list[str]]:
        """One command per process to start: runjobs supervises its own worker processes,
        db_worker has no such option, so it is started `workers` times."""
        manage = [sys.executable, str(ROOT / "manage.py")]
        if self.key == "jobstate":
            burst_flag = ["--burst"] if burst else []
            # -v 0: no line per finished job (runjobs' default since it logs on its own),
            # as db_worker here and Celery's default log level write none either.
            if os.environ.get("JOBSTATE_BENCH_OBSERVE") == "1":  # bench_settings_jobstate
                burst_flag += ["--metrics-port", "0"]
            if in_flight > 1:
                burst_flag += ["--in-flight", str(in_flight)]
            return [[*manage, "runjobs", "-v", "0", "--concurrency", str(workers), *burst_flag]]
        burst_flag = ["--batch"] if burst else []
        return [
            [
                *manage,
                "db_worker",
                *burst_flag,
                "--no-startup-delay",
                "--no-reload",
                "--queue-name",
                "default",
                "--worker-id",
                f"bench-{os.getpid()}-{i}",
            ]
            for i in range(workers)
        ]

    def job_pids(self, procs: list[subprocess.Popen[bytes]]) -> list[int]:
        """The processes that run jobs: runjobs' children, or the db_worker processes."""
        if self.key == "tasksdb":
            return [p.pid for p in procs if p.poll() is None]
        return [pid for p in procs for pid in children(p.pid) if not is_resource_tracker(pid)]


JOBSTATE = System("jobstate", "django-jobstate", "bench.benchmark.bench_settings_jobstate")
TASKSDB = System("tasksdb", "django-tasks-db", "bench.benchmark.bench_settings_tasksdb")
SYSTEMS = [JOBSTATE, TASKSDB]


class Database:
    """One vendor: a migrated template per system, and a fresh copy of it on demand."""

    def __init__(self, vendor: str, prefix: str, workdir: Path) -> None:
        self.vendor = vendor
        self.prefix = prefix
        self.workdir = workdir
        self._templates: set[str] = set()
        self._created: list[str] = []

    def name(self, system: System, suffix: str = "") -> str:
        if self.vendor == "sqlite":
            return str(self.workdir / f"{self.prefix}_{system.key}{suffix}.sqlite3")
        return f"{self.prefix}_{system.key}{suffix}"

    def env(self, system: System, name: str | None = None) -> dict[str, str]:
        return {
            **os.environ,
            **dict(system.env),
            "BENCH_PYTHON": system.python,
            "BENCH_HELPER": system.helper_module,
            "DJANGO_SETTINGS_MODULE": system.settings,
            "BENCH_DB": self.vendor,
            "BENCH_DB_NAME": name or self.name(system),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        }

    def fresh(self, system: System) -> dict[str, str]:
        """Recreate the system's database from its migrated template; return the env for it.
        A peer's record of runs (in Redis) is emptied too; Celery's queue is all in Redis."""
        if not system.database:
            env = self.env(system, "")
            helper(env, "reset")
            return env
        if self.vendor == "mysql":
            # MariaDB has no template databases: each fresh one is migrated anew (a few
            # seconds, untimed), for every system alike.
            env = self.env(system)
            self._recreate(self.name(system))
            helper(env, "migrate")
            return env
        template = self.name(system, "_tpl")
        if system.key not in self._templates:
            self._recreate(template)
            helper(self.env(system, template), "migrate")
            self._templates.add(system.key)
        name = self.name(system)
        if self.vendor == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(name + suffix).unlink(missing_ok=True)
            for suffix in ("", "-wal"):  # a WAL left by an unclean close, if any
                if Path(template + suffix).exists():
                    shutil.copyfile(template + suffix, name + suffix)
        else:
            self._recreate(name, template=template)
        if system.peer:
            helper(self.env(system, name), "reset")
        return self.env(system, name)

    def _recreate(self, name: str, template: str | None = None) -> None:
        if self.vendor == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(name + suffix).unlink(missing_ok=True)
            return
        if self.vendor == "mysql":
            with mysql_admin() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
                cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            if name not in self._created:
                self._created.append(name)
            return
        with pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(
                f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
            )
        if name not in self._created:
            self._created.append(name)

    def server_info(self) -> dict[str, Any]:
        if self.vendor == "sqlite":
            import sqlite3

            return {"sqlite": sqlite3.sqlite_version}
        if self.vendor == "mysql":
            with mysql_admin() as cursor:
                cursor.execute("SELECT VERSION()")
                show = {"version": cursor.fetchone()[0]}
                cursor.execute(
                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN ("
                    + ", ".join(["%s"] * len(MYSQL_SETTINGS))
                    + ")",
                    MYSQL_SETTINGS,
                )
                show |= dict(cursor.fetchall())
            return {"mysql": show}
        with pg_admin() as conn:
            show = {s: conn.execute(f"SHOW {s}").fetchone()[0] for s in PG_SETTINGS}
        return {"postgresql": show}

    def calibrate(self, seconds: float) -> dict[str, Any]:
        """What the machine can commit: single-row UPDATE commits/s, 1 and 4 clients."""
        if self.vendor == "sqlite":
            return {"1": sqlite_commits(self.workdir / "calibrate.sqlite3", seconds)}
        if self.vendor == "mysql":
            return {str(c): mysql_commits(f"{self.prefix}_calibrate", c, seconds) for c in (1, 4)}
        pgbench = shutil.which("pgbench") or next(
            iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
        )
        if pgbench is None:
            return {}
        name = f"{self.prefix}_pgbench"
        self._recreate(name)
        script = self.workdir / "update.sql"
        script.write_text(
            "\\set aid random(1, 100000)\n"
            "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"
        )
        run = functools.partial(subprocess.run, capture_output=True, text=True, check=True)
        run([pgbench, "-i", "-s", "1", "-q", name])
        tps = {}
        for clients in ("1", "4"):
            out = run(
                [
                    pgbench,
                    "-n",
                    "-c",
                    clients,
                    "-j",
                    clients,
                    "-T",
                    str(int(seconds)),
                    "-f",
                    str(script),
                    name,
                ]
            ).stdout
            tps[clients] = float(re.search(r"tps = ([0-9.]+)", out).group(1))
        return tps

    def drop_all(self) -> None:
        if self.vendor == "postgres" and self._created:
            with pg_admin() as conn:
                for name in reversed(self._created):
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if self.vendor == "mysql":
            with mysql_admin() as cursor:
                for name in [*reversed(self._created), f"{self.prefix}_calibrate"]:
                    cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


PG_SETTINGS = ["server_version", "fsync", "synchronous_commit", "full_page_writes", "autovacuum"]


def sqlite_commits(path: Path, seconds: float) -> float:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, n INTEGER)")
    conn.execute("INSERT INTO t (n) SELECT 0 FROM (SELECT 1 UNION ALL SELECT 2)")
    count, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        conn.execute("UPDATE t SET n = n + 1 WHERE id = ?", (count % 2 + 1,))
        count += 1
    conn.close()
    return count / seconds


MYSQL_SETTINGS = [
    "innodb_flush_log_at_trx_commit",
    "innodb_doublewrite",
    "sync_binlog",
    "log_bin",
]


def mysql_commits(name: str, clients: int, seconds: float) -> float:
    """Single-row UPDATE commits/s of `clients` connections (threads: the time is the
    server's, the GIL is released while each waits), pgbench's figure for MariaDB."""
    with mysql_admin() as cursor:
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        cursor.execute(f"CREATE TABLE IF NOT EXISTS `{name}`.t (id INT PRIMARY KEY, n INT)")
        cursor.execute(
            f"INSERT IGNORE INTO `{name}`.t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 1001))
        )
    counts = [0] * clients
    deadline = time.perf_counter() + seconds

    def client(k: int) -> None:
        with mysql_admin(name) as cursor:
            while time.perf_counter() < deadline:
                cursor.execute(
                    "UPDATE t SET n = n + 1 WHERE id = %s", (k * 250 + counts[k] % 250 + 1,)
                )
                counts[k] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / seconds


def pg_admin() -> Any:
    import psycopg

    return psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True)


def helper(env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 3600) -> Any:
    """Run one command of the system's helper (bench_helper, or a peer's module under the
    peer's own interpreter) under `env`; return its JSON."""
    python = env.get("BENCH_PYTHON", sys.executable)
    proc = subprocess.run(
        [python, "-m", env.get("BENCH_HELPER", "bench.benchmark.bench_helper"), *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{env.get('BENCH_HELPER')} {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Workers:
    """Worker processes of one system, each in its own process group, output to a log."""

    def __init__(
        self, system: System, env: dict[str, str], workers: int, *, burst: bool, in_flight: int = 1
    ) -> None:
        self.system = system
        self.log = Path(tempfile.mkstemp(prefix=f"bench-{system.key}-", suffix=".log")[1])
        self.started = time.perf_counter()
        self._pids: list[int] = []
        with self.log.open("wb") as out:
            self.procs = [
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                for command in system.worker_commands(workers, burst=burst, in_flight=in_flight)
            ]

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout: float) -> float | None:
        """Wait for every process to exit; return the wall time since start (None: timed out)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return time.perf_counter() - self.started

    def stop(self, timeout: float = 30) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        if self.wait(timeout) is None:
            self.kill()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def exit_codes(self) -> list[int | None]:
        return [p.returncode for p in self.procs]

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def rss_kib(self) -> int | None:
        """Total VmRSS of the processes that run jobs (None if none is running yet)."""
        values = [rss(pid) for pid in self._pids]
        if not values or None in values:  # first call, or a process ended: look again
            self._pids = self.system.job_pids(self.procs)
            values = [rss(pid) for pid in self._pids]
        values = [v for v in values if v is not None]
        return sum(values) if values else None

    def cleanup(self) -> None:
        self.kill()
        self.log.unlink(missing_ok=True)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces, so split after the last ")".
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def is_resource_tracker(pid: int) -> bool:
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
