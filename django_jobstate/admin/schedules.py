"""The admin of periodic jobs: each schedule, its next and last tick, and three actions.

The settings' schedules (origin "settings") are read-only here. Schedules made here
(origin "admin") are added, edited and deleted with Django's permissions on Schedule
(add, change, delete); the form checks them as the settings' are (schedule_form.py), and
each write is conditional on the row as read (schedules/edits.py). `change_schedule`
allows the actions: Enable and Disable (stored, so they persist across restarts of every
runjobs, until the settings change the definition) and Run now (an extra job of the
schedule, now, leaving its ticks alone). Each change is in the admin log (LogEntry).
"""

from typing import Any

from django.contrib import admin, messages
from django.db import router, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..models import Job, Schedule
from ..schedules import edits
from ..schedules.definitions import Definition, relative
from ..schedules.model import Origin
from ..schedules.writes import db_now, enqueue_tick
from ..states import State
from ..tasksapi import InvalidTask
from .filters import local
from .schedule_form import FORM_FIELDS, ScheduleForm

FIELDS = [
    *["name", "origin", "task_path", "expression", "enabled", "next_tick", "last_tick"],
    *["last_job", "skipped", "last_skipped_at", "missed", "removed_at", "args", "kwargs"],
    *["backend", "queue_name", "priority", "unique", "catch_up", "max_lateness"],
    "definition_hash",
]
# Shown under the form of a schedule made here: what the runjobs made of it.
STATUS = [
    *["origin", "backend", "next_tick", "last_tick", "last_job", "skipped", "last_skipped_at"],
    *["missed", "definition_hash"],
]


