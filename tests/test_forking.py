"""runjobs forks its workers from a fork server that set Django up once (forking.py)."""

import os
import signal
import time
from pathlib import Path

import pytest

from django_jobstate.heartbeats import WorkerHeartbeat
from django_jobstate.models import Job
from django_jobstate.runner.forking import on_sigterm, worker_context
from django_jobstate.states import State
from tests import tasks
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc"),
]


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def parent_of(pid: int) -> int:
    # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so after the ")".
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def worker_pids(count: int) -> list[int]:
    wait_for(lambda: WorkerHeartbeat.objects.count() >= count, timeout=60)
    return list(WorkerHeartbeat.objects.values_list("pid", flat=True))


def test_workers_are_forks_of_one_server_not_fresh_interpreters(runjobs):
    proc = runjobs.start("--concurrency", "2")
    pids = worker_pids(2)

    servers = {parent_of(pid) for pid in pids}
    assert len(servers) == 1, servers
    [server] = servers
    # Not "spawn_main": a spawned worker imports Django and the project again.
    assert all("multiprocessing.forkserver" in cmdline(pid) for pid in pids), [
        cmdline(pid) for pid in pids
    ]
    assert parent_of(server) == proc.pid
    result = tasks.record.enqueue("ran in a fork")
    wait_for(lambda: Job.objects.filter(state=State.SUCCEEDED).exists(), timeout=60)
    assert tasks.record.get_result(result.id).return_value == "ran in a fork"
    output = runjobs.stop(proc)
    assert proc.returncode == 0, output


def test_workers_end_when_their_supervisor_is_killed(runjobs):
    proc = runjobs.start("--concurrency", "2")
    pids = worker_pids(2)

    os.kill(proc.pid, signal.SIGKILL)  # the supervisor alone: not its fork server, nor workers
    proc.wait(timeout=30)

    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=60)


def start_slowly(report: str) -> None:
    """A worker forked from the fork server whose start takes a second (the test sends it
    SIGTERM meanwhile), then sets its handler as child.py does: exit 0 if it heard it."""
    blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    Path(report).write_text(str(blocked))
    time.sleep(1.0)
    heard: list[int] = []
    on_sigterm(lambda signum, frame: heard.append(signum))
    for _ in range(100):
        if heard:
            os._exit(0)
        time.sleep(0.01)
    os._exit(1)


@pytest.mark.django_db(transaction=False)
def test_a_sigterm_that_comes_while_a_worker_starts_reaches_its_handler(tmp_path):
    # The supervisor may stop (SIGTERM) a worker that is still starting; CPython forgets a
    # signal that arrives before its after-fork hook, so the fork server's children are born
    # with SIGTERM blocked and take it once their handler is set (preload.py).
    report = tmp_path / "blocked"
    context = worker_context()
    process = context.Process(target=start_slowly, args=(str(report),))
    process.start()
    wait_for(report.exists, timeout=60)
    os.kill(process.pid, signal.SIGTERM)
    process.join(timeout=60)
    assert report.read_text() == "True"
    assert process.exitcode == 0, "the worker did not hear the SIGTERM sent while it started"
