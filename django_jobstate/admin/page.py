"""What the job admin says about an attempt: why it failed, how it was queued, what the
Retry button would do (or why it is not offered), which run it is, why it may be stuck."""

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from ..conf import get_settings
from ..models import Job
from ..runner.stuck import Concern, Mark, with_liveness
from ..states import LIVE_STATES, FailureReason, State
from .attempts import attach_hand_backs, attempt_label
from .filters import FAILURE_LABELS, local
from .workflow import workflow_context

if TYPE_CHECKING:
    from .jobs import JobAdmin


def format_duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def short_datetime(value: datetime) -> str:
    """Compact and to the second, for columns: '2025-06-01 14:03:07'."""
    return date_format(local(value), "Y-m-d H:i:s")


class JobChangeList(ChangeList):
    """The job list, each shown row with what its marks need, read for the page at once.

    Not annotated on the list's queryset: the capped counts and the filters would compute
    it for every row they scan, not for the rows shown.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows: list[Job] = list(self.result_list)
        attach_hand_backs(rows)
        live = [row.pk for row in rows if row.state in LIVE_STATES]
        if live:  # one query, by primary key
            liveness = with_liveness(Job.objects.filter(pk__in=live))
            seen = {j.pk: j for j in liveness.only("pk")}
            for row in rows:
                if (fresh := seen.get(row.pk)) is not None:
                    for name in ("db_now", "worker_last_seen", "queue_paused_at"):
                        setattr(row, name, getattr(fresh, name))
        self.result_list = rows


def mark_text(mark: Mark) -> tuple[str, str]:
    """What the admin says of a Mark: a short text, and a sentence for its tooltip."""
    age, limit = format_duration(mark.age), format_duration(timedelta(seconds=mark.limit))
    settings = get_settings()
    if mark.concern == Concern.QUEUE_PAUSED:
        return (
            _("waiting on a paused queue (paused %(age)s ago)") % {"age": age},
            _(
                "No worker claims a paused queue's jobs. Resume the queue on the Queues page, "
                "or with: manage.py jobqueues resume NAME."
            ),
        )
    if mark.concern == Concern.SILENT:
        short = _("worker silent since %(since)s (%(age)s)") % {
            "since": short_datetime(mark.since),
            "age": age,
        }
    elif mark.concern == Concern.UNSEEN:
        short = _("no heartbeat from its worker (running %(age)s)") % {"age": age}
    elif mark.concern == Concern.CANCEL_OVERDUE:
        return (
            _("cancel requested %(age)s ago, past its grace (%(limit)s)")
            % {"age": age, "limit": limit},
            _(
                "Its worker should have stopped it JOBSTATE_CANCEL_GRACE after the request; "
                "it has not: that worker may be gone or blocked."
            ),
        )
    else:
        return (
            _("running past its timeout (%(limit)s) by %(age)s") % {"age": age, "limit": limit},
            _(
                "Its worker should have stopped it at its timeout; it has not: that worker "
                "may be gone or blocked."
            ),
        )
    lost_after = format_duration(timedelta(seconds=settings.LOST_AFTER))
    return short, _(
        "Its worker may be gone. A runjobs that has been up for JOBSTATE_LOST_AFTER "
        "(%(lost_after)s) fails the attempts of a worker silent that long as lost; "
        "until one does, this attempt shows as running."
    ) % {"lost_after": lost_after}


def stuck_html(marks: list[Mark]) -> SafeString:
    """why_stuck()'s marks, as shown beside a live attempt's state badge."""
    return format_html_join(
        " ",
        '<span class="jobstate-stuck jobstate-stuck-{}" title="{}">{}</span>',
        ((mark.concern, detail, short) for mark in marks for short, detail in [mark_text(mark)]),
    )


def failure_text(job: Job) -> str:
    """'error: ValueError', 'timeout', 'released (never started)', ... or '' if it did not fail."""
    if not job.failure_reason:
        return ""
    label = str(FAILURE_LABELS[FailureReason(job.failure_reason)])
    if job.failure_reason == FailureReason.ERROR and job.error_class:
        return f"{label}: {job.error_class.rpartition('.')[2]}"
    return label


def failure_html(job: Job) -> str | None:
    """failure_text(), with the error's whole class and message in its tooltip."""
    if not job.failure_reason:
        return None
    detail = ": ".join(filter(None, [job.error_class, job.error_message]))
    return format_html(
        '<span class="jobstate-failure" title="{}">{}</span>',
        Truncator(detail).chars(300),
        failure_text(job),
    )


