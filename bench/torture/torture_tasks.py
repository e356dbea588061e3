"""The torture run's tasks: each body records its start, then sleeps, fails or returns.

Whether an attempt fails is decided by a hash of (seed, result id, attempt), so the check
in torture.py can say, for every attempt, what it should have done.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import time
import uuid

from asgiref.sync import sync_to_async
from django.db import connection

from bench.models import Execution
from django_jobstate.db.clock import Now  # UTC on MariaDB too, as the jobs' times
from django_jobstate.models import Job
from django_jobstate.tasksapi import TaskContext, task

# Kinds of job (an argument). PLAIN returns at once, SLEEP sleeps; OVERRUN sleeps past its
# timeout on its first attempt; GIL_OVERRUN holds the interpreter past it; GIL_HOLD holds
# the interpreter (no timeout of its own: the default one, longer) for longer than the
# lost-after window on its first attempt, and must succeed; UGLY raises errors that are
# hard to store (a NUL, a lone surrogate, a str() that raises) for its planned failures.
PLAIN, SLEEP, OVERRUN = "plain", "sleep", "overrun"
GIL_OVERRUN, GIL_HOLD, UGLY = "gil-overrun", "gil-hold", "ugly"
# The workloads of torture_workloads.py: a batch of fast jobs claimed with a slow one
# (BATCH_FAST bodies stamp when they returned), a schedule's TICK, and the DEADLINE
# overruns whose timeouts fall in a table lock (OVERRUN's plan, their own kind).
BATCH_FAST, BATCH_SLOW, TICK, DEADLINE = "batch-fast", "batch-slow", "tick", "deadline"
# A body of a limited task (limited_per_key, limited_per_task): it sleeps, and stamps when
# it ran (Execution.body_start/body_end) to show which bodies of a key overlapped.
LIMITED = "limited"
OVERRUN_KINDS = frozenset({OVERRUN, GIL_OVERRUN, DEADLINE})
OK, FAIL = "ok", "fail"  # planned outcomes of an attempt (and OVERRUN)
SLEEPERS = frozenset({SLEEP, BATCH_SLOW, LIMITED})
OVERRUN_TIMEOUT = 1.0


class TortureFailure(Exception):
    """The planned failure of an attempt."""


class TortureNulFailure(TortureFailure):
    """A planned failure whose message holds a NUL character."""


class TortureSurrogateFailure(TortureFailure):
    """A planned failure whose message holds a lone surrogate."""


class TortureUnprintableFailure(TortureFailure):
    """A planned failure whose str() raises."""

    def __str__(self) -> str:
        raise RuntimeError("this error cannot be printed")


# Each unprintable error, and its message as the attempt's row must store it.
UGLY_ERRORS: dict[type[TortureFailure], tuple[str, str]] = {
    TortureNulFailure: ("before\x00after", "before\\x00after"),
    TortureSurrogateFailure: ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
    TortureUnprintableFailure: ("unprintable", "<str() of the error failed>"),
}
PLANNED_ERRORS = frozenset(
    f"{cls.__module__}.{cls.__qualname__}" for cls in (TortureFailure, *UGLY_ERRORS)
)


def _digest(seed: int, result_id: str, attempt: int) -> bytes:
    return hashlib.sha256(f"{seed}:{uuid.UUID(result_id)}:{attempt}".encode()).digest()


def planned(seed: int, kind: str, result_id: str, attempt: int, fail_rate: float) -> str:
    """What attempt `attempt` of this task does: OK, FAIL, or OVERRUN (its timeout)."""
    if attempt == 1 and kind in OVERRUN_KINDS:
        return OVERRUN
    if attempt == 1 and kind == GIL_HOLD:
        return OK
    digest = _digest(seed, result_id, attempt)
    return FAIL if int.from_bytes(digest[:8]) / 2**64 < fail_rate else OK


def planned_error(seed: int, kind: str, result_id: str, attempt: int) -> type[TortureFailure]:
    """The class of a planned failure of this attempt."""
    if kind != UGLY:
        return TortureFailure
    return list(UGLY_ERRORS)[_digest(seed, result_id, attempt)[8] % len(UGLY_ERRORS)]


def stored_message(error: type[TortureFailure], attempt: int) -> str:
    """The error message a planned failure of `attempt` must leave in its row."""
    if error in UGLY_ERRORS:
        return UGLY_ERRORS[error][1]
    return f"planned failure of attempt {attempt}"


def record_start(result_id: str, context_attempt: int, worker_id: str) -> tuple[int, int]:
    """Insert the Execution row, with the attempt's state as this very statement sees it;
    return its id and the attempt's number.

    The attempt is the newest one its worker claimed: the body is told only
    TaskContext.attempt, which counts the attempts that ran, not those handed back
    unstarted (released), so it can be less than Job.attempt. Both are recorded.
    """
    ex, job = Execution._meta, Job._meta
    qn = connection.ops.quote_name
    rid = uuid.UUID(result_id)
    rid_ex = ex.get_field("result_id").get_db_prep_value(rid, connection)
    rid_job = job.get_field("result_id").get_db_prep_value(rid, connection)
    columns = ", ".join(
        qn(c) for c in ("result_id", "attempt", "context_attempt", "pid", "worker_id", "seen_state")
    )
    pid = os.getpid()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {qn(ex.db_table)} ({columns}) "
            f"SELECT %s, {qn('attempt')}, %s, %s, %s, {qn('state')} FROM {qn(job.db_table)} "
            f"WHERE {qn('result_id')} = %s AND {qn('worker_id')} = %s "
            f"ORDER BY {qn('attempt')} DESC LIMIT 1 "
            f"RETURNING {qn('id')}, {qn('attempt')}",
            [rid_ex, context_attempt, pid, worker_id, rid_job, worker_id],
        )
        row = cursor.fetchone()
        if row is None:  # no attempt of this worker: recorded as it is, found by the check
            cursor.execute(
                f"INSERT INTO {qn(ex.db_table)} ({columns}) VALUES (%s, %s, %s, %s, %s, '') "
                f"RETURNING {qn('id')}, {qn('attempt')}",
                [rid_ex, context_attempt, context_attempt, pid, worker_id],
            )
            row = cursor.fetchone()
        return int(row[0]), int(row[1])


def hold_the_interpreter(seconds: float) -> None:
    """Sleep in C without releasing the GIL (as a catastrophic regular expression or many
    C extensions do): no other thread of this process runs meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


