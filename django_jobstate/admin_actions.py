"""The job list's actions and a failed job's Retry button: each one the same conditional
write a worker uses.

Each reports what it moved, naming the new attempts, and how many jobs it skipped because
the job had moved on first (a worker claimed it, another operator got there, ...).
"""

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.functions import Least, Now
from django.forms import BooleanField
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .conf import get_settings
from .exceptions import JobAlreadyEnqueued, LostRace
from .managers import CancelOutcome
from .models import Job
from .querysets import JobQuerySet
from .states import LIVE_STATES, FailureReason, State

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    _Base = admin.ModelAdmin[Job]
else:
    _Base = object

# After a retry, the message names this many new attempts, and the list shows up to
# MAX_LISTED tasks by their result ids (more would not fit in a URL).
MAX_NAMED = 10
MAX_LISTED = 100
# The admin log's entry for the new attempt: the job page reads it as "retried by hand".
RETRY_LOG = "Retry of job %(pk)d"
# The admin log's entry of a cancel: the job page reads it to say who asked.
CANCEL_LOG = {
    CancelOutcome.CANCELLED: "Cancelled job %(pk)d (queued)",
    CancelOutcome.REQUESTED: "Asked running job %(pk)d to stop",
}


def state_phrase(job: Job) -> "StrOrPromise":
    """How a sentence ends on `job`'s state: '... is queued', '... which succeeded'."""
    return {
        State.QUEUED: _("is queued"),
        State.RUNNING: _("is running"),
        State.SUCCEEDED: _("succeeded"),
        State.FAILED: _("failed"),
    }[State(job.state)]


def attempt_text(job: Job) -> str:
    return _("attempt %(attempt)d") % {"attempt": job.attempt}


