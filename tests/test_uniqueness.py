"""Unique jobs: at most one live job per key, held by the database, under races and retries."""

import logging
import threading
import time
from contextlib import nullcontext

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count, F

import tests.tasks
from django_jobstate.backend import JobStateBackend
from django_jobstate.exceptions import InvalidPayload, JobAlreadyEnqueued, LostRace
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import InvalidTask, TaskResultStatus, task, task_enqueued
from django_jobstate.uniqueness import unique_key
from tests.conftest import run_racers
from tests.models import Execution
from tests.tasks import (
    record,
    sync_account,
    unique_always_fails,
    unique_or_raise,
    unique_queued_always_fails,
    unique_record,
    unique_with_context,
)

backend = JobStateBackend("default", {})


def live_per_key(scope: str = "live") -> dict[str, int]:
    """Rows per key that hold it: live ones, or for scope "queued", queued ones."""
    holding = {"finished_at": None} if scope == "live" else {"state": State.QUEUED}
    rows = (
        Job.objects.filter(unique_key__isnull=False, **holding)
        .values("unique_key")
        .annotate(n=Count("id"))
    )
    return {row["unique_key"]: row["n"] for row in rows}


def claim_one() -> Job:
    [job] = Job.objects.claim("w")
    return job


# The key


def test_the_key_binds_the_call_with_its_defaults():
    key = unique_key(sync_account, [1], {})
    assert unique_key(sync_account, [], {"account_id": 1}) == key
    assert unique_key(sync_account, [1, "other reason"], {}) == key  # not a key parameter
    assert unique_key(sync_account, [2], {}) != key
    same = unique_key(unique_record, ["a"], {})
    assert unique_key(unique_record, ["a", 1], {}) == same
    assert unique_key(unique_record, [], {"label": "a", "times": 1}) == same
    assert unique_key(unique_record, ["a", 2], {}) != same
    assert unique_key(unique_record, ["a", 1.0], {}) != same  # JSON: 1 and 1.0 differ


def test_a_task_is_part_of_the_key_and_an_explicit_key_is_apart():
    assert unique_key(unique_record, ["1"], {}) != unique_key(unique_or_raise, ["1"], {})
    explicit = unique_record.using(unique_key="site:1")
    assert unique_key(explicit, ["x"], {}) == unique_key(explicit, ["y"], {})
    assert unique_key(explicit, ["x"], {}) != unique_key(unique_record, ["x"], {})


def test_the_context_is_not_part_of_the_key():
    assert len(unique_key(unique_with_context, ["a"], {})) == 64


def test_arguments_that_are_not_json_say_so_as_for_any_task():
    with pytest.raises(InvalidPayload, match="Task arguments must be JSON"):
        unique_record.enqueue(object())
    # What JSON takes as it reads back: bytes as text, tuples as lists.
    assert unique_key(unique_record, [b"a"], {}) == unique_key(unique_record, ["a"], {})
    assert unique_key(sync_account, [(1, 2)], {}) == unique_key(sync_account, [[1, 2]], {})


def test_arguments_that_do_not_bind_say_so():
    with pytest.raises(TypeError, match=r"arguments do not match sync_account\(\)"):
        unique_key(sync_account, [], {"nope": 1})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique": ["account", "reason"]}, r"names 'account', which is not a parameter"),
        ({"unique": "account_id"}, "must be True, False or a list"),
        ({"unique": []}, "names no parameter"),
        ({"unique": True, "unique_scope": "running"}, "unique_scope .* must be one of live"),
        ({"unique": True, "on_duplicate": "ignore"}, "on_duplicate .* must be one of return"),
    ],
)
def test_bad_options_are_refused_at_import(options, message):
    with pytest.raises(InvalidTask, match=message):
        task(**options)(plain_sync)


def plain_sync(account_id: int, reason: str = "") -> None:
    """Made a task only by the test above (a task function must be at module level)."""


def test_an_empty_explicit_key_is_refused():
    with pytest.raises(InvalidTask, match=r"unique_key .* must be a non-empty string"):
        unique_record.using(unique_key="")


# Enqueue


@pytest.mark.django_db
def test_a_duplicate_returns_the_live_task_and_writes_nothing():
    sent = []
    task_enqueued.connect(receiver := lambda task_result, **_: sent.append(task_result.id))
    try:
        first = sync_account.enqueue(42)
        again = sync_account.enqueue(account_id=42, reason="webhook")
        other = sync_account.enqueue(43)
    finally:
        task_enqueued.disconnect(receiver)
    assert again.id == first.id
    assert other.id != first.id
    assert sent == [first.id, other.id]
    assert Job.objects.count() == 2
    record.enqueue("x")
    assert Job.objects.get(task_path="tests.tasks.record").unique_key is None


