"""What a task that takes the context (`@task(takes_context=True)`) receives from this
backend's workers: Django's TaskContext, and whether someone asked to cancel the attempt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.tasks import TaskContext

from .exceptions import JobCancelled


def _never() -> bool:
    return False


# Django's TaskContext is frozen too; its stubs say otherwise.
@dataclass(frozen=True, slots=True, kw_only=True)
class JobStateContext(TaskContext):  # type: ignore[misc]
    # Reads the flag the attempt's supervisor (or watchdog) sets in shared memory: no query.
    cancel_flag: Callable[[], bool] = field(default=_never, repr=False, compare=False)

    @property
    def cancel_requested(self) -> bool:
        """Whether someone asked to cancel this attempt. Stop at a safe point: return, or
        raise (raise_if_cancelled()); past JOBSTATE_CANCEL_GRACE the process is stopped."""
        return self.cancel_flag()

    def raise_if_cancelled(self) -> None:
        """Raise JobCancelled if someone asked to cancel this attempt."""
        if self.cancel_flag():
            raise JobCancelled("the task stopped at a cancel request")
