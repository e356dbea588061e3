"""The Dashboard (admin:django_jobstate_job_dashboard): per queue and in total, over the
last hour or day, what finished (per minute, by outcome), the failure rate, run times and
pickup latencies (p50, p95), what waits now, and the tasks failing most.

The figures are history.py's (aggregates over indexes), the charts charts.py's (inline
SVG). The page works without JavaScript; dashboard.js re-fetches only its fragment
(?fragment=1) every REFRESH_SECONDS, so the charts follow without a reload.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import router
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from ..history import (
    BOUNDS,
    WINDOWS,
    Figures,
    db_now,
    failing_tasks,
    finished_figures,
    quantile,
    waiting_figures,
    window,
)
from ..models import Job, JobQueue
from ..queue_names import configured_queues
from ..states import FailureReason, State
from .charts import Series, format_seconds, histogram, stacked_bars

REFRESH_SECONDS = 15
ERROR_CHARS = 160  # a failing task's last error, shortened (its job's page has it whole)
OUTCOMES = [
    Series(State.SUCCEEDED, str(State.SUCCEEDED.label), "jobstate-o-succeeded"),
    *(Series(r, f"failed: {r.value}", f"jobstate-o-{r.value}") for r in FailureReason),
]


class DashboardMixin:
    """JobAdmin's Dashboard page: its URL and view (view permission on jobs)."""

    admin_site: Any
    opts: Any

    def get_urls(self) -> list[URLPattern]:
        urls: list[URLPattern] = super().get_urls()  # type: ignore[misc]
        view = self.admin_site.admin_view(self.dashboard_view)
        name = f"{self.opts.app_label}_{self.opts.model_name}_dashboard"
        return [path("dashboard/", view, name=name), *urls]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        context = dashboard_context(request)
        if request.GET.get("fragment"):
            template = "admin/django_jobstate/job/dashboard_fragment.html"
            return TemplateResponse(request, template, context)
        context.update(
            self.admin_site.each_context(request),
            opts=self.opts,
            title=_("Dashboard"),
            refresh_seconds=_refresh_seconds(request),
        )
        return TemplateResponse(request, "admin/django_jobstate/job/dashboard.html", context)


def dashboard_context(request: HttpRequest) -> dict[str, Any]:
    window_name = request.GET.get("window", "hour")
    if window_name not in WINDOWS:
        window_name = "hour"
    using = router.db_for_read(Job)
    jobs = Job.objects.db_manager(using).all()
    now = db_now(using)
    start, slots = window(window_name, now)
    width = WINDOWS[window_name][1]
    finished = finished_figures(jobs, start, width)
    waiting = waiting_figures(jobs)
    paused = JobQueue.objects.db_manager(using).paused_names()
    names = sorted(set(finished) | set(waiting) | paused | configured_queues()[0])
    chosen = request.GET.get("queue")
    if chosen not in names:
        chosen = None
    total = Figures()
    rows = []
    for name in names:
        figures = finished.get(name, Figures())
        figures.waiting, figures.oldest_age = waiting.get(name, (0, None))
        rows.append(_row(request, figures, name, window_name, paused=name in paused))
        # A paused queue's waiting jobs are not runnable: not in the total's.
        total.add(replace(figures, waiting=0, oldest_age=None) if name in paused else figures)
    shown = finished.get(chosen, Figures()) if chosen else total
    minutes = width / timedelta(minutes=1)
    times = [timezone.localtime(start + width * i).strftime("%H:%M") for i in range(slots)]
    per_minute = [{k: n / minutes for k, n in shown.bars.get(i, {}).items()} for i in range(slots)]
    scope = chosen or _("all queues")
    return {
        "window": window_name,
        "windows": [(w, _query(request, window=w)) for w in WINDOWS],
        "chosen_queue": chosen,
        "all_queues_url": _query(request, queue=None),
        "rows": rows,
        "total": _row(request, total, None, window_name, paused=False),
        "throughput_chart": stacked_bars(
            "jobstate-throughput",
            _("Jobs finished per minute by outcome, %(scope)s") % {"scope": scope},
            per_minute,
            OUTCOMES,
            times,
        ),
        "run_time_chart": histogram(
            "jobstate-run-time",
            _("Run time, %(scope)s") % {"scope": scope},
            shown.run_time,
            BOUNDS,
            {"p50": quantile(shown.run_time, 0.5), "p95": quantile(shown.run_time, 0.95)},
        ),
        "pickup_chart": histogram(
            "jobstate-pickup",
            _("Pickup latency (queued to started), %(scope)s") % {"scope": scope},
            shown.pickup,
            BOUNDS,
            {"p50": quantile(shown.pickup, 0.5), "p95": quantile(shown.pickup, 0.95)},
        ),
        "failing": [_failing(row, chosen) for row in failing_tasks(jobs, start, chosen)],
        "updated_at": timezone.localtime(now),
        "fragment_url": _query(request, fragment="1"),
    }


def _refresh_seconds(request: HttpRequest) -> int:
    """Every REFRESH_SECONDS, or ?refresh=N (2 to 300: a wall screen, a test)."""
    try:
        return min(300, max(2, int(request.GET.get("refresh", REFRESH_SECONDS))))
    except ValueError:
        return REFRESH_SECONDS


def _query(request: HttpRequest, **changes: str | None) -> str:
    params = request.GET.copy()
    params.pop("fragment", None)
    for key, value in changes.items():
        params.pop(key, None)
        if value is not None:
            params[key] = value
    return "?" + params.urlencode() if params else "?"


def _row(
    request: HttpRequest, figures: Figures, name: str | None, window_name: str, *, paused: bool
) -> dict[str, Any]:
    rate = figures.failure_rate
    return {
        "name": name,
        "url": _query(request, queue=name),
        "paused": paused,
        "finished": figures.succeeded + sum(figures.failed.values()),
        "succeeded": figures.succeeded,
        "failed": sum(figures.failed.values()),
        "failure_rate": None if rate is None else f"{rate:.1%}",
        **{
            f"{kind}_{label}": _duration(quantile(counts, q))
            for kind, counts in (("run", figures.run_time), ("pickup", figures.pickup))
            for label, q in (("p50", 0.5), ("p95", 0.95))
        },
        "waiting": figures.waiting,
        "oldest": _duration(figures.oldest_age),
    }


def _duration(seconds: float | None) -> str | None:
    return None if seconds is None else format_seconds(seconds)


def _failing(row: dict[str, Any], queue: str | None) -> dict[str, Any]:
    changelist = reverse("admin:django_jobstate_job_changelist")
    query = {"task": row["task_path"], "state__exact": State.FAILED.value}
    if queue is not None:
        query["queue_name"] = queue
    error = ": ".join(part for part in (row["error_class"], row["error_message"]) if part)
    return {
        **row,
        "task_name": row["task_path"].rpartition(".")[2],
        "error": Truncator(error.replace("\n", " ")).chars(ERROR_CHARS),
        "list_url": f"{changelist}?{urlencode(query)}",
        "last_url": reverse("admin:django_jobstate_job_change", args=[row["last_id"]]),
    }
