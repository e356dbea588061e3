"""Hostile input: payloads that are not JSON, rows written behind the app's back, skewed clocks.

What the database can refuse, it refuses (IntegrityError); what it cannot, fails that
attempt with a clear error and runs no code; a bad payload is a clear error at enqueue()
and writes no row.
"""

import math
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_jobstate.db.clock import Now
from django_jobstate.exceptions import InvalidPayload
from django_jobstate.models import Job, WorkerHeartbeat
from django_jobstate.runner.worker import Worker
from django_jobstate.states import FailureReason, State
from django_jobstate.tasksapi import InvalidTask, default_task_backend
from tests import tasks
from tests.factories import JobFactory
from tests.framework import IMPORT_TASK, INVALID_TASK
from tests.models import Execution

pytestmark = pytest.mark.django_db

POSTGRES = settings.DB == "postgres"
LIMIT = 1_000_000  # JOBSTATE_MAX_PAYLOAD_BYTES, its default
# For tests that run a Worker in this process: its watchdog thread heartbeats on a
# connection of its own, which would wait for the locks of an open test transaction.
RUNS_A_WORKER = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> list:
    outer = inner = []
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def circular() -> list:
    loop: list = []
    loop.append(loop)
    return loop


class Opaque:
    pass


# Enqueue: arguments that are not JSON


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ([datetime(2024, 1, 1, tzinfo=UTC)], {}, "Object of type datetime is not JSON"),
        ([{1, 2}], {}, "Object of type set is not JSON"),
        ([Opaque()], {}, "Object of type Opaque is not JSON"),
        ([Decimal("1.5")], {}, "Object of type Decimal is not JSON"),
        ([b"\xff not UTF-8"], {}, "Object of type bytes is not JSON"),  # UTF-8 is taken
        ([math.nan], {}, "Out of range float values are not JSON compliant"),
        ([math.inf], {}, "Out of range float values are not JSON compliant"),
        ([{(1, 2): "tuple key"}], {}, "keys must be str, int, float, bool or None"),
        ([circular()], {}, "Circular reference detected"),
        ([], {"when": datetime(2024, 1, 1, tzinfo=UTC)}, "Object of type datetime"),
        ([], {"nan": -math.inf}, "Out of range float values"),
    ],
    ids=[
        "datetime",
        "set",
        "object",
        "decimal",
        "bytes",
        "nan",
        "inf",
        "tuple-key",
        "circular",
        "kwarg-datetime",
        "kwarg-inf",
    ],
)
def test_arguments_that_are_not_json_are_refused_and_write_no_row(args, kwargs, message):
    with pytest.raises(InvalidPayload, match="must be JSON") as refused:
        tasks.record.enqueue(*args, **kwargs)

    assert message in str(refused.value)
    assert "pass a datetime as an ISO string" in str(refused.value)
    assert not Job.objects.exists()


def test_a_10_mb_argument_is_past_the_documented_limit_and_writes_no_row():
    with pytest.raises(InvalidPayload) as refused:
        tasks.record.enqueue("x" * 10_000_000)

    assert f"more than JOBSTATE_MAX_PAYLOAD_BYTES ({LIMIT:,})" in str(refused.value)
    assert not Job.objects.exists()
    tasks.record.enqueue("x" * (LIMIT - 100))  # just under the limit is fine
    assert Job.objects.count() == 1


def test_a_refused_enqueue_leaves_the_callers_transaction_usable():
    with transaction.atomic():
        kept = tasks.record.enqueue("kept")
        with pytest.raises(InvalidPayload):
            tasks.record.enqueue({1, 2})
        also_kept = tasks.record.enqueue("also kept")

    assert set(Job.objects.values_list("result_id", flat=True)) == {
        uuid.UUID(kept.id),
        uuid.UUID(also_kept.id),
    }


def test_deeply_nested_arguments_are_refused_and_write_no_row():
    try:
        tasks.record.enqueue(nested(1_500))
    except Exception as exc:  # not pytest.raises: a RecursionError's report takes seconds
        raised = type(exc).__name__
    else:
        raised = None

    assert (raised, Job.objects.count()) == ("InvalidPayload", 0)