@pytest.mark.django_db
def test_a_duplicate_of_a_running_task_returns_it_with_its_attempts():
    first = unique_record.enqueue("a")
    claim_one()
    again = unique_record.enqueue("a")
    assert (again.id, again.status) == (first.id, TaskResultStatus.RUNNING)
    assert again.worker_ids == ["w"]


@pytest.mark.django_db
def test_on_duplicate_raise_names_the_live_task():
    first = unique_or_raise.enqueue("a")
    with pytest.raises(JobAlreadyEnqueued, match=first.id) as caught:
        unique_or_raise.enqueue("a")
    assert caught.value.result_id == first.id
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_a_finished_task_frees_its_key():
    first = unique_record.enqueue("a")
    Worker(burst=True).run()
    second = unique_record.enqueue("a")
    assert second.id != first.id
    assert Job.objects.filter(state=State.QUEUED).get().result_id.hex == second.id.replace("-", "")


@pytest.mark.django_db
def test_bulk_enqueue_collapses_duplicates_within_the_call_and_with_live_tasks():
    held = unique_record.enqueue("held")
    calls = [(["new"], {}), (["held"], {}), ([], {"label": "new"}), (["other"], {})]
    results = backend.bulk_enqueue(unique_record, calls)
    assert results[1].id == held.id
    assert results[0].id == results[2].id != results[3].id
    assert sorted(Job.objects.values_list("args", flat=True)) == [["held"], ["new"], ["other"]]


@pytest.mark.django_db
def test_bulk_enqueue_with_raise_writes_nothing_on_a_duplicate():
    held = unique_or_raise.enqueue("held")
    with pytest.raises(JobAlreadyEnqueued, match=held.id):
        backend.bulk_enqueue(unique_or_raise, [(["new"], {}), (["held"], {})])
    with pytest.raises(JobAlreadyEnqueued, match="another call of this bulk_enqueue"):
        backend.bulk_enqueue(unique_or_raise, [(["x"], {}), (["x"], {})])
    assert list(Job.objects.values_list("args", flat=True)) == [["held"]]


@pytest.mark.django_db
def test_an_explicit_key_is_per_call():
    first = record.using(unique_key="report:7").enqueue("a")
    assert record.using(unique_key="report:7").enqueue("b").id == first.id
    assert record.using(unique_key="report:8").enqueue("a").id != first.id
    assert record.enqueue("a").id != first.id  # not unique without a key


@pytest.mark.django_db
def test_scope_queued_lets_one_run_while_one_waits():
    first = unique_queued_always_fails.enqueue("a")
    assert unique_queued_always_fails.enqueue("a").id == first.id
    claim_one()
    second = unique_queued_always_fails.enqueue("a")
    assert second.id != first.id
    assert unique_queued_always_fails.enqueue("a").id == second.id


# Retries keep the key


@pytest.mark.django_db
def test_a_retry_keeps_the_key_and_holds_it():
    first = unique_always_fails.enqueue("a")
    job = claim_one()
    retry = Job.objects.fail(job, FailureReason.ERROR)
    assert retry is not None
    assert (retry.unique_key, retry.unique_scope) == (job.unique_key, "live")
    assert unique_always_fails.enqueue("a").id == first.id  # the retry holds it


@pytest.mark.django_db
def test_a_queued_scope_retry_superseded_by_a_newer_duplicate_is_logged(caplog):
    first = unique_queued_always_fails.enqueue("a")
    job = claim_one()
    newer = unique_queued_always_fails.enqueue("a")
    with caplog.at_level(logging.WARNING, logger="django_jobstate"):
        assert Job.objects.fail(job, FailureReason.ERROR) is None
    assert "supersedes the retry" in caplog.text
    assert newer.id in caplog.text
    assert backend.get_result(first.id).status == TaskResultStatus.FAILED
    assert Job.objects.filter(state=State.QUEUED).get().result_id.hex == newer.id.replace("-", "")


@pytest.mark.django_db
def test_a_retry_by_hand_of_a_key_held_by_another_task_raises():
    unique_record.enqueue("a")
    job = claim_one()
    Job.objects.fail(job, FailureReason.ERROR)  # one attempt: no retry
    newer = unique_record.enqueue("a")
    with pytest.raises(JobAlreadyEnqueued, match=newer.id):
        Job.objects.retry(job)
    # A retry that lost to another retry is still a lost race, not a duplicate.
    job = claim_one()
    Job.objects.fail(job, FailureReason.ERROR)
    Job.objects.retry(job)
    with pytest.raises(LostRace):
        Job.objects.retry(job)


