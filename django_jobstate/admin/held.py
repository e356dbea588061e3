"""What the workers of the Workers page hold, and when the rescuer takes it back.

Silence is judged as the rescuer judges it (managers/settle.rescue_lost), by the database
clock: every worker and attempt here is read with the database's now (`db_now`).
"""

from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..conf import get_settings
from ..db.clock import Now
from ..models import Job, WorkerHeartbeat
from ..runner.stuck import silent_after
from .page import format_duration

UNSEEN_SHOWN = 20  # attempts of workers with no heartbeat row listed above the workers


def attach_attempts(workers: list[WorkerHeartbeat]) -> None:
    """Give each worker `held`: the running attempts it holds, oldest first (one query)."""
    held: dict[str, list[Job]] = {worker.worker_id: [] for worker in workers}
    if held:
        fields = ["task_path", "queue_name", "attempt", "started_at", "worker_id"]
        attempts = Job.objects.running().filter(worker_id__in=list(held))
        for job in attempts.only(*fields, "timeout", "cancel_requested_at").order_by("pk"):
            held[job.worker_id].append(job)  # type: ignore[index]  # running: never NULL
    for worker in workers:
        worker.held = sorted(held[worker.worker_id], key=lambda j: (j.started_at, j.pk))  # type: ignore[attr-defined]


def unseen_html() -> SafeString | None:
    """The running attempts whose worker has no heartbeat row at all (it never beat, or its
    row was lost): no row of the list shows them, and the rescuer fails them as lost once
    they are JOBSTATE_LOST_AFTER old. Read through the index of running attempts, unordered
    (an ORDER BY id could walk the primary key through history), at most UNSEEN_SHOWN."""
    beating = WorkerHeartbeat.objects.values("worker_id")
    jobs = Job.objects.running().exclude(worker_id__in=beating).annotate(db_now=Now())
    fields = ["task_path", "queue_name", "started_at", "worker_id"]
    found = sorted(jobs.only(*fields)[: UNSEEN_SHOWN + 1], key=lambda job: job.pk)
    if not found:
        return None
    lost_after = timedelta(seconds=get_settings().LOST_AFTER)

    def line(job: Job) -> tuple[Any, ...]:
        now: datetime = job.db_now  # type: ignore[attr-defined]
        due = _("lost %(when)s") % {"when": relative((job.started_at or now) + lost_after, now)}
        url = reverse("admin:django_jobstate_job_change", args=[job.pk])
        return (url, job.task_path, job.pk, job.task_name, job.worker_id, due)

    more = _("and more") if len(found) > UNSEEN_SHOWN else ""
    return format_html(
        '<div class="jobstate-unseen"><p>{}</p><ul class="jobstate-held">{}</ul>{}</div>',
        _("Running attempts of workers with no heartbeat (never beat, or their row is gone):"),
        format_html_join(
            "",
            '<li><a href="{}" title="{}">#{} {}</a> <span class="jobstate-worker-id">{}</span>'
            ' <span class="jobstate-silent">{}</span></li>',
            (line(job) for job in found[:UNSEEN_SHOWN]),
        ),
        more,
    )


def silence(worker: WorkerHeartbeat) -> timedelta:
    """How long the worker has not beaten, by the database clock (never negative)."""
    return max(timedelta(0), worker.db_now - worker.last_seen)  # type: ignore[attr-defined]


def is_silent(worker: WorkerHeartbeat) -> bool:
    return silence(worker) > timedelta(seconds=silent_after())


def rescue_at(worker: WorkerHeartbeat, job: Job) -> datetime:
    """When a rescuer may fail `job` as lost at the earliest (managers/settle.rescue_lost):
    its worker silent, and the attempt started, JOBSTATE_LOST_AFTER seconds before."""
    lost_after = timedelta(seconds=get_settings().LOST_AFTER)
    return max(worker.last_seen, job.started_at or worker.last_seen) + lost_after


def relative(value: datetime, now: datetime) -> str:
    if value > now:
        return _("in %(time)s") % {"time": format_duration(value - now)}
    return _("%(time)s ago") % {"time": format_duration(now - value)}
