"""The admin as an operations console: every job visible, no state written by hand.

States move only through the conditional writes in managers/. No form saves anything;
the actions (actions.py, retry.py) call those writes.

Permissions: `view_job` shows jobs. `change_job` allows the Retry and Run now actions (the
job page stays read-only for everyone, superusers included). `delete_job` allows cancelling
(the Cancel action, or a live job's Cancel button), which deletes nothing: a queued job
fails as cancelled, a running one is asked to stop. No job is ever deleted from the admin.
"""

import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ..loading import load_task
from ..models import Job
from ..runner.stuck import Concern, why_stuck
from ..states import State
from ..task_options import option_sources, with_settings
from ..tasksapi import InvalidTask
from .attempts import attempt_label
from .dashboard import DashboardMixin
from .filters import (
    CappedPaginator,
    FailureReasonFilter,
    HasRetriesFilter,
    QueueFilter,
    StuckFilter,
    TaskFilter,
    date_navigation,
    state_counts,
)
from .holds import held_html
from .page import (
    JobChangeList,
    failure_html,
    format_duration,
    page_context,
    short_datetime,
    stuck_html,
)
from .retry import RetryActions
from .start import StartTaskAdmin

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

MAX_ID = 2**63 - 1  # the id column is a bigint
ERROR_FIELDSET = (_("Error"), {"fields": ["error_class", "error_message", "traceback_pre"]})
FIELDSETS = [
    (
        None,
        {
            "fields": [
                *["task_path", "state_badge", "failure_reason", "attempt_of", "origin"],
                *["result_id", "unique"],
            ]
        },
    ),
    ERROR_FIELDSET,
    (
        _("Arguments and result"),
        {"fields": ["args_json", "kwargs_json", "return_value_json", "metadata_json"]},
    ),
    (
        _("Where and when"),
        {
            "fields": [
                *["queue_name", "priority", "backend", "run_after", "enqueued_at"],
                *["started_at", "finished_at", "duration", "worker_id", "cancel_requested_at"],
            ]
        },
    ),
    (_("Options"), {"fields": ["max_attempts", "backoff", "timeout", "options_origin"]}),
]


def pretty_json(value: Any) -> str:
    return format_html(
        '<pre class="jobstate-pre">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False)
    )


