"""The admin of periodic jobs: each schedule, its next and last tick, and three actions.

Definitions come from the settings and are read-only here. `change_schedule` allows the
actions: Enable and Disable (stored, so they persist across restarts of every runjobs,
until the settings change the definition) and Run now (an extra job of the schedule,
now, leaving its ticks alone).
"""

from typing import Any

from django.contrib import admin, messages
from django.db import router, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..models import Job, Schedule
from ..schedules.definitions import Definition, relative
from ..schedules.writes import db_now, enqueue_tick
from ..states import State
from ..tasksapi import InvalidTask
from .filters import local

FIELDS = [
    *["name", "task_path", "expression", "enabled", "next_tick", "last_tick", "last_job"],
    *["skipped", "last_skipped_at", "missed", "removed_at", "args", "kwargs", "backend"],
    *["queue_name", "priority", "unique", "catch_up", "max_lateness", "definition_hash"],
]


def when(value: Any, now: Any) -> str:
    """'2026-01-05 03:00:00 (in 4 minutes)' or '(5 minutes ago)'."""
    if value is None:
        return "-"
    return f"{local(value).strftime('%Y-%m-%d %H:%M:%S')} ({relative(value, now)})"


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = [
        *["name", "task", "expression", "enabled_badge", "next_tick", "last_tick", "last_job"],
        *["skipped", "missed"],
    ]
    list_filter = ["enabled", "removed_at"]
    search_fields = ["name", "task_path"]
    ordering = ["name"]
    actions = ["enable", "disable", "run_now"]
    fields = tuple(FIELDS)
    readonly_fields = FIELDS

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
        return False  # schedules are defined in the settings

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False  # no form: the actions make the only writes

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A schedule gone from the settings may go; a live one would come back at once.
        if obj is None or obj.removed_at is None:
            return False
        return request.user.has_perm("django_jobstate.delete_schedule")

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

    @admin.display(description=_("last job"))
    def last_job(self, schedule: Schedule) -> str:
        state = getattr(schedule, "last_state", None)
        if state is None:
            return "-"
        url = reverse("admin:django_jobstate_job_change", args=[schedule.last_job_id])  # type: ignore[attr-defined]
        jobs = reverse("admin:django_jobstate_job_changelist")
        return format_html(
            '<a href="{}"><span class="jobstate-badge jobstate-{}">{}</span></a> '
            '<a href="{}?{}">{}</a>',
            url,
            state,
            State(state).label,
            jobs,
            urlencode({"schedule_name": schedule.name}),
            _("all its jobs"),
        )

    @admin.action(description=_("Enable the selected schedules"), permissions=["operate"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        db = router.db_for_write(Schedule)
        now = db_now(db)
        changed = 0
        for schedule in queryset.filter(enabled=False, removed_at=None):
            # From the next tick after now: the ticks missed while disabled are not due.
            nxt = Definition.from_row(schedule).next_tick(now)
            changed += Schedule.objects.filter(pk=schedule.pk, enabled=False).update(
                enabled=True, next_tick_at=nxt
            )
        self._report(request, changed, queryset, _("enabled"))

    @admin.action(description=_("Disable the selected schedules"), permissions=["operate"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        changed = queryset.filter(enabled=True).update(enabled=False)
        self._report(request, changed, queryset, _("disabled"))

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
