"""Prometheus metrics: a real `runjobs --metrics-port` scraped over HTTP, and the view."""

import json
import re
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_jobstate.backend import JobStateBackend
from django_jobstate.models import Job, JobQueue, WorkerHeartbeat
from django_jobstate.states import State
from django_jobstate.telemetry.gauges import live_counts, oldest_ages
from tests import tasks
from tests.conftest import ROOT, subprocess_env
from tests.factories import JobFactory
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def by(found: dict, name: str, *keys: str) -> Counter:
    """Sum the samples called `name` by the label values `keys`."""
    sums: Counter = Counter()
    for (sample, labels), value in found.items():
        if sample == name:
            sums[tuple(dict(labels)[k] for k in keys)] += value
    return sums


def test_scraped_counters_add_up_to_the_rows_while_two_workers_drain(runjobs):
    backend = JobStateBackend("default", {})
    backend.bulk_enqueue(tasks.record, [([f"ok-{i}"], {}) for i in range(30)])
    backend.bulk_enqueue(tasks.boom, [([f"bad-{i}"], {}) for i in range(4)])  # fail once
    backend.bulk_enqueue(tasks.fails_once, [([f"retry-{i}"], {}) for i in range(5)])
    backend.bulk_enqueue(tasks.always_fails, [([f"never-{i}"], {}) for i in range(2)])
    tasks.busy_loop.enqueue("overdue")  # killed at its timeout by the supervisor, twice
    waiting = tasks.email.using(queue_name="reports").enqueue("not served")
    # --max-jobs replaces workers as they go: the counts of ended ones must stay.
    proc = runjobs.start(
        "--concurrency", "2", "--metrics-port", "0", "--max-jobs", "7", "--queue", "default"
    )

    def port() -> int | None:
        assert proc.poll() is None, runjobs.output(proc)
        found = re.search(r"Metrics at http://127.0.0.1:(\d+)/metrics", runjobs.output(proc))
        return int(found[1]) if found else None

    url = f"http://127.0.0.1:{wait_for(port)}/metrics"

    def scrape() -> dict:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            return samples(response.read().decode())

    during = scrape()  # while it drains: the gauges are read, the counters only grow
    assert during[("jobstate_database_up", ())] == 1
    assert during[("jobstate_workers", ())] <= 2
    wait_for(lambda: not Job.objects.live().filter(queue_name="default").exists())
    after = scrape()
    runjobs.stop(proc)

    rows = Counter(
        {
            (row["task_path"], row["state"], row["failure_reason"]): row["n"]
            for row in Job.objects.terminal()
            .values("task_path", "state", "failure_reason")
            .annotate(n=Count("pk"))
        }
    )
    finished = by(after, "jobstate_jobs_finished_total", "task", "state", "reason")
    assert +finished == rows
    # The kinds of endings the run had to have, for the sum to mean something.
    assert rows[("tests.tasks.fails_once", State.FAILED, "error")] == 5
    assert rows[("tests.tasks.always_fails", State.FAILED, "error")] == 6
    assert rows[("tests.tasks.busy_loop", State.FAILED, "timeout")] == 2  # the supervisor's
    assert sum(n for (_, state, _), n in rows.items() if state == State.SUCCEEDED) == 35
    for key, value in by(during, "jobstate_jobs_finished_total", "task", "state", "reason").items():
        assert value <= finished[key]
    # Every attempt whose body ran has a duration; a released one (never started) has not.
    ran = Counter()
    for (task, _, reason), n in rows.items():
        if reason != "released":
            ran[(task,)] += n
    assert +by(after, "jobstate_job_duration_seconds_count", "task") == ran
    claimed = Job.objects.exclude(started_at=None).filter(queue_name="default").count()
    assert by(after, "jobstate_jobs_claimed_total", "queue")[("default",)] == claimed
    assert by(after, "jobstate_worker_exits_total", "how")[("recycled",)] >= 3
    # The gauges: the live rows now, per queue and state; the unserved queue's job waits.
    gauges = by(after, "jobstate_jobs", "queue", "state")
    assert gauges[("default", "queued")] == gauges[("default", "running")] == 0
    assert gauges[("reports", "queued")] == 1
    assert gauges[("emails", "queued")] == 0  # a configured queue, shown empty
    age = by(after, "jobstate_oldest_runnable_age_seconds", "queue")
    assert age[("reports",)] > 0
    assert age[("default",)] == 0
    # Labels stay bounded: no id of a job or of a result appears.
    assert str(waiting.id) not in str(after)
    labels = {name for _, sample_labels in after for name, _ in sample_labels}
    assert labels <= {"queue", "task", "state", "reason", "how", "le", "status"}


def test_a_bad_metrics_port_exits_2(runjobs):
    done = runjobs.run("--metrics-port", "70000")
    assert done.returncode == 2
    assert "must be a port from 0 to 65535" in done.stdout


def test_a_metrics_port_in_use_is_said_and_nothing_starts(runjobs):
    tasks.record.enqueue("stays queued")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = runjobs.run("--burst", "--metrics-port", str(port))
    assert done.returncode == 1
    assert f"--metrics-port {port}: cannot serve on it" in done.stdout
    assert Job.objects.queued().count() == 1