def test_arguments_and_results_nested_as_deep_as_every_database_stores_and_no_deeper():
    # 31 levels: MariaDB's JSON_VALID check refused 32 to 100 with an IntegrityError that
    # named a constraint, where every other database took them (the limit was 100).
    # The list of arguments, and the dict of keyword arguments, is the first level.
    kept = tasks.record.enqueue(nested(30))
    assert Job.objects.get(result_id=kept.id).args == [nested(30)]
    for where, call in [
        ("Task arguments", lambda: tasks.record.enqueue(nested(31))),
        ("Task keyword arguments", lambda: tasks.record.enqueue(label=nested(31))),
    ]:
        with pytest.raises(InvalidPayload, match=f"{where} are nested more than 31 levels"):
            call()
    assert Job.objects.count() == 1


@RUNS_A_WORKER
def test_a_return_value_nested_too_deep_fails_only_that_attempt():
    deep = tasks.returns_nested.enqueue(32)
    fine = tasks.returns_nested.enqueue(31)

    Worker(burst=True).run()  # must not raise

    failed = Job.objects.get(result_id=deep.id)
    assert (failed.state, failed.error_class) == (
        State.FAILED,
        "django_jobstate.exceptions.InvalidPayload",
    )
    assert "nested more than 31 levels" in failed.error_message
    assert Job.objects.get(result_id=fine.id).return_value == nested(31)


@pytest.mark.skipif(
    settings.DB == "mysql",
    reason="MariaDB/MySQL cannot store JSON this deep (MariaDB's JSON_VALID check refuses 32 "
    "levels, MySQL's JSON type 100): no such row can be written behind the app's back",
)
@RUNS_A_WORKER  # it crashed the worker; fixed in a2a569a
def test_a_row_with_deeply_nested_arguments_fails_without_crashing_the_worker():
    job = JobFactory(args=["placeholder"])
    # Deeper than Python's json reads (3.12: 1,500 levels; 3.13: 10,000), as deep as the
    # database stores (SQLite: 2,000; PostgreSQL: about 12,000). As text: json.dumps cannot
    # write it either; raw SQL, or another language, can.
    deep = 12_000 if POSTGRES else 1_501
    raw_update(job.pk, args=Raw("[" * deep + "]" * deep))
    after = JobFactory(args=["after"])

    try:
        Worker(burst=True).run()
    except Exception as exc:  # not pytest.raises: a RecursionError's report takes seconds
        raised = type(exc).__name__
    else:
        raised = None

    state, why = Job.objects.filter(pk=job.pk).values_list("state", "traceback").get()  # not args
    assert (raised, state) == (None, State.FAILED)
    # Where json reads it, Django's normalize_json (to_task_result) is what refuses it.
    assert "args is nested too deeply to decode" in why or "RecursionError" in why
    assert list(Execution.objects.values_list("label", flat=True)) == [after.args[0]]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("nul\x00", id="nul"),
        pytest.param("lone surrogate \ud800", id="surrogate"),
    ],
)
def test_text_is_stored_as_given_or_refused_with_invalid_payload(text):
    with transaction.atomic():
        try:
            result = tasks.record.enqueue(text)
        except InvalidPayload:
            refused = True
        else:
            refused = False
        Job.objects.count()  # the caller's transaction is still usable

    if refused:
        assert not Job.objects.exists()
    else:
        assert Job.objects.get(result_id=result.id).args == [text]


# Return values


