"""Tasks the tests enqueue. Each one that runs records itself in the Execution table."""

import asyncio
import ctypes
import os
import sys
import time
from pathlib import Path

from django_jobstate.context import JobStateContext
from django_jobstate.tasksapi import TaskContext, task
from tests.limit_tasks import (  # noqa: F401 (exposed: workers find them here)
    five_a_minute,
    five_a_second,
    one_per_customer,
    rated_one_per_customer,
    three_at_once,
    two_per_customer,
    unique_one_per_customer,
    unlimited,
)
from tests.models import Execution
from tests.retry_tasks import (  # noqa: F401 (exposed: workers find them here)
    gives_up,
    rate_limited_once,
    retries_on_connection_errors,
    snoozes_atomically,
    snoozes_forever,
    snoozes_twice,
)
from tests.workflow_tasks import (  # noqa: F401 (exposed: workers find them here)
    add,
    boom_step,
    chord_callback,
    chord_step,
    fails_twice,
    fails_until_allowed,
    square,
    step_value,
    total,
    unique_value,
)


@task
def record(label: str) -> str:
    """Record one execution and return the label."""
    Execution.objects.create(label=label)
    return label


@task(queue_name="emails")
def email(address: str) -> dict[str, str]:
    return {"to": address}


@task
def boom(message: str = "boom") -> None:
    raise ValueError(message)


@task(takes_context=True)
def attempt_number(context: TaskContext) -> int:
    return context.attempt


@task
def returns_set() -> object:
    return {1, 2}


def not_a_task() -> None:
    raise AssertionError("a plain function must never run as a job")


@task
def sleep_then_record(label: str, seconds: float) -> str:
    """Sleep (a job that is mid-flight long enough to signal its worker), then record."""
    time.sleep(seconds)
    Execution.objects.create(label=label)
    return label


@task(max_attempts=3, backoff=0)
def always_fails(label: str) -> None:
    """Record one execution, then raise: every attempt fails."""
    Execution.objects.create(label=label)
    raise ValueError(f"{label} failed")


@task(max_attempts=3, backoff=0)
def fails_once(label: str) -> str:
    """Record one execution; raise on the first one only."""
    Execution.objects.create(label=label)
    if Execution.objects.filter(label=label).count() == 1:
        raise ValueError(f"{label} fails the first time")
    return label


@task(max_attempts=3, backoff=2, timeout=5)
def with_options() -> None:
    pass


def _registered_under_another_name() -> None:
    raise AssertionError("a task whose path does not lead back to it must never run")


aliased = task(_registered_under_another_name)


@task
def returns_nan() -> float:
    return float("nan")


@task(takes_context=True, max_attempts=2, backoff=0)
def sleeps_on_first_attempt(context: TaskContext, label: str, seconds: float) -> int:
    """Record the start of each attempt's body; the first attempt then sleeps."""
    Execution.objects.create(label=f"{label}:{context.attempt}")
    if context.attempt == 1:
        time.sleep(seconds)
    return context.attempt


@task(takes_context=True, max_attempts=2, backoff=0, timeout=1)
def sleeps_on_first_attempt_with_a_timeout(context: TaskContext, label: str, seconds: float) -> int:
    """sleeps_on_first_attempt, with a timeout of a second."""
    Execution.objects.create(label=f"{label}:{context.attempt}")
    if context.attempt == 1:
        time.sleep(seconds)
    return context.attempt


@task(max_attempts=2, backoff=0, timeout=1)
def busy_loop(label: str) -> None:
    """Never return control: only a timeout that does not need the task's help stops it."""
    Execution.objects.create(label=label)
    while True:
        pass


@task(takes_context=True, max_attempts=2, backoff=0)
def changes_its_payload_in_place(context: TaskContext, items: list[str]) -> list[str]:
    """Changes its list argument and its context's metadata without saving them (the
    metadata into something JSON cannot store); the first attempt then fails."""
    items.append("changed")
    context.metadata["unsaved"] = object()  # type: ignore[attr-defined]
    if context.attempt == 1:
        raise ValueError("first attempt fails")
    return items


@task(takes_context=True, max_attempts=2, backoff=2)
def fails_first_attempt(context: TaskContext) -> int:
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return context.attempt


@task
def sleep_and_report(seconds: float) -> list[float]:
    """Sleep, and return when the body started and ended (to measure overlap)."""
    start = time.time()
    time.sleep(seconds)
    Execution.objects.create(label="slept")
    return [start, time.time()]


@task(max_attempts=3, backoff=0)
def record_with_retries(label: str, seconds: float) -> str:
    """Like sleep_then_record, but a transient error (the database restarting) is retried."""
    time.sleep(seconds)
    Execution.objects.create(label=label)
    return label


@task
def returns_nul() -> str:
    """Return text that SQLite stores and PostgreSQL's jsonb refuses (a NUL character)."""
    return "nul\x00"


