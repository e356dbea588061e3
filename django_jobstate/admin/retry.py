"""Retry, from the job list (failed jobs, never a cancelled one unless asked) and from a
failed job's page: the next attempt, by the same conditional write a worker uses.

Each reports what it moved, naming the new attempts, and how many jobs it skipped because
the job had moved on first (another operator retried it, a prune deleted it, ...).
"""

import uuid

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..exceptions import JobAlreadyEnqueued, LostRace
from ..models import Job
from ..querysets import JobQuerySet
from ..states import LIVE_STATES, FailureReason, State
from . import bulk
from .actions import JobActions, attempt_text, state_phrase

# After a retry, the message names this many new attempts, and the list shows up to
# MAX_LISTED tasks by their result ids (more would not fit in a URL).
MAX_NAMED = 10
MAX_LISTED = 100
# The admin log's entry for the new attempt: the job page reads it as "retried by hand".
RETRY_LOG = "Retry of job %(pk)d"


class RetryActions(JobActions):
    """The Retry actions and button of JobAdmin."""

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        retry = path(
            "<path:object_id>/retry/",
            self.admin_site.admin_view(self.retry_view),  # login, staff, CSRF
            name="{}_{}_retry".format(*info),
        )
        return [retry, *super().get_urls()]  # before the catch-all <object_id>/

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
    def retry_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> HttpResponse | None:
        """Retry each selected failure, but never a cancelled one: someone cancelled it so
        that it would not run, and a bulk retry must not undo that by the way."""
        return self.retry_selected(request, queryset, cancelled_too=False)

    @admin.action(
        description=gettext_lazy("Retry the selected failed jobs, cancelled ones included"),
        permissions=["operate"],
    )
    def retry_jobs_cancelled_too(
        self, request: HttpRequest, queryset: JobQuerySet
    ) -> HttpResponse | None:
        return self.retry_selected(request, queryset, cancelled_too=True)

    def retry_selected(
        self, request: HttpRequest, queryset: JobQuerySet, *, cancelled_too: bool
    ) -> HttpResponse | None:
        """Ask first (what will happen to how many jobs), then retry in chunks: each row by
        its own conditional write, so a job retried since the confirmation is skipped."""
        jobs, selected = bulk.selection(request, queryset)
        candidates = jobs.filter(state=State.FAILED)
        cancelled = candidates.filter(failure_reason=FailureReason.CANCELLED).exclude(
            bulk.newer_attempt()
        )
        if not cancelled_too:  # a cancel already retried stays, to be counted as retried
            candidates = candidates.exclude(pk__in=cancelled.values("pk"))
        if not bulk.confirmed(request):
            plan = bulk.retry_plan(jobs, selected, cancelled_too=cancelled_too)
            button = ngettext("Yes, retry %(n)d job", "Yes, retry %(n)d jobs", plan.act) % {
                "n": plan.act
            }
            return bulk.confirm(
                self,
                request,
                title=_("Retry the selected failed jobs?"),
                summary=bulk.retry_summary(plan),
                button=button,
                acts=plan.act > 0,
                hidden=bulk.action_fields(request),
                back_url=request.get_full_path(),
                examples=list(
                    candidates.exclude(bulk.newer_attempt()).order_by("-pk")[: bulk.MAX_EXAMPLES]
                ),
            )
        failed = candidates.count() + (0 if cancelled_too else cancelled.count())
        skipped_cancelled = [] if cancelled_too else list(cancelled.order_by("-pk")[:MAX_NAMED])
        cancelled_count = 0 if cancelled_too else cancelled.count()
        retried: list[Job] = []  # the first MAX_LISTED + 1 only: a selection may be huge
        done, lost, held_count = 0, 0, 0
        held: list[SafeString] = []
        for job in bulk.in_chunks(candidates):
            try:
                new = self.retry_by_hand(request, job)
            except LostRace:
                lost += 1
            except JobAlreadyEnqueued as exc:
                held_count += 1
                if len(held) < MAX_NAMED:
                    held.append(format_html("{}: {}", self.job_link(job), self.key_holder(exc)))
            else:
                done += 1
                if len(retried) <= MAX_LISTED:
                    retried.append(new)
        plan = bulk.Plan(selected, done)
        plan.add_skip(lost, _("already retried"))
        plan.add_skip(cancelled_count, _("cancelled: this action never retries a cancel"))
        plan.add_skip(held_count, _("another job holds the unique key"))
        plan.add_skip(selected - failed, _("not failed"))
        verb = ngettext(
            "Queued a new attempt for %(done)d of %(selected)d selected job",
            "Queued a new attempt for %(done)d of %(selected)d selected jobs",
            selected,
        )
        named = format_html_join(
            ", ", "{} ({})", ((self.job_link(j), attempt_text(j)) for j in retried[:MAX_NAMED])
        )
        if done > MAX_NAMED:
            more = _("and %(more)d more") % {"more": done - MAX_NAMED}
            named = format_html("{} {}", named, more)
        self.report(request, verb, selected, done, plan.skip_text(), named)
        if skipped_cancelled:
            self.say_cancelled_skipped(request, skipped_cancelled, cancelled_count)
        if held:
            message = _("Not retried, as another job holds the unique key: {jobs}.")
            jobs_html = format_html_join("; ", "{}", ((text,) for text in held))
            self.message_user(request, format_html(message, jobs=jobs_html), messages.WARNING)
        return self.show_retried(request, retried, done)

    def say_cancelled_skipped(self, request: HttpRequest, cancelled: list[Job], count: int) -> None:
        """Name the cancelled jobs a bulk retry left alone, and how to retry them anyway."""
        jobs = format_html_join(", ", "{}", ((self.job_link(j),) for j in cancelled[:MAX_NAMED]))
        if count > MAX_NAMED:
            jobs = format_html("{} {}", jobs, _("and %(more)d more") % {"more": count - MAX_NAMED})
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

    def show_retried(
        self, request: HttpRequest, retried: list[Job], count: int
    ) -> HttpResponse | None:
        """Where the operator sees the `count` new attempts (`retried`: the first of them):
        the "failed" filter would hide them."""
        if not count:
            return None  # the list as it was
        if count == 1:
            return redirect(self.change_url(retried[0]))
        if count <= MAX_LISTED:
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
