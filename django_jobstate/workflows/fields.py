"""The columns of dependencies and workflows (managers/deps.py says how they are kept),
apart from models.py so that each stays short; Job takes them from here, with the table of
dependency edges, JobDependency.

A job that depends on others enters held (`hold = "deps"`, out of the claim's index) with
`pending_deps`, the number of the tasks it depends on that have not succeeded yet. Each
of those has `has_dependents` set, so that its success (or its failure for good) looks
up its dependents in JobDependency, in the transaction of that write; an ordinary job
has it False and its success does nothing more than before.
"""

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..db import indexes as db_indexes
from ..limits.concurrency import Hold


class WorkflowFields(models.Model):
    """Job's dependency columns: NULL (False) for a job outside any workflow."""

    # The workflow a step belongs to (workflows.chain(...).enqueue() and the like): the
    # whole can be read back by it. NULL for any other job.
    workflow_id = models.UUIDField(_("workflow"), null=True, blank=True, editable=False)
    # How many of the tasks it depends on have not succeeded yet; held while above 0.
    # NULL for a job that depends on nothing.
    pending_deps = models.IntegerField(
        _("pending dependencies"), null=True, blank=True, editable=False
    )
    # Whether another task depends on this one's result: its final outcome then releases
    # (or fails) them in the same transaction. Kept by every attempt of the task.
    has_dependents = models.BooleanField(
        _("has dependents"), default=False, db_default=False, editable=False
    )
    # What the task is given of the results of the tasks it depends on, written into its
    # arguments when it is released: "one:NAME" (the one result, as keyword NAME),
    # "list:NAME" (the list of results, in order), "list:" (that list as the first
    # positional argument). NULL: nothing.
    receives = models.CharField(  # noqa: DJ001
        _("receives results as"), max_length=110, null=True, blank=True, editable=False
    )

    class Meta:
        abstract = True

    # Job's Meta takes these (models.py).
    CONSTRAINTS = [
        # Held for its dependencies: only with some pending. Otherwise held by its limit or
        # its rate, or not, with no count or a count of 0 or more.
        models.CheckConstraint(
            condition=Q(pending_deps__gte=1, hold=Hold.DEPS)
            | (Q(pending_deps=None) | Q(pending_deps__gte=0))
            & (Q(hold=None) | Q(hold__in=[Hold.LIMIT, Hold.RATE])),
            name="jobstate_job_pending_deps",
        ),
    ]

    INDEXES = [
        # The steps of a workflow (workflows.get_workflow(), the admin's picture). Only steps
        # have an entry.
        db_indexes.Index(
            fields=["workflow_id"],
            condition=Q(workflow_id__isnull=False),
            name="jobstate_job_by_workflow",
        ),
    ]


class JobDependency(models.Model):
    """One edge of a workflow: `downstream` (a task's result id) waits for `upstream` to
    succeed. `position` orders the results a step receives (a chord's callback: the
    group's results in the group's order)."""

    id = models.BigAutoField(primary_key=True)
    upstream = models.UUIDField(_("depends on (result id)"), editable=False)
    downstream = models.UUIDField(_("dependent (result id)"), editable=False)
    position = models.IntegerField(_("position"), default=0, editable=False)

    class Meta:
        verbose_name = _("job dependency")
        verbose_name_plural = _("job dependencies")
        constraints = [
            # Also the index of a task's dependencies (the admin's picture, the results
            # a step receives, an operator's retry).
            models.UniqueConstraint(
                fields=["downstream", "upstream"], name="jobstate_dependency_once"
            ),
        ]
        indexes = [
            # The dependents of a task that finished: the release's lookup.
            models.Index(fields=["upstream"], name="jobstate_dependency_upstream"),
        ]

    def __str__(self) -> str:
        return f"{self.downstream} after {self.upstream}"