@task
def returns_nested(depth: int) -> list:
    """Return lists nested `depth` levels deep."""
    outer = inner = []
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


@task
def returns_large(size: int) -> str:
    """Return a string of `size` characters (past JOBSTATE_MAX_PAYLOAD_BYTES, if large)."""
    return "x" * size


@task(timeout=0.5)
def returns_after_its_timeout(label: str) -> str:
    """Record the start, then return a second later: past the 0.5 s timeout."""
    Execution.objects.create(label=label)
    time.sleep(1.0)
    return label


@task(max_attempts=2, backoff=600)
def fails_with_a_long_backoff(label: str) -> None:
    """Its retry waits 300 to 600 seconds: long enough to see it was not skipped."""
    raise ValueError(label)


@task(takes_context=True, max_attempts=2, backoff=0)
def marks_its_body(context: TaskContext, label: str, seconds: float) -> int:
    """Mark the start and the end of each body in files, outside the database.

    A worker cut off from the database still leaves them, so they count executions on
    every host. The names say which host ran it (JOBSTATE_TEST_HOST) and which process;
    the first attempt sleeps `seconds` in between.
    """
    marks = Path(os.environ["JOBSTATE_TEST_MARKS"])
    name = f"{label}.{context.attempt}.{os.environ['JOBSTATE_TEST_HOST']}.{os.getpid()}"
    (marks / f"{name}.start").touch(exist_ok=False)
    if context.attempt == 1:
        time.sleep(seconds)
    (marks / f"{name}.finish").touch(exist_ok=False)
    return context.attempt


@task(takes_context=True, atomic=True)
def holds_its_row(context: TaskContext, label: str, seconds: float) -> int:
    """An atomic task that saves its progress (its job row stays locked until the body's
    transaction commits), marks its start in a file, then sleeps `seconds`."""
    context.metadata["step"] = 1
    context.save_metadata()  # type: ignore[attr-defined]
    name = f"{label}.{context.attempt}.{os.environ['JOBSTATE_TEST_HOST']}.{os.getpid()}"
    (Path(os.environ["JOBSTATE_TEST_MARKS"]) / f"{name}.start").touch(exist_ok=False)
    time.sleep(seconds)
    return context.attempt


def _hold_the_interpreter(seconds: float) -> None:
    """Sleep in C without releasing the GIL, as a catastrophic regular expression or many
    C extensions do: no other thread of this process runs meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


@task(takes_context=True, max_attempts=2, backoff=0, timeout=1)
def holds_the_interpreter_past_its_timeout(context: TaskContext, label: str) -> int:
    Execution.objects.create(label=f"{label}:{context.attempt}")
    if context.attempt == 1:
        _hold_the_interpreter(30)
    return context.attempt


@task(takes_context=True, max_attempts=2, backoff=0)
def holds_the_interpreter(context: TaskContext, label: str, seconds: float) -> int:
    Execution.objects.create(label=f"{label}:{context.attempt}")
    _hold_the_interpreter(seconds)
    return context.attempt


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot be printed")


@task
def raises(kind: str) -> None:
    """Raise an error that is hard to store: a NUL, a lone surrogate, or no str() at all."""
    if kind == "nul":
        raise ValueError("before\x00after")
    if kind == "surrogate":
        raise ValueError("lone \ud800 surrogate")
    raise Unprintable()


@task
async def async_raises_unprintable() -> None:
    """An async task whose error has no str()."""
    await asyncio.sleep(0)
    raise Unprintable()


@task(takes_context=True, max_attempts=2, backoff=0, atomic=True)
def writes_atomically(context: TaskContext, label: str, seconds: float) -> int:
    """Write a row, then sleep on the first attempt: a zombie's write must roll back."""
    Execution.objects.create(label=f"{label}:{context.attempt}")
    if context.attempt == 1:
        time.sleep(seconds)
    return context.attempt


@task(atomic=True)
def writes_then_fails(label: str) -> None:
    Execution.objects.create(label=label)
    raise ValueError(f"{label} failed after writing")


@task(takes_context=True, max_attempts=2, backoff=0)
async def async_fails_once(context: TaskContext, label: str) -> dict[str, object]:
    """An async task: its first attempt fails, the second awaits and returns."""
    await asyncio.sleep(0.01)
    await Execution.objects.acreate(label=f"{label}:{context.attempt}")
    if context.attempt == 1:
        raise ValueError(f"{label} fails first")
    return {"attempt": context.attempt, "data": b"bytes as text"}


@task(timeout=1)
async def async_overruns(label: str) -> None:
    await Execution.objects.acreate(label=label)
    await asyncio.sleep(60)


# The tasks of Django's own tests/tasks suite and of django-tasks-db's, written our way,
# for tests/test_conformance.py.


