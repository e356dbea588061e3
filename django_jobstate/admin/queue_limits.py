"""Queue limits in the admin (limits/queues.py): the form of a queue's page that changes
them at run time, and the note beside a queued job that its queue's limit holds back."""

from __future__ import annotations

import time
from typing import Any

from django import forms
from django.db import router
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..limits.queues import MAX_QUEUE_CONCURRENCY, QueueLimits, validate
from ..managers.queue_claim import limited_queues
from ..models import Job, JobQueue
from ..states import State

# Running counts of limited queues, for the notes of one page of jobs: a second old at most.
_running: dict[str, tuple[float, int]] = {}


def _running_now(queue: str) -> int:
    cached = _running.get(queue)
    if cached is None or cached[0] < time.monotonic():
        count = Job.objects.filter(queue_name=queue, state=State.RUNNING).count()
        cached = _running[queue] = (time.monotonic() + 1.0, count)
    return cached[1]


def holding_limits(job: Job) -> QueueLimits | None:
    """The limits of `job`'s queue, if it is queued in a queue that has some."""
    if job.state != State.QUEUED or job.hold:
        return None
    db = router.db_for_read(Job)
    return limited_queues(db, [job.queue_name]).get(job.queue_name)


def queue_hold_html(job: Job) -> SafeString:
    """Beside a queued job of a limited queue: what may hold it back. Not stuck."""
    limits = holding_limits(job)
    if limits is None:
        return SafeString("")
    if limits.concurrency is not None and _running_now(job.queue_name) >= limits.concurrency:
        short = _("waits for its queue's limit (%(n)s running)") % {"n": limits.concurrency}
    elif limits.rate:
        short = _("queue rate %(rate)s") % {"rate": limits.rate}
    else:
        return SafeString("")
    detail = _(
        "Its queue %(queue)r is limited (%(limits)s, from the %(source)s): it starts when "
        "the queue has room, in claim order. Not stuck."
    ) % {"queue": job.queue_name, "limits": limits.describe(), "source": limits.source}
    return format_html('<span class="jobstate-held" title="{}">{}</span>', detail, short)


class QueueLimitsForm(forms.ModelForm):
    """A queue's limits, set at run time: they win over QUEUE_LIMITS until "use the
    settings" is ticked."""

    concurrency_limit = forms.IntegerField(
        label=gettext_lazy("concurrency limit"),
        min_value=1,
        max_value=MAX_QUEUE_CONCURRENCY,
        required=False,
        help_text=gettext_lazy("At most this many of its jobs running at once, on every worker."),
    )
    rate_limit = forms.CharField(
        label=gettext_lazy("rate limit"),
        required=False,
        help_text=gettext_lazy('At most this many starts: "10/s", "100/m", "1000/h".'),
    )
    use_settings = forms.BooleanField(
        label=gettext_lazy("use the settings' limits"),
        required=False,
        help_text=gettext_lazy(
            "Forget the limits set here: the settings' QUEUE_LIMITS apply again."
        ),
    )

    class Meta:
        model = JobQueue
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            limits = self.instance.limits
            self.fields["concurrency_limit"].initial = limits.concurrency
            self.fields["rate_limit"].initial = limits.rate

    def clean_rate_limit(self) -> str:
        rate = self.cleaned_data["rate_limit"].strip()
        if rate:
            try:
                rate = validate(self.instance.name, {"rate": rate}).rate
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return rate

    def save_limits(self, by: str) -> JobQueue:
        data = self.cleaned_data
        return JobQueue.objects.set_limits(
            self.instance.name,
            concurrency=data["concurrency_limit"],
            rate=data["rate_limit"],
            clear=data["use_settings"],
            by=by,
        )
