"""OpenTelemetry spans from enqueue to each attempt's run, with JOBSTATE_TRACING = True.

The project installs opentelemetry-api (the `tracing` extra) and configures a tracer
provider and exporter as it does for its web requests; without the setting, nothing here
is imported. enqueue() records a PRODUCER span and stores its W3C trace context in the
job's `trace_context` column, which every retry copies. Each attempt's run is a CONSUMER
span, a child of that producer span (so one trace holds the request that enqueued the
task and every attempt at it), linked to the previous attempt's span when there was one,
with the error recorded on a failed attempt. Span names and attributes follow the
OpenTelemetry messaging conventions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..exceptions import describe_error

if TYPE_CHECKING:
    from ..models import Job
    from ..tasksapi import Task

SYSTEM = "django_jobstate"
tracer = trace.get_tracer("django_jobstate")


@contextmanager
def producer_span(task: Task, calls: int) -> Iterator[tuple[trace.Span, dict[str, Any] | None]]:
    """Record the enqueue of `calls` calls of `task`; yield the span and the trace context
    to store with the jobs (None when no span is recorded, e.g. no SDK configured)."""
    attributes: dict[str, str | int] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.destination.name": task.queue_name,
        "jobstate.task": task.module_path,
        "jobstate.priority": task.priority,
    }
    if calls != 1:
        attributes["messaging.batch.message_count"] = calls
    with tracer.start_as_current_span(
        f"send {task.name}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, Any] = {}
        propagate.inject(carrier)
        yield span, carrier or None


class Attempt:
    """The CONSUMER span of one attempt's run, current while its body runs."""

    def __init__(self, job: Job) -> None:
        stored = job.trace_context if isinstance(job.trace_context, dict) else {}
        links = []
        previous = stored.get("previous")
        if isinstance(previous, dict) and previous.get("attempt") == job.attempt - 1:
            linked = trace.get_current_span(propagate.extract(previous)).get_span_context()
            if linked.is_valid:
                links.append(Link(linked, {"jobstate.attempt": job.attempt - 1}))
        self.job = job
        self.span = tracer.start_span(
            f"process {job.task_name}",
            context=propagate.extract(stored),
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": job.queue_name,
                "messaging.message.id": str(job.result_id),
                "jobstate.job_id": job.pk,
                "jobstate.attempt": job.attempt,
                "jobstate.max_attempts": job.max_attempts,
                "jobstate.task": job.task_path,
                "jobstate.priority": job.priority,
                "jobstate.worker_id": job.worker_id or "",
            },
        )
        self._token = context.attach(trace.set_span_in_context(self.span))

    def finish(self, error: BaseException | None, reason: str) -> None:
        """End the span with the body's outcome; after a failure, leave its context on the
        job for the next attempt (which retry() copies from it) to link to."""
        context.detach(self._token)
        span = self.span
        if error is None:
            span.set_attribute("jobstate.outcome", "succeeded")
        else:
            span.set_attribute("jobstate.outcome", "failed")
            span.set_attribute("jobstate.failure_reason", reason)
            # An error's str() may raise: say so, as its stored message does, and end the
            # span all the same (an attempt whose span cannot end would never be written).
            described = describe_error(error)
            try:
                span.record_exception(error)
            except Exception:
                span.add_event(
                    "exception",
                    {
                        "exception.type": described["error_class"],
                        "exception.message": described["error_message"],
                        "exception.stacktrace": described["traceback"],
                    },
                )
            message = f"{type(error).__name__}: {described['error_message']}"
            span.set_status(Status(StatusCode.ERROR, message))
        span.end()
        if error is not None and isinstance(self.job.trace_context, dict):  # a retry may follow
            carrier: dict[str, Any] = {"attempt": self.job.attempt}
            propagate.inject(carrier, context=trace.set_span_in_context(span))
            self.job.trace_context = {**self.job.trace_context, "previous": carrier}
