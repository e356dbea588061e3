"""Concurrency limits with real workers: two `runjobs --concurrency 4` supervisors drain
limited tasks, a sampler polls the running rows, and every task body records when it ran
(tests/limit_tasks.py): never more than the limit at once, per key or per task."""

import os
import signal
from collections import defaultdict

import pytest
from django.db.models import Count

from django_jobstate.backend import JobStateBackend
from django_jobstate.limits.concurrency import Hold
from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from tests.limit_tasks import one_per_customer, three_at_once, two_per_customer, unlimited
from tests.models import Execution
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

backend = JobStateBackend("default", {})
LIMITS = {"one": 1, "two": 2, "three": 3}


def runs() -> dict[str, list[tuple[float, float, str]]]:
    """{key: [(start, end, label)]} of every body that ran to its end."""
    found = defaultdict(list)
    for label in Execution.objects.filter(label__startswith="run|").values_list("label", flat=True):
        _, key, name, start, end = label.split("|")
        found[key].append((float(start), float(end), name))
    return found


def most_at_once(spans: list[tuple[float, float, str]]) -> int:
    """The most of `spans` that overlapped at any instant."""
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    now = peak = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


def all_succeeded_once(total: int, logs: list[str]) -> None:
    """Every one of the `total` jobs succeeded, none retried; else say which did not, and
    the supervisors' log lines about them (on a loaded machine: a rescue of a worker that
    missed its heartbeats for JOBSTATE_LOST_AFTER?)."""
    others = list(
        Job.objects.exclude(state=State.SUCCEEDED).values_list(
            "pk", "state", "failure_reason", "error_message", "attempt"
        )
    )
    said = [line for log in logs for line in log.splitlines() if "ERROR" in line or "lost" in line]
    assert (Job.objects.filter(state=State.SUCCEEDED).count(), others) == (total, []), said[-20:]
    assert Job.objects.count() == total


def sample(peaks: dict[str, int]) -> int:
    """Count the running rows per concurrency key now; keep each key's peak. Returns how
    many keys of one_per_customer ran at once."""
    running = Job.objects.filter(state=State.RUNNING, concurrency_key__isnull=False)
    rows = running.values("concurrency_key", "concurrency_limit").annotate(n=Count("pk"))
    for row in rows:
        key = row["concurrency_key"]
        peaks[key] = max(peaks.get(key, 0), row["n"])
        assert row["n"] <= row["concurrency_limit"], f"{row['n']} running for limit {row}"
    return sum(1 for row in rows if row["concurrency_limit"] == 1)


def test_two_supervisors_never_run_more_than_the_limit(runjobs):
    calls = 4
    backend.bulk_enqueue(
        one_per_customer, [((c, f"{c}-{i}", 0.15), {}) for i in range(calls) for c in (1, 2, 3)]
    )
    backend.bulk_enqueue(
        two_per_customer, [((c, f"{c}-{i}", 0.1), {}) for i in range(6) for c in (1, 2)]
    )
    backend.bulk_enqueue(three_at_once, [((str(i), 0.1), {}) for i in range(9)])
    backend.bulk_enqueue(unlimited, [((str(i), 0.05), {}) for i in range(8)])
    total = Job.objects.count()
    supervisors = [runjobs.start("--concurrency", "4") for _ in range(2)]

    peaks: dict[str, int] = {}
    keys_at_once = 0

    def drained() -> bool:
        nonlocal keys_at_once
        keys_at_once = max(keys_at_once, sample(peaks))
        return not Job.objects.filter(finished_at=None).exists()

    wait_for(drained, "every job to finish", every=0.02)
    all_succeeded_once(total, [runjobs.stop(proc) for proc in supervisors])
    assert not Job.objects.filter(hold=Hold.LIMIT, state=State.QUEUED).exists()
    found = runs()
    assert sum(len(spans) for spans in found.values()) == total
    for key, spans in found.items():
        kind = key.split(":")[0]
        if kind in LIMITS:
            assert most_at_once(spans) <= LIMITS[kind], (key, sorted(spans))
        # Every body ran exactly once.
        assert len({name for _, _, name in spans}) == len(spans), key
    # Within a key of limit 1, jobs started in claim order (enqueue order here).
    for customer in (1, 2, 3):
        spans = sorted(found[f"one:{customer}"])
        assert [name for _, _, name in spans] == [f"{customer}-{i}" for i in range(calls)]
    # Other keys ran meanwhile: a limit holds back its key only.
    assert keys_at_once >= 2 or any(
        a[0] < b[1] and b[0] < a[1] for a in found["one:1"] for b in found["one:2"] + found["one:3"]
    )
    assert max(peaks.values()) >= 1


def test_a_killed_worker_keeps_its_slot_until_its_attempt_is_rescued(runjobs):
    long = one_per_customer.enqueue(7, "long", 60)
    nxt = one_per_customer.enqueue(7, "next", 0)
    first = runjobs.start()
    wait_for(lambda: Execution.objects.filter(label="start|one:7|long").exists())

    os.killpg(first.pid, signal.SIGKILL)  # the supervisor and its worker, mid-attempt
    runjobs.start()
    lost = Job.objects.get(result_id=long.id)

    def rescued() -> bool:
        # Until the rescue, the slot stays taken: the next job waits, held.
        job = Job.objects.get(result_id=nxt.id)
        current = Job.objects.get(pk=lost.pk)
        if current.state == State.RUNNING:
            assert (job.state, job.hold) == (State.QUEUED, Hold.LIMIT)
        return job.state == State.SUCCEEDED

    wait_for(rescued, "the next job of the key to run after the rescue", every=0.02)
    lost.refresh_from_db()
    job = Job.objects.get(result_id=nxt.id)
    assert (lost.state, lost.failure_reason) == (State.FAILED, FailureReason.LOST)
    assert job.started_at >= lost.finished_at
    assert job.concurrency_slot == 1


def test_held_jobs_do_not_hold_up_other_jobs(runjobs):
    """A backlog of one key's jobs, held, ahead of other jobs in the queue."""
    backend.bulk_enqueue(one_per_customer, [((9, str(i), 0.0), {}) for i in range(200)])
    blocker = Job.objects.filter(concurrency_key__isnull=False).order_by("id").first()
    Job.objects.filter(pk=blocker.pk).update(run_after=blocker.run_after.replace(year=2999))
    others = backend.bulk_enqueue(unlimited, [((str(i), 0.0), {}) for i in range(5)])
    result = runjobs.run("--burst", timeout=120)  # ends once nothing is runnable
    assert result.returncode == 0, result.stdout
    assert Job.objects.filter(state=State.SUCCEEDED).count() == len(others)
    assert Job.objects.filter(hold=Hold.LIMIT, state=State.QUEUED).count() == 199


def test_a_burst_run_drains_a_key_one_job_after_another(runjobs):
    """Each finish hands the key's slot to the next job, which the finishing worker (or
    another) then claims: the burst does not end while the key has jobs."""
    backend.bulk_enqueue(one_per_customer, [((4, str(i), 0.0), {}) for i in range(5)])
    result = runjobs.run("--burst", "--concurrency", "2", timeout=120)
    assert result.returncode == 0, result.stdout
    assert Job.objects.filter(state=State.SUCCEEDED).count() == 5
    assert [name for _, _, name in sorted(runs()["one:4"])] == [str(i) for i in range(5)]