@task(takes_context=True, max_attempts=2, backoff=0)
def reports_progress(context: JobStateContext, steps: int, fail_first: bool = False) -> object:
    """Save progress after each step; with `fail_first`, the first attempt then fails."""
    context.metadata["seen"] = [*context.metadata.get("seen", []), context.attempt]
    for step in range(1, steps + 1):
        context.metadata["progress"] = f"{step} of {steps}"
        context.save_metadata()
    if fail_first and context.attempt == 1:
        raise RuntimeError("the first attempt fails after saving its progress")
    return context.metadata


@task
def noop(*args: object, **kwargs: object) -> None:
    return None


@task
async def noop_async(*args: object, **kwargs: object) -> None:
    return None


@task
def meaning_of_life() -> int:
    return 42


@task
async def returns_normalizable() -> object:
    """Return what JSON does not have but Django's backends normalize: a tuple, bytes."""
    await asyncio.sleep(0)
    return {"pair": (1, 2), "raw": b"text", "nested": [(3,)]}


@task
def returns_a_function() -> object:
    return lambda: True


@task
def fails(kind: str) -> None:
    """Raise what a task may raise: an error, SystemExit, KeyboardInterrupt, exit()."""
    if kind == "value-error":
        raise ValueError("This task failed due to ValueError")
    if kind == "system-exit":
        raise SystemExit("This task failed due to SystemExit")
    if kind == "keyboard-interrupt":
        raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")
    if kind == "exit":
        sys.exit(1)
    raise ValueError(ValueError("This task failed"))


@task(takes_context=True)
def returns_its_result_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
async def returns_its_context_async(context: TaskContext) -> dict[str, object]:
    return {"id": context.task_result.id, "attempt": context.attempt}


@task
def echo(value: object) -> object:
    return value


@task
def returns_nan_in_a_list() -> list[float]:
    return [float("nan")]


@task(unique=["account_id"])
def sync_account(account_id: int, reason: str = "") -> int:
    """Unique by account: at most one live sync per account."""
    Execution.objects.create(label=f"sync:{account_id}")
    return account_id


@task(unique=True)
def unique_record(label: str, times: int = 1) -> str:
    Execution.objects.create(label=label)
    return label


@task(unique=True, on_duplicate="raise")
def unique_or_raise(label: str) -> None:
    Execution.objects.create(label=label)


@task(unique=True, max_attempts=5, backoff=0)
def unique_always_fails(label: str) -> None:
    Execution.objects.create(label=label)
    raise ValueError(f"{label} failed")


@task(unique=True, unique_scope="queued", max_attempts=5, backoff=0)
def unique_queued_always_fails(label: str) -> None:
    Execution.objects.create(label=label)
    raise ValueError(f"{label} failed")


@task(takes_context=True, unique=True)
def unique_with_context(context: TaskContext, label: str) -> int:
    return context.attempt


@task(takes_context=True, max_attempts=3, backoff=0)
def stops_when_cancelled(context: TaskContext, label: str) -> None:
    """Record its start, then work in small steps, stopping at a cancel request."""
    Execution.objects.create(label=f"{label}:started")
    while True:
        context.raise_if_cancelled()  # type: ignore[attr-defined]
        time.sleep(0.01)


@task(max_attempts=3, backoff=0)
def never_returns(label: str) -> None:
    """Record its start, then spin without ever looking at a cancel request."""
    Execution.objects.create(label=f"{label}:started")
    while True:
        pass


@task(max_attempts=3, backoff=0, queue_name="emails")
def record_in_emails(label: str) -> str:
    Execution.objects.create(label=label)
    return label


@task
def record_then_sleep(label: str, seconds: float) -> str:
    """Record its start, then sleep: a test knows the body began (not just the claim)."""
    Execution.objects.create(label=label)
    time.sleep(seconds)
    return label


# In-flight attempts (runjobs --in-flight): each records its start and its end, so that a
# test can count how many ran at once from the order of the rows.


@task(max_attempts=3, backoff=0)
async def async_waits(label: str, seconds: float) -> str:
    await Execution.objects.acreate(label=f"{label}:start")
    await asyncio.sleep(seconds)
    await Execution.objects.acreate(label=f"{label}:end")
    return label


@task(max_attempts=3, backoff=0)
def sync_waits(label: str, seconds: float) -> str:
    Execution.objects.create(label=f"{label}:start")
    time.sleep(seconds)
    Execution.objects.create(label=f"{label}:end")
    return label


@task(timeout=1)
async def async_sleeps_past_its_timeout(label: str) -> None:
    await Execution.objects.acreate(label=f"{label}:start")
    await asyncio.sleep(60)
    await Execution.objects.acreate(label=f"{label}:end")