@pytest.mark.django_db
def test_a_worker_drains_a_failing_unique_task_through_all_its_attempts():
    unique_always_fails.enqueue("a")
    Worker(burst=True).run()
    assert list(Job.objects.values_list("state", flat=True).distinct()) == [State.FAILED]
    assert Job.objects.count() == 5 == Execution.objects.count()


# The database holds it, whatever the app does


@pytest.mark.django_db
@pytest.mark.parametrize("scope", ["live", "queued"])
def test_the_database_refuses_a_second_holder(scope):
    unique_record.using(unique_key="k").enqueue("a")
    Job.objects.update(unique_scope=scope)
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_raw(Job.objects.get().unique_key, scope)


@pytest.mark.django_db
def test_the_database_refuses_a_key_without_a_scope():
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_raw("0" * 64, None)


def insert_raw(key: str, scope: str | None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_jobstate_job (result_id, attempt, task_path, args, kwargs, "
            "backend, queue_name, priority, run_after, max_attempts, backoff, state, "
            "enqueued_at, failure_reason, error_class, error_message, traceback, unique_key, "
            "unique_scope) VALUES (%s, 1, 'tests.tasks.record', '[]', '{}', 'default', "
            "'default', 0, %s, 1, 0, 'queued', %s, '', '', '', '', %s, %s)",
            ["0" * 32, "2026-01-01 00:00:00", "2026-01-01 00:00:00", key, scope],
        )


# Transactions


def enqueue_in_a_transaction(then: str, holding: threading.Event, release: threading.Event):
    try:
        with transaction.atomic():
            unique_record.enqueue("tx")
            holding.set()
            release.wait(30)
            if then == "rollback":
                transaction.set_rollback(True)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("then", ["commit", "rollback"])
def test_an_enqueue_waits_for_an_uncommitted_holder(then):
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=enqueue_in_a_transaction, args=(then, holding, release))
    holder.start()
    assert holding.wait(30)
    got: list[str] = []

    def enqueue() -> None:
        try:
            got.append(unique_record.enqueue("tx").id)
        finally:
            connection.close()

    waiter = threading.Thread(target=enqueue)
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive(), "the second enqueue did not wait for the first's transaction"
    release.set()
    holder.join(30)
    waiter.join(30)
    [job] = Job.objects.all()
    assert got == [str(job.result_id)]
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_repeatable_read_says_what_to_do():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serializes writers: no snapshot can miss a holder")
    # PostgreSQL refuses the write; MariaDB/MySQL find the holder by a locking read, which
    # reads the latest rows whatever the snapshot.
    refused = connection.vendor == "postgresql"
    with (
        pytest.raises(OperationalError, match="Retry the whole transaction")
        if refused
        else nullcontext(),
        transaction.atomic(),
    ):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        Job.objects.exists()  # the snapshot is taken here
        other = threading.Thread(target=enqueue_and_close)
        other.start()
        other.join(30)
        unique_record.enqueue("rr")
    assert Job.objects.count() == 1


