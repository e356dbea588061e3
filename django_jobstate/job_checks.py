"""What the database refuses in a job row, whoever writes it: the fields each state implies
(a queued row has no worker, only a failed row a failure reason...), the values a state,
a failure reason, a priority or a unique scope may take, and a schedule's tick whole.
Job.Meta takes them (models.py), beside limits/fields.py's and workflows/fields.py's. The
moves between states are states.py's; these are the database's backstop for any write,
the app's or not.
"""

from django.db import models
from django.db.models import Q

from .states import FailureReason, State
from .uniqueness import UniqueScope

_STARTED = Q(started_at__isnull=False, worker_id__isnull=False)
_NOT_FAILED = Q(failure_reason="")
_CANCELLED = Q(failure_reason=FailureReason.CANCELLED)
_NEVER_STARTED = Q(failure_reason__in=[FailureReason.CANCELLED, FailureReason.UPSTREAM_FAILED])


CHECKS = [
    models.CheckConstraint(condition=Q(state__in=State.values), name="jobstate_job_state"),
    models.CheckConstraint(
        condition=Q(failure_reason__in=["", *FailureReason.values]),
        name="jobstate_job_failure_reason",
    ),
    models.CheckConstraint(
        condition=Q(priority__gte=-100, priority__lte=100), name="jobstate_job_priority"
    ),
    models.CheckConstraint(
        condition=Q(attempt__gte=1, max_attempts__gte=1), name="jobstate_job_attempt"
    ),
    # The fields each state implies.
    models.CheckConstraint(
        condition=~Q(state=State.QUEUED)
        | Q(started_at=None, finished_at=None, worker_id=None, cancel_requested_at=None)
        & _NOT_FAILED,
        name="jobstate_job_queued_fields",
    ),
    models.CheckConstraint(
        condition=~Q(state=State.RUNNING) | _STARTED & Q(finished_at=None) & _NOT_FAILED,
        name="jobstate_job_running_fields",
    ),
    models.CheckConstraint(
        condition=~Q(state=State.SUCCEEDED) | _STARTED & Q(finished_at__isnull=False) & _NOT_FAILED,
        name="jobstate_job_succeeded_fields",
    ),
    # Failed: started by a worker, or cancelled or failed upstream while queued
    # (never started); a cancelled attempt was asked to be.
    models.CheckConstraint(
        condition=~Q(state=State.FAILED)
        | Q(finished_at__isnull=False)
        & ~_NOT_FAILED
        & (_STARTED | Q(started_at=None, worker_id=None) & _NEVER_STARTED)
        & (~_CANCELLED | Q(cancel_requested_at__isnull=False)),
        name="jobstate_job_failed_fields",
    ),
    models.CheckConstraint(
        condition=Q(unique_key=None, unique_scope=None)
        # NOT NULL too: IN with a NULL is unknown, which a CHECK lets through.
        | Q(
            unique_key__isnull=False,
            unique_scope__isnull=False,
            unique_scope__in=UniqueScope.values,
        ),
        name="jobstate_job_unique_scope",
    ),
    models.CheckConstraint(
        condition=Q(schedule_name=None, scheduled_for=None)
        | Q(schedule_name__isnull=False, scheduled_for__isnull=False),
        name="jobstate_job_schedule_tick",
    ),
]
