"""What the job admin says about an attempt: why it failed, how it was queued, what the
Retry button would do (or why it is not offered)."""

from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from .admin_filters import FAILURE_LABELS
from .models import Job
from .states import LIVE_STATES, FailureReason, State

if TYPE_CHECKING:
    from .admin import JobAdmin


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
    ids = [str(attempt.pk) for attempt in attempts if attempt.previous_id or attempt.attempt > 1]
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
        if str(attempt.pk) in by_hand:
            text = _("retried by hand by %(user)s") % {"user": by_hand[str(attempt.pk)]}
        elif previous is not None and previous.failure_reason == FailureReason.RELEASED:
            text = _("queued again: attempt %(attempt)d never started") % {
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
    for attempt in [job, *attempts]:
        # Attributes for the template and the readonly fields only, not model fields.
        attempt.origin_text = texts.get(attempt.pk, "")  # type: ignore[attr-defined]
        attempt.failure_html = failure_html(attempt)  # type: ignore[attr-defined]
        attempt.duration_text = model_admin.duration(attempt)  # type: ignore[attr-defined]
    context: dict[str, Any] = {"attempts": attempts, **cancel_context(model_admin, request, job)}
    if job.state != State.FAILED:
        return context
    refusal = model_admin.why_not_retried(job, attempts)
    if refusal is not None:
        context["retry_note"] = format_html(_("Retry is not offered: {reason}."), reason=refusal)
        return context
    context["retry_note"] = _(
        "Attempt %(attempt)d of %(max)d failed (%(why)s); no further attempt is queued."
    ) % {"attempt": job.attempt, "max": job.max_attempts, "why": failure_text(job)}
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
