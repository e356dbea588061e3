import json
import os
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
        """Signal `proc`, wait for it to exit, and return its output."""
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
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.racer", *command],
            cwd=ROOT,
            env=subprocess_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", "a racer did not start"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
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

    JOBSTATE_SLOW_ONLY_IN="test_a.py test_b.py" (scripts/test's MariaDB pass) deselects the
    slow tests of every other file.

    JOBSTATE_TEST_SHARD="K/N" keeps the files of shard K of N (scripts/test splits each
    pass so, a PostgreSQL or MariaDB shard on a server of its own): see shard_files(). The
    MariaDB pass's slow tests are left out first, so that its shards share what is left.
    """
    if (only_in := os.environ.get("JOBSTATE_SLOW_ONLY_IN")) is not None:
        files = set(only_in.split())
        kept, dropped = [], []
        for item in items:
            slow = item.get_closest_marker("slow") is not None
            (dropped if slow and item.path.name not in files else kept).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    if shard := os.environ.get("JOBSTATE_TEST_SHARD"):
        files = shard_files(items, shard)
        dropped = [item for item in items if item.path.name not in files]
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.path.name in files]
    if os.environ.get("JOBSTATE_TEST_DB", "sqlite") == "sqlite":
        items.sort(key=lambda item: item.module.__name__ != "tests.test_bench_smoke")
    else:
        for item in items:
            if "browser" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.skip(reason=BROWSER_ON_SQLITE))


def shard_files(items: list[pytest.Item], shard: str) -> set[str]:
    """The files of shard "K/N": whole files (their module fixtures run once), dealt out
    heaviest first to the lightest shard so far, a slow test (real processes) weighing as
    much as fifty others. The same files whatever the order of collection."""
    try:
        k, n = (int(part) for part in shard.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"JOBSTATE_TEST_SHARD={shard!r}: use K/N, 1 <= K <= N") from None
    weights: dict[str, int] = {}
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        weights[item.path.name] = weights.get(item.path.name, 0) + (50 if slow else 1)
    shards: list[tuple[int, set[str]]] = [(0, set()) for _ in range(n)]
    for name in sorted(weights, key=lambda name: (-weights[name], name)):
        i = min(range(n), key=lambda i: (shards[i][0], i))
        shards[i] = (shards[i][0] + weights[name], shards[i][1] | {name})
    return shards[k - 1][1]


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