@task(timeout=1)
async def async_holds_the_loop(label: str) -> None:
    """Never gives the event loop back: cancelling it cannot stop it."""
    await Execution.objects.acreate(label=f"{label}:start")
    time.sleep(60)


@task(timeout=1)
def sync_sleeps_past_its_timeout(label: str) -> None:
    Execution.objects.create(label=f"{label}:start")
    time.sleep(60)


@task(takes_context=True)
async def async_stops_when_cancelled(context: TaskContext, label: str) -> None:
    await Execution.objects.acreate(label=f"{label}:started")
    while True:
        context.raise_if_cancelled()  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)


@task
async def async_never_returns(label: str) -> None:
    """Ignores cancel requests: only the worker's cancellation at the grace stops it."""
    await Execution.objects.acreate(label=f"{label}:started")
    await asyncio.sleep(3600)


@task
async def async_waits_for_file(path: str) -> str:
    """Touches nothing in the database: returns once `path` exists."""
    while not os.path.exists(path):
        await asyncio.sleep(0.01)
    return path


@task
def shows_settings(names: list[str]) -> dict[str, str]:
    """The PostgreSQL settings `names` of the connection the task runs on (its worker's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names])
        return dict(cursor.fetchall())


@task
def waits_for_file(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.01)
    return path


@task(timeout=5)
async def async_overruns_and_says_so(started: str, cancelled: str) -> None:
    """Runs past its timeout; writes files, not rows, so a locked database cannot hold it."""
    Path(started).touch()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        Path(cancelled).touch()
        raise


@task(takes_context=True)
async def async_reports_progress(context: JobStateContext, steps: int) -> int:
    for step in range(1, steps + 1):
        context.metadata["done"] = step
        await context.asave_metadata()
        await asyncio.sleep(0.01)
    return steps


@task
def starts_then_sleeps(label: str, seconds: float) -> str:
    """One attempt: records its start, sleeps, records its end."""
    Execution.objects.create(label=f"{label}:start")
    time.sleep(seconds)
    Execution.objects.create(label=f"{label}:end")
    return label


# Declared with the django-tasks backport's decorator where it is installed: on Django 5.2
# and 6.0 it is the framework; on 6.1 a project that still has it (Wagtail pulls it in) mixes
# both decorators on the same backend (tests/test_tasksapi.py).
try:
    from django_tasks import task as backport_task
except ImportError:
    backport_task = None

if backport_task is not None:

    @backport_task(max_attempts=2, backoff=0, queue_name="emails", priority=5)
    def backport_flaky(label: str) -> str:
        """Fail the first attempt, succeed the second: the options reached the worker."""
        Execution.objects.create(label=label)
        if Execution.objects.filter(label=label).count() < 2:
            raise ValueError(f"{label}: first attempt")
        return label


# Quick attempts in one batch with a slow one (test_flushing.py): each run appends its
# label to a file (no database write, so that a batch holds many); with `until`, the
# attempt records its start and runs until that file exists (a slow attempt of a task
# whose attempts were quick).


def _mark(path: str, label: str) -> None:
    with open(path, "a") as marks:
        marks.write(f"{label}\n")


@task(max_attempts=3, backoff=0)
def marks_a_file(path: str, label: str, until: str = "") -> str:
    _mark(path, label)
    if until:
        Execution.objects.create(label=f"{label}:start")
        while not os.path.exists(until):
            time.sleep(0.05)
    return label


@task(max_attempts=3, backoff=0)
async def async_marks_a_file(path: str, label: str, until: str = "") -> str:
    _mark(path, label)
    if until:
        await Execution.objects.acreate(label=f"{label}:start")
        while not os.path.exists(until):
            await asyncio.sleep(0.05)
    return label


@task
def runs_until_a_file_exists(path: str, label: str) -> None:
    """Another task than the quick ones: one the worker has not seen yet."""
    Execution.objects.create(label=f"{label}:start")
    while not os.path.exists(path):
        time.sleep(0.05)


# tests/test_conflicts.py and tests/test_isolation.py


@task(takes_context=True)
def saves_metadata_at_the_gate(context: JobStateContext, gate: str) -> str:
    """Wait for the file `gate`, then save metadata: a write of the worker's own, made from
    the task's body."""
    while not os.path.exists(gate):
        time.sleep(0.01)
    context.metadata["saved"] = True
    context.save_metadata()
    Execution.objects.create(label="saved")
    return "saved"


@task
def records_its_isolation(label: str) -> str:
    """Record `label` (once per run) and return the isolation level of the worker's session."""
    from django.db import connection

    Execution.objects.create(label=label)
    with connection.cursor() as cursor:
        try:  # MySQL 8 and MariaDB 11.1+
            cursor.execute("SELECT @@SESSION.transaction_isolation")
        except Exception:  # MariaDB before 11.1
            cursor.execute("SELECT @@SESSION.tx_isolation")
        return str(cursor.fetchone()[0])