def when(value: Any, now: Any) -> str:
    """'2026-01-05 03:00:00 (in 4 minutes)' or '(5 minutes ago)'."""
    if value is None:
        return "-"
    return f"{local(value).strftime('%Y-%m-%d %H:%M:%S')} ({relative(value, now)})"


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = [
        *["name", "origin", "task", "expression", "enabled_badge", "next_tick", "last_job"],
        "skipped_missed",
    ]
    list_filter = ["origin", "enabled", "removed_at"]
    search_fields = ["name", "task_path"]
    ordering = ["name"]
    actions = ["enable", "disable", "run_now"]
    form = ScheduleForm

    class Media:
        css = {"all": ["django_jobstate/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        newest = Job.objects.filter(result_id=OuterRef("last_result_id")).order_by("-attempt")
        return (
            super()
            .get_queryset(request)
            .annotate(
                last_state=Subquery(newest.values("state")[:1]),
                last_job_id=Subquery(newest.values("pk")[:1]),
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobstate.add_schedule")

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # The settings' schedules have no form (the actions make their only writes).
        if obj is not None and obj.origin != Origin.ADMIN:
            return False
        return request.user.has_perm("django_jobstate.change_schedule")

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # One at a time, from its page (no bulk delete, which would not ask each row).
        # A settings' schedule only once gone from them: a live one would come back.
        if obj is None or (obj.origin == Origin.SETTINGS and obj.removed_at is None):
            return False
        return request.user.has_perm("django_jobstate.delete_schedule")

    def get_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        if obj is None:
            return FORM_FIELDS
        if self.has_change_permission(request, obj):
            return FORM_FIELDS + STATUS
        return FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        if obj is None:
            return []
        if self.has_change_permission(request, obj):
            return ["name", *STATUS]  # the name is the key its jobs carry
        return FIELDS

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        """Store through edits.py: conditional on the row as read, and a notification."""
        try:
            if not change:
                row = edits.add(form.definition)
            else:
                row = edits.edit(Schedule.objects.get(pk=obj.pk), form.definition)
        except (edits.ScheduleChanged, Schedule.DoesNotExist) as exc:
            # Nothing written: no "added/changed successfully", no entry in the admin log.
            self.message_user(request, str(exc), messages.ERROR)
            request.jobstate_not_saved = True  # type: ignore[attr-defined]
            return
        obj.__dict__.update(
            {f.attname: getattr(row, f.attname) for f in Schedule._meta.concrete_fields}
        )

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if not getattr(request, "jobstate_not_saved", False):
            return super().log_addition(request, obj, message)
        return None

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if not getattr(request, "jobstate_not_saved", False):
            return super().log_change(request, obj, message)
        return None

    def response_add(self, request: HttpRequest, obj: Schedule, *args: Any) -> HttpResponse:
        if getattr(request, "jobstate_not_saved", False):
            return redirect("admin:django_jobstate_schedule_changelist")
        return super().response_add(request, obj, *args)

    def response_change(self, request: HttpRequest, obj: Schedule) -> HttpResponse:
        if getattr(request, "jobstate_not_saved", False):
            return redirect("admin:django_jobstate_schedule_changelist")
        return super().response_change(request, obj)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobstate.change_schedule")

    @admin.display(description=_("task"), ordering="task_path")
    def task(self, schedule: Schedule) -> str:
        return format_html(
            '<span title="{}">{}</span>', schedule.task_path, schedule.task_path.rpartition(".")[2]
        )

    @admin.display(description=_("schedule"))
    def expression(self, schedule: Schedule) -> str:
        return schedule.expression

    @admin.display(description=_("enabled"), ordering="enabled")
    def enabled_badge(self, schedule: Schedule) -> str:
        if schedule.removed_at is not None:
            return format_html(
                '<span class="jobstate-badge jobstate-failed">{}</span>', _("removed")
            )
        state, text = ("succeeded", _("enabled")) if schedule.enabled else ("queued", _("disabled"))
        return format_html('<span class="jobstate-badge jobstate-{}">{}</span>', state, text)

    @admin.display(description=_("next tick"), ordering="next_tick_at")
    def next_tick(self, schedule: Schedule) -> str:
        if not schedule.enabled or schedule.removed_at is not None:
            return "-"
        return when(schedule.next_tick_at, timezone.now())

    @admin.display(description=_("last tick"), ordering="last_tick_at")
    def last_tick(self, schedule: Schedule) -> str:
        return when(schedule.last_tick_at, timezone.now())

    @admin.display(description=_("skip / miss"))
    def skipped_missed(self, schedule: Schedule) -> str:
        # One column for both: the list fits 1366 px beside the origin.
        return f"{schedule.skipped} / {schedule.missed}"

    @admin.display(description=_("last job"), ordering="last_tick_at")
    def last_job(self, schedule: Schedule) -> str:
        state = getattr(schedule, "last_state", None)
        if state is None:
            return "-"
        url = reverse("admin:django_jobstate_job_change", args=[schedule.last_job_id])  # type: ignore[attr-defined]
        jobs = reverse("admin:django_jobstate_job_changelist")
        # Its tick's time too (one column less: the list fits 1366 px).
        return format_html(
            '<a href="{}"><span class="jobstate-badge jobstate-{}">{}</span></a> '
            '<span class="jobstate-last-tick" title="{}">{}</span> <a href="{}?{}">{}</a>',
            url,
            state,
            State(state).label,
            when(schedule.last_tick_at, timezone.now()),
            relative(schedule.last_tick_at, timezone.now()),
            jobs,
            urlencode({"schedule_name": schedule.name}),
            _("all its jobs"),
        )

    @admin.action(description=_("Enable the selected schedules"), permissions=["operate"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        # From the next tick after now: the ticks missed while disabled are not due.
        self._set_enabled(request, queryset, True)

    @admin.action(description=_("Disable the selected schedules"), permissions=["operate"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Schedule], on: bool) -> None:
        changed = 0
        for schedule in queryset.filter(enabled=not on, removed_at=None):
            if edits.set_enabled(schedule, on):
                changed += 1
                self.log_change(request, schedule, "Enabled." if on else "Disabled.")
        self._report(request, changed, queryset, _("enabled") if on else _("disabled"))

    @admin.action(description=_("Run the selected schedules now"), permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        db = router.db_for_write(Schedule)
        done: list[tuple[str, Job]] = []
        skipped: list[tuple[str, Job]] = []
        for schedule in queryset.filter(removed_at=None):
            definition = Definition.from_row(schedule)
            try:
                with transaction.atomic(using=db):
                    job = enqueue_tick(
                        db, definition, db_now(db), last_result_id=schedule.last_result_id
                    )
            except (InvalidTask, TypeError, ValueError) as exc:  # its task, its arguments
                self.message_user(
                    request,
                    format_html("{} {}: {}", _("Not enqueued:"), schedule.name, str(exc)),
                    messages.ERROR,
                )
                continue
            (skipped if job.deduplicated else done).append((schedule.name, job))
            if not job.deduplicated:  # work started by hand: who, as Start a task logs it
                self.log_change(request, schedule, f"Run now: job #{job.pk}.")
        link = "<a href='{}'>{} (job {})</a>"

        def links(pairs: list[tuple[str, Job]]) -> str:
            return format_html_join(
                ", ",
                link,
                (
                    (reverse("admin:django_jobstate_job_change", args=[j.pk]), n, j.pk)
                    for n, j in pairs
                ),
            )

        if done:
            self.message_user(request, format_html("{} {}", _("Enqueued:"), links(done)))
        if skipped:
            self.message_user(
                request,
                format_html(
                    "{} {}",
                    _(
                        "Not enqueued, a job with the same unique key is still live (their "
                        "last run, or another job of their task):"
                    ),
                    links(skipped),
                ),
                messages.WARNING,
            )

    def _report(
        self, request: HttpRequest, changed: int, queryset: QuerySet[Schedule], what: Any
    ) -> None:
        total = queryset.count()
        message = ngettext("%(n)d schedule %(what)s.", "%(n)d schedules %(what)s.", changed) % {
            "n": changed,
            "what": what,
        }
        if changed < total:
            message += " " + _("%(n)d already were, or are removed.") % {"n": total - changed}
        self.message_user(request, message, messages.SUCCESS if changed else messages.WARNING)
