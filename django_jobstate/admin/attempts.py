"""Which run of its task an attempt is ('2/3'): attempts handed back unstarted or snoozed
add one to max_attempts each, not a run, and are counted apart."""

from typing import Any

from django.utils.translation import gettext as _

from ..models import Job
from ..states import FailureReason

UNCOUNTED = (FailureReason.RELEASED, FailureReason.SNOOZED)  # each adds an attempt, not a run


def attach_hand_backs(jobs: list[Job]) -> None:
    """Set `handed_back` and `snoozed` on each of `jobs`: how many earlier attempts of its
    task a worker released unstarted, or the task snoozed. One query for them all (the
    (result_id, attempt) index)."""
    tasks = {job.result_id for job in jobs if job.attempt > 1}
    uncounted: dict[Any, list[tuple[int, str]]] = {}
    if tasks:
        rows = Job.objects.filter(result_id__in=tasks, failure_reason__in=UNCOUNTED)
        for result_id, number, reason in rows.values_list("result_id", "attempt", "failure_reason"):
            uncounted.setdefault(result_id, []).append((number, reason))
    for job in jobs:
        earlier = [reason for n, reason in uncounted.get(job.result_id, []) if n < job.attempt]
        job.handed_back = earlier.count(FailureReason.RELEASED)  # type: ignore[attr-defined]
        job.snoozed = earlier.count(FailureReason.SNOOZED)  # type: ignore[attr-defined]


def attempt_label(job: Job, handed_back: int, snoozed: int = 0) -> str:
    """'2/3': which of its task's runs this attempt is, not counting the `handed_back`
    earlier attempts that a worker released unstarted (each added an attempt, not a run),
    nor the `snoozed` ones (each asked to run again later).
    """
    apart = handed_back + snoozed
    runs = f"{job.attempt - apart}/{max(1, job.max_attempts - apart)}"
    if job.failure_reason == FailureReason.RELEASED:
        return _("%(runs)s (handed back)") % {"runs": runs}
    if job.failure_reason == FailureReason.SNOOZED:
        return _("%(runs)s (snoozed)") % {"runs": runs}
    notes = [_("%(n)d handed back") % {"n": handed_back}] if handed_back else []
    notes += [_("%(n)d snoozed") % {"n": snoozed}] if snoozed else []
    return f"{runs} ({', '.join(notes)})" if notes else runs
