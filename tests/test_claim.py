"""Real processes race to claim the same jobs: each job must be won exactly once."""

from collections import Counter

import pytest

from django_jobstate.models import Job
from django_jobstate.states import State
from tests.conftest import run_racers
from tests.factories import JobFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLAIMERS = 4
JOBS = 300


def race(limit: int) -> list[list[int]]:
    return run_racers([["claim", f"claimer-{n}", str(limit)] for n in range(CLAIMERS)])


@pytest.mark.parametrize("limit", [1, 7])
@pytest.mark.parametrize("round_", range(3))
def test_concurrent_claimers_never_share_a_job(limit, round_):
    # On a loaded machine one claimer can drain every job before the others are scheduled:
    # such a round proves nothing, so it is run again (a few times at most).
    for _ in range(5):
        Job.objects.bulk_create(JobFactory.build_batch(JOBS))  # one statement, not 300
        jobs = sorted(Job.objects.values_list("pk", flat=True))
        assert len(jobs) == JOBS
        won = race(limit)

        counts = Counter(pk for ids in won for pk in ids)
        assert sorted(counts) == jobs, "a job was lost or invented"
        assert max(counts.values()) == 1, "a job was claimed twice"
        if sum(1 for ids in won if ids) > 1:
            break
        Job.objects.all().delete()
    assert sum(1 for ids in won if ids) > 1, "no race happened: only one claimer won jobs"
    # Each row names the one claimer that won it.
    owner = {pk: f"claimer-{n}" for n, ids in enumerate(won) for pk in ids}
    rows = Job.objects.values_list("pk", "state", "worker_id")
    assert {pk: worker for pk, _, worker in rows} == owner
    assert {state for _, state, _ in rows} == {State.RUNNING}
