"""What a running attempt saves of itself: its metadata, fenced like an outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import InvalidPayload, LostRace
from ..payload import encode_payload
from ..states import State
from .base import Writes
from .conflicts import retries_conflicts

if TYPE_CHECKING:
    from ..models import Job


def check_metadata(metadata: Any) -> dict[str, Any]:
    """`metadata` as it will read back from JSON; InvalidPayload if it cannot be stored."""
    if not isinstance(metadata, dict):
        raise InvalidPayload(f"Job metadata must be a dict, not {type(metadata).__name__}.")
    value: dict[str, Any] = encode_payload(metadata, "Job metadata")[0]
    return value


class Progress(Writes):
    @retries_conflicts
    def save_metadata(self, job: Job, metadata: dict[str, Any]) -> None:
        """Write `job`'s metadata if it is still running for its worker; else LostRace.

        A zombie (an attempt failed as lost, whose body still runs) cannot overwrite what
        the next attempt saves.
        """
        value = check_metadata(metadata)
        fence = {"pk": job.pk, "state": State.RUNNING, "worker_id": job.worker_id}
        if self.using(job._state.db).filter(**fence).update(metadata=value) != 1:
            raise LostRace(
                f"Job {job.pk} was no longer running for worker {job.worker_id} when saving "
                f"its metadata: another writer moved it on. Nothing was changed."
            )
        job.metadata = value
