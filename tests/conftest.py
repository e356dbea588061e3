import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.sharding import shard_files

ROOT = Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that must use this test run's database."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "JOBSTATE_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


def skewed_env(skew: float) -> dict[str, str]:
    """Extra environment for a child process whose clock is `skew` seconds off."""
    return {
        "PYTHONPATH": str(ROOT / "tests" / "clock_skew"),
        "JOBSTATE_TEST_CLOCK_SKEW": str(skew),
    }


def run_interruptible(args: list[str], timeout: float, **popen: Any) -> tuple[int, str]:
    """Run `args` to its end; return its exit status and output (stdout and stderr).

    Past `timeout` (a safety net, never a measurement) it gets Ctrl-C, so that it stops
    the processes it started (a kill would leave them running, and loading the machine,
    for the rest of the run), then the test fails with the end of its output."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"{args[1]} took over {timeout:g} s; its output ends:\n{output[-6000:]}")
    return proc.returncode, output


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc; where there is
    no /proc, say yes: it cannot be told)."""
    if not Path("/proc/self/status").exists():
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it exited
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signum - 1)))


class Runjobs:
    """Start `manage.py runjobs` processes against the test database; kill leftovers.

    Output goes to a file per process (a pipe nobody reads would block a chatty worker).
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"runjobs-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "runjobs", *args],
                cwd=ROOT,
                env=subprocess_env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        return proc.log.read_text()  # type: ignore[attr-defined]

    def stop(self, proc: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> str:
        """Signal `proc`, wait for it to exit, and return its output.

        A SIGTERM waits until runjobs handles it: a Python process still starting (seconds
        on a loaded machine) is ended by it, as any program is, before our code can run."""
        if signum == signal.SIGTERM:
            deadline = time.monotonic() + 60
            while not catches(proc.pid, signum) and proc.poll() is None:
                if time.monotonic() > deadline:
                    break  # signalled anyway: the exit status will tell
                time.sleep(0.05)
        proc.send_signal(signum)
        self.wait(proc, 30)
        return self.output(proc)

    def run(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        proc = self.start(*args, **env)
        self.wait(proc, timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, self.output(proc), None)

    def wait(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Wait for `proc` to exit; if it does not, fail with the end of its output."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tail = self.output(proc)[-6000:]
            pytest.fail(f"runjobs did not exit within {timeout:g} s; its output ends:\n{tail}")

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def keep_a_worker_writing(runjobs: Runjobs, jobs: int = 3000) -> None:
    """Start runjobs on a backlog of short jobs, so that it commits every few milliseconds.

    Only the "default" queue: jobs of the other queues stay queued for the test to use.
    """
    from django_jobstate.backend import JobStateBackend
    from django_jobstate.models import Job
    from django_jobstate.states import State
    from tests import tasks

    backend = JobStateBackend("default", {})
    backend.bulk_enqueue(tasks.sleep_then_record, [((f"busy-{i}", 0.002), {}) for i in range(jobs)])
    runjobs.start("--queue", "default")
    deadline = time.monotonic() + 30
    while not Job.objects.filter(state=State.SUCCEEDED).exists():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)


def run_racers(commands: list[list[str]]) -> list[object]:
    """Run `python -m tests.racer ...` processes that start together; return their JSON.

    Each says "ready" once connected; all are told to go at once only then, so a slow
    start on a loaded machine cannot let one racer finish before the others begin.
    """
    procs: list[subprocess.Popen[str]] = []
    try:
        for command in commands:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.racer", *command],
                    cwd=ROOT,
                    env=subprocess_env(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n", "a racer did not start"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        # A safety net only: CI at load 30 took over 120 s for 300 unique enqueues.
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    finally:
        # However the race ended, no racer outlives it: one left running would write
        # into the next tests' tables.
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    return [json.loads(out) for out in outputs]


BROWSER_ON_SQLITE = "browser tests run on SQLite (a page's queries run on each database without it)"


@pytest.hookimpl(trylast=True)  # after pytest-django's order (database tests first)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On SQLite the benchmark smoke test runs first; on PostgreSQL it stays near the end.

    scripts/test runs the passes side by side: this way their benchmarks, which drain jobs
    as fast as the machine goes, do not run at the same time.

    The browser tests run on SQLite only: what a page shows is the same on every database,
    and the queries behind each page run on every database in the tests without a browser
    (test_admin_*.py, their plans in test_admin_plans.py).

    JOBSTATE_SLOW_ONLY_IN="test_a.py test_b.py" (scripts/test's SQLite and MariaDB passes)
    deselects the slow tests of every other file, but the browser tests (SQLite's only);
    JOBSTATE_SLOW_NOT_IN="test_c.py" (its PostgreSQL pass) deselects those of these files.

    JOBSTATE_DATABASE_TESTS_ONLY=1 (scripts/test's PostgreSQL and MariaDB passes) deselects
    the tests that never open the test database and start no process: they prove the same
    on every database, and SQLite's pass runs them.

    JOBSTATE_TEST_SHARD="K/N" keeps the files of shard K of N (scripts/test splits each
    pass so, a PostgreSQL or MariaDB shard on a server of its own): see tests/sharding.py. The
    MariaDB pass's slow tests are left out first, so that its shards share what is left.
    """
    only_in, not_in = (os.environ.get(f"JOBSTATE_SLOW_{which}_IN") for which in ("ONLY", "NOT"))
    if only_in is not None or not_in is not None:
        kept, dropped = [], []
        for item in items:
            slow = item.get_closest_marker("slow") is not None
            name = item.path.name
            out = (only_in is not None and name not in only_in.split()) or (
                not_in is not None and name in not_in.split()
            )
            browser = "browser" in getattr(item, "fixturenames", ())
            (dropped if slow and out and not browser else kept).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    if os.environ.get("JOBSTATE_DATABASE_TESTS_ONLY") == "1":
        kept, dropped = [], []
        for item in items:
            (kept if uses_the_database(item) else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    if shard := os.environ.get("JOBSTATE_TEST_SHARD"):
        files = shard_files(items, shard, os.environ.get("JOBSTATE_TEST_DB", "sqlite"))
        dropped = [item for item in items if item.path.name not in files]
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.path.name in files]
    if os.environ.get("JOBSTATE_TEST_DB", "sqlite") == "sqlite":
        items.sort(key=lambda item: item.module.__name__ != "tests.test_bench_smoke")
    else:
        for item in items:
            if "browser" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.skip(reason=BROWSER_ON_SQLITE))


DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_reset_sequences"}


def uses_the_database(item: pytest.Item) -> bool:
    """Whether `item` may prove something of the database under test: it opens the test
    database (pytest-django's marker or fixtures), or it starts processes (slow) that may."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return (
        item.get_closest_marker("django_db") is not None
        or item.get_closest_marker("slow") is not None
        or bool(fixtures & DATABASE_FIXTURES)
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """JOBSTATE_TEST_CPU_LOG=FILE: append each test's wall and CPU seconds (its own and its
    waited-for children's: the runjobs processes it started) to FILE, one tab-separated line
    a test: what to look at when CI nears its 20 minutes on two shared cores."""
    log = os.environ.get("JOBSTATE_TEST_CPU_LOG")
    if not log:
        yield
        return

    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    wall, used = time.monotonic(), cpu()
    yield
    wall, used = time.monotonic() - wall, cpu() - used
    db = os.environ.get("JOBSTATE_TEST_DB", "sqlite")
    with open(log, "a") as out:
        out.write(f"{db}\t{used:.2f}\t{wall:.2f}\t{item.nodeid}\n")


@pytest.fixture(scope="session", autouse=True)
def flush_keeps_what_migrate_made() -> Iterator[None]:
    """After a transactional test, empty every table but the content types and permissions.

    Django's flush empties those too, then makes them again (post_migrate) for the next
    test: a tenth of the suite's own CPU, in CI's side-by-side passes. What tests write to
    them is only user_permissions, which the flush still empties. (pytest-django runs the
    tests that roll back before these, on the migrated tables.)"""
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType
    from django.core.management.color import no_style
    from django.db import connections
    from django.test import TransactionTestCase

    kept = {ContentType._meta.db_table, Permission._meta.db_table}

    def _fixture_teardown(self: TransactionTestCase) -> None:
        for db in self._databases_names(include_mirrors=False):
            ops, introspection = connections[db].ops, connections[db].introspection
            names = introspection.django_table_names(only_existing=True, include_views=False)
            ops.execute_sql_flush(ops.sql_flush(no_style(), [n for n in names if n not in kept]))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", _fixture_teardown)
        yield


@pytest.fixture
def runjobs(tmp_path: Path) -> Iterator[Runjobs]:
    runner = Runjobs(tmp_path)
    yield runner
    runner.cleanup()


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Write importable modules: make_module("pkg.name", source) -> the dotted name.

    Each name gets a unique top-level package, so that no test sees another's module; all
    of them leave sys.modules at the end.
    """
    root = f"jobstate_test_{uuid.uuid4().hex}"
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name: str, source: str) -> str:
        directory = tmp_path / root
        for part in ["", *name.split(".")[:-1]]:
            directory /= part
            directory.mkdir(exist_ok=True)
            (directory / "__init__.py").touch()
        (directory / f"{name.rpartition('.')[2]}.py").write_text(source)
        return f"{root}.{name}"

    yield make
    for name in [n for n in sys.modules if n == root or n.startswith(f"{root}.")]:
        del sys.modules[name]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the SQLite test database's turn files (db/sqlite_turns.py) once Django has
    removed the database: one run's files would otherwise stay in /dev/shm."""
    from django.conf import settings

    from django_jobstate.db.sqlite_turns import SUFFIXES

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        name = str(database.get("TEST", {}).get("NAME") or "")
        if name and not Path(name).exists():
            for suffix in SUFFIXES.values():
                Path(name + suffix).unlink(missing_ok=True)
