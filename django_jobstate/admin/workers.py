"""The Workers page: every worker process that heartbeats, what it holds, and the silent.

A read-only changelist of WorkerHeartbeat rows (one per worker process; a `runjobs`
supervisor beats for its workers, a worker run in-process for itself). Silence is judged
as the rescuer judges it, by the database clock: each row is read with the database's
now, in the query that reads the rows. The attempts the shown workers hold are read in
one more query for the page, through the index of running attempts by worker
(jobstate_job_running): neither grows with the job table's history.
"""

from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..conf import get_settings
from ..db.clock import Now
from ..models import Job, WorkerHeartbeat
from ..runner.stuck import silent_after
from .held import attach_attempts, is_silent, relative, rescue_at, silence, unseen_html
from .page import format_duration, short_datetime


class WorkerChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows: list[WorkerHeartbeat] = list(self.result_list)
        attach_attempts(rows)
        self.result_list = rows


FIELDS = [
    *["worker_id", "host", "pid", "supervisor", "supervisor_pid", "queues"],
    *["concurrency", "in_flight", "started", "last_beat", "holds"],
]


class QueueFilter(admin.SimpleListFilter):
    """The workers that take jobs from a queue: those named for it, and those serving all."""

    title = gettext_lazy("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # One row per worker process: the table is as small as the fleet.
        names = {
            name
            for (queues,) in WorkerHeartbeat.objects.values_list("queues")
            for name in queues or []
        }
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        name = self.value()
        if name is None:
            return queryset
        # In Python: SQLite has no JSON containment lookup, and the table is small.
        rows = WorkerHeartbeat.objects.values_list("worker_id", "queues")
        ids = [worker_id for worker_id, queues in rows if queues is None or name in queues]
        return queryset.filter(worker_id__in=ids)


class StatusFilter(admin.SimpleListFilter):
    title = gettext_lazy("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("alive", _("beating")), ("silent", _("silent"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        cutoff = Now() - timedelta(seconds=silent_after())
        if self.value() == "silent":
            return queryset.filter(last_seen__lt=cutoff)
        if self.value() == "alive":
            return queryset.filter(last_seen__gte=cutoff)
        return queryset


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = [
        *["worker", "process", "supervised_by", "queue_names", "last_beat", "holds"],
    ]
    list_display_links = None
    list_filter = ["host", QueueFilter, StatusFilter]
    search_fields = ["worker_id", "host", "supervisor"]
    ordering = ["host", "worker_id"]
    list_per_page = 50
    show_facets = admin.ShowFacets.NEVER  # a count per choice, for a page read in an incident
    fields = tuple(FIELDS)
    readonly_fields = FIELDS

    class Media:
        css = {"all": ["django_jobstate/admin.css", "django_jobstate/workers.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerHeartbeat]:
        return super().get_queryset(request).annotate(db_now=Now())

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        worker = super().get_object(request, object_id, from_field)
        if worker is not None:
            attach_attempts([worker])
        return worker

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return WorkerChangeList

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rows are the workers' own

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a worker writes its row at every beat

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a silent worker's row goes once its attempts are rescued

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> Any:
        settings = get_settings()
        context = {
            "title": _("Workers"),
            "rules": _(
                "Silent after %(silent)s without a heartbeat; their attempts are failed as "
                "lost %(lost)s after the last one (JOBSTATE_LOST_AFTER), by a running runjobs."
            )
            % {
                "silent": format_duration(timedelta(seconds=silent_after(settings))),
                "lost": format_duration(timedelta(seconds=settings.LOST_AFTER)),
            },
            "unseen": unseen_html(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    @admin.display(description=gettext_lazy("worker"), ordering="worker_id")
    def worker(self, worker: WorkerHeartbeat) -> SafeString:
        if is_silent(worker):
            status = format_html(
                '<span class="jobstate-badge jobstate-failed">{}</span>', _("silent")
            )
        else:
            status = format_html(
                '<span class="jobstate-badge jobstate-succeeded">{}</span>', _("beating")
            )
        url = reverse("admin:django_jobstate_workerheartbeat_change", args=[worker.pk])
        return format_html(
            '<a class="jobstate-worker-id" href="{}">{}</a> {}', url, worker.worker_id, status
        )

    @admin.display(description=gettext_lazy("host, pid"), ordering="host")
    def process(self, worker: WorkerHeartbeat) -> SafeString:
        return format_html(
            '<span class="jobstate-worker-id">{}</span><br>{}',
            worker.host,
            _("pid %(pid)s") % {"pid": worker.pid},
        )

    @admin.display(description=gettext_lazy("supervisor"), ordering="supervisor")
    def supervised_by(self, worker: WorkerHeartbeat) -> SafeString:
        in_flight = _("in flight %(n)s") % {"n": worker.in_flight or 1}
        if not worker.supervisor:
            return format_html("<em>{}</em><br>{}", _("in-process"), in_flight)
        return format_html(
            '<span class="jobstate-worker-id">{}</span><br>{}<br>{}<br>{}',
            worker.supervisor,
            _("pid %(pid)s") % {"pid": worker.supervisor_pid or "?"},
            _("concurrency %(n)s") % {"n": worker.concurrency or "?"},
            in_flight,
        )

    @admin.display(description=gettext_lazy("queues"), ordering="queues")
    def queue_names(self, worker: WorkerHeartbeat) -> str:
        return ", ".join(sorted(worker.queues)) if worker.queues else _("all")

    @admin.display(description=gettext_lazy("started"), ordering="started_at")
    def started(self, worker: WorkerHeartbeat) -> SafeString:
        return format_html(
            '<span title="{}">{}</span>',
            short_datetime(worker.started_at),
            _("started %(when)s") % {"when": relative(worker.started_at, worker.db_now)},  # type: ignore[attr-defined]
        )

    @admin.display(description=gettext_lazy("last beat"), ordering="last_seen")
    def last_beat(self, worker: WorkerHeartbeat) -> SafeString:
        ago = format_html(
            '<span title="{}">{}</span>',
            short_datetime(worker.last_seen),
            _("%(time)s ago") % {"time": format_duration(silence(worker))},
        )
        ago = format_html('{}<br><span class="jobstate-quiet">{}</span>', ago, self.started(worker))
        if not is_silent(worker):
            return ago
        held: list[Job] = worker.held  # type: ignore[attr-defined]
        if not held:
            lost_after = timedelta(seconds=get_settings().LOST_AFTER)
            note = _("holds nothing: forgotten after %(time)s of silence") % {
                "time": format_duration(lost_after)
            }
        else:
            due = min(rescue_at(worker, job) for job in held)
            note = _("failed as lost from %(at)s (%(when)s)") % {
                "at": short_datetime(due),
                "when": relative(due, worker.db_now),  # type: ignore[attr-defined]
            }
        return format_html('{}<br><span class="jobstate-silent">{}</span>', ago, note)

    @admin.display(description=gettext_lazy("holds"))
    def holds(self, worker: WorkerHeartbeat) -> SafeString:
        held: list[Job] = worker.held  # type: ignore[attr-defined]
        if not held:
            return format_html('<span class="jobstate-idle">{}</span>', _("idle"))
        now: datetime = worker.db_now  # type: ignore[attr-defined]
        silent = is_silent(worker)

        def line(job: Job) -> tuple[Any, ...]:
            url = reverse("admin:django_jobstate_job_change", args=[job.pk])
            started = job.started_at or now
            notes = [
                _("for %(time)s") % {"time": format_duration(max(timedelta(0), now - started))}
            ]
            if job.cancel_requested_at is not None:
                notes.append(_("cancel asked"))
            if silent:
                notes.append(_("lost %(when)s") % {"when": relative(rescue_at(worker, job), now)})
            return (url, job.task_path, job.pk, job.task_name, job.queue_name, ", ".join(notes))

        return format_html(
            '<ul class="jobstate-held">{}</ul>',
            format_html_join(
                "",
                '<li><a href="{}" title="{}">#{} {}</a> <span class="jobstate-held-queue">{}'
                '</span> <span class="jobstate-held-time">{}</span></li>',
                (line(job) for job in held),
            ),
        )
