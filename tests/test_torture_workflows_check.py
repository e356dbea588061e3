"""The torture run's workflow figures (bench/torture/torture_check_workflows.py) count what
they say: rows of chords and chains made to break each rule, and rows that keep them.
(The run itself, under faults, is test_torture.py's.)"""

import itertools
import sys
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from django_jobstate.models import JobDependency
from django_jobstate.states import FailureReason, State

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORKFLOW = uuid.uuid4()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(rid: str, n: int, state: str, start: float | None, end: float | None, **more) -> dict:
    return {
        "id": abs(hash((rid, n))) % 10**6,
        "result_id": uuid.UUID(rid),
        "workflow_id": WORKFLOW,
        "attempt": n,
        "max_attempts": 3,
        "task_path": "bench.torture.torture_tasks.workflow_step",
        "args": [1, "plain", 0, 0.0],
        "kwargs": {},
        "state": state,
        "failure_reason": "",
        "error_class": "",
        "error_message": "",
        "worker_id": "w" if start is not None else None,
        "started_at": None if start is None else at(start),
        "finished_at": None if end is None else at(end),
        "return_value": n if state == State.SUCCEEDED else None,
        **more,
    }


def ok(rid: str, start: float, end: float, n: int = 1) -> dict:
    return attempt(rid, n, State.SUCCEEDED, start, end)


def gave_up(rid: str, end: float, reason: str = FailureReason.UPSTREAM_FAILED) -> dict:
    return attempt(rid, 1, State.FAILED, None, end, failure_reason=reason)


def failed(rid: str, start: float, end: float, n: int = 1) -> dict:
    return attempt(rid, n, State.FAILED, start, end, failure_reason=FailureReason.ERROR)


def ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def chord(group: list[str], callback: str) -> None:
    JobDependency.objects.bulk_create(
        JobDependency(upstream=up, downstream=callback, position=i) for i, up in enumerate(group)
    )


def chain(steps: list[str]) -> None:
    JobDependency.objects.bulk_create(
        JobDependency(upstream=a, downstream=b) for a, b in itertools.pairwise(steps)
    )


@pytest.fixture(autouse=True, scope="module")
def forget_torture_tasks():
    """bench/torture/torture_tasks.py (which the check imports) defines tasks outside the
    test project's task modules: the checks' W004 (which reads sys.modules) would report
    them in every test of test_checks.py that runs after these."""
    yield
    sys.modules.pop("bench.torture.torture_tasks", None)


def figures(jobs: list[dict], executions: list[dict] | None = None) -> dict[str, object]:
    jobs = sorted(jobs, key=lambda j: (str(j["result_id"]), j["attempt"]))
    from bench.torture.torture_check import Faults  # not at collection: see above
    from bench.torture.torture_check_workflows import workflow_figures

    found = workflow_figures(jobs, executions or [], Faults(), defaultdict(list))
    return {key: figure.value for key, figure in found.items() if figure.must_be_zero}


def test_workflows_that_keep_every_rule_count_nothing():
    *group, callback = ids(4)
    chord(group, callback)
    a, b, c = steps = ids(3)
    chain(steps)
    x, y, z = doomed = ids(3)
    chain(doomed)
    jobs = [ok(group[0], 0, 1), failed(group[1], 0, 1), ok(group[1], 2, 3, n=2), ok(group[2], 0, 2)]
    jobs.append(ok(callback, 4, 5) | {"kwargs": {"results": [1, 2, 1]}})
    jobs += [ok(a, 0, 1), ok(b, 1.5, 2), ok(c, 2.5, 3)]
    jobs += [
        failed(x, 0, 1),
        failed(x, 1, 2, n=2),
        failed(x, 2, 3, n=3),
        gave_up(y, 3),
        gave_up(z, 3),
    ]
    assert set(figures(jobs).values()) == {0}


