"""`runjobs` behind PgBouncer in transaction pooling mode, for real: a throwaway pgbouncer
in front of the test cluster with fewer server connections than it has clients, the jobs'
alias through it and JOBSTATE_LISTEN_DATABASE direct (PgBouncer does not deliver
notifications in transaction mode). Every job runs exactly once, and an idle worker is
woken by an enqueue made through PgBouncer."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from django_jobstate.models import Job
from django_jobstate.states import State
from tests.conftest import ROOT, subprocess_env
from tests.models import Execution
from tests.waiting import wait_for

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
)
POOL_SIZE = 2  # server connections, for 2 workers, the monitor and the scheduler
LISTEN_APP = "jobstate-direct-listen"

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PgBouncer is PostgreSQL's"),
    pytest.mark.skipif(
        PGBOUNCER is None,
        reason="pgbouncer is not installed (scripts/test and .ci/run install it with apt-get "
        "when run as root; else `apt-get install pgbouncer`)",
    ),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def pgbouncer():
    """A pgbouncer in transaction mode in front of the test cluster; yields its port.

    As an unprivileged user (it refuses to run as root), in a directory of its own, on a
    free loopback port; trust authentication, as the throwaway cluster has.
    """
    db = connection.settings_dict
    directory = Path(tempfile.mkdtemp(prefix="jobstate-pgbouncer."))
    port = free_port()
    (directory / "users.txt").write_text(f'"{db["USER"]}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={db['HOST']} port={db['PORT']}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory}/users.txt\npool_mode = transaction\n"
        f"default_pool_size = {POOL_SIZE}\nmax_client_conn = 100\nadmin_users = {db['USER']}\n"
        f"logfile = {directory}/pgbouncer.log\n"
    )
    command = [str(PGBOUNCER), str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:
        owner = "postgres" if _user_exists("postgres") else "nobody"
        shutil.chown(directory, owner)
        for path in directory.iterdir():
            shutil.chown(path, owner)
        command = ["runuser", "-u", owner, "--", *command]
    with (directory / "stdout.log").open("wb") as out:
        proc = subprocess.Popen(command, cwd=directory, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _accepts(port):
            log = _log(directory)
            assert proc.poll() is None, f"pgbouncer exited {proc.returncode}:\n{log}"
            assert time.monotonic() < deadline, f"pgbouncer did not listen:\n{log}"
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _log(directory: Path) -> str:
    return "\n".join(
        p.read_text(errors="replace") for p in sorted(directory.glob("*.log")) if p.exists()
    )


def bounced_settings(port: int) -> str:
    """The settings of a project whose jobs' alias goes through pgbouncer (as Django's
    documentation asks for transaction pooling: no server-side cursors), with a direct
    alias for the listener."""
    direct = connection.settings_dict
    return json.dumps(
        {
            "DATABASES": {
                "default": {**direct, "PORT": str(port), "DISABLE_SERVER_SIDE_CURSORS": True},
                "direct": {
                    **direct,
                    "OPTIONS": {"application_name": LISTEN_APP},
                    "TEST": {"MIRROR": "default"},
                },
            },
            "JOBSTATE_LISTEN_DATABASE": "direct",
        }
    )


def enqueue_through(settings: str, code: str) -> None:
    """Run `code` in a new process of the project behind pgbouncer (`tasks` imported)."""
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-v", "0", "-c", code],
        cwd=ROOT,
        env=subprocess_env(JOBSTATE_TEST_SETTINGS=settings),
        check=True,
        timeout=120,
    )


def console(port: int, command: str) -> list[dict[str, object]]:
    """The rows about the test database of a SHOW command of pgbouncer's console."""
    import psycopg

    db = connection.settings_dict
    with psycopg.connect(
        host="127.0.0.1", port=port, dbname="pgbouncer", user=db["USER"], autocommit=True
    ) as admin:
        cursor = admin.execute(command)  # no parameters: the simple protocol it speaks
        names = [column.name for column in cursor.description or []]
        rows = [dict(zip(names, row, strict=True)) for row in cursor]
    return [row for row in rows if row["database"] == db["NAME"]]


def test_runjobs_through_pgbouncer_in_transaction_mode(pgbouncer, runjobs):
    settings = bounced_settings(pgbouncer)
    worker = runjobs.start(
        "--concurrency", "2", "--poll-interval", "30", JOBSTATE_TEST_SETTINGS=settings
    )
    enqueue_through(
        settings,
        "from tests import tasks\n"
        "for n in range(100): tasks.record.enqueue(f'one-{n}')\n"
        "tasks.record.get_backend().bulk_enqueue(\n"
        "    tasks.record, [([f'bulk-{n}'], {}) for n in range(300)])\n"
        "for n in range(100): tasks.sleep_then_record.enqueue(f'slow-{n}', 0.005)\n",
    )
    clients, servers = [], []

    def drained() -> bool:
        clients.append(len(console(pgbouncer, "SHOW CLIENTS")))
        servers.append(len(console(pgbouncer, "SHOW SERVERS")))
        return not Job.objects.live().exists()

    wait_for(drained, timeout=180, what="the jobs to run")
    counts = Counter(Execution.objects.values_list("label", flat=True))
    expected = [f"{kind}-{n}" for kind, size in [("one", 100), ("bulk", 300), ("slow", 100)]
                for n in range(size)]  # fmt: skip
    assert sorted(counts) == sorted(expected)
    assert set(counts.values()) == {1}, "a job ran twice"
    assert set(Job.objects.values_list("state", flat=True)) == {State.SUCCEEDED}
    # Transaction pooling for real: four clients (two workers, the monitor, the
    # scheduler) took turns on at most POOL_SIZE server connections. (In session mode two
    # of them would have waited for a server connection all along.)
    assert [pool["pool_mode"] for pool in console(pgbouncer, "SHOW POOLS")] == ["transaction"]
    assert max(clients) >= 4, clients
    assert 0 < max(servers) <= POOL_SIZE, servers

    # The listener is direct; the workers, idle until their poll 30 s away, are woken by
    # an enqueue whose NOTIFY went through pgbouncer.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND query LIKE 'LISTEN %%'",
            [LISTEN_APP],
        )
        assert cursor.fetchone() == (1,)
    time.sleep(2)  # every worker past the claim that found nothing, and waiting
    enqueued = time.monotonic()
    enqueue_through(settings, "from tests import tasks; tasks.record.enqueue('woken')")
    wait_for(lambda: Execution.objects.filter(label="woken").exists(), timeout=60)
    assert time.monotonic() - enqueued < 15, "the worker waited for its poll"

    out = runjobs.stop(worker)
    assert worker.returncode == 0, out
    assert "prepared statement" not in out, out