@RUNS_A_WORKER
def test_a_return_value_past_the_limit_fails_the_attempt_and_the_worker_goes_on():
    big = tasks.returns_large.enqueue(LIMIT + 10)
    small = tasks.returns_large.enqueue(3)

    Worker(burst=True).run()

    failed = Job.objects.get(result_id=big.id)
    assert (failed.state, failed.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert failed.error_class == "django_jobstate.exceptions.InvalidPayload"
    assert "JOBSTATE_MAX_PAYLOAD_BYTES" in failed.error_message
    assert failed.return_value is None
    assert Job.objects.get(result_id=small.id).return_value == "xxx"


@RUNS_A_WORKER
def test_a_return_value_the_database_cannot_store_fails_only_that_attempt():
    nul = tasks.returns_nul.enqueue()
    after = tasks.record.enqueue("after")

    Worker(burst=True).run()  # must not raise

    job = Job.objects.get(result_id=nul.id)
    assert job.state in (State.SUCCEEDED, State.FAILED)
    if job.state == State.FAILED:
        assert job.error_class == "django_jobstate.exceptions.InvalidPayload"
    else:
        assert job.return_value == "nul\x00"
    assert Job.objects.get(result_id=after.id).state == State.SUCCEEDED


# Rows written behind the app's back


def raw_insert(**values: object) -> None:
    """INSERT a job row with raw SQL: the app's checks do not run, the database's do."""
    now = timezone.now()
    row = {
        "result_id": uuid.uuid4(),
        "attempt": 1,
        "task_path": "tests.tasks.record",
        "args": ["raw"],
        "kwargs": {},
        "backend": "default",
        "queue_name": "default",
        "priority": 0,
        "run_after": now,
        "max_attempts": 1,
        "backoff": 0.0,
        "timeout": None,
        "state": State.QUEUED.value,
        "enqueued_at": now,
        "started_at": None,
        "finished_at": None,
        "worker_id": None,
        "return_value": None,
        "failure_reason": "",
        "error_class": "",
        "error_message": "",
        "traceback": "",
        **values,
    }
    fields = [Job._meta.get_field(name) for name in row]
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {qn(Job._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))})",
            [f.get_db_prep_save(v, connection) for f, v in zip(fields, row.values(), strict=True)],
        )


@dataclass
class Raw:
    """A parameter passed to the database as it is."""

    value: object


def json_null() -> Raw:
    """JSON's null (not SQL's NULL), as a parameter for a jsonb or a text column."""
    if POSTGRES:
        from psycopg.types.json import Jsonb

        return Raw(Jsonb(None))
    return Raw("null")


def raw_update(pk: int, **values: object) -> None:
    qn = connection.ops.quote_name
    fields = [Job._meta.get_field(name) for name in values]
    params = [
        v.value if isinstance(v, Raw) else f.get_db_prep_save(v, connection)
        for f, v in zip(fields, values.values(), strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(Job._meta.db_table)} SET "
            f"{', '.join(f'{qn(f.column)} = %s' for f in fields)} WHERE {qn('id')} = %s",
            [*params, pk],
        )


def started(**values: object) -> dict[str, object]:
    now = timezone.now()
    return {"worker_id": "w1", "started_at": now - timedelta(seconds=1), **values}


def finished(**values: object) -> dict[str, object]:
    return started(finished_at=timezone.now(), **values)


FAILED = {"state": State.FAILED.value, "failure_reason": FailureReason.ERROR.value}


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"state": "paused"}, id="state-outside-the-four"),
        pytest.param({"state": "QUEUED"}, id="state-wrong-case"),
        pytest.param({"state": ""}, id="state-empty"),
        pytest.param(started(state=State.SUCCEEDED.value), id="succeeded-without-finished_at"),
        pytest.param(started(**FAILED), id="failed-without-finished_at"),
        pytest.param(finished(state=State.FAILED.value), id="failed-without-reason"),
        pytest.param(finished(**{**FAILED, "failure_reason": "oops"}), id="unknown-failure-reason"),
        pytest.param(finished(state=State.SUCCEEDED.value, worker_id=None), id="no-worker"),
        pytest.param({"state": State.RUNNING.value, "worker_id": "w1"}, id="running-unstarted"),
        pytest.param(started(state=State.RUNNING.value, worker_id=None), id="running-no-worker"),
        pytest.param(finished(state=State.RUNNING.value), id="running-finished"),
        pytest.param(started(), id="queued-started"),
        pytest.param({"failure_reason": FailureReason.LOST.value}, id="queued-failed-reason"),
        pytest.param({"attempt": 0}, id="attempt-0"),
        pytest.param({"max_attempts": 0}, id="max-attempts-0"),
        pytest.param({"args": None}, id="args-sql-null"),
        pytest.param({"priority": 101}, id="priority-out-of-range"),
    ],
)
def test_the_database_refuses_a_row_outside_the_state_machine(values):
    with pytest.raises(IntegrityError), transaction.atomic():
        raw_insert(**values)

    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("state", "values"),
    [
        (State.QUEUED, {"state": "paused"}),
        (State.RUNNING, {"state": "cancelled"}),
        (State.SUCCEEDED, {"finished_at": None}),
        (State.FAILED, {"finished_at": None}),
        (State.FAILED, {"failure_reason": ""}),
        (State.SUCCEEDED, {"state": State.QUEUED.value}),  # queued with a worker and times
        (State.RUNNING, {"state": State.SUCCEEDED.value}),  # terminal without finished_at
    ],
)
def test_the_database_refuses_an_update_outside_the_state_machine(state, values):
    job = JobFactory.in_state(state)
    before = Job.objects.filter(pk=job.pk).values().get()

    with pytest.raises(IntegrityError), transaction.atomic():
        raw_update(job.pk, **values)

    assert Job.objects.filter(pk=job.pk).values().get() == before


