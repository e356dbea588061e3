"""The job list's actions and a live job's Cancel button (the Retry ones are in
retry.py): each one the same conditional write a worker uses.

Each reports what it moved, and how many jobs it skipped because the job had moved on
first (a worker claimed it, another operator got there, ...).
"""

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.functions import Least
from django.forms import BooleanField
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..conf import get_settings
from ..db.clock import Now
from ..managers import CancelOutcome
from ..models import Job
from ..querysets import JobQuerySet
from ..states import LIVE_STATES, State
from . import bulk

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    _Base = admin.ModelAdmin[Job]
else:
    _Base = object

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


def cancel_one_text(job: Job) -> str:
    """What cancelling `job` will do, for its confirmation page."""
    if job.state == State.QUEUED:
        return _("Job #%(pk)d is queued: it will fail as cancelled and never run.") % {"pk": job.pk}
    if job.state == State.RUNNING:
        text = _(
            "Job #%(pk)d is running on worker %(worker)s: it will be asked to stop, and "
            "stopped after %(grace)g seconds if it has not. Whatever it wrote so far stays "
            "written, unless the task is atomic."
        ) % {"pk": job.pk, "worker": job.worker_id, "grace": get_settings().CANCEL_GRACE}
        if job.cancel_requested_at is not None:
            text += " " + _("It was already asked to stop.")
        return text
    return _("Job #%(pk)d has finished: there is nothing to cancel.") % {"pk": job.pk}


def attempt_text(job: Job) -> str:
    return _("attempt %(attempt)d") % {"attempt": job.attempt}


class JobActions(_Base):
    """The actions of JobAdmin but Retry, and the `operate` and `cancel` permissions."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Retry and run now: the model's change permission, though no form ever saves."""
        return super().has_change_permission(request)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancel: the change permission too, as every action that starts or stops work."""
        return self.has_operate_permission(request)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        cancel = path(
            "<path:object_id>/cancel/",
            self.admin_site.admin_view(self.cancel_view),  # login, staff, CSRF
            name="{}_{}_cancel".format(*info),
        )
        return [cancel, *super().get_urls()]  # before the catch-all <object_id>/

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

    def posted_job(
        self,
        request: HttpRequest,
        object_id: str,
        may_act: Callable[[HttpRequest], bool],
        *,
        allow_get: bool = False,
    ) -> Job | HttpResponse:
        """The job a button's POST acts on, or the response that refuses it: not a POST
        (nor a GET, for a button that asks first), a job that is gone (a prune), or a user
        who may not see it or act on it."""
        allowed = ["GET", "POST"] if allow_get else ["POST"]
        if request.method not in allowed:
            return HttpResponseNotAllowed(allowed)
        job = self.get_object(request, unquote(object_id))
        if job is None:
            gone = _("Job #%(pk)s does not exist (anymore: a prune may have deleted it).")
            self.message_user(request, gone % {"pk": object_id}, messages.WARNING)
            return redirect(self.changelist_url())
        if not (self.has_view_permission(request, job) and may_act(request)):
            raise PermissionDenied
        return job

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
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> HttpResponse | None:
        """Queued jobs fail as cancelled (never started, kept as a record); running ones
        are asked to stop, and stopped after JOBSTATE_CANCEL_GRACE. Asked first; then in
        chunks, each row by its own conditional write."""
        jobs, selected = bulk.selection(request, queryset)
        if not bulk.confirmed(request):
            plan, counts = bulk.cancel_plan(jobs, selected)
            button = ngettext("Yes, cancel %(n)d job", "Yes, cancel %(n)d jobs", plan.act) % {
                "n": plan.act
            }
            return bulk.confirm(
                self,
                request,
                title=_("Cancel the selected jobs?"),
                summary=bulk.cancel_summary(plan, counts),
                button=button,
                acts=plan.act > 0,
                hidden=bulk.action_fields(request),
                back_url=request.get_full_path(),
                examples=list(jobs.live().order_by("-pk")[: bulk.MAX_EXAMPLES]),
            )
        outcomes = Counter(self.cancel_by_hand(request, job) for job in bulk.in_chunks(jobs.live()))
        done = outcomes[CancelOutcome.CANCELLED] + outcomes[CancelOutcome.REQUESTED]
        verb = ngettext(
            "Cancelled %(done)d of %(selected)d selected job",
            "Cancelled %(done)d of %(selected)d selected jobs",
            selected,
        )
        if requested := outcomes[CancelOutcome.REQUESTED]:
            verb += " " + _("(%(requested)d running: asked to stop)") % {"requested": requested}
        self.report(request, verb, selected, done, _("already finished"))
        return None

    def cancel_by_hand(self, request: HttpRequest, job: Job) -> CancelOutcome:
        outcome = Job.objects.cancel(job)
        if outcome != CancelOutcome.FINISHED:
            message = CANCEL_LOG[outcome] % {"pk": job.pk}
            self.log_change(request, job, message)
        return outcome

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Cancel button of a queued or running job's page: a confirmation page that
        says what will happen, then a POST that does it."""
        job = self.posted_job(request, object_id, self.has_cancel_permission, allow_get=True)
        if not isinstance(job, Job):
            return job
        if not bulk.confirmed(request):
            return bulk.confirm(
                self,
                request,
                title=_("Cancel job #%(pk)d?") % {"pk": job.pk},
                summary=cancel_one_text(job),
                button=_("Yes, cancel it"),
                acts=job.state in LIVE_STATES,
                hidden=[],
                back_url=self.change_url(job),
                examples=[job],
            )
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
