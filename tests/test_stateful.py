"""Random sequences of every state write, against the real database, checked after each step.

A hypothesis state machine keeps its own model of the Job table (each attempt's state and
worker) and drives enqueue (of unique keys too), claim, succeed, fail, rescue (fail_running
and rescue_lost), retry, cancel (of queued, running and finished attempts) and prune, plus
stale writes that must lose. After every step it checks the invariants: every state is one
of four; at most one live attempt per logical task and per unique key; the attempts of a
task are 1..n but for the pruned ones; a terminal row never changes; a cancelled failure
had a request, and no attempt follows it but one retried by hand; and the table is what
the model expects.
"""

from __future__ import annotations

import inspect
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_jobstate.exceptions import JobAlreadyEnqueued, LostRace, WorkerLost
from django_jobstate.managers import CancelOutcome
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.states import (
    LIVE_STATES,
    TERMINAL_STATES,
    FailureReason,
    InvalidTransition,
    State,
)

WORKERS = ("w1", "w2", "w3")
MACHINE_SETTINGS = settings(
    max_examples=35,
    stateful_step_count=50,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the repository
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class Attempt:
    """The model's view of one row."""

    pk: int
    result_id: Any
    attempt: int
    max_attempts: int
    priority: int
    run_after: datetime
    state: State = State.QUEUED
    worker_id: str | None = None
    old: bool = False  # started "two hours ago" (see time_passes)
    key: str | None = None  # its unique key
    cancel_requested: bool = False
    cancelled: bool = False  # failed as cancelled


def prune_terminal(older_than: timedelta, states: list[str] | None) -> None:
    """Job.objects.prune() if it exists; else the terminal rows, by a plain delete."""
    method = getattr(Job.objects, "prune", None)
    if method is not None and "older_than" in inspect.signature(method).parameters:
        method(older_than=older_than, states=states)
        return
    live = Job.objects.live().values("result_id")
    doomed = Job.objects.terminal().exclude(result_id__in=live)
    (doomed if states is None else doomed.filter(state__in=states)).delete()


SEEN: Counter[str] = Counter()  # what the runs covered, checked at the end


def table() -> dict[int, dict[str, Any]]:
    return {row["id"]: row for row in Job.objects.values()}


# The same sequences every run (a random run under load once reached no succeeded row), from a
# seed whose runs reach every case the test asserts at its end: of seeds 1-13, three reach no
# cancel of a running attempt. A change of the rules changes the sequences: if the coverage
# check then fails, try the next seeds (a failure of an invariant is a bug, whatever the seed).
@seed(3)
class JobMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Job.objects.update(previous=None)
        Job.objects.all().delete()
        WorkerHeartbeat.objects.all().delete()
        self.rows: dict[int, Attempt] = {}
        self.gone: dict[Any, set[int]] = defaultdict(set)  # attempts pruned
        self.by_hand: set[int] = set()  # attempts the retry rule created
        self.terminal: dict[int, dict[str, Any]] = {}  # snapshot of each terminal row
        self.fresh: set[str] = set()  # workers that heartbeat since time last passed

    # Helpers

    def in_state(self, *states: State) -> list[Attempt]:
        return sorted((a for a in self.rows.values() if a.state in states), key=lambda a: a.pk)

    def add(self, job: Job) -> None:
        self.rows[job.pk] = Attempt(
            job.pk, job.result_id, job.attempt, job.max_attempts, job.priority, job.run_after
        )
        self.rows[job.pk].key = job.unique_key

    def key_holder(self, key: str | None, other_than: Any = None) -> Attempt | None:
        """The live row that holds unique key `key` (of a task other than `other_than`)."""
        return next(
            (
                a
                for a in self.rows.values()
                if key and a.key == key and a.state in LIVE_STATES and a.result_id != other_than
            ),
            None,
        )

    def live_attempt(self, result_id: Any) -> bool:
        return any(a.result_id == result_id and a.state in LIVE_STATES for a in self.rows.values())

    def exists(self, result_id: Any, attempt: int) -> bool:
        return any(a.result_id == result_id and a.attempt == attempt for a in self.rows.values())

    def record_failure(self, row: Attempt, job_next: Job | None) -> None:
        """Apply a fail(): the row failed, and its next attempt exists iff it may retry."""
        row.state = State.FAILED
        row.cancelled = row.cancel_requested  # whatever failed it: never retried then
        may_retry = row.attempt < row.max_attempts and not row.cancelled
        assert (job_next is not None) == may_retry
        if job_next is not None:
            assert (job_next.result_id, job_next.attempt) == (row.result_id, row.attempt + 1)
            self.add(job_next)

    def must_lose(self, write: Any) -> None:
        """`write` must raise LostRace (or write nothing) and leave the table as it was."""
        before = table()
        try:
            written = write()
        except LostRace:
            pass
        else:
            assert not written, f"a write that should have lost wrote {written!r}"
        assert table() == before

    # Rules

    @rule(
        max_attempts=st.integers(1, 3),
        due=st.booleans(),
        priority=st.sampled_from([0, 0, 5]),
    )
    def enqueue(self, max_attempts: int, due: bool, priority: int) -> None:
        run_after = timezone.now() + timedelta(hours=-1 if due else 1)
        job = Job.objects.enqueue(
            "tests.tasks.record",
            ["x"],
            max_attempts=max_attempts,
            priority=priority,
            run_after=run_after,
        )
        self.add(job)

    @rule(key=st.sampled_from(["k1", "k2"]), max_attempts=st.integers(1, 3), due=st.booleans())
    def enqueue_unique(self, key: str, max_attempts: int, due: bool) -> None:
        holder = self.key_holder(key)
        job = Job.objects.enqueue(
            "tests.tasks.record",
            ["x"],
            max_attempts=max_attempts,
            run_after=timezone.now() + timedelta(hours=-1 if due else 1),
            unique_key=key,
        )
        if holder is None:
            assert not job.deduplicated
            self.add(job)
        else:
            assert (job.deduplicated, job.pk) == (True, holder.pk)
            SEEN["deduplicated"] += 1

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), data=st.data())
    def claim(self, worker: str, limit: int, data: st.DataObject) -> None:
        def key(a: Any) -> tuple[int, datetime, int]:
            return (-a.priority, a.run_after, a.pk)

        # From the head, or from the key of any row, as a worker draining a backlog does.
        from_key = data.draw(st.sampled_from([None, *sorted(map(key, self.rows.values()))]))
        now = timezone.now()
        due = [a for a in self.in_state(State.QUEUED) if a.run_after <= now]
        due = sorted((a for a in due if from_key is None or key(a) >= from_key), key=key)
        won = Job.objects.claim(worker, limit=limit, from_key=from_key)
        assert [job.pk for job in won] == [a.pk for a in due[:limit]]
        for job in won:
            assert (job.state, job.worker_id) == (State.RUNNING, worker)
            self.rows[job.pk].state, self.rows[job.pk].worker_id = State.RUNNING, worker

    @precondition(lambda self: self.in_state(State.RUNNING))
    @rule(data=st.data())
    def succeed(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(self.in_state(State.RUNNING)))
        Job.objects.succeed(Job.objects.get(pk=row.pk), "done")
        row.state = State.SUCCEEDED

    @precondition(lambda self: self.in_state(State.RUNNING))
    @rule(worker=st.sampled_from(WORKERS))
    def succeed_many(self, worker: str) -> None:
        rows = [a for a in self.in_state(State.RUNNING) if a.worker_id == worker]
        jobs = [(Job.objects.get(pk=a.pk), a.pk) for a in rows]
        assert Job.objects.succeed_many(worker, jobs) == {a.pk for a in rows}
        for row in rows:
            row.state = State.SUCCEEDED

    @precondition(lambda self: self.in_state(State.RUNNING))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(self.in_state(State.RUNNING)))
        job = Job.objects.get(pk=row.pk)
        next_job = Job.objects.fail(job, FailureReason.ERROR, error_class="E", error_message="e")
        self.record_failure(row, next_job)

    @rule(worker=st.sampled_from(WORKERS))
    def fail_running(self, worker: str) -> None:
        """A supervisor whose worker process died fails its attempts as lost."""
        rows = [a for a in self.in_state(State.RUNNING) if a.worker_id == worker]
        error = WorkerLost("its worker process was killed by SIGKILL")
        assert Job.objects.fail_running(worker, FailureReason.LOST, error) == len(rows)
        self.sync_failures(rows)

    @rule(worker=st.sampled_from(WORKERS))
    def beat(self, worker: str) -> None:
        WorkerHeartbeat.objects.beat({worker: 1}, host="h", queues=None)
        self.fresh.add(worker)

    @rule()
    def time_passes(self) -> None:
        """Two hours pass: every running attempt and every heartbeat is two hours older."""
        two_hours = timedelta(hours=2)
        for job in Job.objects.running():
            Job.objects.filter(pk=job.pk).update(started_at=job.started_at - two_hours)
            self.rows[job.pk].old = True
        for beat in WorkerHeartbeat.objects.all():
            WorkerHeartbeat.objects.filter(pk=beat.pk).update(last_seen=beat.last_seen - two_hours)
        self.fresh.clear()

    @rule()
    def rescue_lost(self) -> None:
        rows = [a for a in self.in_state(State.RUNNING) if a.old and a.worker_id not in self.fresh]
        assert Job.objects.rescue_lost(lost_after=3600) == len(rows)
        self.sync_failures(rows)

    def sync_failures(self, rows: list[Attempt]) -> None:
        for row in rows:
            failed = Job.objects.get(pk=row.pk)
            reason = FailureReason.CANCELLED if row.cancel_requested else FailureReason.LOST
            assert (failed.state, failed.failure_reason) == (State.FAILED, reason)
            following = Job.objects.filter(result_id=row.result_id, attempt=row.attempt + 1)
            self.record_failure(row, following.first())

    @precondition(lambda self: self.in_state(State.FAILED))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(self.in_state(State.FAILED)))
        job = Job.objects.get(pk=row.pk)
        if self.live_attempt(row.result_id) or self.exists(row.result_id, row.attempt + 1):
            self.must_lose(lambda: Job.objects.retry(job))
            return
        if self.key_holder(row.key, other_than=row.result_id):
            before = table()
            with pytest.raises(JobAlreadyEnqueued):
                Job.objects.retry(job)
            assert table() == before
            SEEN["retry met a held key"] += 1
            return
        new = Job.objects.retry(job)  # by hand: a cancelled task too
        self.add(new)
        self.by_hand.add(new.pk)

    @precondition(lambda self: self.in_state(State.QUEUED))
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(self.in_state(State.QUEUED)))
        assert Job.objects.cancel(Job.objects.get(pk=row.pk)) == CancelOutcome.CANCELLED
        row.state, row.cancel_requested, row.cancelled = State.FAILED, True, True
        SEEN["cancelled queued"] += 1

    @precondition(lambda self: self.in_state(State.RUNNING))
    @rule(data=st.data())
    def cancel_running(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(self.in_state(State.RUNNING)))
        assert Job.objects.cancel(Job.objects.get(pk=row.pk)) == CancelOutcome.REQUESTED
        row.cancel_requested = True
        SEEN["cancel requested"] += 1
        if data.draw(st.booleans(), label="the task then stops and its worker fails it"):
            job = Job.objects.get(pk=row.pk)
            self.record_failure(row, Job.objects.fail(job, FailureReason.ERROR))

    @precondition(lambda self: self.in_state(*TERMINAL_STATES))
    @rule(data=st.data())
    def cancel_finished(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(self.in_state(*TERMINAL_STATES)))
        before = table()
        assert Job.objects.cancel(Job.objects.get(pk=row.pk)) == CancelOutcome.FINISHED
        assert table() == before

    @rule(states=st.sampled_from([None, [State.SUCCEEDED], [State.FAILED]]))
    def prune(self, states: list[str] | None) -> None:
        allowed = set(TERMINAL_STATES if states is None else states)
        tasks = defaultdict(list)
        for a in sorted(self.rows.values(), key=lambda a: a.attempt):
            tasks[a.result_id].append(a)
        # Whole tasks, by their final outcome: never part of one, never one still live.
        prunable = [
            {a.pk for a in attempts}
            for result_id, attempts in tasks.items()
            if attempts[-1].state in allowed and not self.live_attempt(result_id)
        ]
        prune_terminal(timedelta(0), states)
        remaining = set(Job.objects.values_list("pk", flat=True))
        deleted = set(self.rows) - remaining
        assert deleted <= set().union(*prunable), "prune deleted an attempt of a live task"
        assert all(task <= deleted or not task & deleted for task in prunable), (
            "prune deleted part of a task"
        )
        for pk in deleted:
            row = self.rows.pop(pk)
            self.gone[row.result_id].add(row.attempt)
            self.terminal.pop(pk)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS), how=st.sampled_from(["succeed", "fail"]))
    def stale_write(self, data: st.DataObject, worker: str, how: str) -> None:
        """A writer whose view is stale (it believes the row runs for `worker`) must lose."""
        row = data.draw(st.sampled_from(sorted(self.rows.values(), key=lambda a: a.pk)))
        if (row.state, row.worker_id) == (State.RUNNING, worker):
            worker = next(w for w in WORKERS if w != worker)  # owned by someone else
        stale = Job.objects.get(pk=row.pk)
        stale.state, stale.worker_id = State.RUNNING, worker
        if how == "succeed":
            self.must_lose(lambda: Job.objects.succeed(stale, "late"))
            self.must_lose(lambda: Job.objects.succeed_many(worker, [(stale, "late")]))
        else:
            self.must_lose(lambda: Job.objects.fail(stale, FailureReason.ERROR))

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), believed=st.sampled_from(sorted(TERMINAL_STATES)))
    def move_out_of_a_terminal_state(self, data: st.DataObject, believed: State) -> None:
        """A writer that believes a row terminal is refused before it writes anything."""
        row = data.draw(st.sampled_from(sorted(self.rows.values(), key=lambda a: a.pk)))
        stale = Job.objects.get(pk=row.pk)
        stale.state = believed
        before = table()
        with pytest.raises(InvalidTransition):
            Job.objects.succeed(stale, "again")
        with pytest.raises(InvalidTransition):
            Job.objects.fail(stale, FailureReason.ERROR)
        assert table() == before

    # Invariants: one read of the table per step, every check made on that snapshot (a
    # query per check cost two thirds of this test's time, for the same rows).

    @invariant()
    def the_table_keeps_every_invariant(self) -> None:
        rows = table()
        self.states_are_the_four(rows)
        self.at_most_one_live_row_per(rows, "result_id")  # one live attempt per task
        self.at_most_one_live_row_per(rows, "unique_key")
        self.attempts_are_numbered_without_gaps(rows)
        self.terminal_rows_never_change(rows)
        self.a_cancelled_failure_had_a_request_and_no_automatic_retry(rows)
        self.the_table_is_what_the_model_expects(rows)

    def states_are_the_four(self, rows: dict[int, dict[str, Any]]) -> None:
        assert {row["state"] for row in rows.values()} <= set(State.values)

    def at_most_one_live_row_per(self, rows: dict[int, dict[str, Any]], column: str) -> None:
        live = Counter(
            row[column]
            for row in rows.values()
            if row["state"] in LIVE_STATES and row[column] is not None
        )
        assert not [value for value, n in live.items() if n > 1], (column, live)

    def attempts_are_numbered_without_gaps(self, rows: dict[int, dict[str, Any]]) -> None:
        numbers: dict[Any, set[int]] = defaultdict(set)
        for row in rows.values():
            numbers[row["result_id"]].add(row["attempt"])
        for result_id, present in numbers.items():
            seen = present | self.gone[result_id]
            assert seen == set(range(1, max(seen) + 1)), (result_id, present, seen)

    def terminal_rows_never_change(self, rows: dict[int, dict[str, Any]]) -> None:
        for pk, row in rows.items():
            if row["state"] not in TERMINAL_STATES:
                continue
            before = self.terminal.setdefault(pk, row)
            if before["previous_id"] is not None and before["previous_id"] not in rows:
                before = {**before, "previous_id": None}  # prune unlinks a deleted previous
            assert row == before, f"terminal row {pk} changed"
        assert set(self.terminal) <= set(rows), "a terminal row vanished without a prune"

    def a_cancelled_failure_had_a_request_and_no_automatic_retry(
        self, rows: dict[int, dict[str, Any]]
    ) -> None:
        for row in rows.values():
            if row["failure_reason"] == FailureReason.CANCELLED:
                assert row["cancel_requested_at"] is not None
                following = [r for r in rows.values() if r["previous_id"] == row["id"]]
                assert all(r["id"] in self.by_hand for r in following), row["id"]
                if row["worker_id"] is None:
                    SEEN["cancelled, never started"] += 1

    def the_table_is_what_the_model_expects(self, rows: dict[int, dict[str, Any]]) -> None:
        def cancelled(r: dict[str, Any]) -> bool:
            return r["failure_reason"] == FailureReason.CANCELLED

        actual = {
            pk: (
                r["state"],
                r["worker_id"],
                r["attempt"],
                cancelled(r),
                bool(r["cancel_requested_at"]),
            )
            for pk, r in rows.items()
        }
        expected = {
            pk: (a.state, a.worker_id, a.attempt, a.cancelled, a.cancel_requested)
            for pk, a in self.rows.items()
        }
        assert actual == expected
        SEEN["steps"] += 1
        SEEN.update(f"state {state}" for state, *_ in actual.values())
        SEEN.update("retried" for _, _, attempt, *_ in actual.values() if attempt > 1)
        SEEN.update("cancelled while running" for s, w, _, c, _ in actual.values() if c and w)
        SEEN.update("gone" for attempts in self.gone.values() if attempts)


@pytest.mark.django_db(transaction=True)
def test_random_sequences_of_state_writes_keep_every_invariant():
    SEEN.clear()
    run_state_machine_as_test(JobMachine, settings=MACHINE_SETTINGS)

    # The runs were not vacuous: they reached every state, retries, prunes and cancels.
    print("SEEN", SEEN)
    assert SEEN["steps"] >= 200, SEEN
    assert all(SEEN[f"state {state}"] for state in State.values), SEEN
    assert SEEN["retried"], SEEN
    assert SEEN["gone"], SEEN
    assert SEEN["deduplicated"], SEEN
    assert SEEN["cancelled, never started"], SEEN
    assert SEEN["cancelled while running"], SEEN  # requested, then failed by any writer