def test_the_database_refuses_a_second_live_attempt_and_a_duplicate_attempt():
    first = JobFactory(max_attempts=3)

    with pytest.raises(IntegrityError), transaction.atomic():
        raw_insert(result_id=first.result_id, attempt=2)  # two live attempts
    with pytest.raises(IntegrityError), transaction.atomic():
        raw_insert(result_id=first.result_id, attempt=1, **finished(**FAILED))  # (task, 1) twice

    assert list(Job.objects.values_list("pk", flat=True)) == [first.pk]


@pytest.mark.parametrize(
    ("task_path", "args", "message"),
    [
        ("tests.tasks.not_a_task", [], "'tests.tasks.not_a_task' is a function, not a Task"),
        ("tests.tasks.no_such_task", [], "Cannot import the task 'tests.tasks.no_such_task'"),
        ("no_such_module.job", [], "Cannot import the task 'no_such_module.job'"),
        ("os.system", "touch {sentinel}", "'os.system' is a builtin_function_or_method, not"),
        ("builtins.exec", "open({sentinel!r}, 'w')", "'builtins.exec' is a builtin_function_or"),
        ("subprocess.Popen", ["touch", "{sentinel}"], "'subprocess.Popen' is a type, not a Task"),
        ("shutil.rmtree", "{keep}", "'shutil.rmtree' is a function, not a Task"),
        ("os.path", [], "'os.path' is a module, not a Task"),
        ("tests.tasks", [], "'tests.tasks' is a module, not a Task"),
        ("os", [], "Cannot import the task 'os'"),
        ("", [], "Cannot import the task ''"),
        ("tests.tasks.record.func", [], "Cannot import the task 'tests.tasks.record.func'"),
        ("tests.tasks.Execution", [], "'tests.tasks.Execution' is a ModelBase, not a Task"),
    ],
)
@RUNS_A_WORKER
def test_a_row_naming_something_that_is_not_a_task_fails_and_runs_no_code(
    tmp_path, task_path, args, message
):
    sentinel, keep = tmp_path / "ran", tmp_path / "keep"
    keep.mkdir()
    if isinstance(args, str):
        args = [args.format(sentinel=str(sentinel), keep=str(keep))]
    elif args:
        args = [[arg.format(sentinel=str(sentinel)) for arg in args]]
    job = JobFactory(args=["placeholder"])
    raw_update(job.pk, task_path=task_path, args=args)

    Worker(burst=True).run()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_class == INVALID_TASK
    assert message in job.error_message
    assert not sentinel.exists(), "the row ran code"
    assert keep.exists(), "the row ran code"
    assert not Execution.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        pytest.param({"label": "from a dict"}, {}, id="args-object"),
        pytest.param("x", {}, id="args-string"),
        pytest.param(json_null(), {}, id="args-null"),
        pytest.param(["ok"], ["not", "a", "dict"], id="kwargs-list"),
        pytest.param(["ok"], "text", id="kwargs-string"),
    ],
)
@RUNS_A_WORKER  # a JSON object or string as args ran the task; fixed in a2a569a
def test_a_row_whose_args_are_not_a_list_or_kwargs_not_a_dict_fails_and_runs_no_code(args, kwargs):
    job = JobFactory(args=["placeholder"])
    raw_update(job.pk, args=args, kwargs=kwargs)

    Worker(burst=True).run()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_class == INVALID_TASK
    assert "they must be a JSON array and a JSON object" in job.error_message
    assert not Execution.objects.exists(), "the task ran with arguments the row made up"