def body(context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float) -> int:
    result = context.task_result
    # First thing: a body paused after this line and resumed later does not record again.
    execution, attempt = record_start(result.id, context.attempt, result.worker_ids[-1])
    began = time.monotonic()
    outcome = planned(seed, kind, result.id, attempt, fail_rate)
    first = attempt == 1
    if kind in (GIL_OVERRUN, GIL_HOLD) and first:
        hold_the_interpreter(seconds)  # an overrun holds it past its timeout: killed
    elif kind in SLEEPERS or outcome == OVERRUN:
        time.sleep(seconds)  # an overrun sleeps past its timeout: its worker process ends
    if outcome == OVERRUN:  # still alive past the deadline: the timeout was not enforced
        Execution.objects.filter(pk=execution).update(ended_at=Now())
    if kind == LIMITED:  # before it raises or returns: its worker writes the outcome after
        Execution.objects.filter(pk=execution).update(body_start=began, body_end=time.monotonic())
    if outcome == FAIL:
        raise_planned(seed, kind, result.id, attempt)
    if kind == BATCH_FAST:  # when it returned, to compare with when its success was written
        Execution.objects.filter(pk=execution).update(returned_at=Now())
    return attempt


async def async_body(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float
) -> int:
    """body() as an async task (runjobs --in-flight runs it on the worker's event loop):
    it sleeps with asyncio, and an overrun is cancelled at its deadline; holding the
    interpreter holds the loop, so only its process's end stops it."""
    result = context.task_result
    execution, attempt = await sync_to_async(record_start)(
        result.id, context.attempt, result.worker_ids[-1]
    )
    outcome = planned(seed, kind, result.id, attempt, fail_rate)
    first = attempt == 1
    if kind in (GIL_OVERRUN, GIL_HOLD) and first:
        hold_the_interpreter(seconds)
    elif kind in SLEEPERS or outcome == OVERRUN:
        await asyncio.sleep(seconds)
    if outcome == OVERRUN:
        await Execution.objects.filter(pk=execution).aupdate(ended_at=Now())
    if outcome == FAIL:
        raise_planned(seed, kind, result.id, attempt)
    if kind == BATCH_FAST:
        await Execution.objects.filter(pk=execution).aupdate(returned_at=Now())
    return attempt


