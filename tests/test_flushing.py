"""Finished attempts are written while a slow attempt of their batch runs (flushing.py,
and inflight.py's loop), under real `runjobs`: they never show `running` for long, and
a worker process killed during the slow one runs none of them twice."""

import os
import signal

import pytest
from django.db import transaction

from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from tests import tasks
from tests.models import Execution
from tests.test_recovery import wait_for, worker_pid

QUICK = 8

MODES = [
    # The slow attempt is one of the quick task's: the worker expected it to be quick.
    pytest.param([], tasks.marks_a_file, None, id="one at a time"),
    # Another task, not seen yet: the worker writes what it holds before beginning it.
    pytest.param([], tasks.marks_a_file, tasks.runs_until_a_file_exists, id="a new task"),
    pytest.param(["--in-flight", "4"], tasks.marks_a_file, None, id="in-flight sync"),
    pytest.param(["--in-flight", "4"], tasks.async_marks_a_file, None, id="in-flight async"),
]


@pytest.mark.parametrize(("options", "quick", "slow"), MODES)
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_quick_successes_are_written_while_a_slow_attempt_runs_and_never_run_twice(
    runjobs, tmp_path, options, quick, slow
):
    marks, release = tmp_path / "marks", tmp_path / "release"
    with transaction.atomic():  # one commit: the worker claims them together
        results = [quick.enqueue(str(marks), f"q{i}") for i in range(QUICK)]
        if slow is None:
            held = quick.enqueue(str(marks), "slow", str(release))
        else:
            held = slow.enqueue(str(release), "slow")
    ids = [result.id for result in results]
    proc = runjobs.start(*options)

    wait_for(lambda: Execution.objects.filter(label="slow:start").exists())
    # While it runs, the quick ones are written (within FLUSH_AFTER: the wait is a net).
    quick_rows = Job.objects.filter(result_id__in=ids)
    wait_for(lambda: quick_rows.filter(state=State.SUCCEEDED).count() == QUICK, timeout=30)
    running = Job.objects.get(result_id=held.id)
    assert running.state == State.RUNNING, runjobs.output(proc)

    # Its worker process dies: the slow attempt fails as lost; the quick ones ran once.
    os.kill(worker_pid(running.worker_id), signal.SIGKILL)
    wait_for(lambda: Job.objects.get(pk=running.pk).state == State.FAILED)
    release.touch()  # its retry, if its task has one, returns
    live = Job.objects.filter(state__in=[State.QUEUED, State.RUNNING])
    wait_for(lambda: not live.exists())
    output = runjobs.stop(proc)
    assert Job.objects.get(pk=running.pk).failure_reason == FailureReason.LOST
    ran = [label for label in marks.read_text().split() if label != "slow"]
    assert sorted(ran) == sorted(f"q{i}" for i in range(QUICK)), output
    assert quick_rows.count() == QUICK, "a quick job ran again"
    assert set(quick_rows.values_list("attempt", flat=True)) == {1}
    assert set(quick_rows.values_list("state", flat=True)) == {State.SUCCEEDED}


@pytest.mark.django_db
def test_a_worker_run_inside_a_transaction_writes_what_it_holds_itself(settings):
    """In a test's transaction, another connection would not see the jobs: the flusher's
    thread leaves them to the worker, which writes them once the slow attempt returns."""
    # Nor would it see the worker's heartbeat row: no beat from the watchdog's thread.
    settings.JOBSTATE_HEARTBEAT_INTERVAL = 3600
    settings.JOBSTATE_LOST_AFTER = 7200
    quick = [tasks.sleep_then_record.enqueue(f"q{i}", 0) for i in range(QUICK)]
    slow = tasks.sleep_then_record.enqueue("slow", 0.3)  # well past FLUSH_AFTER
    Worker(burst=True).run()
    for result in [*quick, slow]:
        assert Job.objects.get(result_id=result.id).state == State.SUCCEEDED