@pytest.fixture
def hostile_module(make_module, tmp_path):
    """An importable module that is no task module, and leaves a file when imported.

    It defines a real @task too: a worker that imported it would also run it.
    """
    imported, ran = tmp_path / "imported", tmp_path / "ran"
    name = make_module(
        "hostile",
        "import pathlib\n" + IMPORT_TASK + f"pathlib.Path({str(imported)!r}).touch()\n"
        "@task\n"
        "def job():\n"
        f"    pathlib.Path({str(ran)!r}).touch()\n",
    )
    return name, [imported, ran]


def assert_refused_without_import(job: Job, name: str, files: list) -> None:
    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, FailureReason.ERROR)
    assert job.error_class == INVALID_TASK
    assert f"{name!r} is not a task module of this project" in job.error_message
    assert "JOBSTATE_TASK_MODULES" in job.error_message
    assert [f.name for f in files if f.exists()] == [], "the row imported a module"


@RUNS_A_WORKER
def test_a_row_naming_a_module_that_is_no_task_module_fails_without_importing_it(
    hostile_module,
):
    name, files = hostile_module
    job = JobFactory(args=[])
    raw_update(job.pk, task_path=f"{name}.job")

    Worker(burst=True).run()

    assert_refused_without_import(job, name, files)
    assert name not in sys.modules


@RUNS_A_WORKER
def test_runjobs_does_not_import_a_module_a_row_names(hostile_module, runjobs, tmp_path):
    name, files = hostile_module
    job = JobFactory(args=[])
    raw_update(job.pk, task_path=f"{name}.job")
    after = JobFactory(args=["after"])

    done = runjobs.run("--burst", PYTHONPATH=str(tmp_path))  # the module is importable there

    assert done.returncode == 0, done.stdout
    assert_refused_without_import(job, name, files)
    assert list(Execution.objects.values_list("label", flat=True)) == [after.args[0]]


def test_get_result_does_not_import_a_module_a_row_names(hostile_module):
    name, files = hostile_module
    job = JobFactory.in_state(State.SUCCEEDED, args=[])
    raw_update(job.pk, task_path=f"{name}.job")

    with pytest.raises(InvalidTask, match="is not a task module of this project"):
        default_task_backend.get_result(str(job.result_id))

    assert [f.name for f in files if f.exists()] == [], "get_result() imported a module"
    assert name not in sys.modules


# Clocks


@RUNS_A_WORKER
def test_run_after_far_in_the_past_runs_now():
    result = tasks.record.using(run_after=datetime(1970, 1, 2, tzinfo=UTC)).enqueue("old")

    Worker(burst=True).run()

    assert Job.objects.get(result_id=result.id).state == State.SUCCEEDED
    assert list(Execution.objects.values_list("label", flat=True)) == ["old"]


@pytest.mark.parametrize(
    "run_after",
    [datetime(9999, 12, 31, tzinfo=UTC), timezone.now() + timedelta(days=365)],
    ids=["year-9999", "next-year"],
)
@RUNS_A_WORKER
def test_run_after_far_in_the_future_does_not_run(run_after):
    result = tasks.record.using(run_after=run_after).enqueue("future")

    assert Job.objects.claim("eager") == []
    Worker(burst=True).run()

    job = Job.objects.get(result_id=result.id)
    assert (job.state, job.run_after) == (State.QUEUED, run_after)
    assert not Execution.objects.exists()


@pytest.fixture
def clock_ahead(monkeypatch):
    """Give this process a clock one hour ahead of the database's.

    One process cannot move the machine's clock without root; what the app reads as "now"
    is timezone.now(), so shifting it is this worker's skew. The database clock is real.
    """
    real_now = timezone.now

    def skewed(hours: float = 1.0) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=hours))

    return skewed