def test_a_step_started_before_its_upstream_succeeded_is_counted():
    *group, callback = ids(3)
    chord(group, callback)
    jobs = [ok(group[0], 0, 1), ok(group[1], 0, 3)]  # the callback started at 2, before 3
    jobs.append(ok(callback, 2, 4) | {"kwargs": {"results": [1, 1]}})
    assert figures(jobs)["workflow_early"] == 1
    # Its body's record counts too, though its row says it started later.
    jobs[-1] = ok(callback, 3.5, 4) | {"kwargs": {"results": [1, 1]}}
    assert figures(jobs)["workflow_early"] == 0
    execution = {"result_id": uuid.UUID(callback), "attempt": 1, "recorded_at": at(2.9)}
    assert figures(jobs, [execution])["workflow_early"] == 1


def test_a_callback_that_succeeded_twice_never_ran_or_ran_after_a_failure_is_counted():
    twice, never, after = (ids(3) for _ in range(3))
    for *group, callback in (twice, never, after):
        chord(group, callback)
    jobs = [ok(twice[0], 0, 1), ok(twice[1], 0, 1), ok(twice[2], 2, 3), ok(twice[2], 4, 5, n=2)]
    jobs += [ok(never[0], 0, 1), ok(never[1], 0, 1), gave_up(never[2], 2)]
    jobs += [ok(after[0], 0, 1), failed(after[1], 0, 1), ok(after[2], 2, 3)]
    found = figures(jobs)
    assert found["workflow_callbacks"] == 3
    assert found["workflow_early"] == 1  # the one after a failure: its upstream never succeeded


def test_a_callback_given_other_results_is_counted():
    *group, callback = ids(3)
    chord(group, callback)
    jobs = [ok(group[0], 0, 1), failed(group[1], 0, 0.5), ok(group[1], 0.6, 1, n=2)]
    jobs.append(ok(callback, 2, 3) | {"kwargs": {"results": [2, 1]}})  # out of order
    assert figures(jobs)["workflow_results"] == 1


def test_a_chain_step_left_after_its_upstream_succeeded_or_run_after_it_failed_is_counted():
    a, b = held = ids(2)
    c, d = ran = ids(2)
    e, f = cancelled = ids(2)
    for steps in (held, ran, cancelled):
        chain(steps)
    jobs = [ok(a, 0, 1), gave_up(b, 2)]  # released never: failed as if its upstream had
    jobs += [failed(c, 0, 1), ok(d, 2, 3)]
    jobs += [
        attempt(e, 1, State.FAILED, None, 1, failure_reason=FailureReason.CANCELLED),
        gave_up(f, 1, FailureReason.CANCELLED),  # after a cancelled upstream: right
    ]
    assert figures(jobs)["workflow_released"] == 2


def test_a_workflow_not_done_when_the_drain_gave_up_is_left_to_the_runs_own_figure():
    *group, callback = ids(3)
    chord(group, callback)
    a, b = steps = ids(2)
    chain(steps)
    jobs = [ok(group[0], 0, 1), attempt(group[1], 1, State.QUEUED, None, None)]
    jobs.append(attempt(callback, 1, State.QUEUED, None, None, hold="deps"))
    jobs += [ok(a, 0, 1), attempt(b, 1, State.QUEUED, None, None)]
    assert set(figures(jobs).values()) == {0}


def test_a_step_still_waiting_after_its_upstream_failed_is_counted():
    *group, callback = ids(3)
    chord(group, callback)
    a, b = steps = ids(2)
    chain(steps)
    jobs = [ok(group[0], 0, 1), failed(group[1], 0, 1)]
    jobs.append(attempt(callback, 1, State.QUEUED, None, None, hold="deps"))
    jobs += [failed(a, 0, 1), attempt(b, 1, State.QUEUED, None, None, hold="deps")]
    found = figures(jobs)
    assert found["workflow_callbacks"] == 1
    assert found["workflow_released"] == 1
