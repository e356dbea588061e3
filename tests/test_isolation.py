"""MariaDB/MySQL under REPEATABLE READ (InnoDB's own default; Django's is READ COMMITTED):
workers and claimers whose sessions run at that level still run each job once.

Why it holds: every fence is a locking read or an UPDATE (the claim's SELECT ... FOR UPDATE
SKIP LOCKED, each outcome's conditional UPDATE), which InnoDB runs on the newest committed
rows at any level, not on the transaction's snapshot; the only plain reads inside our
transactions read back rows the transaction itself wrote, which its snapshot shows. The
level's gap locks make more deadlocks, which are made again (managers/conflicts.py)."""

from collections import Counter

import pytest
from django.db import connection

from django_jobstate.models import Job
from django_jobstate.states import State
from tests import tasks
from tests.conftest import run_racers
from tests.factories import JobFactory
from tests.models import Execution

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL isolation levels"),
]

JOBS = 200


@pytest.fixture
def repeatable_read(monkeypatch):
    """Child processes' sessions run at REPEATABLE READ (tests/settings.py)."""
    monkeypatch.setenv("JOBSTATE_TEST_MYSQL_ISOLATION", "repeatable read")


def test_workers_at_repeatable_read_run_each_job_once(runjobs, repeatable_read):
    results = [tasks.records_its_isolation.enqueue(f"job-{i}") for i in range(JOBS)]
    procs = [runjobs.start("--burst") for _ in range(3)]
    for proc in procs:
        runjobs.wait(proc, 300)
        assert proc.returncode == 0, runjobs.output(proc)

    rows = Job.objects.values_list("state", "return_value")
    assert Counter(rows) == {(State.SUCCEEDED, "REPEATABLE-READ"): JOBS}
    assert Job.objects.count() == len(results)  # no attempt failed, none retried
    runs = Counter(Execution.objects.values_list("label", flat=True))
    assert runs == {f"job-{i}": 1 for i in range(JOBS)}


@pytest.mark.parametrize("limit", [1, 7])
def test_claimers_at_repeatable_read_never_share_a_job(repeatable_read, limit):
    for _ in range(5):  # a round in which one claimer won everything proves nothing
        jobs = JobFactory.create_batch(300)
        won = run_racers([["claim", f"claimer-{n}", str(limit)] for n in range(4)])
        counts = Counter(pk for ids in won for pk in ids)
        assert sorted(counts) == sorted(job.pk for job in jobs), "a job was lost or invented"
        assert max(counts.values()) == 1, "a job was claimed twice"
        if sum(1 for ids in won if ids) > 1:
            break
        Job.objects.all().delete()
    assert sum(1 for ids in won if ids) > 1, "no race happened: only one claimer won jobs"