def origins(attempts: list[Job]) -> dict[int, str]:
    """How each of a task's attempts was queued, by id: enqueued, retried by hand, ..."""
    ids = [str(attempt.pk) for attempt in attempts]  # a first one: started by hand
    by_hand = {
        entry.object_id: entry.user.get_username()
        for entry in LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(Job),
            object_id__in=ids,
            action_flag=ADDITION,
        ).select_related("user")
    }
    by_id = {attempt.pk: attempt for attempt in attempts}
    texts = {}
    for attempt in attempts:
        previous = by_id.get(attempt.previous_id) if attempt.previous_id else None
        if str(attempt.pk) in by_hand and attempt.attempt == 1 and not attempt.previous_id:
            text = _("started by hand by %(user)s") % {"user": by_hand[str(attempt.pk)]}
        elif str(attempt.pk) in by_hand:
            text = _("retried by hand by %(user)s") % {"user": by_hand[str(attempt.pk)]}
        elif previous is not None and previous.failure_reason == FailureReason.RELEASED:
            text = _("queued again: attempt %(attempt)d never started") % {
                "attempt": previous.attempt
            }
        elif previous is not None and previous.failure_reason == FailureReason.SNOOZED:
            text = _("snoozed: attempt %(attempt)d asked to run again later") % {
                "attempt": previous.attempt
            }
        elif previous is not None and previous.attempt < previous.max_attempts:
            text = _("automatic retry")
        elif attempt.attempt > 1:
            text = _("retry")
        else:
            text = _("enqueued")
        texts[attempt.pk] = text
    return texts


def page_context(
    model_admin: "JobAdmin", request: HttpRequest, job: Job, attempts: list[Job]
) -> dict[str, Any]:
    """The history table's rows, and the note (with the Retry button) over a failed job."""
    texts = origins(attempts)
    released = [a.attempt for a in attempts if a.failure_reason == FailureReason.RELEASED]
    snoozes = [a.attempt for a in attempts if a.failure_reason == FailureReason.SNOOZED]
    for attempt in [job, *attempts]:
        # Attributes for the template and the readonly fields only, not model fields.
        attempt.origin_text = texts.get(attempt.pk, "")  # type: ignore[attr-defined]
        attempt.failure_html = failure_html(attempt)  # type: ignore[attr-defined]
        attempt.duration_text = model_admin.duration(attempt)  # type: ignore[attr-defined]
        earlier = sum(number < attempt.attempt for number in released)
        snoozed = sum(number < attempt.attempt for number in snoozes)
        attempt.handed_back, attempt.snoozed = earlier, snoozed  # type: ignore[attr-defined]
        attempt.attempt_label = attempt_label(attempt, earlier, snoozed)  # type: ignore[attr-defined]
    context: dict[str, Any] = {"attempts": attempts, **cancel_context(model_admin, request, job)}
    context.update(workflow_context(model_admin, job))  # a step's: its workflow's picture
    if job.state != State.FAILED:
        return context
    refusal = model_admin.why_not_retried(job, attempts)
    if refusal is not None:
        context["retry_note"] = format_html(_("Retry is not offered: {reason}."), reason=refusal)
        return context
    handed_back: int = job.handed_back  # type: ignore[attr-defined]
    snoozed_before: int = job.snoozed  # type: ignore[attr-defined]
    why = failure_text(job)
    if handed_back:
        why = _("%(why)s; %(n)d earlier attempts were handed back unstarted") % {
            "why": why,
            "n": handed_back,
        }
    if snoozed_before:
        why = _("%(why)s; it snoozed %(n)d times before") % {"why": why, "n": snoozed_before}
    context["retry_note"] = _(
        "Attempt %(attempt)d of %(max)d failed (%(why)s); no further attempt is queued."
    ) % {
        "attempt": job.attempt - handed_back - snoozed_before,
        "max": max(1, job.max_attempts - handed_back - snoozed_before),
        "why": why,
    }
    if model_admin.has_view_permission(request, job) and model_admin.has_operate_permission(
        request
    ):
        opts = model_admin.opts
        context["retry_url"] = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_retry",
            args=[job.pk],
            current_app=model_admin.admin_site.name,
        )
        context["retry_label"] = _("Retry: queue attempt %(attempt)d") % {
            "attempt": job.attempt + 1
        }
    return context


def cancel_context(model_admin: "JobAdmin", request: HttpRequest, job: Job) -> dict[str, Any]:
    """The Cancel button of a live job, and who asked to cancel it (the admin's log)."""
    context: dict[str, Any] = {}
    if job.cancel_requested_at is not None:
        entry = (
            LogEntry.objects.filter(
                content_type=ContentType.objects.get_for_model(Job),
                object_id=str(job.pk),
                action_flag=CHANGE,
            )
            .select_related("user")
            .order_by("action_time")
            .first()
        )
        who = entry.user.get_username() if entry else _("code or the command line")
        context["cancel_note"] = _("Cancel requested %(when)s by %(who)s.") % {
            "when": job.cancel_requested_at.strftime("%Y-%m-%d %H:%M:%S"),
            "who": who,
        }
    live = job.state in LIVE_STATES and job.cancel_requested_at is None
    may = model_admin.has_view_permission(request, job) and model_admin.has_cancel_permission(
        request
    )
    if live and may:
        opts = model_admin.opts
        context["cancel_url"] = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_cancel",
            args=[job.pk],
            current_app=model_admin.admin_site.name,
        )
        context["cancel_label"] = (
            _("Cancel: it will never run")
            if job.state == State.QUEUED
            else _("Cancel: ask it to stop")
        )
    return context
