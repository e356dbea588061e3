"""Limits of a queue with real workers: two `runjobs --concurrency 4` supervisors drain a
limited queue and another one while a sampler polls the running rows, and every task body
records when it ran (tests/limit_tasks.py)."""

import io
import os
import signal

import pytest
from django.core.management import call_command

from django_jobstate.backend import JobStateBackend
from django_jobstate.limits.queues import burst
from django_jobstate.models import Job, JobQueue
from django_jobstate.states import FailureReason, State
from tests.limit_tasks import unlimited
from tests.models import Execution
from tests.test_limits_race import all_succeeded_once, most_at_once, runs
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

backend = JobStateBackend("default", {"QUEUES": ["default", "emails", "reports"]})
reports = unlimited.using(queue_name="reports")
emails = unlimited.using(queue_name="emails")


def running(queue: str) -> int:
    return Job.objects.filter(queue_name=queue, state=State.RUNNING).count()


def drain(runjobs, check) -> None:
    """Two supervisors run every job, calling check() meanwhile; each job succeeds once."""
    total = Job.objects.count()
    supervisors = [runjobs.start("--concurrency", "4") for _ in range(2)]

    def drained() -> bool:
        check()
        return not Job.objects.filter(finished_at=None).exists()

    wait_for(drained, "every job to finish", every=0.02)
    all_succeeded_once(total, [runjobs.stop(proc) for proc in supervisors])


def test_two_supervisors_never_run_more_than_the_queue_limit(runjobs):
    JobQueue.objects.set_limits("reports", concurrency=3, by="test")
    backend.bulk_enqueue(reports, [((f"r{i}", 0.1), {}) for i in range(18)])
    backend.bulk_enqueue(emails, [((f"e{i}", 0.1), {}) for i in range(16)])
    peaks = {"reports": 0, "emails": 0}

    def check() -> None:
        for queue in peaks:
            peaks[queue] = max(peaks[queue], running(queue))
        assert peaks["reports"] <= 3

    drain(runjobs, check)
    spans = runs()["free"]
    assert len(spans) == 34
    limited = [s for s in spans if s[2].startswith("r")]
    assert most_at_once(limited) <= 3, sorted(limited)
    # The other queue ran beside it: a full queue never stopped a worker.
    other = [s for s in spans if s[2].startswith("e")]
    assert any(a[0] < b[1] and b[0] < a[1] for a in other for b in limited), sorted(spans)


def test_a_limit_changed_at_run_time_reaches_running_workers(runjobs):
    # Jobs long enough that several run at once even on a loaded machine (0.2 s and four
    # at once: SQLite in CI ran them all without a sample seeing four).
    backend.bulk_enqueue(reports, [((f"r{i}", 0.4), {}) for i in range(20)])
    supervisors = [runjobs.start("--concurrency", "4") for _ in range(2)]
    wait_for(lambda: running("reports") >= 3, "several jobs of the queue to run", every=0.02)
    call_command("jobqueues", "limit", "reports", "--concurrency", "1", stdout=io.StringIO())
    # Those running finish; from then on, one at a time.
    before = list(Job.objects.filter(state=State.RUNNING).values_list("pk", flat=True))
    ran_before = Job.objects.filter(pk__in=before)
    wait_for(
        lambda: not ran_before.filter(finished_at=None).exists(),
        "the jobs running at the change to finish",
        every=0.02,
    )

    def one_at_a_time() -> bool:
        assert running("reports") <= 1
        return not Job.objects.filter(finished_at=None).exists()

    wait_for(one_at_a_time, "every job to finish", every=0.02)
    for proc in supervisors:
        runjobs.stop(proc)
    assert Job.objects.filter(state=State.SUCCEEDED).count() == 20


def test_a_rate_holds_over_the_run(runjobs):
    rate, count = "20/s", 40
    JobQueue.objects.set_limits("reports", rate=rate, by="test")
    backend.bulk_enqueue(reports, [((f"r{i}", 0.0), {}) for i in range(count)])
    drain(runjobs, lambda: None)
    starts = sorted(Job.objects.filter(queue_name="reports").values_list("started_at", flat=True))
    assert len(starts) == count
    # Starts in any one-second window: at most the rate plus the bucket's burst.
    for i, first in enumerate(starts):
        within = [t for t in starts[i:] if (t - first).total_seconds() < 1]
        assert len(within) <= 20 + burst(rate), (first, len(within))
    # Over the run: the first `burst` at once, then 20 a second.
    assert (starts[-1] - starts[0]).total_seconds() >= (count - burst(rate) - 1) / 20


def test_a_killed_worker_keeps_its_queue_place_until_its_attempt_is_rescued(runjobs):
    JobQueue.objects.set_limits("reports", concurrency=1, by="test")
    long = reports.enqueue("long", 60)
    nxt = reports.enqueue("next", 0)
    first = runjobs.start()
    wait_for(lambda: Execution.objects.filter(label="start|free|long").exists())

    os.killpg(first.pid, signal.SIGKILL)  # the supervisor and its worker, mid-attempt
    runjobs.start()
    lost = Job.objects.get(result_id=long.id)

    def rescued() -> bool:
        job = Job.objects.get(result_id=nxt.id)
        if Job.objects.get(pk=lost.pk).state == State.RUNNING:
            assert job.state == State.QUEUED  # its place is still taken
        return job.state == State.SUCCEEDED

    wait_for(rescued, "the next job of the queue to run after the rescue", every=0.02)
    lost.refresh_from_db()
    job = Job.objects.get(result_id=nxt.id)
    assert (lost.state, lost.failure_reason) == (State.FAILED, FailureReason.LOST)
    assert job.started_at >= lost.finished_at
