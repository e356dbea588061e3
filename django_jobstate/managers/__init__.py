"""Conditional writes of Job rows: the only code that writes a state.

Every write names the state it expects (and, for a running attempt, the worker that owns
it). When the row has moved on, the write matches zero rows, changes nothing and raises
LostRace. JobManager is assembled from one part per kind of write: enqueue.py (and
unique.py, for unique tasks), claim.py, outcomes.py (succeed, fail, retry), settle.py
(rescue, release, time out: fail() on behalf of a worker), cancel.py, limits.py (the
slots of concurrency limits), progress.py (a running attempt's metadata) and prune.py;
base.py holds the one state check and fence they share (Writes._transition).
"""

from ..exceptions import class_path, describe_error, storable_text
from .base import (
    ClaimKey,
    claim_key,
    close_connection,
    connection_lost,
    timeout_error,
    writing,
)
from .cancel import Cancel, CancelOutcome
from .claim import Claim
from .enqueue import Enqueue
from .insert import ENQUEUE_CHUNK
from .outcomes import backoff_delay
from .progress import Progress, check_metadata
from .prune import Prune
from .result_ids import uuid7
from .settle import Settle

__all__ = [
    "ENQUEUE_CHUNK",
    "CancelOutcome",
    "ClaimKey",
    "JobManager",
    "backoff_delay",
    "check_metadata",
    "claim_key",
    "class_path",
    "close_connection",
    "connection_lost",
    "describe_error",
    "storable_text",
    "timeout_error",
    "uuid7",
    "writing",
]


class JobManager(Enqueue, Claim, Settle, Cancel, Progress, Prune):
    """Job.objects: the reads of JobQuerySet, and every write of a Job row."""
