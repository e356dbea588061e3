"""The job list's actions: each one the same conditional write a worker uses.

Each reports how many jobs it moved and how many it skipped because the job had moved on
first (a worker claimed it, another operator got there, ...).
"""

from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.db.models.functions import Least, Now
from django.forms import BooleanField
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .exceptions import LostRace
from .models import Job
from .querysets import JobQuerySet

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    _Base = admin.ModelAdmin[Job]
else:
    _Base = object


class JobActions(_Base):
    """The actions of JobAdmin, which defines the `operate` and `cancel` permissions."""

    @admin.action(description=_("Retry the selected failed jobs"), permissions=["operate"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        selected = self.selected_count(request, queryset)
        retried = 0
        for job in queryset:
            try:
                new = Job.objects.retry(job)
            except LostRace:
                continue
            retried += 1
            self.log_addition(request, new, f"Retry of job {job.pk}")
        verb = ngettext(
            "Queued a new attempt for %(done)d of %(selected)d selected job",
            "Queued a new attempt for %(done)d of %(selected)d selected jobs",
            selected,
        )
        self.report(request, verb, selected, retried, _("not failed, or already retried"))

    @admin.action(description=_("Run the selected queued jobs now"), permissions=["operate"])
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

    @admin.action(description=_("Cancel the selected queued jobs"), permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = self.selected_count(request, queryset)
        cancelled = []
        for job in queryset.queued():
            try:
                Job.objects.cancel(job)
            except LostRace:
                continue
            cancelled.append(job)
        if cancelled:
            # The rows are gone: log the jobs as read (the default log_deletions() only iterates).
            self.log_deletions(request, cancelled)  # type: ignore[arg-type]
        verb = ngettext(
            "Cancelled %(done)d of %(selected)d selected job",
            "Cancelled %(done)d of %(selected)d selected jobs",
            selected,
        )
        self.report(request, verb, selected, len(cancelled), _("no longer queued"))

    def selected_count(self, request: HttpRequest, queryset: QuerySet[Job]) -> int:
        """How many jobs the operator selected, including any gone by now."""
        if BooleanField().to_python(request.POST.get("select_across")):
            return queryset.count()
        return len(set(request.POST.getlist(ACTION_CHECKBOX_NAME)))

    def report(
        self, request: HttpRequest, verb: str, selected: int, done: int, skip_reason: "StrOrPromise"
    ) -> None:
        """Tell how many jobs an action moved and how many it skipped because they moved on."""
        selected = max(selected, done)
        skipped = selected - done
        message = verb % {"done": done, "selected": selected}
        if skipped:
            message += _("; skipped %(skipped)d (%(reason)s).") % {
                "skipped": skipped,
                "reason": skip_reason,
            }
        else:
            message += _("; skipped 0.")
        self.message_user(request, message, messages.WARNING if skipped else messages.SUCCESS)
