"""runjobs forks its workers from a fork server that set Django up once (forking.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_jobstate.heartbeats import WorkerHeartbeat
from django_jobstate.models import Job
from django_jobstate.runner.forking import on_sigterm, worker_context
from django_jobstate.states import State
from tests import tasks
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent

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
    on_sigterm(lambda: heard.append(signal.SIGTERM))
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


# A worker's main thread waiting on its stop Event, as an idle worker does (Waiter.wait),
# over and over, while SIGTERMs come; the stop clears it again.
WAITS_ON_ITS_EVENT = """
import os, signal, sys, threading, time
from django_jobstate.runner.forking import on_sigterm
stopping = threading.Event()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as a fork is born: preload.py
on_sigterm(stopping.set)
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    stopping.wait(0.0001)
    stopping.clear()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the storm goes on: exit 0
os._exit(0)
"""


@pytest.mark.django_db(transaction=False)
def test_a_sigterm_never_stops_a_worker_for_ever_in_the_middle_of_a_wait():
    # A handler that set the Event itself came, now and then, while the main thread held
    # the Event's lock inside wait(): it waited for it for ever (runjobs never exited, seen
    # at load). A storm of SIGTERMs hung such a process 2 times in 5 within 2 s.
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITS_ON_ITS_EVENT, "6"], stdout=subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    sent = 0
    while proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        sent += 1
        time.sleep(0.0002)
        if sent > 200_000:  # its loop ends after 6 s: it hangs in a handler
            break
    try:
        assert proc.wait(timeout=30) == 0, f"it exited {proc.returncode} after {sent} SIGTERMs"
    finally:
        proc.kill()
        proc.stdout.close()
