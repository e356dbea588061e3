"""The torture run's excuse for a write that came late (bench/torture/torture_check_workloads.py
_stalled()): a writer frozen meanwhile. On SQLite one write lock holds every writer, so any
worker's frozen process excuses everyone's late write; elsewhere, only the frozen worker's
own. (The run itself, under faults, is test_torture.py's.)"""

import sys
from datetime import UTC, datetime, timedelta

import pytest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FROZEN, NEIGHBOUR = "torture:aaaa/0.3", "torture:bbbb/1.4"


@pytest.fixture(autouse=True, scope="module")
def forget_torture_tasks():
    """As in test_torture_workflows_check.py: the check imports the torture's tasks, which the
    checks' W004 would report in every later test of test_checks.py."""
    yield
    sys.modules.pop("bench.torture.torture_tasks", None)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stalled(jobs: list[dict], worker: str, start: float, end: float, **faults) -> bool:
    from bench.torture.torture_check import Faults  # not at collection: see above
    from bench.torture.torture_check_workloads import _stalled
    from bench.torture.torture_workloads import Workload

    return _stalled(Faults(**faults), Workload(), jobs, worker, at(start), at(end))


def holding(kind: str, attempt: int = 1) -> dict:
    """An attempt of FROZEN's from 0 to 6 s, of the torture's `kind`."""
    return {
        "worker_id": FROZEN,
        "args": [1, kind, 6.0, 0.0],
        "attempt": attempt,
        "started_at": at(0),
        "finished_at": at(6),
    }


@pytest.mark.parametrize("sqlite", [True, False])
def test_a_held_interpreter_excuses_everyones_late_write_on_sqlite_only(sqlite):
    jobs = [holding("gil-hold")]

    assert stalled(jobs, NEIGHBOUR, 0.5, 6.1, one_write_lock=sqlite) is sqlite
    assert stalled(jobs, FROZEN, 0.5, 6.1, one_write_lock=sqlite)  # its own, everywhere
    assert not stalled(jobs, NEIGHBOUR, 7, 8, one_write_lock=sqlite)  # after it: no excuse


def test_an_attempt_that_does_not_hold_the_interpreter_excuses_nothing():
    # A retry of a task that held it (the first attempt alone holds), and a plain body.
    for jobs in ([holding("gil-hold", attempt=2)], [holding("plain")]):
        assert not stalled(jobs, NEIGHBOUR, 0.5, 6.1, one_write_lock=True)
        assert not stalled(jobs, FROZEN, 0.5, 6.1, one_write_lock=True)


def test_a_hold_excuses_no_more_than_its_length_after_its_claim():
    # Its attempt left unfinished, or failed as lost long after its process was killed.
    for finished in (None, at(30)):
        jobs = [{**holding("gil-hold"), "finished_at": finished}]
        assert stalled(jobs, NEIGHBOUR, 0.5, 6.1, one_write_lock=True)
        assert not stalled(jobs, NEIGHBOUR, 14, 15, one_write_lock=True)


def test_a_stopped_worker_excuses_everyones_late_write_on_sqlite_only():
    from bench.torture.torture_check import Pause

    pause = Pause(pid=1, worker_id=FROZEN, long=True, stopped=at(0), resumed=at(6))
    for sqlite in (True, False):
        assert stalled([], NEIGHBOUR, 0.5, 6.1, one_write_lock=sqlite, pauses=[pause]) is sqlite
        assert stalled([], FROZEN, 0.5, 6.1, one_write_lock=sqlite, pauses=[pause])
