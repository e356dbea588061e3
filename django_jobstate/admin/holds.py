"""Why a queued job waits, in the job admin's words: held by its concurrency limit, its
task's rate or the tasks it depends on (its `hold`), or by its queue's limits or pause."""

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..limits.concurrency import Hold
from ..models import Job
from ..states import State
from .queue_limits import queue_hold_html


def held_html(job: Job) -> SafeString:
    """For a queued job held back (its `hold`): by a concurrency limit (limits/), waiting
    for a slot a running job of its key frees; by its task's rate; or by the tasks it
    depends on (workflows). Not stuck."""
    if job.state != State.QUEUED:
        return SafeString("")
    if not job.hold:
        return queue_hold_html(job)
    if job.hold == Hold.RATE:
        short = _("starts at its rate (%(rate)s)") % {"rate": job.rate_limit}
        detail = _(
            "Held by its task's rate limit: at most %(rate)s attempts of this task start, "
            "across all workers. It starts when the task's turn comes, in claim order. "
            "Not stuck."
        ) % {"rate": job.rate_limit}
    elif job.hold == Hold.DEPS:
        short = _("waits for %(n)s task(s) it depends on") % {"n": job.pending_deps}
        detail = _(
            "Held until every task it depends on has succeeded (depends_on, or a step of a "
            "workflow); if one fails for good, it fails too, as upstream_failed."
        )
    else:
        short = _("waits for a slot (limit %(n)s)") % {"n": job.concurrency_limit}
        detail = _(
            "Held by its concurrency limit: at most %(n)s jobs of this task (or of its "
            "concurrency_key's value) run at once. It becomes runnable when one of them "
            "finishes, oldest held first."
        ) % {"n": job.concurrency_limit}
    return format_html('<span class="jobstate-held" title="{}">{}</span>', detail, short)
