"""Tasks of tests/test_limits.py (concurrency limits), exposed by tests/tasks.py.

Each run records "start|key|label" when its body begins and "run|key|label|start|end"
(time.time(), one machine's clock) when it ends, in the Execution table: the test reads
from those rows which bodies overlapped."""

import time

from django_jobstate.tasksapi import task
from tests.models import Execution


def _run(key: str, label: str, seconds: float) -> str:
    start = time.time()
    Execution.objects.create(label=f"start|{key}|{label}")
    time.sleep(seconds)
    Execution.objects.create(label=f"run|{key}|{label}|{start!r}|{time.time()!r}")
    return label


@task(concurrency=1, concurrency_key=["customer"])
def one_per_customer(customer: int, label: str, seconds: float = 0.0) -> str:
    return _run(f"one:{customer}", label, seconds)


@task(concurrency=2, concurrency_key=["customer"], max_attempts=2, backoff=0)
def two_per_customer(customer: int, label: str, seconds: float = 0.0) -> str:
    return _run(f"two:{customer}", label, seconds)


@task(concurrency=3)
def three_at_once(label: str, seconds: float = 0.0) -> str:
    return _run("three", label, seconds)


@task
def unlimited(label: str, seconds: float = 0.0) -> str:
    return _run("free", label, seconds)


@task(unique=True, concurrency=1, concurrency_key=["customer"])
def unique_one_per_customer(customer: int, label: str) -> str:
    return _run(f"unique:{customer}", label, 0.0)


@task(rate_limit="5/s")
def five_a_second(label: str, seconds: float = 0.0) -> str:
    return _run("rate", label, seconds)


# Its next token is 12 s away once its bucket's one is taken: a claim soon after finds
# none due, however loaded the machine (five_a_second's come back within 0.2 s).
@task(rate_limit="5/m")
def five_a_minute(label: str) -> str:
    return _run("rate", label, 0.0)


@task(rate_limit="2/s", concurrency=1, concurrency_key=["customer"], max_attempts=2, backoff=0)
def rated_one_per_customer(customer: int, label: str, fail: bool = False) -> str:
    if fail:
        raise ValueError("asked to fail")
    return _run(f"rated:{customer}", label, 0.0)