@pytest.mark.skipif(
    settings.DB == "sqlite",
    reason="SQLite has one clock: the claim compares run_after with this process's clock "
    "(SQLite's own has only milliseconds), so a worker's skew is the machine's.",
)
@RUNS_A_WORKER
def test_a_worker_whose_clock_is_ahead_cannot_run_a_job_early_on_postgresql(clock_ahead):
    due_soon = tasks.record.using(run_after=timezone.now() + timedelta(minutes=5)).enqueue("s")
    clock_ahead(hours=1)  # to this worker, the job has been due for 55 minutes

    assert Job.objects.claim("skewed") == []
    Worker(worker_id="skewed", burst=True).run()

    assert Job.objects.get(result_id=due_soon.id).state == State.QUEUED
    assert not Execution.objects.exists()


def test_a_running_job_is_not_rescued_while_its_worker_heartbeats():
    long_ago = timezone.now() - timedelta(hours=2)
    alive = JobFactory(running=True, worker_id="alive", started_at=long_ago)
    silent = JobFactory(running=True, worker_id="silent", started_at=long_ago)
    young = JobFactory(running=True, worker_id="young", started_at=timezone.now())
    WorkerHeartbeat.objects.beat({"alive": 1}, host="h", queues=None)

    assert Job.objects.rescue_lost(lost_after=3.0) == 1

    states = dict(Job.objects.values_list("worker_id", "state"))
    assert states == {"alive": State.RUNNING, "silent": State.FAILED, "young": State.RUNNING}
    assert {alive.pk, young.pk} == set(Job.objects.running().values_list("pk", flat=True))
    assert silent.pk in Job.objects.filter(failure_reason=FailureReason.LOST).values_list(
        "pk", flat=True
    )


def test_a_rescue_that_waited_judges_as_of_when_its_rescuer_decided():
    """SQLite's write lock held past JOBSTATE_LOST_AFTER (a long transaction) holds up every
    beat alike, and the writes of a rescuer that had decided to judge just before. Once the
    lock was gone the judge's own beat landed first, and its rescue took the others, whose
    beats still waited, for silent: found by the torture run, a healthy attempt failed as
    lost and ran again beside its body. The rescue judges as of its decision."""
    lost_after = settings.JOBSTATE_LOST_AFTER
    stall = 2 * lost_after
    JobFactory(running=True, worker_id="held-up", started_at=timezone.now() - timedelta(hours=1))
    WorkerHeartbeat.objects.beat({"judge": 1, "held-up": 2}, host="h", queues=None)
    # The last beats before the stall; then the judge's, which landed first after it.
    WorkerHeartbeat.objects.update(last_seen=Now() - timedelta(seconds=stall + 0.1))
    WorkerHeartbeat.objects.beat({"judge": 1}, host="h", queues=None)
    rescue = {"judges": ["judge"], "judge_gap": lost_after / 2}

    decided = time.monotonic() - stall  # as the stall began
    assert Job.objects.rescue_lost(lost_after, decided=decided, **rescue) == 0
    assert Job.objects.get(worker_id="held-up").state == State.RUNNING

    # Decided now, with the held-up worker silent all along: lost.
    assert Job.objects.rescue_lost(lost_after, decided=time.monotonic(), **rescue) == 1


def test_a_rescuer_whose_next_beat_is_held_up_decides_no_rescue():
    """The other half of the test above: while its own beat is overdue (held up by the
    same lock as the others'), a rescuer does not decide to judge at all."""
    from django_jobstate.runner.liveness import Pulse, judge_gap

    lost_after = settings.JOBSTATE_LOST_AFTER
    pulse = Pulse("rescuer")
    pulse.beat({"judge": 1}, None)
    assert not pulse.may_judge  # not connected for a window yet
    pulse._connected_since -= lost_after  # as if its beats had landed for a window
    assert pulse.may_judge
    pulse._last_beat -= judge_gap(lost_after) + 0.1  # the next one has not landed
    assert not pulse.may_judge


def test_a_heartbeat_is_stamped_by_the_database_clock_whatever_the_workers(clock_ahead):
    job = JobFactory(running=True, worker_id="behind", started_at=timezone.now())
    raw_update(job.pk, started_at=timezone.now() - timedelta(hours=2))
    clock_ahead(hours=-1)  # a worker whose clock is an hour behind heartbeats
    WorkerHeartbeat.objects.beat({"behind": 1}, host="h", queues=None)

    assert Job.objects.rescue_lost(lost_after=3.0) == 0
    job.refresh_from_db()
    assert job.state == State.RUNNING
