"""db/sqlite_turns.py: writers of the application and runjobs take turns at SQLite's write lock.

Real processes: `runjobs --concurrency 2` drains a backlog of no-op jobs while this process
writes as a Django view does (a row and a job per transaction.atomic()) in a tight loop.
Without turns SQLite's busy handler let the loop take the lock back each time, and the
drain all but stopped (100 to 300 jobs per 1,000 commits). No timed assertion: jobs drained
per commit, which the machine's load scales alike on both sides. The ratios of rates are
the benchmark's (bench.py --only sqlite_fair).
"""

import fcntl
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from django_jobstate.backend import JobStateBackend
from django_jobstate.db.sqlite_turns import APP, SUFFIXES
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import State
from tests import tasks
from tests.conftest import ROOT, subprocess_env
from tests.models import Execution
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's single write lock"),
]

BACKLOG = 100_000
COMMITS = 1_000
# Jobs the drain must finish per writer commit, at least: 8 to 13 with turns (a worker's turn
# writes up to 100 jobs, the writer's a row and a job), 0.1 to 0.3 without.
SHARE = 1.0
# The backlog must outlast the writer's loop, so that every commit counted had the drain
# beside it: at the share above the loop takes 8,000 to 13,000 jobs of it. A drain that runs
# through the rest (70 or more jobs per commit) has kept the lock from the writer. (The
# loop does not look at the backlog as it goes: a count between commits left the drain
# room enough to pass without turns.)

# Seconds between the drain's first job and the writer's first commit: not a bound, the
# time for runjobs' processes to finish starting, which takes the CPU from this process and
# measured the machine, not the turns (the drain ran far ahead with or without them).
SETTLE = 1.0


@pytest.mark.slow
def test_a_writer_in_a_tight_loop_leaves_the_drain_its_turns(runjobs):
    JobStateBackend("default", {}).bulk_enqueue(tasks.noop, [((), {})] * BACKLOG)
    backlog = Job.objects.filter(pk__lte=Job.objects.aggregate(Max("pk"))["pk__max"])
    proc = runjobs.start("--concurrency", "2")
    done = Job.objects.filter(state=State.SUCCEEDED)
    wait_for(done.exists, "runjobs to finish a job", timeout=60)
    time.sleep(SETTLE)
    before = done.count()
    failures = []
    for i in range(COMMITS):
        try:
            with transaction.atomic():  # a view: its row, and the job it enqueues
                Execution.objects.create(label=f"page {i}")
                tasks.noop.enqueue()
        except OperationalError as exc:
            failures.append(str(exc))
    drained = done.count() - before
    left = backlog.filter(state=State.QUEUED).count()  # not the writer's jobs, which wait behind
    output = runjobs.stop(proc)

    assert failures == [], f"{len(failures)} of {COMMITS} transactions failed: {failures[0]}"
    assert left, (
        f"the drain ran through {BACKLOG} jobs while the writer committed {COMMITS} times: "
        "the writer did not get its turns"
    )
    assert drained >= COMMITS * SHARE, (
        f"the drain finished {drained} jobs while the writer committed {COMMITS} times"
    )
    assert "locked" not in output, output[-3000:]


# A writer process in a party (`workers`: as runjobs' processes are, `app` otherwise) that
# writes `rounds` rows, each in its own transaction, as fast as it can; each label holds
# time.monotonic() (one clock for the machine) as the row was written.
WRITER = """
import sys, time
import django
django.setup()
from django.db import transaction
from tests.models import Execution
party, rounds = sys.argv[1], int(sys.argv[2])
if party == "workers":
    from django_jobstate.db.sqlite_turns import join_workers
    join_workers()
print("ready", flush=True)
for i in range(rounds):
    with transaction.atomic():
        Execution.objects.create(label=f"{party} {i} {time.monotonic()}")
"""


def start_writer(party: str, rounds: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, party, str(rounds)],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


def finish(proc: subprocess.Popen[bytes]) -> None:
    proc.wait(timeout=120)
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.returncode == 0


