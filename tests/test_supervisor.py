"""The supervisor: attempts its workers never started are handed back, never lost; stops
and failures reach every worker and the exit code."""

import json
import os
import signal
import time

import pytest
from django.db import transaction

from django_jobstate.models import Job
from django_jobstate.runner.forking import send, worker_context
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.models import Execution
from tests.test_recovery import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def warm_up(count: int = 10) -> None:
    """A few quick jobs, so that the workers claim in batches."""
    for n in range(count):
        tasks.record.enqueue(f"warm-up {n}")
    wait_for(lambda: Execution.objects.filter(label__startswith="warm-up").count() == count)


def test_attempts_held_behind_a_slow_one_are_handed_back_to_other_workers(runjobs, tmp_path):
    holder = runjobs.start()
    warm_up()  # now it claims in batches
    # The slow one runs until the test lets it end (not for a time a loaded machine can
    # outlast before the second worker is up): the attempts behind it can only have run
    # meanwhile if they were handed back.
    done = tmp_path / "done"
    with transaction.atomic():  # claimed together: the slow job first, the others behind it
        slow = tasks.runs_until_a_file_exists.enqueue(str(done), "slow")
        behind = [tasks.record.enqueue(f"behind {n}") for n in range(20)]
    ids = [result.id for result in behind]
    slow_worker = wait_for(lambda: Job.objects.get(result_id=slow.id).worker_id)
    held = Job.objects.filter(result_id__in=ids, attempt=1, worker_id=slow_worker)
    assert held.exists(), "not claimed in one batch"
    other = runjobs.start()  # the worker to hand them to
    succeeded = Job.objects.filter(result_id__in=ids, state=State.SUCCEEDED)
    wait_for(lambda: succeeded.count() == len(ids), "the attempts held behind the slow one")
    assert Job.objects.get(result_id=slow.id).state == State.RUNNING
    done.touch()
    wait_for(lambda: not Job.objects.filter(result_id__in=[slow.id, *ids]).live().exists())
    runjobs.stop(holder)
    runjobs.stop(other)

    slow_done = Job.objects.get(result_id=slow.id).finished_at
    for result in behind:
        final = Job.objects.attempts_of(result.id).last()
        assert final.state == State.SUCCEEDED
        assert final.finished_at < slow_done, "ran by another worker, not after the slow one"
    handed_back = Job.objects.filter(result_id__in=ids, state=State.FAILED)
    assert set(handed_back.values_list("failure_reason", flat=True)) <= {FailureReason.RELEASED}
    labels = Execution.objects.filter(label__startswith="behind").values_list("label", flat=True)
    assert sorted(labels) == sorted(f"behind {n}" for n in range(20))  # each ran once


def test_a_timeout_with_every_task_timed_loses_none_of_the_attempts_claimed_with_it(
    runjobs, settings
):
    settings.JOBSTATE_DEFAULT_TIMEOUT = 30  # read at enqueue: every job has a deadline
    runjobs.start()
    warm_up()
    with transaction.atomic():
        spin = tasks.busy_loop.enqueue("spin")
        behind = [tasks.record.enqueue(f"behind {n}") for n in range(5)]
    ids = [result.id for result in behind]
    wait_for(lambda: not Job.objects.filter(result_id__in=[spin.id, *ids]).live().exists())

    assert Job.objects.get(result_id=spin.id, attempt=1).failure_reason == FailureReason.TIMEOUT
    for result in behind:  # max_attempts=1, yet each ran: a handed-back attempt never ran
        rows = list(Job.objects.attempts_of(result.id))
        assert rows[-1].state == State.SUCCEEDED
        assert {row.failure_reason for row in rows[:-1]} <= {FailureReason.RELEASED}
        assert tasks.record.get_result(result.id).errors == []
    labels = Execution.objects.filter(label__startswith="behind").values_list("label", flat=True)
    assert sorted(labels) == sorted(f"behind {n}" for n in range(5))


def test_a_signal_during_start_up_reaches_every_worker(runjobs):
    proc = runjobs.start("--concurrency", "4")
    # As soon as it starts its workers (its handlers are in place by then).
    wait_for(lambda: "started 4 worker(s)" in runjobs.output(proc), timeout=60, every=0.001)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 0, runjobs.output(proc)


def test_a_burst_run_that_cannot_reach_the_database_does_not_exit_as_done(runjobs):
    tasks.record.enqueue("never")
    unreachable = {
        "DATABASES": {
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "HOST": "127.0.0.1",
                "PORT": "1",  # nothing listens there
                "NAME": "none",
                "USER": "none",
            }
        }
    }

    done = runjobs.run(
        "--burst", "--skip-checks", JOBSTATE_TEST_SETTINGS=json.dumps(unreachable), timeout=60
    )

    assert done.returncode == 3, done.stdout
    assert "could not reach the database 'default'" in done.stdout
    assert Job.objects.get().state == State.QUEUED


def test_a_signal_to_a_worker_process_already_reaped_is_no_error():
    """A fork server reaps a worker process as it dies, before the supervisor hears of it:
    a worker killed at one attempt's deadline and found past another's at the next turn
    was gone, and os.kill() raised ProcessLookupError, which ended the supervisor (seen in
    a torture run). runner/forking.send() passes over it."""
    process = worker_context().Process(target=time.sleep, args=(60,))
    process.start()
    os.kill(process.pid, signal.SIGKILL)

    def reaped() -> bool:
        try:
            os.kill(process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(reaped, what="the fork server to reap it")
    for signum in (signal.SIGKILL, signal.SIGTERM):
        send(process, signum)  # not yet told it ended: os.kill() would raise
    process.join()
    assert process.exitcode == -signal.SIGKILL
