"""The job list's filters, counts, paginator and date navigation, cheap on millions of rows.

Django's stock versions read every matching row on every page: its filters for a char
field and its date hierarchy run a SELECT DISTINCT, its paginator counts them all. These
read a bounded number of rows, or use an index.
"""

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Max, Min, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy as _

from ..runner.stuck import Concern, stuck
from ..states import FailureReason, State

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# How many rows a count or a filter's list of choices looks at, at most.
SCAN_LIMIT = 10_000


def capped_count(queryset: QuerySet[Any]) -> int:
    """Count the rows of `queryset`, stopping after SCAN_LIMIT + 1 of them.

    Unordered: any SCAN_LIMIT + 1 rows make the same count, and an ORDER BY id DESC LIMIT
    lets MariaDB walk the primary key backwards through all history instead of reading
    the few rows a filter's index finds."""
    return queryset.order_by()[: SCAN_LIMIT + 1].count()


def display_count(*counts: int) -> str:
    """The sum of capped counts: '1,234', or '10,000+' when capped_count() stopped one."""
    total = sum(min(count, SCAN_LIMIT) for count in counts)
    return f"{total:,}+" if any(count > SCAN_LIMIT for count in counts) else f"{total:,}"


class CappedPaginator(Paginator):
    """A paginator that never counts past SCAN_LIMIT: later pages need a narrower filter."""

    @cached_property
    def count(self) -> int:
        return capped_count(cast("QuerySet[Any]", self.object_list))  # the admin pages querysets

    @property
    def display_count(self) -> str:
        return display_count(self.count)


def state_counts(request: HttpRequest, cl: ChangeList) -> list[dict[str, Any]]:
    """Per state, the jobs that match every current filter but the state filter, capped."""
    # The "state" field has choices, so the admin builds a ChoicesFieldListFilter for it.
    spec = cast(
        admin.ChoicesFieldListFilter,
        next(spec for spec in cl.filter_specs if getattr(spec, "field_path", "") == "state"),
    )
    queryset = cl.get_queryset(request, exclude_parameters=spec.expected_parameters())
    current = request.GET.get(spec.lookup_kwarg)
    rows: list[dict[str, Any]] = [
        {
            "state": state.value,
            "label": state.label,
            "count": capped_count(queryset.filter(state=state)),
            "url": cl.get_query_string({spec.lookup_kwarg: state.value}, [spec.lookup_kwarg]),
            "selected": current == state.value,
        }
        for state in State
    ]
    all_row = {
        "state": "all",
        "label": _("All"),
        "count": display_count(*(row["count"] for row in rows)),
        "url": cl.get_query_string(remove=[spec.lookup_kwarg]),
        "selected": current is None,
    }
    for row in rows:
        row["count"] = display_count(row["count"])
    return [all_row, *rows]


class RecentValuesFilter(admin.SimpleListFilter):
    """Offer the values of `field` found in the latest SCAN_LIMIT jobs (and the chosen one)."""

    field: str

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Cached on the request: the state counts build the filters a second time.
        cache = request.__dict__.setdefault("_jobstate_recent_values", {})
        if self.field not in cache:
            recent = model_admin.get_queryset(request).order_by("-pk")[:SCAN_LIMIT]
            cache[self.field] = set(recent.values_list(self.field, flat=True))
        values = cache[self.field] | ({self.value()} if self.value() else set())
        return [(value, value) for value in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        return queryset.filter(**{self.field: self.value()})


class QueueFilter(RecentValuesFilter):
    title = _("queue")
    parameter_name = field = "queue_name"


class TaskFilter(RecentValuesFilter):
    title = _("task")
    parameter_name = "task"
    field = "task_path"


class HasRetriesFilter(admin.SimpleListFilter):
    """Attempts of a task that ran more than once: retries and the attempts they retried.

    Found through the `previous` links, which the unique index on `previous_id` serves,
    rather than `attempt > 1`, which would read every row. (A retry whose earlier attempt
    was pruned has no link left, and is listed under "No".)
    """

    title = _("has retries")
    parameter_name = "retried"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, "StrOrPromise"]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("yes", "no"):
            return queryset
        links = queryset.model._default_manager.filter(previous__isnull=False)
        linked = links.values("pk").union(links.values("previous_id"))
        if self.value() == "yes":
            return queryset.filter(pk__in=linked)
        return queryset.exclude(pk__in=linked)