def test_the_view_serves_the_database_gauges(client, settings):
    settings.ROOT_URLCONF = "tests.urls"
    tasks.record.enqueue("a")
    tasks.email.enqueue("b")
    Job.objects.claim("w1", queues=["emails"])
    WorkerHeartbeat.objects.beat({"w1": 1}, host="h", queues=None)

    response = client.get(reverse("jobstate-metrics"))

    assert response.status_code == 200
    found = samples(response.content.decode())
    jobs = by(found, "jobstate_jobs", "queue", "state")
    assert jobs[("default", "queued")] == 1
    assert jobs[("emails", "running")] == 1
    assert jobs[("emails", "queued")] == jobs[("reports", "running")] == 0
    assert by(found, "jobstate_workers_seen", "status") == Counter({("alive",): 1})
    assert found[("jobstate_database_up", ())] == 1


def test_a_paused_queues_waiting_jobs_are_reported_apart_from_runnable_ones(client, settings):
    settings.ROOT_URLCONF = "tests.urls"
    now = timezone.now()
    JobFactory(queue_name="emails", run_after=now - timedelta(hours=1))  # paused: waits
    JobFactory(queue_name="default", run_after=now - timedelta(seconds=1))
    JobFactory(queue_name="old", run_after=now - timedelta(hours=2))  # no longer configured
    for queue in ["emails", "old"]:
        JobQueue.objects.pause(queue)

    found = samples(client.get(reverse("jobstate-metrics")).content.decode())

    runnable = by(found, "jobstate_oldest_runnable_age_seconds", "queue")
    assert runnable[("emails",)] == 0  # nothing runnable: a deliberate pause fires no alert
    assert ("old",) not in runnable
    assert 1 <= runnable[("default",)] < 3600
    paused = by(found, "jobstate_oldest_paused_age_seconds", "queue")
    assert set(paused) == {("emails",), ("old",)}
    assert paused[("emails",)] >= 3600
    assert paused[("old",)] >= 7200
    flags = by(found, "jobstate_queue_paused", "queue")
    assert flags == Counter({("emails",): 1, ("old",): 1})  # 0 for the others
    assert set(flags) == {("default",), ("emails",), ("reports",), ("old",)}


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's planner has no statistics")
@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits
def test_the_gauges_read_live_rows_from_their_partial_indexes_never_history():
    backend = JobStateBackend("default", {})
    backend.bulk_enqueue(tasks.record, [([str(i)], {}) for i in range(20_000)])
    while batch := Job.objects.claim("w", limit=1000):
        Job.objects.succeed_many("w", [(job, None) for job in batch])
    backend.bulk_enqueue(tasks.record, [(["live"], {})] * 20)
    Job.objects.claim("w", limit=5)
    mysql = connection.vendor == "mysql"
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {'TABLE ' if mysql else ''}{Job._meta.db_table}")
        if mysql:
            cursor.fetchall()  # its report

    with CaptureQueriesContext(connection) as queries:
        assert dict(oldest_ages())["default"] >= 0
        counts = dict((tuple(labels), n) for labels, n in live_counts())
    assert (counts[("default", "queued")], counts[("default", "running")]) == (15, 5)
    # Queued rows in two ranges (the runnable index; the held rows', which a concurrency
    # limit keeps out of it), running ones, the ages, and the paused queues' names (from
    # their own small table).
    assert len(queries) == 5
    if mysql:  # no partial index: the claim order's (state first, migration 0009)
        reads = set()
        with connection.cursor() as cursor:
            for query in queries:
                cursor.execute(f"EXPLAIN FORMAT=JSON {query['sql']}")
                stack = [json.loads(cursor.fetchone()[0])]
                while stack:
                    node = stack.pop()
                    children = node.values() if isinstance(node, dict) else node
                    stack.extend(c for c in children if isinstance(c, dict | list))
                    if isinstance(node, dict) and node.get("table_name") == Job._meta.db_table:
                        reads.add((node["access_type"], node.get("key")))
        # The held rows: a range of their own index (hold first), whatever the history.
        assert reads == {("ref", "jobstate_job_claim_order"), ("range", "jobstate_job_held")}
        return

    scans = set()
    with connection.cursor() as cursor:
        for query in queries:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {query['sql']}")
            stack = [cursor.fetchone()[0][0]["Plan"]]
            while stack:
                node = stack.pop()
                stack.extend(node.get("Plans", []))
                if node.get("Relation Name") == Job._meta.db_table:
                    scans.add((node["Node Type"], node.get("Index Name")))
    indexes = {index for _, index in scans}
    assert indexes == {"jobstate_job_runnable", "jobstate_job_held", "jobstate_job_running"}
    assert not any(kind == "Seq Scan" for kind, _ in scans)


OFF = """
import sys, django
django.setup()
import django_jobstate.management.commands.runjobs, django_jobstate.runner.supervisor
from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from tests import tasks
tasks.reports_progress.using(metadata={"a": 1}).enqueue(1)
tasks.boom.enqueue()
Worker(burst=True).run()
assert Job.objects.filter(state="succeeded").count() == 1
print(sorted(m for m in sys.modules if m.split(".")[0] in ("prometheus_client", "opentelemetry")))
"""


def test_with_metrics_and_tracing_off_neither_library_is_imported():
    done = subprocess.run(
        [sys.executable, "-c", OFF],
        env=subprocess_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
