"""`manage.py runjobs` as a real process, where the database is the subject: a run read
back, workers claiming at once, a server that restarts or is down when runjobs starts,
jobs routed to another database, PostgreSQL's wake-ups. scripts/test runs these on every
database; test_runjobs.py (signals, arguments, logging) on one."""

import contextlib
import json
import socket
import threading
import time

import pytest
from django.conf import settings
from django.db import connection, connections, transaction

from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import TaskResultStatus
from tests import tasks
from tests.dbfaults import NO_SERVER_CTL, no_server_ctl, server_ctl
from tests.models import Execution
from tests.test_runjobs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def drain_after_the_restart(runjobs, worker, results) -> None:
    """Wait for every job to finish after a server restart; each task succeeded."""
    deadline = time.monotonic() + 120
    while Job.objects.live().exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    live = list(Job.objects.live().values_list("pk", "state", "attempt", "worker_id"))
    out = runjobs.stop(worker)
    assert live == [], f"still live 120 s after the restart: {live}\n{out[-6000:]}"
    assert worker.returncode == 0, out
    for result in results:
        assert tasks.record_with_retries.get_result(result.id).status == "SUCCESSFUL"


def test_enqueue_run_and_read_back_the_results(runjobs):
    ok = tasks.record.enqueue("hello")
    bad = tasks.boom.enqueue("no luck")
    mail = tasks.email.enqueue("ada@example.com")

    done = runjobs.run("--burst")

    assert done.returncode == 0, done.stdout
    assert ok.task.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.record.get_result(ok.id).return_value == "hello"
    assert tasks.email.get_result(mail.id).return_value == {"to": "ada@example.com"}
    failed = tasks.boom.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError
    assert "no luck" in failed.errors[0].traceback
    assert list(Execution.objects.values_list("label", flat=True)) == ["hello"]
    assert not Job.objects.live().exists()


def test_concurrency_runs_that_many_jobs_at_once(runjobs):
    proc = runjobs.start("--concurrency", "3")
    # All three workers up first: one that starts late on a loaded machine finds no job left.
    wait_for(lambda: WorkerHeartbeat.objects.count() == 3, timeout=60)
    with transaction.atomic():
        results = [tasks.sleep_and_report.enqueue(1.5) for _ in range(6)]
    wait_for(lambda: not Job.objects.live().exists(), timeout=60)
    runjobs.stop(proc)
    assert proc.returncode == 0, runjobs.output(proc)

    spans = [tasks.sleep_and_report.get_result(r.id).return_value for r in results]
    # The most bodies running at one instant, measured from when each really ran.
    overlap = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert overlap == 3
    assert Job.objects.values("worker_id").distinct().count() == 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_a_new_job_wakes_an_idle_worker_without_waiting_for_the_poll(runjobs):
    worker = runjobs.start("--poll-interval", "60")
    listening = "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()" \
        " AND state = 'idle' AND query LIKE 'LISTEN %%'"  # fmt: skip

    def idle_and_listening() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(listening)
            return cursor.fetchone() is not None

    wait_for(idle_and_listening, timeout=60)  # its next claim is 60 s away

    result = tasks.record.enqueue("woken")
    enqueued = time.monotonic()
    wait_for(lambda: tasks.record.get_result(result.id).is_finished, timeout=50)

    assert time.monotonic() - enqueued < 30, "the worker waited for its 60 s poll"
    runjobs.stop(worker)


@pytest.mark.skipif(no_server_ctl(), reason=NO_SERVER_CTL)
def test_a_database_server_restart_during_a_run_loses_nothing(runjobs):
    results = [tasks.record_with_retries.enqueue(f"r{n}", 0.05) for n in range(60)]
    worker = runjobs.start("--concurrency", "2")
    wait_for(lambda: Execution.objects.count() >= 10)

    server_ctl("restart")
    connections.close_all()  # this test's own connection died with the server

    drain_after_the_restart(runjobs, worker, results)
    # Each body completed once: a success that could not be written during the restart
    # was written when the server came back, not run again. (A body whose own query hit
    # the restart failed, and its task was retried: the database error is the task's.)
    assert sorted(Execution.objects.values_list("label", flat=True)) == sorted(
        f"r{n}" for n in range(60)
    )


