"""Tasks the workflow tests chain. Each run records itself in the Execution table."""

import time

from django_jobstate.tasksapi import task
from tests.models import Execution


@task
def step_value(x: object, label: str = "") -> object:
    Execution.objects.create(label=label or f"value:{x}")
    return x


@task
def square(x: int) -> int:
    Execution.objects.create(label=f"square:{x}")
    return x * x


@task
def add(a: int, b: int) -> int:
    Execution.objects.create(label=f"add:{a}+{b}")
    return a + b


@task
def total(results: list[int], label: str = "total") -> int:
    """A chord's callback: records when it ran, and what it got."""
    Execution.objects.create(label=f"{label}:{results}")
    return sum(results)


@task
def boom_step(label: str) -> None:
    Execution.objects.create(label=f"boom:{label}")
    raise RuntimeError(f"{label} went wrong")


@task(max_attempts=3, backoff=0)
def fails_twice(label: str) -> str:
    """Fails its first two attempts, then succeeds."""
    runs = Execution.objects.filter(label__startswith=f"fails_twice:{label}:").count()
    Execution.objects.create(label=f"fails_twice:{label}:{runs + 1}")
    if runs < 2:
        raise RuntimeError(f"attempt {runs + 1} of {label} fails")
    return label


@task
def fails_until_allowed(label: str) -> str:
    """Fails until an Execution "allow:LABEL" exists (an operator's fix, then Retry)."""
    Execution.objects.create(label=f"try:{label}")
    if not Execution.objects.filter(label=f"allow:{label}").exists():
        raise RuntimeError(f"{label} is not allowed yet")
    return label


@task(unique=True)
def unique_value(x: int) -> int:
    Execution.objects.create(label=f"unique_value:{x}")
    return x


@task
def chord_step(chord: int, i: int, seconds: float = 0.0) -> int:
    """A step of the race test's chords: records its end, after an optional sleep."""
    if seconds:
        time.sleep(seconds)
    Execution.objects.create(label=f"step:{chord}:{i}")
    return i


@task
def chord_callback(results: list[int], chord: int, size: int) -> int:
    """The race test's callback: records itself, and whether every step had ended."""
    done = Execution.objects.filter(label__startswith=f"step:{chord}:").count()
    Execution.objects.create(label=f"callback:{chord}:{'ok' if done == size else done}")
    assert results == list(range(size)), results
    return chord
