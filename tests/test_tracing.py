"""OpenTelemetry: one trace from enqueue (this process) to every attempt (runjobs' workers)."""

import json
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from django_jobstate.models import Job
from django_jobstate.runner.worker import Worker
from django_jobstate.states import State
from tests import tasks

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider():
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global one can be set only once
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture(autouse=True)
def tracing_on(settings):
    settings.JOBSTATE_TRACING = True
    EXPORTER.clear()


def hex_id(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_one_trace_from_enqueue_to_each_attempt_across_processes(runjobs, tmp_path: Path):
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        retried = tasks.fails_once.enqueue("r")
        failed = tasks.boom.enqueue("no luck")
    spans_file = tmp_path / "spans.jsonl"
    done = runjobs.run(
        "--burst",
        "--concurrency",
        "2",
        JOBSTATE_TEST_SETTINGS=json.dumps({"JOBSTATE_TRACING": True}),
        JOBSTATE_TEST_SPANS=str(spans_file),
    )
    assert done.returncode == 0, done.stdout

    ours = [s for s in EXPORTER.get_finished_spans() if s.name != "request"]
    assert {s.kind for s in ours} == {SpanKind.PRODUCER}
    producers = {s.attributes["messaging.message.id"]: s for s in ours}
    assert producers.keys() == {retried.id, failed.id}
    for producer in producers.values():
        assert producer.parent.span_id == request.get_span_context().span_id
        assert producer.context.trace_id == request.get_span_context().trace_id
    stored = Job.objects.get(result_id=retried.id, attempt=1).trace_context
    assert stored["traceparent"].split("-")[2] == f"{producers[retried.id].context.span_id:016x}"

    consumers = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert {c["kind"] for c in consumers} == {"SpanKind.CONSUMER"}
    by_task = {}
    for span in consumers:
        by_task.setdefault(span["attributes"]["messaging.message.id"], []).append(span)
    first, second = sorted(by_task[retried.id], key=lambda s: s["attributes"]["jobstate.attempt"])
    trace_id = hex_id(request.get_span_context().trace_id, 32)
    for span in (first, second):
        assert span["context"]["trace_id"] == trace_id  # the enqueuing request's trace
        assert span["parent_id"] == hex_id(producers[retried.id].context.span_id, 16)
        assert span["name"] == "process fails_once"
    assert first["attributes"]["jobstate.outcome"] == "failed"
    assert first["status"]["status_code"] == "ERROR"
    assert [e["name"] for e in first["events"]] == ["exception"]
    assert second["attributes"]["jobstate.outcome"] == "succeeded"
    assert second["status"]["status_code"] == "UNSET"
    # The retry is linked to the attempt before it.
    assert [link["context"]["span_id"] for link in second["links"]] == [first["context"]["span_id"]]
    assert first["links"] == []
    job = Job.objects.get(result_id=retried.id, attempt=2)
    assert second["attributes"]["jobstate.job_id"] == job.pk
    assert second["attributes"]["jobstate.worker_id"] == job.worker_id
    assert second["attributes"]["messaging.destination.name"] == "default"

    [boom] = by_task[failed.id]
    assert boom["status"] == {"status_code": "ERROR", "description": "ValueError: no luck"}
    [event] = boom["events"]
    assert event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "no luck"
    assert boom["attributes"]["jobstate.failure_reason"] == "error"
    assert boom["context"]["trace_id"] == trace_id


@pytest.mark.django_db
def test_without_a_span_to_join_the_job_stores_no_context_and_still_runs(settings):
    settings.JOBSTATE_TRACING = False
    result = tasks.record.enqueue("plain")
    assert Job.objects.get(result_id=result.id).trace_context is None
    assert EXPORTER.get_finished_spans() == ()

    settings.JOBSTATE_TRACING = True
    traced = tasks.record.enqueue("traced")
    Worker(burst=True).run()

    assert Job.objects.get(result_id=traced.id).trace_context["traceparent"]
    assert set(Job.objects.values_list("state", flat=True)) == {State.SUCCEEDED}
    kinds = sorted(span.kind.name for span in EXPORTER.get_finished_spans())
    assert kinds == ["CONSUMER", "CONSUMER", "PRODUCER"]  # the untraced job's run: a root span


@pytest.mark.django_db
def test_a_bulk_enqueue_is_one_producer_span_for_every_job():
    from django_jobstate.backend import JobStateBackend

    JobStateBackend("default", {}).bulk_enqueue(tasks.record, [(["a"], {}), (["b"], {})])

    [span] = EXPORTER.get_finished_spans()
    assert span.name == "send record"
    assert span.attributes["messaging.batch.message_count"] == 2
    contexts = {json.dumps(c) for c in Job.objects.values_list("trace_context", flat=True)}
    assert len(contexts) == 1


@pytest.mark.django_db
def test_a_workflow_is_one_producer_span_and_one_trace_for_every_step():
    from django_jobstate.workflows import chord, group, step
    from tests import workflow_tasks

    steps = group(step(workflow_tasks.step_value, i) for i in range(3))
    wf = chord(steps, step(workflow_tasks.total)).enqueue()

    [span] = EXPORTER.get_finished_spans()
    assert span.attributes["messaging.batch.message_count"] == 4
    assert span.attributes["jobstate.workflow_id"] == wf.id
    contexts = {json.dumps(c) for c in Job.objects.values_list("trace_context", flat=True)}
    assert len(contexts) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.parametrize("in_flight", ["1", "4"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_whose_str_raises_fails_its_attempt_and_the_worker_goes_on(
    runjobs, tmp_path: Path, kind, in_flight
):
    """Tracing formats a hostile error as carefully as the rest: the attempt fails, its span
    ends with the error, and the worker runs the next job (and a --burst run exits)."""
    hostile = tasks.raises.enqueue("unprintable") if kind == "sync" else None
    hostile = hostile or tasks.async_raises_unprintable.enqueue()
    after = tasks.record.enqueue("after")
    spans_file = tmp_path / "spans.jsonl"
    done = runjobs.run(
        "--burst",
        "--in-flight",
        in_flight,
        JOBSTATE_TEST_SETTINGS=json.dumps({"JOBSTATE_TRACING": True}),
        JOBSTATE_TEST_SPANS=str(spans_file),
    )
    assert done.returncode == 0, done.stdout
    failed = Job.objects.get(result_id=hostile.id)
    assert failed.state == State.FAILED, done.stdout
    assert failed.error_class == "tests.tasks.Unprintable"
    assert failed.error_message == "<str() of the error failed>"
    assert Job.objects.get(result_id=after.id).state == State.SUCCEEDED
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    [span] = [s for s in spans if s["attributes"]["messaging.message.id"] == hostile.id]
    assert span["events"][0]["attributes"]["exception.message"] == "<str() of the error failed>"
    assert span["status"] == {
        "status_code": "ERROR",
        "description": "Unprintable: <str() of the error failed>",
    }
