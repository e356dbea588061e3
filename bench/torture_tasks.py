"""The torture run's tasks: each body records its start, then sleeps, fails or returns.

Whether an attempt fails is decided by a hash of (seed, result id, attempt), so the check
in torture.py can say, for every attempt, what it should have done.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

from django.db import connection
from django.tasks import TaskContext, task

from bench.models import Execution
from django_jobstate.models import Job

PLAIN, SLEEP, OVERRUN = "plain", "sleep", "overrun"  # kinds of job (an argument)
OK, FAIL = "ok", "fail"  # planned outcomes of an attempt (and OVERRUN)
OVERRUN_TIMEOUT = 1.0


class TortureFailure(Exception):
    """The planned failure of an attempt."""


def planned(seed: int, kind: str, result_id: str, attempt: int, fail_rate: float) -> str:
    """What attempt `attempt` of this task does: OK, FAIL, or OVERRUN (its timeout)."""
    if kind == OVERRUN and attempt == 1:
        return OVERRUN
    digest = hashlib.sha256(f"{seed}:{uuid.UUID(result_id)}:{attempt}".encode()).digest()
    return FAIL if int.from_bytes(digest[:8]) / 2**64 < fail_rate else OK


def record_start(result_id: str, attempt: int, worker_id: str) -> None:
    """Insert the Execution row, with the attempt's state as this very statement sees it."""
    ex, job = Execution._meta, Job._meta
    qn = connection.ops.quote_name
    rid = uuid.UUID(result_id)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {qn(ex.db_table)} "
            f"({qn('result_id')}, {qn('attempt')}, {qn('pid')}, {qn('worker_id')}, "
            f"{qn('seen_state')}) "
            f"VALUES (%s, %s, %s, %s, COALESCE((SELECT {qn('state')} FROM {qn(job.db_table)} "
            f"WHERE {qn('result_id')} = %s AND {qn('attempt')} = %s), ''))",
            [
                ex.get_field("result_id").get_db_prep_value(rid, connection),
                attempt,
                os.getpid(),
                worker_id,
                job.get_field("result_id").get_db_prep_value(rid, connection),
                attempt,
            ],
        )


def body(context: TaskContext, seed: int, kind: str, seconds: float, fail_rate: float) -> int:
    result = context.task_result
    # First thing: a body paused after this line and resumed later does not record again.
    record_start(result.id, context.attempt, result.worker_ids[-1])
    outcome = planned(seed, kind, result.id, context.attempt, fail_rate)
    if kind == SLEEP or outcome == OVERRUN:
        time.sleep(seconds)  # an overrun sleeps past its timeout: its worker process ends
    if outcome == FAIL:
        raise TortureFailure(f"planned failure of attempt {context.attempt}")
    return context.attempt


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
    """The first attempt runs past its timeout; the later ones are plain."""
    return body(context, seed, kind, seconds, fail_rate)