def test_a_waiting_worker_writes_before_the_application_writes_again():
    """runjobs' party waits while the application holds the turn: once the application
    commits, its next transaction steps aside and the worker's write goes first, however
    tight the application's loop. (SQLite's busy handler let the loop win: the worker slept
    1, 2, 5 ... ms between tries and found the lock taken each time.)"""
    with transaction.atomic():
        first = Execution.objects.create(label="app 0")
        proc = start_writer("workers", 1)
        time.sleep(0.3)  # not a bound: the worker waits for this transaction to end
    for i in range(1, 200):
        with transaction.atomic():
            Execution.objects.create(label=f"app {i}")
    finish(proc)

    order = list(Execution.objects.filter(pk__gt=first.pk).order_by("pk"))
    position = next(i for i, row in enumerate(order) if row.label.startswith("workers"))
    assert position <= 1, f"the application wrote {position} times before the waiting worker"


def test_a_waiting_application_writes_before_a_busy_worker_writes_again():
    """The other way round: runjobs' party writes in a tight loop; the application's
    transaction waits no more than the worker's turn in progress. (SQLite's busy handler
    let the worker's loop win, as the Wagtail editor found.)"""
    proc = start_writer("workers", 5000)
    try:
        workers = Execution.objects.filter(label__startswith="workers")
        deadline = time.monotonic() + 60
        while workers.count() < 100:  # well into its loop
            assert time.monotonic() < deadline, "the worker's loop never got going"
            time.sleep(0.01)
        # From here on the application's party waits (as its transaction's turn will,
        # with this process's own shared lock on the same file): what is measured is
        # the turns, not how soon a loaded machine runs this process up to that lock.
        waits = os.open(str(connection.settings_dict["NAME"]) + SUFFIXES[APP], os.O_RDWR)
        try:
            fcntl.flock(waits, fcntl.LOCK_SH)
            asked = time.monotonic()
            with transaction.atomic():
                mine = Execution.objects.create(label="app")
        finally:
            os.close(waits)
    finally:
        finish(proc)

    before_mine = workers.filter(pk__lt=mine.pk).values_list("label", flat=True)
    while_waiting = [label for label in before_mine if float(label.split()[2]) > asked]
    assert workers.filter(pk__gt=mine.pk).exists(), "the worker's loop ended first: no contest"
    # One write in progress when the application asked, and one the machine's scheduler
    # may slip in: SQLite's busy handler let it wait for dozens.
    assert len(while_waiting) <= 10, f"{len(while_waiting)} worker writes went first"


def test_a_killed_writer_leaves_no_turn_taken():
    """The kernel drops a dead process's flock: a writer killed inside its transaction
    holds the turn no longer than its process lives."""
    code = (
        "import django, os, sys, time; django.setup()\n"
        "from django.db import transaction\n"
        "with transaction.atomic():\n"
        "    print('in turn', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"in turn\n"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        with transaction.atomic():
            # A turn never given back: this wait would end at the busy timeout, without it.
            assert connection.jobstate_turns.held  # type: ignore[attr-defined]
            Execution.objects.create(label="after the kill")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def closing(write):
    """`write` then close the connection it opened (a thread's own)."""

    def run():
        try:
            write()
        finally:
            connection.close()

    return run


def test_heartbeat_writes_take_no_turn():
    """Registering a worker, forgetting one, forgetting the silent ones: transactions
    (bulk_create() on Django 5.2, delete()). Behind a turn that a stopped writer holds they
    would wait, while every other beat (one UPDATE in autocommit, no turn) lands, and a
    judge would take the workers of whoever beats here for lost (tests/test_liveness.py).
    They take no turn."""
    beat = functools.partial(WorkerHeartbeat.objects.beat, host="h", queues=None)
    beat({"kept": 1, "gone": 2, "silent": 3})
    WorkerHeartbeat.objects.filter(worker_id="silent").update(
        last_seen=timezone.now() - timedelta(hours=1)
    )
    turn = os.open(str(connection.settings_dict["NAME"]) + SUFFIXES["turn"], os.O_RDWR)
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)  # as a writer SIGSTOPped holding its turn
        for write in (
            lambda: beat({"kept": 1, "new": 4}),
            lambda: WorkerHeartbeat.objects.forget("gone"),
            lambda: WorkerHeartbeat.objects.forget_lost(60),
        ):
            thread = threading.Thread(target=closing(write), daemon=True)
            thread.start()
            # Not a bound on its speed: a turn's wait ends at SQLite's busy timeout, 30 s.
            thread.join(10)
            assert not thread.is_alive(), "a heartbeat's write waited for the turn"
    finally:
        os.close(turn)
    assert set(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == {"kept", "new"}
