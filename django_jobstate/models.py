"""The Job table: one row per attempt of a task (what the database refuses in one:
job_checks.py; the other tables: heartbeats.py, queues.py, schedules/model.py,
limits/fields.py, workflows/fields.py)."""

from datetime import timedelta

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

# The other tables, each in its own module (Django finds an app's models in this one).
from .db import indexes as db_indexes
from .heartbeats import WorkerHeartbeat as WorkerHeartbeat
from .job_checks import CHECKS
from .limits import fields as limit_fields
from .limits.fields import ConcurrencyLock as ConcurrencyLock
from .limits.fields import TaskRate as TaskRate
from .managers import JobManager
from .payload import PayloadField
from .queues import JobQueue as JobQueue
from .schedules.model import Schedule as Schedule
from .states import LIVE_STATES, FailureReason, State
from .uniqueness import HOLDS_KEY, KEY_INDEX, UniqueScope
from .workflows.fields import JobDependency as JobDependency
from .workflows.fields import WorkflowFields

_DEFAULT: dict = {"default": "default", "db_default": "default"}


class Job(limit_fields.ConcurrencyFields, WorkflowFields):
    """One attempt of one enqueued task; its next attempt, if any, is a new row.

    Its concurrency limit's columns come from ConcurrencyFields (limits/fields.py), its
    dependencies' from WorkflowFields (workflows/fields.py)."""

    State = State
    FailureReason = FailureReason

    # A db_default beside a default: the database fills the column in, so an enqueue's
    # INSERT sends only the values that differ from it (JobManager._insert).
    result_id = models.UUIDField(
        _("result id"), editable=False, help_text=_("The TaskResult id, shared by every attempt.")
    )
    # Not Positive*Field: their own CHECK (>= 0) would repeat jobstate_job_attempt's (>= 1), and
    # PostgreSQL compiles every CHECK of the table for each INSERT statement.
    attempt = models.IntegerField(_("attempt"), default=1, db_default=1, editable=False)
    # Not a OneToOneField: its unique index would hold every first attempt's NULL too, and
    # every write of a row would update it. The partial unique constraint below holds only
    # the links.
    previous = models.ForeignKey(
        "self",
        verbose_name=_("previous attempt"),
        null=True,
        blank=True,
        editable=False,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    task_path = models.CharField(_("task"), max_length=255, editable=False)
    args = PayloadField(_("args"), default=list, editable=False)
    kwargs = PayloadField(_("kwargs"), default=dict, editable=False)
    backend = models.CharField(_("backend alias"), max_length=100, **_DEFAULT)
    queue_name = models.CharField(_("queue"), max_length=100, **_DEFAULT)
    priority = models.SmallIntegerField(_("priority"), default=0, db_default=0)
    run_after = models.DateTimeField(_("run after"))
    max_attempts = models.SmallIntegerField(_("max attempts"), default=1, db_default=1)
    backoff = models.FloatField(_("backoff (s)"), default=0, db_default=0)
    timeout = models.FloatField(_("timeout (s)"), null=True, blank=True)
    state = models.CharField(
        _("state"),
        max_length=16,
        choices=State.choices,
        default=State.QUEUED,
        db_default=State.QUEUED,
        editable=False,
    )
    enqueued_at = models.DateTimeField(_("enqueued at"), editable=False)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True, editable=False)
    # NULL, not "", means "no worker": the state constraints test it with IS NULL.
    worker_id = models.CharField(  # noqa: DJ001
        _("worker"), max_length=64, null=True, blank=True, editable=False
    )
    return_value = PayloadField(_("return value"), null=True, blank=True, editable=False)
    failure_reason = models.CharField(
        _("failure reason"),
        max_length=16,
        choices=FailureReason.choices,
        blank=True,
        default="",
        db_default="",
    )
    error_class = models.CharField(
        _("error class"), max_length=255, blank=True, default="", db_default=""
    )
    error_message = models.TextField(_("error message"), blank=True, default="", db_default="")
    traceback = models.TextField(_("traceback"), blank=True, default="", db_default="")
    # NULL for a job that is not unique, so that it has no entry in the unique indexes.
    unique_key = models.CharField(  # noqa: DJ001
        _("unique key"),
        max_length=64,
        null=True,
        blank=True,
        editable=False,
        help_text=_("SHA-256 of the task and the arguments it is unique by."),
    )
    unique_scope = models.CharField(  # noqa: DJ001
        _("unique scope"),
        max_length=8,
        choices=UniqueScope.choices,
        null=True,
        blank=True,
        editable=False,
    )
    # Periodic jobs (schedules.py): the schedule and the tick that enqueued the job, kept by
    # its retries; NULL for a job enqueued otherwise.
    schedule_name = models.CharField(  # noqa: DJ001
        _("schedule"), max_length=200, null=True, blank=True, editable=False
    )
    scheduled_for = models.DateTimeField(_("scheduled for"), null=True, blank=True, editable=False)

    deduplicated = False  # True on the live job a unique key's enqueue returned instead
    # What the task says of itself ("42 of 100 rows"): set at enqueue, saved by the task
    # while it runs (JobStateContext.save_metadata), copied to the next attempt.
    metadata = PayloadField(_("metadata"), default=dict, db_default={}, blank=True, editable=False)
    # The W3C trace context of the enqueue, with JOBSTATE_TRACING (tracing.py); NULL without.
    trace_context = models.JSONField(_("trace context"), null=True, blank=True, editable=False)
    # When someone asked to cancel this attempt (database clock): set with the move to
    # failed for a queued one, alone for a running one (its worker is asked to stop).
    cancel_requested_at = models.DateTimeField(
        _("cancel requested at"), null=True, blank=True, editable=False
    )

    objects = JobManager()

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        # Starting any task with any arguments is more than changing jobs: asked for apart.
        permissions = [("enqueue_task", _("Can start any task by hand"))]
        constraints = [
            *CHECKS,  # what the row may hold (job_checks.py)
            models.UniqueConstraint(
                fields=["result_id", "attempt"], name="jobstate_job_one_row_per_attempt"
            ),
            # Periodic jobs: one first attempt per tick of a schedule, whoever inserts it (the
            # scheduler's compare-and-set already sees to it; this is the backstop).
            db_indexes.UniqueConstraint(
                fields=["schedule_name", "scheduled_for"],
                condition=Q(schedule_name__isnull=False, attempt=1),
                name="jobstate_job_one_job_per_tick",
            ),
            db_indexes.UniqueConstraint(
                fields=["previous"],
                condition=Q(previous__isnull=False),
                name="jobstate_job_one_next_attempt",
            ),
            # Two workers or two reapers can never both create the next attempt. "Live" is
            # said as "not finished", which the state constraints above make the same as
            # queued or running: a condition on the state would let PostgreSQL serve the
            # claim's candidates from this index, in the wrong order, and sort them all,
            # whenever its statistics said that few rows are queued (17 ms per claim, not 1).
            db_indexes.UniqueConstraint(
                fields=["result_id"],
                condition=Q(finished_at__isnull=True),
                name="jobstate_job_one_live_attempt",
            ),
            # Unique jobs (uniqueness.py): at most one live, or one queued, attempt per key.
            # Partial on unique_scope, which ordinary jobs leave NULL: they write no entry.
            # "Live" is "not finished" for the reason given above; the claim never names
            # unique_scope, so neither index can be picked for it.
            *(
                db_indexes.UniqueConstraint(
                    fields=["unique_key"], condition=HOLDS_KEY[scope], name=KEY_INDEX[scope]
                )
                for scope in UniqueScope
            ),
            *limit_fields.CONSTRAINTS,
            *WorkflowFields.CONSTRAINTS,
        ]
        indexes = [
            # The claim's candidates, per queue in the claim's order; only queued rows are
            # in it. Queue first, so that a claim from one queue never walks another's
            # backlog (a claim from several merges their heads: managers/claim.py). The
            # order is all ascending (-priority, not priority DESC), so that a claim can
            # start from a key: JobManager.claim(from_key=...). Rows held by a concurrency
            # limit are not in it (limits/fields.py): a claim never walks them.
            db_indexes.Index(
                F("queue_name"),
                -F("priority"),
                F("run_after"),
                F("id"),
                condition=Q(state=State.QUEUED, hold=None),
                name="jobstate_job_runnable",
            ),
            db_indexes.Index(
                fields=["worker_id"], condition=Q(state=State.RUNNING), name="jobstate_job_running"
            ),
            # The admin: capped counts per state, and the list filtered by state, newest first.
            # Partial, one per terminal state, so that a row enters one only when it finishes
            # (queued and running rows are in the two above): an index on (state, id) would
            # take a new entry at every write of a row, as PostgreSQL writes a new version.
            # MariaDB/MySQL would get them whole, the primary key's twins: migration 0019
            # drops them there.
            db_indexes.Index(
                fields=["-id"], condition=Q(state=State.SUCCEEDED), name="jobstate_job_succeeded"
            ),
            db_indexes.Index(
                fields=["-id"], condition=Q(state=State.FAILED), name="jobstate_job_failed"
            ),
            # The admin's link from a job to every job with its unique key. Only unique jobs
            # have an entry.
            db_indexes.Index(
                fields=["unique_key"],
                condition=Q(unique_key__isnull=False),
                name="jobstate_job_by_unique_key",
            ),
            # The admin's date navigation (MIN/MAX) and its date ranges.
            # (Whole, but one of ours: Django warns of the expression index above from each.)
            db_indexes.Index(fields=["enqueued_at"], name="jobstate_job_by_enqueued"),
            # prune() (and the retention schedule): the attempts finished before a time.
            # Only finished rows have an entry, each written once, when it finishes.
            db_indexes.Index(
                fields=["finished_at"],
                condition=Q(finished_at__isnull=False),
                name="jobstate_job_by_finished",
            ),
            *limit_fields.INDEXES,
            *WorkflowFields.INDEXES,
        ]

    def __str__(self) -> str:
        return f"{self.task_name} #{self.pk} (attempt {self.attempt}, {self.state})"

    @property
    def task_name(self) -> str:
        return self.task_path.rpartition(".")[2]

    @property
    def is_terminal(self) -> bool:
        return self.state not in LIVE_STATES

    @property
    def duration(self) -> timedelta | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at