def state_seen_elsewhere(job: Job) -> tuple[str, str | None]:
    """The job's state and finish time as another connection sees it (the test's own may
    be in a transaction, with SQLite's snapshot)."""
    seen: list[tuple[str, str | None]] = []

    def read() -> None:
        try:
            row = Job.objects.get(pk=job.pk)
            seen.append((row.state, row.finished_at))
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(30)
    return seen[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bulk", [False, True])
def test_a_duplicate_locks_nothing_while_its_transaction_lasts(runjobs, bulk):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks; a transaction holds the write lock from BEGIN")
    if connection.vendor == "mysql":
        pytest.skip("InnoDB's duplicate-key check locks the holder until the transaction ends")
    labels = ["busy", "busy too"] if bulk else ["busy"]
    held = [unique_record.enqueue(label) for label in labels]
    holders = list(Job.objects.order_by("pk"))
    with transaction.atomic():
        if bulk:
            got = backend.bulk_enqueue(unique_record, [([label], {}) for label in labels])
        else:
            got = [unique_record.enqueue(labels[0])]
        assert [r.id for r in got] == [r.id for r in held]
        # While the enqueuer's transaction lasts, a worker claims the holders, runs them
        # and writes their outcomes: nothing waits for this transaction.
        done = runjobs.run("--burst", timeout=120)
        assert done.returncode == 0, done.stdout
        for holder in holders:
            assert state_seen_elsewhere(holder)[0] == State.SUCCEEDED, done.stdout
    assert Job.objects.count() == len(labels)


@pytest.mark.django_db
def test_past_its_rounds_a_duplicate_takes_the_holder_from_the_insert(monkeypatch):
    # Only a key whose holders finish between every INSERT and read gets there.
    monkeypatch.setattr("django_jobstate.managers.unique.UNIQUE_ROUNDS", 1)
    held = unique_record.enqueue("held")
    assert unique_record.enqueue("held").id == held.id
    got = backend.bulk_enqueue(unique_record, [(["new"], {}), (["held"], {})])
    assert got[1].id == held.id != got[0].id
    assert Job.objects.count() == 2


def enqueue_and_close() -> None:
    try:
        unique_record.enqueue("rr")
    finally:
        connection.close()


# Races between real processes


class Sampler(threading.Thread):
    """Counts the live rows per key every 50 ms, in its own connection."""

    def __init__(self, scope: str = "live") -> None:
        super().__init__()
        self.scope = scope
        self.stop = threading.Event()
        self.samples = 0
        self.worst: dict[str, int] = {}

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for key, n in live_per_key(self.scope).items():
                    if n > 1:
                        self.worst[key] = n
                self.samples += 1
                time.sleep(0.05)  # more often took the CPU the racers race with
        finally:
            connection.close()

    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(30)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_racing_enqueuers_get_one_live_row_per_key(runjobs):
    worker = runjobs.start("--concurrency", "2", "-v", "0")  # holders finish meanwhile
    with Sampler() as sampler:
        outputs = run_racers([["enqueue-unique", "unique_record", "200", "20"]] * 8)
    runjobs.stop(worker)
    assert sampler.samples > 10
    assert sampler.worst == {}
    assert all(n == 1 for n in live_per_key().values())
    rows = {str(r): label for r, label in Job.objects.values_list("result_id", "args__0")}
    inserted = [result_id for out in outputs for result_id in out["inserted"]]
    assert sorted(inserted) == sorted(rows), "a row without its task_enqueued, or the reverse"
    # Every caller got a task of its key that exists: the holder, or one that finished.
    for out in outputs:
        for label, result_id in out["got"]:
            assert rows[result_id] == label
    assert len(rows) < 8 * 200  # duplicates were returned, not written


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("failing", "scope"),
    [("unique_always_fails", "live"), ("unique_queued_always_fails", "queued")],
)
def test_retries_never_collide_with_racing_enqueuers(runjobs, failing, scope):
    worker = runjobs.start("--concurrency", "4")
    # Race only once the workers run: before that every enqueue meets a waiting holder.
    getattr(tests.tasks, failing).enqueue("warm")
    deadline = time.monotonic() + 60
    while not Execution.objects.exists():
        assert time.monotonic() < deadline, f"no worker started; see {worker.log}"
        time.sleep(0.05)
    with Sampler(scope) as sampler:
        # A supersede needs an enqueue to land while its key's attempt runs, then that
        # attempt to fail: on a loaded machine one round of racers may see none.
        for _round in range(4):
            run_racers([["enqueue-unique", failing, "200", "5"]] * 4)
            deadline = time.monotonic() + 60
            while Job.objects.filter(finished_at=None).exists():
                if time.monotonic() > deadline:
                    left = list(Job.objects.filter(finished_at=None).values("pk", "state"))
                    pytest.fail(f"jobs left live: {left[:5]}; see {worker.log}")
                time.sleep(0.1)
            if scope == "live" or "supersedes the retry" in runjobs.output(worker):
                break
    log = runjobs.stop(worker)
    assert sampler.samples > 10
    assert sampler.worst == {}
    assert "IntegrityError" not in log
    assert (
        Execution.objects.count()
        == Job.objects.exclude(failure_reason=FailureReason.RELEASED).count()
    )
    failed = Job.objects.filter(failure_reason=FailureReason.ERROR)
    # Failed attempts that had another one coming, but have no next attempt.
    cut_short = (
        Job.objects.filter(state=State.FAILED)
        .exclude(failure_reason=FailureReason.ERROR, attempt__gte=F("max_attempts"))
        .exclude(pk__in=Job.objects.filter(previous__isnull=False).values("previous"))
    )
    if scope == "live":
        # Every task ran all five attempts: a retry never met a duplicate.
        ran = failed.values("result_id").annotate(n=Count("id"))
        assert {row["n"] for row in ran} == {5}
        assert not cut_short.exists()
    else:
        # A retry that met a newer waiting duplicate gave way to it, and said so.
        superseded = log.count("supersedes the retry")
        assert superseded == cut_short.count() > 0
