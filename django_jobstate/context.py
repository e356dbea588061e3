"""What a task declared with `takes_context=True` receives when this backend runs it:
Django's TaskContext, the job's metadata, and whether someone asked to cancel the attempt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from .exceptions import JobCancelled
from .tasksapi import TaskContext

if TYPE_CHECKING:
    from .models import Job


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStateContext(TaskContext):  # type: ignore[misc]  # frozen at runtime, not in the stubs
    """Django's TaskContext, plus the job's `metadata`, a way to save it, and cancel requests.

    `metadata` is the dict given at enqueue (`task.using(metadata={...})`), as the previous
    attempt left it; change it in place and call save_metadata() to store it, e.g. progress:
    `context.metadata["progress"] = "42 of 100 rows"`.
    """

    metadata: dict[str, Any] = field(default_factory=dict)
    _job: Job | None = field(default=None, repr=False, compare=False)
    # Reads the flag the attempt's supervisor (or watchdog) sets in shared memory: no query.
    cancel_flag: Callable[[], bool] = field(default=_never, repr=False, compare=False)

    def save_metadata(self) -> None:
        """Store `metadata` on the attempt, only while it is still this worker's: raises
        LostRace (and stores nothing) once it was failed as lost, timed out or cancelled."""
        if self._job is None:
            raise RuntimeError("save_metadata() needs a job run by a django_jobstate worker.")
        from .models import Job

        Job.objects.save_metadata(self._job, self.metadata)

    async def asave_metadata(self) -> None:
        """save_metadata() for an `async def` task."""
        await sync_to_async(self.save_metadata)()

    @property
    def cancel_requested(self) -> bool:
        """Whether someone asked to cancel this attempt. Stop at a safe point: return, or
        raise (raise_if_cancelled()); past JOBSTATE_CANCEL_GRACE the process is stopped."""
        return self.cancel_flag()

    def raise_if_cancelled(self) -> None:
        """Raise JobCancelled if someone asked to cancel this attempt."""
        if self.cancel_flag():
            raise JobCancelled("the task stopped at a cancel request")
