"""When a --burst run ends: not before what it can claim has run, not waiting for ever on
rows another transaction holds locked."""

import threading
import time

import pytest
from django.db import connection, transaction

from django_jobstate.models import Job
from django_jobstate.runner import burst
from django_jobstate.runner.burst import BurstEnd
from django_jobstate.runner.worker import Worker
from django_jobstate.states import State
from tests import tasks
from tests.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


class RowLock(threading.Thread):
    """Holds `SELECT ... FOR UPDATE` on one job, in its own transaction, until released
    (as an application's select_for_update() or an admin action would)."""

    def __init__(self, pk: int) -> None:
        super().__init__()
        self.pk = pk
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=self.pk)
                self.holding.set()
                self.release.wait(300)
        finally:
            connection.close()

    def __enter__(self) -> "RowLock":
        self.start()
        assert self.holding.wait(30), "the lock was not taken"
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.join(30)


def in_a_thread(worker: Worker) -> threading.Thread:
    def run() -> None:
        try:
            worker.run()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def ran() -> list[str]:
    return sorted(Execution.objects.values_list("label", flat=True))


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [[], ["--concurrency", "2"], ["--in-flight", "4"]], ids=["one", "two", "in-flight"]
)
def test_a_burst_run_exits_leaving_a_job_another_transaction_locks(runjobs, options):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks: see the SQLite test below")
    tasks.record.enqueue("locked")
    locked = Job.objects.get()
    for i in range(5):
        tasks.record.enqueue(f"free-{i}")
    with RowLock(locked.pk):
        done = runjobs.run("--burst", *options, timeout=120)
    assert done.returncode == 0, done.stdout
    assert ran() == [f"free-{i}" for i in range(5)]
    assert Job.objects.get(pk=locked.pk).state == State.QUEUED
    skipped = [line for line in done.stdout.splitlines() if "holds them locked" in line]
    assert skipped, done.stdout
    assert all(line.endswith(f"passes them over): {locked.pk}") for line in skipped), skipped


@pytest.mark.slow
def test_on_sqlite_the_run_waits_for_the_transaction_then_runs_every_job(runjobs):
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite case")
    tasks.record.enqueue("locked")
    locked = Job.objects.get()
    for i in range(5):
        tasks.record.enqueue(f"free-{i}")
    # select_for_update() locks no row on SQLite, but the transaction holds the write lock
    # from BEGIN (receivers.py): the run waits for it (within the busy timeout), then runs
    # every job, the "locked" one too. (Held for longer than the busy timeout, the run
    # would fail to start: Django's JSON check begins a transaction.)
    with RowLock(locked.pk):
        proc = runjobs.start("--burst")
        time.sleep(0.5)  # not an assertion: the run meets the lock or not, and must pass
    runjobs.wait(proc, 60)
    out = runjobs.output(proc)
    assert proc.returncode == 0, out
    assert ran() == ["free-0", "free-1", "free-2", "free-3", "free-4", "locked"]
    assert "holds them locked" not in out


def test_a_job_locked_for_a_moment_is_run_not_left(monkeypatch):
    """A claim in flight (or any short transaction) passes a row over for a moment: the
    run must claim it once it is free, not exit as though it were locked for good."""
    monkeypatch.setattr(burst, "LOCKED_GRACE", 60.0)  # the release below is well within
    tasks.record.enqueue("briefly locked")
    locked = Job.objects.get()
    worker = Worker(burst=True, poll_interval=0.05)
    with RowLock(locked.pk):
        runner = in_a_thread(worker)
        deadline = time.monotonic() + 60
        # On SQLite the lock is the transaction's: the claim waits instead of passing over.
        while not worker._burst_end._passed_over and connection.vendor != "sqlite":
            assert time.monotonic() < deadline, "the worker never passed the row over"
            time.sleep(0.01)
    runner.join(60)
    assert not runner.is_alive()
    assert ran() == ["briefly locked"]
    assert Job.objects.get(pk=locked.pk).state == State.SUCCEEDED


def test_a_burst_run_waits_for_a_job_due_soon_beside_a_locked_one(monkeypatch):
    """A locked row does not cut short the wait for a job due within BURST_HORIZON."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks")
    monkeypatch.setattr(burst, "LOCKED_GRACE", 0.0)
    tasks.record.enqueue("locked")
    locked = Job.objects.get()
    tasks.fails_first_attempt.enqueue()  # its retry waits 1 to 2 s
    with RowLock(locked.pk):
        runner = in_a_thread(Worker(burst=True, poll_interval=0.05))
        runner.join(60)
        assert not runner.is_alive(), "the run waited for the locked job"
    assert sorted(Job.objects.values_list("state", flat=True)) == [
        State.FAILED,
        State.QUEUED,
        State.SUCCEEDED,
    ]


def test_a_job_seen_runnable_for_the_first_time_is_never_taken_as_locked(monkeypatch):
    """A job that fell due (or was enqueued) after the claim that found nothing was passed
    over by no claim: even with no grace at all, the run claims again before it exits."""
    monkeypatch.setattr(burst, "LOCKED_GRACE", 0.0)
    end = BurstEnd("w", None, "default")
    assert end.reached()  # nothing at all: done
    tasks.record.enqueue("due after the claim")
    assert not end.reached(), "exited before any claim could take the job"
    assert end.reached()  # a claim (as a worker makes between the two) passed it over
