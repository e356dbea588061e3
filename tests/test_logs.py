"""Structured logs: a real runjobs with the JSON formatter writes only JSON lines, each
with a stable `event` and, for a job, the job's fields."""

import json
import logging
import signal
import time

import pytest

from django_jobstate.models import Job
from django_jobstate.telemetry.logs import JsonFormatter, job_fields
from tests import tasks
from tests.factories import JobFactory

JOB_KEYS = {"job_id", "result_id", "task", "queue", "attempt", "max_attempts", "worker_id"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_every_line_of_a_worker_run_is_json_with_an_event(runjobs):
    tasks.record.enqueue("ok")
    tasks.boom.enqueue("no luck")
    tasks.fails_once.enqueue("again")
    tasks.busy_loop.enqueue("overdue")  # the supervisor stops it at its timeout, twice
    proc = runjobs.start("--concurrency", "2", JOBSTATE_TEST_JSON_LOGS="1")
    deadline = time.monotonic() + 60
    # Done, and the two workers started in place of those killed at the timeouts are up
    # (a worker stopped while it starts, before its handler is set, ends without a word).
    while Job.objects.live().exists() or runjobs.output(proc).count('"worker.started"') < 4:
        assert time.monotonic() < deadline, runjobs.output(proc)
        time.sleep(0.1)
    output = runjobs.stop(proc, signal.SIGTERM)

    lines = [json.loads(line) for line in output.splitlines()]  # each one parses

    assert all(isinstance(line.get("event"), str) for line in lines), output
    events = [line["event"] for line in lines]
    for expected in [
        "supervisor.started",
        "worker.started",
        "job.succeeded",
        "job.failed",
        "worker.overdue",
        "job.settled",
        "supervisor.signal",
        "worker.stopped",
        "supervisor.stopped",
    ]:
        assert expected in events, expected
    for line in lines:
        if line["event"].startswith("job."):
            assert line.keys() >= JOB_KEYS, line
    failed = next(line for line in lines if line["event"] == "job.failed")
    assert failed["task"] == "tests.tasks.boom" or failed["task"] == "tests.tasks.fails_once"
    assert failed["failure_reason"] == "error"
    assert "ValueError" in failed["exc_info"] or "RuntimeError" in failed["exc_info"]
    settled = [line for line in lines if line["event"] == "job.settled"]
    assert {line["failure_reason"] for line in settled} == {"timeout"}
    assert {line["task"] for line in settled} == {"tests.tasks.busy_loop"}


@pytest.mark.django_db
def test_the_formatter_writes_the_extra_fields_and_the_message():
    job = JobFactory()
    record = logging.LogRecord("django_jobstate.worker", logging.INFO, "f", 1, "Job %s", (1,), None)
    for key, value in job_fields(job, "job.succeeded", duration_ms=1.5).items():
        setattr(record, key, value)

    line = json.loads(JsonFormatter().format(record))

    assert line["message"] == "Job 1"
    assert line["event"] == "job.succeeded"
    assert line["job_id"] == job.pk
    assert line["result_id"] == str(job.result_id)
    assert (line["level"], line["logger"], line["duration_ms"]) == ("INFO", record.name, 1.5)
