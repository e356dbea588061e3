"""The Queues page: every queue with its waiting and running jobs, paused or not, and its
limits; the Pause and Resume actions, and each queue's page to change its limits (the
JobQueue rows that every claim reads)."""

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..models import Job, JobQueue
from ..queue_names import known_queues
from .filters import capped_count, display_count
from .queue_limits import QueueLimitsForm


@admin.register(JobQueue)
class JobQueueAdmin(admin.ModelAdmin):
    list_display = ["name", "status", "queued", "running", "limits", "changed_by", "changed_at"]
    ordering = ["name"]
    actions = ["pause", "resume"]
    form = QueueLimitsForm
    fields = ["name", "paused_at", "concurrency_limit", "rate_limit", "use_settings", "changed_by"]
    readonly_fields = ["name", "paused_at", "changed_by", "changed_at"]

    def save_model(self, request: HttpRequest, obj: JobQueue, form: Any, change: bool) -> None:
        # Only the limits, through their manager: never a save() of the whole row, which
        # would write back a pause read before.
        if form.has_changed():
            form.save_limits(by=f"admin:{request.user.get_username()}")

    @admin.display(description=gettext_lazy("limits"))
    def limits(self, queue: JobQueue) -> str:
        limits = queue.limits
        if not limits.limited:
            return "-"
        source = _("set here") if limits.source == "run time" else _("settings")
        return f"{limits.describe()} ({source})"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # every known queue is listed; a pause is the action

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a row is how a pause is stored; "resume" clears it

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # One row per known queue, so that each can be paused from here.
        missing = known_queues() - set(JobQueue.objects.values_list("name", flat=True))
        if missing and self.has_change_permission(request):
            JobQueue.objects.bulk_create(
                [JobQueue(name=name) for name in sorted(missing) if name], ignore_conflicts=True
            )
        return super().changelist_view(request, extra_context)

    @admin.display(description=gettext_lazy("status"), ordering="paused_at")
    def status(self, queue: JobQueue) -> str:
        if queue.paused_at is None:
            return _("running")
        since = queue.paused_at.strftime("%Y-%m-%d %H:%M:%S")
        return format_html(
            '<span class="jobstate-paused">{}</span>',
            _("paused since %(since)s") % {"since": since},
        )

    @admin.display(description=gettext_lazy("queued"))
    def queued(self, queue: JobQueue) -> str:
        # Two index ranges: the runnable index's (rows held by a concurrency limit are
        # not in it) and the held rows'; one count over both would read neither.
        waiting = Job.objects.queued().filter(queue_name=queue.name)
        held = waiting.filter(hold__isnull=False)  # as the held rows' index says it
        return display_count(capped_count(waiting.filter(hold=None)), capped_count(held))

    @admin.display(description=gettext_lazy("running"))
    def running(self, queue: JobQueue) -> str:
        return display_count(capped_count(Job.objects.running().filter(queue_name=queue.name)))

    @admin.action(description=gettext_lazy("Pause the selected queues"), permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[JobQueue]) -> None:
        self._change(request, queryset, pause=True)

    @admin.action(description=gettext_lazy("Resume the selected queues"), permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[JobQueue]) -> None:
        self._change(request, queryset, pause=False)

    def _change(self, request: HttpRequest, queryset: QuerySet[JobQueue], *, pause: bool) -> None:
        by = f"admin:{request.user.get_username()}"
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            write = JobQueue.objects.pause if pause else JobQueue.objects.resume
            queue = write(name, by=by)
            self.log_change(request, queue, "Paused" if pause else "Resumed")
        message = (
            ngettext(
                "Paused %(n)d queue: %(names)s.", "Paused %(n)d queues: %(names)s.", len(names)
            )
            if pause
            else ngettext(
                "Resumed %(n)d queue: %(names)s.", "Resumed %(n)d queues: %(names)s.", len(names)
            )
        )
        self.message_user(
            request, message % {"n": len(names), "names": ", ".join(names)}, messages.SUCCESS
        )
