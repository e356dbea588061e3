"""Prometheus metrics: the counters of what happens in processes (gauges.py reads what is
true of the queues now from the database, and serves both).

Two sources. What happens in processes (attempts finished, their durations, claims, lost
races) is counted where it happens: in each worker process, and in the supervisor (the
attempts it fails for a worker that ended, and those it rescues from lost workers). Under
`runjobs --metrics-port` they all run prometheus_client's multiprocess mode in a directory
of the supervisor's own, so one scrape of the supervisor adds up every worker it ever ran,
respawned ones included. What is true of the queues now (queued and running jobs, the
oldest runnable job's age, workers alive) is read from the database at each scrape, from
live rows only: the runnable and running partial indexes, never the history.

Nothing here imports prometheus_client until metrics are asked for (the `metrics` extra).
Label values are bounded: queue, task path, state, failure reason; never an id.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import Job

# Set in the supervisor for its worker processes: metrics are on, and where they go.
ENV = "JOBSTATE_METRICS_DIR"
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

# This process's counters, once install() ran (runjobs --metrics-port); None otherwise,
# and then the worker's hot path pays one comparison per call site.
recorder: Recorder | None = None


class Recorder:
    """The counters and the histogram one process adds to."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        # registry=None: the supervisor's scrape reads every process's files instead.
        self.finished_total = Counter(
            "jobstate_jobs_finished",
            "Attempts finished, by the state they ended in and why they failed.",
            ["queue", "task", "state", "reason"],
            registry=None,
        )
        self.duration = Histogram(
            "jobstate_job_duration_seconds",
            "How long attempts ran, from start to outcome.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=None,
        )
        self.claimed_total = Counter(
            "jobstate_jobs_claimed", "Attempts claimed by workers.", ["queue"], registry=None
        )
        self.discarded_total = Counter(
            "jobstate_outcomes_discarded",
            "Outcomes a worker discarded because another writer had moved the attempt on "
            "(lost races: it was failed as lost, timed out or handed back meanwhile).",
            ["queue", "task"],
            registry=None,
        )
        self.worker_exits_total = Counter(
            "jobstate_worker_exits",
            "Worker processes that ended, by how (replaced unless the supervisor stops).",
            ["how"],
            registry=None,
        )

    def claimed(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.claimed_total.labels(job.queue_name).inc()

    def finished(self, job: Job, duration: float | None = None) -> None:
        """Count a terminal attempt once, in the process that wrote it."""
        from ..states import FailureReason

        reason = job.failure_reason
        # A snoozed attempt is failed in the table, but no failure of its task.
        state = "snoozed" if reason == FailureReason.SNOOZED else job.state
        self.finished_total.labels(job.queue_name, job.task_path, state, reason).inc()
        started, finished = job.started_at, job.finished_at
        if duration is None and reason != FailureReason.RELEASED and started and finished:
            duration = (finished - started).total_seconds()
        if duration is not None:
            self.duration.labels(job.queue_name, job.task_path).observe(max(0.0, duration))

    def discarded(self, job: Job) -> None:
        self.discarded_total.labels(job.queue_name, job.task_path).inc()


def install() -> Recorder:
    """Count this process's events into the directory named by ENV (multiprocess mode)."""
    global recorder
    directory = os.environ[ENV]
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from prometheus_client import values

    # Imported before the variable was set (the project's code did): switch it over.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    recorder = Recorder()
    return recorder


def uninstall() -> None:
    """Stop counting in this process (the Exporter closed)."""
    global recorder
    recorder = None
