"""Bulk actions over a selection of any size: what they will do, asked first, then done
in chunks.

An action first answers with a confirmation page that counts, by the database, what will
happen to how many of the selected jobs ("12 failed jobs will get a new attempt; 3 are
skipped: 2 already retried, 1 not failed"); nothing is written until the operator
confirms. Then the rows are read in chunks of CHUNK by descending id (never all at once,
whatever "select all" selected), each written by its own conditional write: a row that a
worker or another operator moved since the confirmation is skipped, not overwritten.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Count, Exists, OuterRef, Q
from django.forms import BooleanField
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..conf import get_settings
from ..models import Job
from ..querysets import JobQuerySet
from ..states import FailureReason, State

if TYPE_CHECKING:
    from .actions import JobActions

# Rows read, and written one by one, per round trip of a bulk action.
CHUNK = 500
# Jobs a confirmation page names, as examples of what it will act on.
MAX_EXAMPLES = 10
# Confirmation: the POST field that says the operator saw the plan and confirmed it.
CONFIRMED = "confirm"
TEMPLATE = "admin/django_jobstate/job/confirm_action.html"


def select_across(request: HttpRequest) -> bool:
    return bool(BooleanField().to_python(request.POST.get("select_across")))


def ticked(request: HttpRequest) -> list[str]:
    return list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))


def selection(request: HttpRequest, queryset: JobQuerySet) -> tuple[JobQuerySet, int]:
    """The jobs an action acts on, unordered, and how many the operator selected.

    "Select all": every job the list's filters match now. Otherwise the jobs ticked,
    wherever they are now (one claimed since the list was shown, filtered on "queued",
    is still the operator's choice); a ticked job since deleted counts as selected.
    """
    if select_across(request):
        jobs = queryset.order_by()
        return jobs, jobs.count()
    ids = [pk for pk in ticked(request) if pk.isascii() and pk.isdigit()]
    return Job.objects.filter(pk__in=ids), len(ticked(request))


def in_chunks(jobs: JobQuerySet) -> Iterator[Job]:
    """Each of `jobs`, read CHUNK rows at a time by descending id. Rows an action creates
    meanwhile (a retry's new attempt) have higher ids: they are never visited."""
    last: int | None = None
    while True:
        page = jobs.order_by("-pk")
        if last is not None:
            page = page.filter(pk__lt=last)
        rows = list(page[:CHUNK])
        yield from rows
        if len(rows) < CHUNK:
            return
        last = rows[-1].pk


@dataclass
class Plan:
    """What an action will do (or did): how many jobs it acts on, and why it skips the
    others, each reason with its count."""

    selected: int
    act: int
    skips: list[tuple[int, str]] = field(default_factory=list)

    def add_skip(self, count: int, text: str) -> None:
        if count > 0:
            self.skips.append((count, text))

    @property
    def skipped(self) -> int:
        return sum(count for count, _text in self.skips)

    def skip_text(self) -> str:
        """'2 already retried, 1 not failed'; 'not failed' when that is the one reason."""
        if len(self.skips) == 1:
            return self.skips[0][1]
        return ", ".join(f"{count} {text}" for count, text in self.skips)


def newer_attempt() -> Exists:
    """A later attempt of the row's task exists: it was retried (or is older)."""
    later = Job.objects.filter(result_id=OuterRef("result_id"), attempt__gt=OuterRef("attempt"))
    return Exists(later)


def retry_plan(jobs: JobQuerySet, selected: int, *, cancelled_too: bool) -> Plan:
    """Count, in one query, what a bulk retry of `jobs` would do."""
    counts = jobs.filter(state=State.FAILED).aggregate(
        failed=Count("pk"),
        retried=Count("pk", filter=Q(newer_attempt())),
        cancelled=Count(
            "pk", filter=Q(failure_reason=FailureReason.CANCELLED) & ~Q(newer_attempt())
        ),
    )
    cancelled = 0 if cancelled_too else counts["cancelled"]
    plan = Plan(selected, counts["failed"] - counts["retried"] - cancelled)
    plan.add_skip(counts["retried"], _("already retried"))
    plan.add_skip(cancelled, _("cancelled (this action never retries a cancel)"))
    plan.add_skip(selected - counts["failed"], _("not failed"))
    return plan


def cancel_plan(jobs: JobQuerySet, selected: int) -> tuple[Plan, dict[str, int]]:
    """Count, in one query, what a bulk cancel of `jobs` would do; and per state."""
    counts = jobs.filter(state__in=[State.QUEUED, State.RUNNING]).aggregate(
        queued=Count("pk", filter=Q(state=State.QUEUED)),
        running=Count("pk", filter=Q(state=State.RUNNING)),
        asked=Count("pk", filter=Q(state=State.RUNNING, cancel_requested_at__isnull=False)),
    )
    plan = Plan(selected, counts["queued"] + counts["running"])
    plan.add_skip(selected - plan.act, _("already finished"))
    return plan, counts


def retry_summary(plan: Plan) -> str:
    text = ngettext(
        "%(n)d failed job will get a new attempt",
        "%(n)d failed jobs will get a new attempt",
        plan.act,
    ) % {"n": plan.act}
    return with_skips(text, plan)


def cancel_summary(plan: Plan, counts: dict[str, int]) -> str:
    parts = []
    if counts["queued"]:
        parts.append(
            ngettext(
                "%(n)d queued job will be cancelled: it will never run",
                "%(n)d queued jobs will be cancelled: they will never run",
                counts["queued"],
            )
            % {"n": counts["queued"]}
        )
    if counts["running"]:
        running = ngettext(
            "%(n)d running job will be asked to stop, and stopped after %(grace)g s if it has not",
            "%(n)d running jobs will be asked to stop, and stopped after %(grace)g s if they "
            "have not",
            counts["running"],
        ) % {"n": counts["running"], "grace": get_settings().CANCEL_GRACE}
        if counts["asked"]:
            running += " " + _("(%(n)d already asked)") % {"n": counts["asked"]}
        parts.append(running)
    text = "; ".join(parts) or _("No selected job will be cancelled")
    return with_skips(text, plan)


def with_skips(text: str, plan: Plan) -> str:
    if not plan.skipped:
        return f"{text}."
    skipped = ngettext("%(n)d is skipped: %(why)s", "%(n)d are skipped: %(why)s", plan.skipped) % {
        "n": plan.skipped,
        "why": plan.skip_text(),
    }
    return f"{text}; {skipped}."


def confirm(
    model_admin: "JobActions",
    request: HttpRequest,
    *,
    title: str,
    summary: str,
    button: str,
    acts: bool,
    hidden: list[tuple[str, str]],
    back_url: str,
    examples: list[Job] | None = None,
) -> TemplateResponse:
    """The confirmation page: `summary` of what will happen, and a form that posts
    `hidden` back with CONFIRMED (or only a way back when nothing would happen)."""
    opts = model_admin.opts
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "title": title,
        "summary": summary,
        "button": button,
        "acts": acts,
        "hidden": [*hidden, (CONFIRMED, "yes")],
        "examples": examples or [],
        "back_url": back_url,
        "action_url": request.get_full_path(),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def action_fields(request: HttpRequest) -> list[tuple[str, str]]:
    """What an action's confirmation posts back: the action, the selection."""
    fields = [("action", request.POST.get("action", ""))]
    if select_across(request):
        fields.append(("select_across", "1"))
    fields.extend((ACTION_CHECKBOX_NAME, pk) for pk in ticked(request))
    return fields


def confirmed(request: HttpRequest) -> bool:
    return request.method == "POST" and request.POST.get(CONFIRMED) == "yes"