def raise_planned(seed: int, kind: str, result_id: str, attempt: int) -> None:
    error = planned_error(seed, kind, result_id, attempt)
    if error in UGLY_ERRORS:
        raise error(UGLY_ERRORS[error][0])
    raise error(stored_message(error, attempt))


@task(takes_context=True, max_attempts=5, backoff=0.2)
def flaky(context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float) -> int:
    """Retried: should end succeeded unless all five attempts fail."""
    return body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True)
def once(context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float) -> int:
    """One attempt (the default): a fault that consumes it fails the task."""
    return body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True, max_attempts=3, backoff=0.2, timeout=OVERRUN_TIMEOUT)
def overrun(context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float) -> int:
    """The first attempt runs (or holds the interpreter) past its timeout; the later ones
    are plain."""
    return body(context, seed, kind, seconds, fail_rate)


# Their async twins (--async-fraction), the same plans.


@task(takes_context=True, max_attempts=5, backoff=0.2)
async def flaky_async(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float
) -> int:
    return await async_body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True)
async def once_async(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float
) -> int:
    return await async_body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True, max_attempts=3, backoff=0.2, timeout=OVERRUN_TIMEOUT)
async def overrun_async(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float
) -> int:
    return await async_body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True, max_attempts=3, backoff=0.2)
def batched(context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float) -> int:
    """A fast or slow job of a mixed batch (never planned to fail: any failure is a fault)."""
    return body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True, max_attempts=3, backoff=0.2)
async def batched_async(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float
) -> int:
    return await async_body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True, max_attempts=3, backoff=0.2, unique=["key"])
def unique_flaky(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float, key: str = ""
) -> int:
    """At most one live task per `key`: enqueued again and again while workers drain."""
    return body(context, seed, kind, seconds, fail_rate)


# Concurrency limits (docs/howto/limits.md), enqueued in clumps due together with the rest
# (torture.py): at most one body at once per `key`, at most two of the task at once.
@task(takes_context=True, max_attempts=3, backoff=0.2, concurrency=1, concurrency_key=["key"])
def limited_per_key(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float, key: str = ""
) -> int:
    return body(context, seed, kind, seconds, fail_rate)


@task(takes_context=True, max_attempts=3, backoff=0.2, concurrency=2)
def limited_per_task(
    context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float
) -> int:
    return body(context, seed, kind, seconds, fail_rate)


LIMITED_TASKS = frozenset(t.module_path for t in (limited_per_key, limited_per_task))
ASYNC_TWINS = {flaky: flaky_async, once: once_async, overrun: overrun_async, batched: batched_async}
# The tasks of the main mix (bench/torture/torture.py's enqueue), which the cancels pick from.
ORDINARY = frozenset(
    t.module_path for t in (flaky, once, overrun, flaky_async, once_async, overrun_async)
)


# A step of a workflow (bench/torture/torture_workflows.py: chains and chords enqueued with
# django_jobstate.workflows): the same plans; a chord's callback is given its group's
# results as `results` (torture_check_workflows.py compares them with the group's).
@task(takes_context=True, max_attempts=3, backoff=0.2)
def workflow_step(
    context: TaskContext,
    seed: int,
    kind: str,
    seconds: float,
    fail_rate: float,
    results: list[int] | None = None,
) -> int:
    return body(context, seed, kind, seconds, fail_rate)
