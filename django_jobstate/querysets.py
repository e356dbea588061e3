"""Reads of Job rows, named after the set they return (`Job.objects.runnable()`, ...)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Exists, OuterRef

from .db.clock import Now
from .limits.concurrency import HELD, Hold
from .states import LIVE_STATES, TERMINAL_STATES, State

if TYPE_CHECKING:
    from .models import Job


class JobQuerySet(models.QuerySet["Job"]):
    def queued(self) -> JobQuerySet:
        return self.filter(state=State.QUEUED)

    def running(self) -> JobQuerySet:
        return self.filter(state=State.RUNNING)

    def live(self) -> JobQuerySet:
        return self.filter(state__in=LIVE_STATES)

    def terminal(self) -> JobQuerySet:
        return self.filter(state__in=TERMINAL_STATES)

    def due(self, queues: Iterable[str] | None = None) -> JobQuerySet:
        """Queued jobs whose time has come, paused queues' included; not those held by a
        concurrency limit (limits.py), which wait for a slot (and are not in the claim's
        index, which serves this)."""
        return self.queued().filter(run_after__lte=Now(), hold=None).for_queues(queues)

    def runnable(self, queues: Iterable[str] | None = None) -> JobQuerySet:
        """Due jobs that a worker may claim: not those of a paused queue."""
        from .models import JobQueue

        paused = JobQueue.objects.paused().values("name")
        return self.due(queues).exclude(queue_name__in=paused)

    def held_by_limits(self) -> list[dict[str, Any]]:
        """The queued jobs that wait for a slot of a concurrency limit, per task and limit:
        [{"task": path, "limit": N, "held": count}], waiting for a running job of their
        key to finish, not stuck (limits.py)."""
        held = self.filter(HELD).order_by().values("task_path", "concurrency_limit")
        rows = held.annotate(n=models.Count("pk")).order_by("task_path", "concurrency_limit")
        return [
            {"task": row["task_path"], "limit": row["concurrency_limit"], "held": row["n"]}
            for row in rows
        ]

    def held_by_rates(self) -> list[dict[str, Any]]:
        """The due jobs of rate-limited tasks, per task and rate: [{"task": path, "rate":
        "10/s", "due": N}]; they start at that rate across every worker, not stuck
        (limits/rates.py). Read from the rated rows' index."""
        rated = self.filter(state=State.QUEUED, hold=Hold.RATE, run_after__lte=Now())
        rows = (
            rated.order_by()
            .values("task_path", "rate_limit")
            .annotate(n=models.Count("pk"))
            .order_by("task_path", "rate_limit")
        )
        return [
            {"task": row["task_path"], "rate": row["rate_limit"], "due": row["n"]} for row in rows
        ]

    def held_by_queue_limits(self) -> list[dict[str, Any]]:
        """The limited queues that have due jobs (queue_limits.py): [{"queue": name,
        "limits": "at most 3 running, rate 10/s", "from": "settings" or "run time",
        "running": N, "due": N}]. Their due jobs wait for room in the queue, not stuck."""
        from .managers.queue_claim import limited_queues

        names = self.model._default_manager.queue_names()
        found = []
        for queue, limits in limited_queues(self.db, names).items():
            jobs = self.filter(queue_name=queue)
            found.append(
                {
                    "queue": queue,
                    "limits": limits.describe(),
                    "from": limits.source,
                    "running": jobs.running().count(),
                    "due": jobs.due(None).count(),
                }
            )
        return found

    def for_queues(self, queues: Iterable[str] | None) -> JobQuerySet:
        """The jobs of those queues (None: of every queue)."""
        return self if queues is None else self.filter(queue_name__in=list(queues))

    def attempts_of(self, result_id: str | uuid.UUID) -> JobQuerySet:
        return self.filter(result_id=result_id).order_by("attempt")

    def prunable(self, older_than: timedelta, states: Iterable[str] | None = None) -> JobQuerySet:
        """Every attempt of the tasks that are done and old: whose newest attempt is terminal,
        in `states`, and finished more than `older_than` ago, by the database clock.

        Whole tasks only, so that pruning never changes what a task's result reads as: a
        task whose final success was deleted would read as failed (and could be retried),
        one whose failed attempts were deleted would lose its errors. `states` is the
        task's final outcome. Never a task that still has a live attempt, nor one whose
        result another task may still be given (never_released()).
        """
        from .workflows.fields import JobDependency

        states = TERMINAL_STATES if states is None else {State(s) for s in states}
        if live := states & LIVE_STATES:
            raise ValueError(f"Only terminal attempts can be pruned, not {sorted(live)}.")
        jobs = self.model._default_manager
        newer = jobs.filter(result_id=OuterRef("result_id"), attempt__gt=OuterRef("attempt"))
        final = jobs.filter(
            result_id=OuterRef("result_id"),
            state__in=sorted(states),
            finished_at__lt=Now() - older_than,
        ).exclude(Exists(newer))
        live_attempt = jobs.live().filter(result_id=OuterRef("result_id"))
        waited_for = JobDependency.objects.filter(
            upstream=OuterRef("result_id"), downstream__in=never_released(jobs)
        )
        return self.filter(Exists(final)).exclude(Exists(live_attempt)).exclude(Exists(waited_for))

    def counts_by_queue(self) -> dict[str, dict[str, int]]:
        """Return {queue: {state: count}}, every state present, for the queues with jobs."""
        counts: dict[str, dict[str, int]] = {}
        rows = self.order_by().values_list("queue_name", "state").annotate(n=models.Count("pk"))
        for queue, state, n in rows:
            counts.setdefault(queue, dict.fromkeys(State.values, 0))[state] = n
        return dict(sorted(counts.items()))

    def oldest_runnable_age(self) -> float | None:
        """Seconds the longest-waiting runnable job has been due (database clock), or None."""
        return _oldest_age(self.runnable())

    def paused_backlog(self) -> tuple[int, float | None]:
        """How many due jobs wait in paused queues, and for how long the oldest has (None
        if none): waiting by an operator's choice, not runnable."""
        from .models import JobQueue

        paused = JobQueue.objects.paused().values("name")
        jobs = self.due().filter(queue_name__in=paused)
        return jobs.count(), _oldest_age(jobs)

    def stats(self, lost_after: float) -> dict[str, Any]:
        """Describe the queues and the workers, in the shape `jobstats --json` prints.

        A worker is lost once silent for `lost_after` seconds (database clock), as for
        rescue_lost(); a worker with running attempts but no heartbeat row at all is lost too.
        """
        from .models import WorkerHeartbeat

        running = self.running().order_by().values_list("worker_id").annotate(n=models.Count("pk"))
        per_worker: dict[str, int] = dict(running)
        workers = []
        beats = WorkerHeartbeat.objects.annotate(age=Now() - models.F("last_seen"))
        for beat in beats:
            age = max(0.0, beat.age.total_seconds())
            workers.append(
                {
                    "worker_id": beat.worker_id,
                    "host": beat.host,
                    "pid": beat.pid,
                    "last_seen_age_seconds": round(age, 3),
                    "lost": age > lost_after,
                    "running": per_worker.pop(beat.worker_id, 0),
                }
            )
        for worker_id, n in per_worker.items():
            workers.append(
                {
                    "worker_id": worker_id,
                    "host": None,
                    "pid": None,
                    "last_seen_age_seconds": None,
                    "lost": True,
                    "running": n,
                }
            )
        workers.sort(key=lambda worker: worker["worker_id"])
        age = self.oldest_runnable_age()
        paused_due, paused_age = self.paused_backlog()
        from .models import JobQueue

        return {
            "queues": self.counts_by_queue(),
            "paused_queues": sorted(JobQueue.objects.paused_names()),
            "cancel_requested": self.running().filter(cancel_requested_at__isnull=False).count(),
            "oldest_runnable_age_seconds": None if age is None else round(age, 3),
            "paused_due": paused_due,
            "held_by_limits": self.held_by_limits(),
            "held_by_queue_limits": self.held_by_queue_limits(),
            "held_by_rates": self.held_by_rates(),
            "oldest_paused_age_seconds": None if paused_age is None else round(paused_age, 3),
            "workers": workers,
            "lost_workers": sum(worker["lost"] for worker in workers),
        }


def _oldest_age(jobs: JobQuerySet) -> float | None:
    """Seconds the longest-waiting of due `jobs` has been due (database clock), or None."""
    age = jobs.aggregate(age=Now() - models.Min("run_after"))["age"]
    return None if age is None else max(0.0, age.total_seconds())


def never_released(jobs: Any) -> Any:
    """The result ids of the tasks that depend on others with an attempt never released:
    held, or failed or cancelled while held. Released, such a task is given its upstreams'
    results (managers/deps.py): an upstream failed for good that an operator retries
    brings those it failed back, held again. (A released task has them in its arguments:
    a retry of it copies them.)"""
    return jobs.filter(pending_deps__gt=0).values("result_id")
