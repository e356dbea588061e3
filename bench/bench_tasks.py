"""The benchmark's tasks. A no-op writes nothing: each system's own rows are the record."""

from django.tasks import task


@task
def noop() -> None:
    """Do nothing: the benchmark measures the runner, not the work."""


@task
def old_noop() -> None:
    """The task path of the pre-filled history rows, so counts can tell them apart."""


@task
def warmup() -> None:
    """Run once before the latency feed, to know the worker is up and polling."""
