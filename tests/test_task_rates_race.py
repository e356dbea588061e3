"""A task's rate with real workers: two `runjobs --concurrency 4` supervisors drain a
rate-limited task and another task of the same queue; the starts (the rows' started_at,
the database's clock) never exceed the rate by more than one batch, and the other task's
jobs run meanwhile (tests/limit_tasks.py)."""

import pytest

from django_jobstate.backend import JobStateBackend
from django_jobstate.limits.queues import burst
from django_jobstate.models import Job
from django_jobstate.states import State
from tests.limit_tasks import five_a_second, unlimited
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

backend = JobStateBackend("default", {})
RATE, COUNT = "5/s", 25


def test_two_supervisors_start_a_task_at_its_rate_and_others_meanwhile(runjobs):
    backend.bulk_enqueue(five_a_second, [((f"r{i}", 0.0), {}) for i in range(COUNT)])
    backend.bulk_enqueue(unlimited, [((f"u{i}", 0.3), {}) for i in range(30)])
    supervisors = [runjobs.start("--concurrency", "4") for _ in range(2)]
    wait_for(
        lambda: not Job.objects.filter(finished_at=None).exists(),
        "every job to finish",
        timeout=180,
    )
    for proc in supervisors:
        runjobs.stop(proc)
    assert Job.objects.filter(state=State.SUCCEEDED).count() == COUNT + 30  # once each
    rated = Job.objects.filter(task_path="tests.limit_tasks.five_a_second")
    starts = sorted(rated.values_list("started_at", flat=True))
    count = 5  # a second
    # Starts in any one-second window: at most the rate plus the bucket's one batch.
    for i, first in enumerate(starts):
        within = [t for t in starts[i:] if (t - first).total_seconds() < 1]
        assert len(within) <= count + burst(RATE), (first, len(within))
    # Over the run: the first batch at once, then five a second.
    assert (starts[-1] - starts[0]).total_seconds() >= (COUNT - burst(RATE) - 1) / count
    # The other task of the queue ran while the rated one waited for its turns.
    others = Job.objects.filter(task_path="tests.limit_tasks.unlimited")
    assert others.filter(started_at__gt=starts[0], started_at__lt=starts[-1]).exists()
