"""The --in-flight worker loop, in process: quick jobs claimed by the batch and held in
hand until a place frees, handed back on a stop, not started once failed meanwhile;
outcomes written by a thread of their own (runner/inflight.py, hand.py, writer.py)."""

from contextlib import contextmanager
from dataclasses import replace

import pytest

from django_jobstate.conf import get_settings
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import task_started
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def enqueue(count: int, task=tasks.record, *extra):
    task.get_backend().bulk_enqueue(task, [([f"j{n}", *extra], {}) for n in range(count)])


@contextmanager
def started_bodies():
    """The result ids of the attempts whose bodies began (task_started), in order."""
    started: list[str] = []

    def began(sender, task_result, **kwargs):
        started.append(task_result.id)

    task_started.connect(began)
    try:
        yield started
    finally:
        task_started.disconnect(began)


@pytest.fixture
def claims(monkeypatch):
    """The jobs each claim returned, in order; `claims.after` may act on each."""
    made: list[list[Job]] = []
    claim = Job.objects.claim

    def counted(*args, **kwargs):
        jobs = claim(*args, **kwargs)
        made.append(jobs)
        if hasattr(counted, "after"):
            counted.after(len(made), jobs)
        return jobs

    monkeypatch.setattr(Job.objects, "claim", counted)
    counted.made = made
    return counted


def test_quick_jobs_are_claimed_by_the_batch_not_a_place_at_a_time(claims):
    enqueue(120, tasks.noop)  # no write of its own: quick on a loaded machine too
    Worker(burst=True, in_flight=4, max_batch=50).run()
    assert Job.objects.filter(state=State.SUCCEEDED, attempt=1).count() == 120
    sizes = [len(jobs) for jobs in claims.made if jobs]
    # The first claim fills the places (how long jobs take is not known yet); the next
    # ones take a batch each. A place at a time would be 30 claims or more.
    assert sizes[0] == 4, sizes
    assert len(sizes) <= 6, sizes


def test_a_stop_hands_back_the_jobs_held_in_hand(claims):
    enqueue(120, tasks.noop)  # no write of its own: a batch in hand on a loaded machine too
    worker = Worker(burst=True, in_flight=2, max_batch=50)

    def stop_after_the_second(number, jobs):
        if number == 2:  # its first batch (the first claim only fills the places)
            worker.stop()

    claims.after = stop_after_the_second
    with started_bodies() as started:
        worker.run()
    held = claims.made[1]
    assert len(held) > 2, [len(jobs) for jobs in claims.made]
    assert not {str(job.result_id) for job in held} & set(started), "a held job was started"
    released = Job.objects.filter(state=State.FAILED, failure_reason=FailureReason.RELEASED)
    assert set(released.values_list("pk", flat=True)) == {job.pk for job in held}
    # Every job ran once, or was handed back unstarted (its next attempt queued), or was
    # never claimed.
    queued = Job.objects.queued()
    assert queued.filter(attempt=2).count() == len(held)
    assert len(started) == len(set(started)) == 120 - queued.count()
    assert not Job.objects.running().exists()


def test_jobs_held_in_hand_that_were_failed_meanwhile_are_not_started(claims, monkeypatch):
    # Held jobs are checked against the database once held longer than HEARTBEAT_INTERVAL
    # (a paused process): here at every turn.
    every_turn = replace(get_settings(), HEARTBEAT_INTERVAL=0)
    monkeypatch.setattr("django_jobstate.runner.hand.get_settings", lambda: every_turn)
    enqueue(30, tasks.noop)
    rescued: list[int] = []

    def rescue_the_last_three(number, jobs):
        # As if the worker had been taken for lost: another process failed them.
        if number == 2 and len(jobs) > 3:
            rescued.extend(job.pk for job in jobs[-3:])
            Job.objects.release(jobs[0].worker_id, rescued)

    claims.after = rescue_the_last_three
    with started_bodies() as started:
        Worker(burst=True, in_flight=2, max_batch=50).run()
    assert len(rescued) == 3, [len(jobs) for jobs in claims.made]
    # Each began once: the rescued ones as their next attempt only.
    assert len(started) == len(set(started)) == 30
    assert Job.objects.filter(pk__in=rescued, failure_reason=FailureReason.RELEASED).count() == 3


def test_an_error_writing_outcomes_is_raised_by_the_worker(monkeypatch):
    enqueue(10, tasks.noop)  # the attempts left running when it raises touch no database
    worker = Worker(burst=True, in_flight=2)

    def broken(outcomes):
        raise RuntimeError("cannot write")

    monkeypatch.setattr(worker, "record", broken)
    with pytest.raises(RuntimeError, match="cannot write"):
        worker.run()