# Short, for a column: the model's labels are sentences.
FAILURE_LABELS = {
    FailureReason.ERROR: _("error"),
    FailureReason.TIMEOUT: _("timeout"),
    FailureReason.LOST: _("lost"),
    FailureReason.INTERRUPTED: _("interrupted"),
    FailureReason.RELEASED: _("released (never started)"),
    FailureReason.CANCELLED: _("cancelled"),
    FailureReason.SNOOZED: _("snoozed (runs again later)"),
    FailureReason.UPSTREAM_FAILED: _("upstream failed (never started)"),
}


class FailureReasonFilter(admin.SimpleListFilter):
    """Failed attempts by why they failed.

    Filtered on the state too, which only failed rows can match: the rows come from the
    partial index of failed rows (newest first), and the state counts of the other
    states are contradictions that PostgreSQL answers without reading a row.
    """

    title = _("failure reason")
    parameter_name = "failure_reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, "StrOrPromise"]]:
        return [(reason.value, FAILURE_LABELS[reason]) for reason in FailureReason]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in FailureReason.values:
            return queryset
        return queryset.filter(state=State.FAILED, failure_reason=self.value())


class StuckFilter(admin.SimpleListFilter):
    """Live attempts that may be stuck, by why (runner/stuck.py), judged by the database
    clock in the list's own query: running rows come from the index of running rows,
    queued ones from the claim's index, never from a scan of history."""

    title = _("stuck")
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, "StrOrPromise"]]:
        return [
            (Concern.SILENT.value, _("Stuck: worker silent")),
            (Concern.CANCEL_OVERDUE.value, _("Stuck: cancel past grace")),
            (Concern.PAST_TIMEOUT.value, _("Stuck: past timeout")),
            (Concern.QUEUE_PAUSED.value, _("Stuck: queue paused")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None or value not in {v for v, _label in self.lookups(request, None)}:
            return queryset
        return queryset.filter(stuck(Concern(value)))


class CalendarQuerySet:
    """Stands in for the list's queryset in Django's date_hierarchy().

    Django lists the days (or months, years) that hold a job with a SELECT DISTINCT over
    every matching row; this lists the calendar between the first and the last job, from
    one MIN/MAX query. A day without jobs may be offered: its page is empty.
    """

    def __init__(self, queryset: QuerySet[Any], field: str) -> None:
        self.queryset, self.field = queryset, field
        self.bounds: dict[str, datetime | None] | None = None

    def aggregate(self, **aggregates: Any) -> dict[str, datetime | None]:
        # date_hierarchy() asks for first=Min(field), last=Max(field), and only that.
        if self.bounds is None:
            self.bounds = self.queryset.aggregate(first=Min(self.field), last=Max(self.field))
        return self.bounds

    def datetimes(self, field: str, kind: str) -> list[datetime]:
        bounds = self.aggregate()
        if bounds["first"] is None or bounds["last"] is None:
            return []
        first, last = truncate(local(bounds["first"]), kind), truncate(local(bounds["last"]), kind)
        calendar = []
        while first <= last:
            calendar.append(first)
            first = next_period(first, kind)
        return calendar


def local(value: datetime) -> datetime:
    """`value` in the current time zone (as is when the project has USE_TZ = False)."""
    return timezone.localtime(value) if timezone.is_aware(value) else value


def truncate(value: datetime, kind: str) -> datetime:
    value = value.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind in ("month", "year"):
        value = value.replace(day=1)
    return value.replace(month=1) if kind == "year" else value


def next_period(value: datetime, kind: str) -> datetime:
    if kind == "day":
        return value + timedelta(days=1)
    if kind == "month":
        return value.replace(year=value.year + value.month // 12, month=value.month % 12 + 1)
    return value.replace(year=value.year + 1)


class CalendarChangeList:
    """The change list as date_hierarchy() reads it, with a CalendarQuerySet."""

    def __init__(self, cl: ChangeList) -> None:
        self.cl = cl
        self.queryset = CalendarQuerySet(cl.queryset, cl.date_hierarchy)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cl, name)


def date_navigation(cl: ChangeList) -> dict[str, Any] | None:
    """The context of Django's date hierarchy, without its SELECT DISTINCT."""
    return date_hierarchy(cast(ChangeList, CalendarChangeList(cl)))  # a stand-in, duck-typed
