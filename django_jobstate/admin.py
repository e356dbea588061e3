"""The admin: every job visible, nothing editable by hand, only queued jobs cancellable."""

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .exceptions import LostRace
from .models import Job
from .states import State


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "task_name",
        "state",
        "queue_name",
        "priority",
        "attempt_of",
        "enqueued_at",
        "started_at",
        "finished_at",
        "worker_id",
    ]
    list_filter = ["state", "queue_name"]
    search_fields = ["task_path", "=result_id", "=worker_id"]
    ordering = ["-id"]
    fields = readonly_fields = [
        "result_id",
        "task_path",
        "state",
        "failure_reason",
        "attempt",
        "max_attempts",
        "previous",
        "queue_name",
        "priority",
        "backend",
        "args",
        "kwargs",
        "run_after",
        "enqueued_at",
        "started_at",
        "finished_at",
        "worker_id",
        "timeout",
        "backoff",
        "return_value",
        "error_class",
        "error_message",
        "traceback",
    ]

    @admin.display(description="attempt")
    def attempt_of(self, job: Job) -> str:
        return f"{job.attempt}/{job.max_attempts}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # states move only through the worker's conditional writes

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        if obj is not None and obj.state != State.QUEUED:
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        try:
            Job.objects.cancel(obj)
        except LostRace as exc:
            self.message_user(request, str(exc), level="warning")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        queryset.filter(state=State.QUEUED).delete()