@admin.register(Job)
class JobAdmin(DashboardMixin, StartTaskAdmin, RetryActions, admin.ModelAdmin):
    list_display = [
        "id",
        "task",
        "state_badge",
        "failure",
        "queue_name",
        "priority",
        "attempt_of",
        "enqueued",
        "started",
        "duration",
        "worker_id",
    ]
    list_filter = [
        "state",
        StuckFilter,
        FailureReasonFilter,
        QueueFilter,
        TaskFilter,
        HasRetriesFilter,
    ]
    search_fields = ["task_path", "worker_id__exact"]  # and ids: see get_search_results()
    search_help_text = _("A job id, a result id, a worker id, or part of a task's path.")
    date_hierarchy = "enqueued_at"
    ordering = ["-id"]
    actions = ["retry_jobs", "retry_jobs_cancelled_too", "run_now", "cancel_jobs"]
    # Never count the whole table: the paginator stops at SCAN_LIMIT, facets are off.
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fieldsets = cast("_FieldsetSpec", FIELDSETS)  # plain dicts where the stubs have a TypedDict
    readonly_fields = [name for _title, options in FIELDSETS for name in options["fields"]]

    class Media:
        css = {"all": ["django_jobstate/admin.css"]}

    # Permissions: derived from the state, never from a form.

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # no form writes a job: states move only through conditional writes

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # a job's record stays: cancelling is the Cancel action and button

    # The list.

    @admin.display(description=_("task"), ordering="task_path")
    def task(self, job: Job) -> str:
        return format_html('<span title="{}">{}</span>', job.task_path, job.task_name)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[JobChangeList]:
        return JobChangeList

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, job: Job) -> str:
        badge = format_html(
            '<span class="jobstate-badge jobstate-{}">{}</span>', job.state, job.get_state_display()
        )
        marks = why_stuck(job)
        overdue = Concern.CANCEL_OVERDUE in {mark.concern for mark in marks}
        if job.state == State.RUNNING and job.cancel_requested_at is not None and not overdue:
            ago = format_duration(timezone.now() - job.cancel_requested_at)
            note = _("cancel requested %(ago)s ago") % {"ago": ago}
            badge = format_html('{} <span class="jobstate-cancel">{}</span>', badge, note)
        badge = format_html("{} {}", badge, held_html(job)) if job.state == State.QUEUED else badge
        return format_html("{} {}", badge, stuck_html(marks)) if marks else badge

    @admin.display(description=_("failure"))
    def failure(self, job: Job) -> str | None:
        return failure_html(job)

    @admin.display(description=_("attempt"))
    def attempt_of(self, job: Job) -> str:
        return attempt_label(job, getattr(job, "handed_back", 0), getattr(job, "snoozed", 0))

    @admin.display(description=_("how queued"))
    def origin(self, job: Job) -> str:
        return getattr(job, "origin_text", "")  # set by render_change_form()

    @admin.display(description=_("enqueued"), ordering="enqueued_at")
    def enqueued(self, job: Job) -> str:
        return short_datetime(job.enqueued_at)

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, job: Job) -> str | None:
        return short_datetime(job.started_at) if job.started_at else None

    @admin.display(description=_("duration"))
    def duration(self, job: Job) -> str:
        if job.started_at is None:
            return self.get_empty_value_display()
        if job.finished_at is None:
            return _("%(duration)s so far") % {
                "duration": format_duration(timezone.now() - job.started_at)
            }
        return format_duration(job.finished_at - job.started_at)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        # A job id or a result id finds its rows through an index, not a scan of task paths.
        term = search_term.strip()
        # ASCII digits only: isdigit() is also true for "²", which int() refuses. Past
        # bigint, it cannot be an id: search it as text like any other term.
        if term.isascii() and term.isdigit() and int(term) <= MAX_ID:
            return queryset.filter(pk=int(term)), False
        try:
            return queryset.filter(result_id=uuid.UUID(term)), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        if cl := context.get("cl"):
            context["state_counts"] = state_counts(request, cl)
            context["date_navigation"] = date_navigation(cl)
            context["selection_note_all"] = _("All %(total_count)s selected") % {
                "total_count": cl.paginator.display_count
            }
        return response

    # The job page.

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        if obj is None or obj.state == State.FAILED:
            return FIELDSETS
        return [fieldset for fieldset in FIELDSETS if fieldset is not ERROR_FIELDSET]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Job | None = None,
    ) -> HttpResponse:
        if obj is not None:
            # Every attempt of this logical task, for the history table under the fields.
            attempts = list(Job.objects.attempts_of(obj.result_id))
            context.update(page_context(self, request, obj, attempts))
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.display(description=_("unique key"))
    def unique(self, job: Job) -> str:
        if job.unique_key is None:
            return self.get_empty_value_display()
        url = f"{self.changelist_url()}?{urlencode({'unique_key': job.unique_key})}"
        return format_html(
            '<code>{}…</code> ({}) <a href="{}">{}</a>',
            job.unique_key[:12],
            job.get_unique_scope_display(),
            url,
            _("every attempt and job with this key"),
        )

    @admin.display(description=_("where the options come from"))
    def options_origin(self, job: Job) -> str:
        """Each option's value and its source (JOBSTATE_TASK_OPTIONS, @task or a default),
        by today's settings and code; the row keeps max_attempts, backoff and timeout as
        they were at enqueue."""
        try:
            task = load_task(job.task_path)
            effective = with_settings(task)  # a retry_on path that no longer imports
            sources = option_sources(task)
        except InvalidTask as exc:
            return str(exc)
        stored = {"max_attempts": job.max_attempts, "backoff": job.backoff, "timeout": job.timeout}
        return format_html_join(
            "",
            '<div><code>{}</code> = {} <span class="help">({})</span></div>',
            (
                (name, stored[name] if name in stored else getattr(effective, name, None), source)
                for name, source in sources.items()
            ),
        )

    @admin.display(description=_("arguments"))
    def args_json(self, job: Job) -> str:
        return pretty_json(job.args)

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, job: Job) -> str:
        return pretty_json(job.kwargs)

    @admin.display(description=_("return value"))
    def return_value_json(self, job: Job) -> str:
        if job.state != State.SUCCEEDED:
            return self.get_empty_value_display()
        return pretty_json(job.return_value)

    @admin.display(description=_("metadata"))
    def metadata_json(self, job: Job) -> str:
        return pretty_json(job.metadata) if job.metadata else self.get_empty_value_display()

    @admin.display(description=_("traceback"))
    def traceback_pre(self, job: Job) -> str:
        if not job.traceback:
            return self.get_empty_value_display()
        return format_html('<pre class="jobstate-pre jobstate-traceback">{}</pre>', job.traceback)