class JobActions(_Base):
    """The actions of JobAdmin, which defines the `operate` and `cancel` permissions."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Retry and run now: the model's change permission, though no form ever saves."""
        return super().has_change_permission(request)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancel: the model's delete permission (a cancel deletes nothing: the job is
        kept as a record; the permission is the one that cancelled jobs before)."""
        return super().has_delete_permission(request)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        retry = path(
            "<path:object_id>/retry/",
            self.admin_site.admin_view(self.retry_view),  # login, staff, CSRF
            name="{}_{}_retry".format(*info),
        )
        cancel = path(
            "<path:object_id>/cancel/",
            self.admin_site.admin_view(self.cancel_view),
            name="{}_{}_cancel".format(*info),
        )
        return [retry, cancel, *super().get_urls()]  # before the catch-all <object_id>/

    def change_url(self, job: Job) -> str:
        name = f"admin:{self.opts.app_label}_{self.opts.model_name}_change"
        return reverse(name, args=[job.pk], current_app=self.admin_site.name)

    def changelist_url(self) -> str:
        name = f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"
        return reverse(name, current_app=self.admin_site.name)

    def job_link(self, job: Job) -> SafeString:
        return format_html(
            '<a href="{}">{}</a>', self.change_url(job), _("job #%(pk)d") % {"pk": job.pk}
        )

    def why_not_retried(self, job: Job, attempts: list[Job]) -> SafeString | None:
        """Why the Retry button refuses `job`, given every attempt of its task; None if not."""
        job = next((attempt for attempt in attempts if attempt.pk == job.pk), job)  # fresh
        if job.state != State.FAILED:
            return format_html(_("it {state}; only a failure is retried"), state=state_phrase(job))
        live = next((a for a in attempts if a.state in LIVE_STATES), None)
        if live is not None:
            return format_html(
                _("{attempt} ({link}) {state}"),
                attempt=attempt_text(live),
                link=self.job_link(live),
                state=state_phrase(live),
            )
        newest = attempts[-1] if attempts else job
        if newest.pk == job.pk:
            return None
        newest_text = format_html(
            _("the newest is {attempt} ({link}), which {state}"),
            attempt=attempt_text(newest),
            link=self.job_link(newest),
            state=state_phrase(newest),
        )
        following = next((a for a in attempts if a.previous_id == job.pk), None)
        if following is None:
            return format_html(_("it is an older attempt; {newest}"), newest=newest_text)
        retried = format_html(
            _("it was already retried as {attempt} ({link}), which {state}"),
            attempt=attempt_text(following),
            link=self.job_link(following),
            state=state_phrase(following),
        )
        return retried if following.pk == newest.pk else format_html("{}; {}", retried, newest_text)

    @admin.action(
        description=gettext_lazy("Retry the selected failed jobs"), permissions=["operate"]
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        """Retry each selected failure, but never a cancelled one: someone cancelled it so
        that it would not run, and a bulk retry must not undo that by the way."""
        return self.retry_selected(request, queryset, cancelled_too=False)

    @admin.action(
        description=gettext_lazy("Retry the selected failed jobs, cancelled ones included"),
        permissions=["operate"],
    )
    def retry_jobs_cancelled_too(
        self, request: HttpRequest, queryset: QuerySet[Job]
    ) -> HttpResponse | None:
        return self.retry_selected(request, queryset, cancelled_too=True)

    def retry_selected(
        self, request: HttpRequest, queryset: QuerySet[Job], *, cancelled_too: bool
    ) -> HttpResponse | None:
        selected = self.selected_count(request, queryset)
        retried, held, cancelled = [], [], []
        for job in queryset:
            # A failed row never changes again: its reason, read here, is final.
            if job.failure_reason == FailureReason.CANCELLED and not cancelled_too:
                cancelled.append(job)
                continue
            try:
                retried.append(self.retry_by_hand(request, job))
            except LostRace:
                continue
            except JobAlreadyEnqueued as exc:
                held.append(format_html("{}: {}", self.job_link(job), self.key_holder(exc)))
        verb = ngettext(
            "Queued a new attempt for %(done)d of %(selected)d selected job",
            "Queued a new attempt for %(done)d of %(selected)d selected jobs",
            selected,
        )
        named = format_html_join(
            ", ", "{} ({})", ((self.job_link(j), attempt_text(j)) for j in retried[:MAX_NAMED])
        )
        if len(retried) > MAX_NAMED:
            more = _("and %(more)d more") % {"more": len(retried) - MAX_NAMED}
            named = format_html("{} {}", named, more)
        reason: str = _("not failed, or already retried")
        if cancelled:
            others = max(selected, len(retried)) - len(retried) - len(cancelled)
            n = {"n": len(cancelled)}
            parts = [_("%(n)d cancelled: this action never retries a cancel") % n]
            reason = "; ".join([*parts, f"{others} {reason}"] if others > 0 else parts)
        self.report(request, verb, selected, len(retried), reason, named)
        if cancelled:
            self.say_cancelled_skipped(request, cancelled)
        if held:
            message = _("Not retried, as another job holds the unique key: {jobs}.")
            jobs = format_html_join("; ", "{}", ((text,) for text in held[:MAX_NAMED]))
            self.message_user(request, format_html(message, jobs=jobs), messages.WARNING)
        return self.show_retried(request, retried)

    def say_cancelled_skipped(self, request: HttpRequest, cancelled: list[Job]) -> None:
        """Name the cancelled jobs a bulk retry left alone, and how to retry them anyway."""
        jobs = format_html_join(", ", "{}", ((self.job_link(j),) for j in cancelled[:MAX_NAMED]))
        if len(cancelled) > MAX_NAMED:
            jobs = format_html(
                "{} {}", jobs, _("and %(more)d more") % {"more": len(cancelled) - MAX_NAMED}
            )
        message = _(
            "Not retried, as they were cancelled: {jobs}. To run a cancelled job again, use "
            "the Retry button of its page, or the action \u201c{action}\u201d."
        )
        action = _("Retry the selected failed jobs, cancelled ones included")
        self.message_user(request, format_html(message, jobs=jobs, action=action), messages.WARNING)

    def key_holder(self, exc: JobAlreadyEnqueued) -> SafeString:
        """Which job holds the unique key that a retry met, linked."""
        holders = Job.objects.live().filter(result_id=exc.result_id or uuid.UUID(int=0))
        holder = holders.first()
        if holder is None:  # it moved on, or was never named
            return format_html("{}", _("another job with the same unique key was queued"))
        message = _("{link} with the same unique key {state}")
        return format_html(message, link=self.job_link(holder), state=state_phrase(holder))

    def retry_by_hand(self, request: HttpRequest, job: Job) -> Job:
        """Queue the next attempt of `job` (LostRace if it is not the task's newest failure).

        A task that used all its attempts gets one more, so that the new row reads "2/2",
        not "2/1"; a task with attempts left keeps its count.
        """
        new = Job.objects.retry(job, max_attempts=max(job.max_attempts, job.attempt + 1))
        self.log_addition(request, new, RETRY_LOG % {"pk": job.pk})
        return new

    def show_retried(self, request: HttpRequest, retried: list[Job]) -> HttpResponse | None:
        """Where the operator sees the new attempts: the "failed" filter would hide them."""
        if not retried:
            return None  # the list as it was
        if len(retried) == 1:
            return redirect(self.change_url(retried[0]))
        if len(retried) <= MAX_LISTED:
            # Every attempt of those tasks: the failures and their new attempts.
            ids = ",".join(str(job.result_id) for job in retried)
            return redirect(f"{self.changelist_url()}?{urlencode({'result_id__in': ids})}")
        # Too many to name in a URL: the list without its state filter, newest first.
        params = request.GET.copy()
        for name in ("state__exact", "p"):
            params.pop(name, None)
        return redirect(
            f"{self.changelist_url()}?{params.urlencode()}" if params else self.changelist_url()
        )

    def posted_job(
        self,
        request: HttpRequest,
        object_id: str,
        may_act: Callable[[HttpRequest], bool],
    ) -> Job | HttpResponse:
        """The job a button's POST acts on, or the response that refuses it: not a POST,
        a job that is gone (a prune), or a user who may not see it or act on it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self.get_object(request, unquote(object_id))
        if job is None:
            gone = _("Job #%(pk)s does not exist (anymore: a prune may have deleted it).")
            self.message_user(request, gone % {"pk": object_id}, messages.WARNING)
            return redirect(self.changelist_url())
        if not (self.has_view_permission(request, job) and may_act(request)):
            raise PermissionDenied
        return job

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Retry button of a failed job's page: POST only, with the action's permissions."""
        job = self.posted_job(request, object_id, self.has_operate_permission)
        if not isinstance(job, Job):
            return job
        refusal: str | None = self.why_not_retried(
            job, list(Job.objects.attempts_of(job.result_id))
        )
        if refusal is None:
            try:
                new = self.retry_by_hand(request, job)
            except LostRace as exc:  # another operator, or a prune, got there first
                attempts = list(Job.objects.attempts_of(job.result_id))
                refusal = self.why_not_retried(job, attempts) or str(exc)
            except JobAlreadyEnqueued as exc:
                refusal = self.key_holder(exc)
            else:
                message = _("Retried as {attempt} ({link}): queued to run now.")
                done = format_html(message, attempt=attempt_text(new), link=self.job_link(new))
                self.message_user(request, done, messages.SUCCESS)
                return redirect(self.change_url(new))
        message = _("Job #{pk} was not retried: {reason}.")
        self.message_user(
            request, format_html(message, pk=job.pk, reason=refusal), messages.WARNING
        )
        return redirect(self.change_url(job))

    @admin.action(
        description=gettext_lazy("Run the selected queued jobs now"), permissions=["operate"]
    )
    def run_now(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = self.selected_count(request, queryset)
        # One conditional UPDATE; a job that is already due keeps its place in the queue.
        moved = queryset.queued().update(run_after=Least("run_after", Now()))
        verb = ngettext(
            "Set %(done)d of %(selected)d selected job to run now",
            "Set %(done)d of %(selected)d selected jobs to run now",
            selected,
        )
        self.report(request, verb, selected, moved, _("no longer queued"))

    @admin.action(description=gettext_lazy("Cancel the selected jobs"), permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        """Queued jobs fail as cancelled (never started, kept as a record); running ones
        are asked to stop, and stopped after JOBSTATE_CANCEL_GRACE."""
        selected = self.selected_count(request, queryset)
        if not BooleanField().to_python(request.POST.get("select_across")):
            # The jobs ticked, wherever they are now: one claimed since the list was shown
            # (filtered on "queued") is asked to stop, not skipped.
            queryset = Job.objects.filter(pk__in=request.POST.getlist(ACTION_CHECKBOX_NAME))
        outcomes = [self.cancel_by_hand(request, job) for job in queryset.live()]
        done = sum(outcome != CancelOutcome.FINISHED for outcome in outcomes)
        verb = ngettext(
            "Cancelled %(done)d of %(selected)d selected job",
            "Cancelled %(done)d of %(selected)d selected jobs",
            selected,
        )
        requested = outcomes.count(CancelOutcome.REQUESTED)
        if requested:
            verb += " " + _("(%(requested)d running: asked to stop)") % {"requested": requested}
        self.report(request, verb, selected, done, _("already finished"))

    def cancel_by_hand(self, request: HttpRequest, job: Job) -> CancelOutcome:
        outcome = Job.objects.cancel(job)
        if outcome != CancelOutcome.FINISHED:
            message = CANCEL_LOG[outcome] % {"pk": job.pk}
            self.log_change(request, job, message)
        return outcome

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Cancel button of a queued or running job's page: POST only."""
        job = self.posted_job(request, object_id, self.has_cancel_permission)
        if not isinstance(job, Job):
            return job
        outcome = self.cancel_by_hand(request, job)
        text = {
            CancelOutcome.CANCELLED: _("Job #%(pk)d was cancelled: it will never run."),
            CancelOutcome.REQUESTED: _(
                "Job #%(pk)d is running: it was asked to stop, and will be stopped if it "
                "has not within %(grace)g seconds."
            ),
            CancelOutcome.FINISHED: _("Job #%(pk)d had already finished: nothing to cancel."),
        }[outcome] % {"pk": job.pk, "grace": get_settings().CANCEL_GRACE}
        level = messages.WARNING if outcome == CancelOutcome.FINISHED else messages.SUCCESS
        self.message_user(request, text, level)
        return redirect(self.change_url(job))

    def selected_count(self, request: HttpRequest, queryset: QuerySet[Job]) -> int:
        """How many jobs the operator selected, including any gone by now."""
        if BooleanField().to_python(request.POST.get("select_across")):
            return queryset.count()
        return len(set(request.POST.getlist(ACTION_CHECKBOX_NAME)))

    def report(
        self,
        request: HttpRequest,
        verb: str,
        selected: int,
        done: int,
        skip_reason: "StrOrPromise",
        named: SafeString | None = None,
    ) -> None:
        """Tell how many jobs an action moved (naming them) and how many it skipped because
        they moved on."""
        selected = max(selected, done)
        skipped = selected - done
        message: str = verb % {"done": done, "selected": selected}
        if named:
            message = format_html("{}: {}", message, named)
        if skipped:
            tail = _("; skipped %(skipped)d (%(reason)s).") % {
                "skipped": skipped,
                "reason": skip_reason,
            }
        else:
            tail = _("; skipped 0.")
        message = format_html("{}{}", message, tail)
        self.message_user(request, message, messages.WARNING if skipped else messages.SUCCESS)
