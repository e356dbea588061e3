"""Prometheus metrics read from the database at each scrape (queued and running jobs, the
oldest runnable job's age, workers alive), and the two ways they are served:
`runjobs --metrics-port PORT` (Exporter) and a view for a web process (metrics_view, whose
public path is django_jobstate.metrics.metrics_view). The counters are metrics.py's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .metrics import ENV, install, uninstall

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse


class DatabaseCollector:
    """Gauges read from the database at each scrape, from live rows only."""

    def __init__(self, workers: Callable[[], int] | None = None) -> None:
        self.workers = workers  # the supervisor's live worker processes

    def collect(self) -> Iterator[Any]:
        from django.db import DatabaseError, connections, router
        from prometheus_client.core import GaugeMetricFamily

        from ..models import Job

        jobs = GaugeMetricFamily(
            "jobstate_jobs", "Jobs queued and running now.", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "jobstate_oldest_runnable_age_seconds",
            "Seconds the longest-waiting runnable job of each queue has been due.",
            labels=["queue"],
        )
        paused_oldest = GaugeMetricFamily(
            "jobstate_oldest_paused_age_seconds",
            "Seconds the longest-waiting due job of each paused queue has been due: it waits "
            "by an operator's choice, and is not in jobstate_oldest_runnable_age_seconds.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "jobstate_queue_paused", "1 for a paused queue, 0 otherwise.", labels=["queue"]
        )
        up = GaugeMetricFamily("jobstate_database_up", "Whether the scrape's queries worked.")
        try:
            for labels, value in live_counts():
                jobs.add_metric(labels, value)
            runnable, waiting, paused_names = queue_ages()
            for queue, age in sorted(runnable.items()):
                oldest.add_metric([queue], age)
            for queue, age in sorted(waiting.items()):
                paused_oldest.add_metric([queue], age)
            for queue in sorted(_known_queues() | paused_names):
                paused.add_metric([queue], int(queue in paused_names))
            up.add_metric([], 1)
        except DatabaseError:
            up.add_metric([], 0)
        finally:
            if self.workers is not None:  # a thread of the exporter's server: let go
                connections[router.db_for_write(Job)].close()
        yield jobs
        yield oldest
        yield paused_oldest
        yield paused
        yield up
        if self.workers is not None:
            yield GaugeMetricFamily(
                "jobstate_workers", "Worker processes this runjobs runs now.", value=self.workers()
            )


def _known_queues() -> set[str]:
    from ..backend import JobStateBackend
    from ..tasksapi import task_backends

    return {q for b in task_backends.all() if isinstance(b, JobStateBackend) for q in b.queues}


def live_counts() -> list[tuple[list[str], int]]:
    """[([queue, state], count)] of queued and running jobs; 0 for configured queues."""
    from django.db.models import Count

    from ..models import Job
    from ..states import State

    counts = {(q, s): 0 for q in _known_queues() for s in (State.QUEUED, State.RUNNING)}
    # One query per partial index (jobstate_job_runnable, jobstate_job_held: the rows a
    # concurrency limit holds are not in the runnable one; jobstate_job_running).
    queued = Job.objects.queued()
    live = (
        (State.QUEUED, queued.filter(hold=None)),
        (State.QUEUED, queued.filter(hold__isnull=False)),  # as the held index says it
        (State.RUNNING, Job.objects.running()),
    )
    for state, rows in live:
        for queue, n in rows.order_by().values_list("queue_name").annotate(n=Count("pk")):
            counts[(queue, state)] = counts.get((queue, state), 0) + n
    return [([q, str(s)], n) for (q, s), n in sorted(counts.items())]


def queue_ages() -> tuple[dict[str, float], dict[str, float], set[str]]:
    """Per queue, how long its longest-waiting due job has been due (database clock): for
    unpaused queues ({queue: seconds}, 0 for a configured queue with none), for paused
    ones apart (their jobs are not runnable), and the paused queues' names."""
    from django.db.models import Min

    from ..db.clock import Now
    from ..models import Job, JobQueue

    paused = JobQueue.objects.paused_names()
    runnable = dict.fromkeys(_known_queues(), 0.0)
    waiting = dict.fromkeys(paused, 0.0)
    rows = Job.objects.due().order_by().values_list("queue_name")
    for queue, age in rows.annotate(age=Now() - Min("run_after")):
        (waiting if queue in paused else runnable)[queue] = max(0.0, age.total_seconds())
    return runnable, waiting, paused


def oldest_ages() -> list[tuple[str, float]]:
    """[(queue, seconds)] of each queue's longest-waiting runnable job (database clock)."""
    return sorted(queue_ages()[0].items())


class Exporter:
    """The supervisor's metrics: a directory for every process's counters, and an HTTP
    server at 127.0.0.1:PORT/metrics that adds them up, with the database's gauges."""

    def __init__(self, port: int, workers: Callable[[], int]) -> None:
        self.directory = tempfile.mkdtemp(prefix="jobstate-metrics-")
        os.environ[ENV] = self.directory  # spawned workers inherit it
        install()
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        # Workers by heartbeat, of every runjobs: an alert on "no live worker" must not
        # need a scrape of a web process. Before the database gauges, which close the
        # server thread's connection once done.
        registry.register(HeartbeatCollector())
        registry.register(DatabaseCollector(workers))
        try:
            self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        except OSError:
            self.close()
            raise
        self.port = self.server.server_port

    def close(self) -> None:
        if hasattr(self, "server"):
            self.server.shutdown()
            self.server.server_close()
        uninstall()
        os.environ.pop(ENV, None)
        shutil.rmtree(self.directory, ignore_errors=True)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The database's gauges (jobs, oldest runnable age, workers by heartbeat), for a
    project that scrapes its web process: path("metrics/jobs", metrics_view)."""
    from django.http import HttpResponse
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    registry.register(HeartbeatCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class HeartbeatCollector:
    """`jobstate_workers_seen{status}`: workers alive and lost, by their heartbeats."""

    def collect(self) -> Iterator[Any]:
        from django.db import DatabaseError
        from django.db.models import F
        from prometheus_client.core import GaugeMetricFamily

        from ..conf import get_settings
        from ..db.clock import Now
        from ..models import WorkerHeartbeat

        lost_after = get_settings().LOST_AFTER
        seen = GaugeMetricFamily(
            "jobstate_workers_seen", "Workers by their heartbeats.", labels=["status"]
        )
        rows = WorkerHeartbeat.objects.annotate(age=Now() - F("last_seen")).values_list("age")
        try:
            ages = list(rows)
        except DatabaseError:
            return  # jobstate_database_up says so; a made-up 0 alive would page someone
        lost = sum(age.total_seconds() > lost_after for (age,) in ages)
        seen.add_metric(["alive"], len(ages) - lost)
        seen.add_metric(["lost"], lost)
        yield seen