@pytest.mark.skipif(no_server_ctl(), reason=NO_SERVER_CTL)
def test_a_claim_whose_reply_the_restart_lost_is_handed_back(runjobs):
    # The claim's commit reached the server, its reply did not (the server restarting):
    # a row runs in the name of a live worker that never received it, and nobody fails a
    # live worker's attempts as lost. Here the test claims it in the worker's name, on a
    # queue the worker does not serve, then restarts the server: the worker's next claim
    # fails on the connection the restart dropped (kept between claims: with Django's
    # default CONN_MAX_AGE, 0, each claim opens one, and only a restart in the middle of a
    # claim would fail it), which leaves the worker in doubt, and it hands back what runs
    # in its name unseen.
    worker = runjobs.start(
        "--concurrency", "1", "--queue", "default", JOBSTATE_TEST_CONN_MAX_AGE="none"
    )
    tasks.record.enqueue("claiming")  # run: the worker claims, and will claim in the restart
    # Written too: a restart that fell in the outcome's write (retried on a new
    # connection) would leave the worker no claim in doubt.
    wait_for(lambda: Job.objects.filter(state=State.SUCCEEDED).exists())
    worker_id = WorkerHeartbeat.objects.get().worker_id
    tasks.email.enqueue("lost@example.com")
    (unseen,) = Job.objects.claim(worker_id, queues=["emails"])

    server_ctl("restart")
    connections.close_all()

    deadline = time.monotonic() + 120
    while Job.objects.filter(pk=unseen.pk, state=State.RUNNING).exists():
        assert time.monotonic() < deadline, (
            f"still running 120 s after the restart:\n{runjobs.stop(worker)[-6000:]}"
        )
        time.sleep(0.1)
    out = runjobs.stop(worker)
    assert Job.objects.get(pk=unseen.pk).failure_reason == FailureReason.RELEASED, out
    assert Job.objects.filter(queue_name="emails", state=State.QUEUED).count() == 1, out
    assert f"handed back 1 attempt(s) of a claim whose reply it lost: {unseen.pk}" in out


def test_jobs_routed_to_another_database_never_need_default_and_survive_its_restart(runjobs):
    results = [tasks.record_with_retries.enqueue(f"j{n}", 0.05) for n in range(40)]
    routed = {
        "DATABASES": {
            "jobs": {
                **settings.DATABASES["default"],
                "NAME": str(connection.settings_dict["NAME"]),
            },
            # Unusable: a worker that used the default connection instead would fail.
            "default": (
                {**settings.DATABASES["default"], "PORT": "1"}
                if connection.vendor != "sqlite"
                else {"ENGINE": "django.db.backends.sqlite3", "NAME": "/nonexistent/db.sqlite3"}
            ),
        },
        "DATABASE_ROUTERS": ["tests.routers.EverythingOnJobs"],
    }
    worker = runjobs.start(JOBSTATE_TEST_SETTINGS=json.dumps(routed, default=str))
    wait_for(lambda: Execution.objects.count() >= 10)
    if not no_server_ctl():  # the jobs' database restarts: the workers reconnect to it
        server_ctl("restart")
        connections.close_all()

    drain_after_the_restart(runjobs, worker, results)


class DownThenUp:
    """A TCP forwarder to the test database's server that drops every connection until
    `up()`: a server that is down (restarting, failing over), then back, for the
    processes pointed at it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.is_up = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []  # closed by close()
        threading.Thread(target=self._serve, daemon=True).start()

    def up(self) -> None:
        self.is_up.set()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if not self.is_up.is_set():
                client.close()
                continue
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def start_behind_a_server_that_is_down(runjobs):
    """A runjobs pointed at a DownThenUp forwarder, once it said the database is
    unavailable (or exited); the caller closes the forwarder."""
    db = connection.settings_dict
    proxy = DownThenUp(db["HOST"] or "127.0.0.1", int(db["PORT"]))
    port = {"postgres": "PGPORT", "mysql": "JOBSTATE_MYSQL_PORT"}[settings.DB]
    try:
        worker = runjobs.start(**{port: str(proxy.port)})
        wait_for(
            lambda: "unavailable" in runjobs.output(worker) or worker.poll() is not None,
            timeout=60,
        )
    except BaseException:
        proxy.close()
        raise
    return proxy, worker


@pytest.mark.skipif(settings.DB == "sqlite", reason="SQLite has no server to be down")
def test_runjobs_started_while_the_server_is_down_waits_for_it_then_runs_jobs(runjobs):
    # On MariaDB, Django's system checks ask the server its version before handle() runs:
    # runjobs used to exit 1 there on a traceback, so a supervisor (re)started during a
    # restart died instead of waiting, as it does for a server lost later.
    result = tasks.record.enqueue("after the outage")
    proxy, worker = start_behind_a_server_that_is_down(runjobs)
    try:
        assert worker.poll() is None, runjobs.output(worker)[-3000:]

        proxy.up()
        wait_for(lambda: Execution.objects.filter(label="after the outage").exists(), timeout=60)
        wait_for(lambda: tasks.record.get_result(result.id).status == "SUCCESSFUL")
        out = runjobs.stop(worker)
        assert worker.returncode == 0, out
    finally:
        proxy.close()


@pytest.mark.skipif(settings.DB == "sqlite", reason="SQLite has no server to be down")
def test_a_sigterm_while_runjobs_waits_for_the_server_at_start_stops_it_cleanly(runjobs):
    proxy, worker = start_behind_a_server_that_is_down(runjobs)
    try:
        # MariaDB: the checks, before handle(), wait for the server; PostgreSQL: the
        # supervisor does. Either way runjobs handles the signal and exits cleanly.
        out = runjobs.stop(worker)
    finally:
        proxy.close()
    assert worker.returncode == 0, out
    if settings.DB == "mysql":
        assert "Stopped while waiting for the database: no job was run." in out
