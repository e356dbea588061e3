"""The torture run's verdict on concurrency limits (the limited tasks of torture_tasks.py).

Why each check is sound:
- Over a key's limit, sampled. Five times a second one statement counts, per key, the
  live rows that hold a slot and the running ones (a running limited row holds a slot):
  never more than the limit. A unique index forbids two holders of one slot, a CHECK a
  slot past the limit: this watches that they stay so, whatever the faults.
- Over a key's limit, from the bodies. Each body stamps time.monotonic() (one clock for
  every process of the host, partitioned ones included, and no skew) just after it
  recorded its start and just before it returns or raises, so before its worker writes
  its outcome: a body that ended by itself ended before its slot was freed, and the next
  body of the key can only start after that. A body that stamped nothing (its process
  killed, at a deadline or by a fault, or its stamp refused by an outage) ended by the
  time its row was failed, unless its attempt was failed as lost with its process alive
  (its host cut off, or its worker's supervisor unable to beat for it): then it may have
  slept on, up to its planned seconds. A rescued attempt's slot is freed at the rescue,
  not when its body ends: a body that went on past its row's end is counted until that
  end only, and any body of the key that started after the rescue and before that body's
  end is an "overlap after a rescue", shown apart, as the database bounds rows, not
  processes (docs/howto/limits.md); it must be explained by a fault that silenced the
  worker (a SIGSTOP, a cut), else it counts over the limit. So, per key, the bodies
  counted until their end (a rescued one until its row ended) never exceed the limit.
- Held left behind. A finish hands its slot to the oldest held row of its key in its own
  transaction, so no committed state has a held row while its key has a free slot:
  sampled five times a second (one statement), and once at the end.
- Every limited job ran once per attempt, none lost, none left: the run's own figures
  (run_twice, tasks_missing, not_terminal, left_running, broken_chains), which count
  the limited tasks with the rest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.torture.torture_check import CLOCK_SLACK, Faults, Figure, _overlaps, describe
from bench.torture.torture_tasks import LIMITED_TASKS
from django_jobstate.states import FailureReason

Row = dict[str, Any]
# Failed by someone else than the attempt's own worker: its body may have outlived its row.
RESCUED = (FailureReason.LOST, FailureReason.INTERRUPTED, FailureReason.TIMEOUT)
SLACK = CLOCK_SLACK.total_seconds()


def limit_figures(
    jobs: list[Row], executions: list[Row], faults: Faults, examples: dict[str, list[str]]
) -> dict[str, Figure]:
    from django.db.models import Count, F, OuterRef, Subquery
    from django.db.models.functions import Coalesce

    from django_jobstate.limits.concurrency import HELD, HOLDS_SLOT
    from django_jobstate.models import Job

    work = faults.workload
    limited = [j for j in jobs if j["task_path"] in LIMITED_TASKS]
    if not limited:
        return {"limits": Figure("limited tasks (per key, limit 1 / per task, limit 2)", "-")}
    by_key = {(str(j["result_id"]), j["attempt"]): j for j in limited}
    spans: dict[str, list[Span]] = defaultdict(list)
    for e in executions:
        job = by_key.get((str(e["result_id"]), e["attempt"]))
        if job is not None and job["concurrency_key"] is not None:
            spans[job["concurrency_key"]].append(_span(e, job, faults))
    over, after_rescue = 0, 0
    for key_spans in spans.values():
        limit = key_spans[0].job["concurrency_limit"]
        over += _over(key_spans, limit, examples, faults)
        for span in key_spans:
            if span.end <= span.until:
                continue
            # Bodies of the key begun while this one outlived its rescued row.
            later = [s for s in key_spans if span.until < s.start < span.end and s is not span]
            if not later:
                continue
            if _silenced(span.job, faults):
                after_rescue += len(later)
                examples["limit_after_rescue"].append(
                    f"{describe(span.job)}; its body ran {span.end - span.until:.2f} s past "
                    f"its rescue, {len(later)} of its key began meanwhile"
                )
            else:
                over += len(later)
                examples["limit_over_bodies"].append(
                    f"{_describe(span, faults)}: its body ran on after it was failed, "
                    f"unexplained; began meanwhile: "
                    + "; ".join(_describe(s, faults) for s in later)
                )
    holders = (
        Job.objects.filter(HOLDS_SLOT, concurrency_key=OuterRef("concurrency_key"))
        .order_by()
        .values("concurrency_key")
        .annotate(c=Count("pk"))
        .values("c")
    )
    left = Job.objects.filter(HELD).annotate(holders=Coalesce(Subquery(holders), 0))
    left_behind = left.filter(holders__lt=F("concurrency_limit")).count()
    firsts = [j for j in limited if j["attempt"] == 1]
    per_key = sum(j["concurrency_limit"] == 1 for j in firsts)
    keys = len({j["concurrency_key"] for j in firsts if j["concurrency_limit"] == 1})
    limits = {j["concurrency_key"]: j["concurrency_limit"] for j in firsts}
    peak = {
        n: max((v for k, v in work.limit_peaks.items() if limits.get(k) == n), default=0)
        for n in (1, 2)
    }
    rescued = [j for j in limited if j["failure_reason"] in (*RESCUED, FailureReason.RELEASED)]
    examples["limit_over_sampled"] += work.limit_over
    examples["limit_held_free"] += work.limit_held_free
    return {
        "limits": Figure(
            "limited tasks: limit 1 per key over the keys / limit 2 for the task "
            "(attempts; most running at once, sampled)",
            f"{per_key} over {keys} / {len(firsts) - per_key} ({len(limited)}; "
            f"{peak[1]} / {peak[2]})",
        ),
        "limit_faults": Figure(
            "  limited attempts failed by a fault (lost / interrupted / timed out / released)",
            " / ".join(
                str(sum(j["failure_reason"] == r for j in limited))
                for r in (*RESCUED, FailureReason.RELEASED)
            ),
            examples=[describe(j) for j in rescued[:5]],
        ),
        "limit_freezes": Figure(
            "  supervisors SIGSTOPped whole in a limited body, its key's next job waiting",
            len(faults.freezes),
            note=", ".join(
                f"{(f.ended - f.at).total_seconds():.1f} s, {len(f.victims)} running"
                for f in faults.freezes
                if f.ended
            ),
        ),
        "limit_over_sampled": Figure(
            "concurrency keys seen over their limit (slot holders or running rows, sampled)",
            len(work.limit_over),
            True,
            f"{work.limit_samples} samples",
        ),
        "limit_over_bodies": Figure(
            "bodies of a key begun while its limit's worth of bodies ran", over, True
        ),
        "limit_after_rescue": Figure(
            "  bodies begun while a body of the key outlived its rescued attempt (a SIGSTOP, "
            "a cut: not counted)",
            after_rescue,
        ),
        "limit_held_free": Figure(
            "held jobs while their key had a free slot (sampled, and at the end)",
            len(work.limit_held_free) + left_behind,
            True,
        ),
    }


@dataclass
class Span:
    """When a body ran, in seconds of time.monotonic(): `until` is its end, or its row's
    end if sooner and its attempt was rescued (its slot was freed then). `exact`: both
    ends stamped by the body (else read from the database clock: CLOCK_SLACK)."""

    start: float
    end: float
    until: float
    exact: bool
    job: Row

    @property
    def until_exact(self) -> bool:
        """Whether `until` is the body's own stamp, not its row's end."""
        return self.exact and self.until == self.end


def _span(e: Row, job: Row, faults: Faults) -> Span:
    """When the body ran (see the module's docstring)."""
    finished = _mono(job["finished_at"], faults) if job["finished_at"] else float("inf")
    if e["body_end"] is not None:
        start, end, exact = e["body_start"], e["body_end"], True
    else:
        start, end, exact = _mono(e["recorded_at"], faults), finished, False
        if job["failure_reason"] == FailureReason.LOST and _silenced(job, faults):
            end = max(finished, start + job["args"][2] + SLACK)  # it slept on, at most
    until = min(end, finished) if job["failure_reason"] in RESCUED else end
    return Span(start, end, until, exact, job)


def _mono(at: datetime, faults: Faults) -> float:
    """A time of the database clock in seconds of time.monotonic()."""
    return at.timestamp() - faults.workload.mono_to_db


def _silenced(job: Row, faults: Faults) -> bool:
    """Was the worker of `job` alive but silenced when it was failed: SIGSTOPped (a paused
    worker, or its whole supervisor) or its host cut off, and not killed before?"""
    wid, finished = job["worker_id"] or "", job["finished_at"]
    if finished is None:
        return False
    base = wid.rsplit("/", 1)[0] + "/"
    if any(k.target in (wid, base) and k.at <= finished for k in faults.kills):
        return False
    if any(p.worker_id == wid and p.stopped <= finished for p in faults.pauses):
        return True
    return any(
        wid.startswith(c.prefix) and _overlaps(job["started_at"], finished, c.at, c.ended)
        for c in [*faults.cuts, *faults.freezes]
    )


def _describe(span: Span, faults: Faults) -> str:
    """A job, and its body's span in the database clock's time of day."""

    def at(mono: float) -> str:
        if mono == float("inf"):
            return "never"
        stamp = mono + faults.workload.mono_to_db
        return datetime.fromtimestamp(stamp, tz=UTC).strftime("%H:%M:%S.%f")[:-3]

    how = "stamped by the body" if span.exact else "read from its rows"
    return (
        f"{describe(span.job)} [body {at(span.start)} to {at(span.end)}, counted until "
        f"{at(span.until)}, {how}]"
    )


def _over(spans: list[Span], limit: int, examples: Any, faults: Faults) -> int:
    """How many bodies began while `limit` others of the key ran (each counted until
    `until`: a rescued one until its row ended)."""
    over = 0
    for span in spans:
        running = []
        for s in spans:
            # No slack between two stamps of the bodies (one clock), else CLOCK_SLACK.
            before = 0.0 if s.exact and span.exact else SLACK
            after = 0.0 if span.exact and s.until_exact else SLACK
            if s is not span and s.start < span.start - before and span.start < s.until - after:
                running.append(s)
        if len(running) >= limit:
            over += 1
            examples["limit_over_bodies"].append(
                f"{_describe(span, faults)} began while {len(running)} ran: "
                + "; ".join(_describe(s, faults) for s in running)
            )
    return over
