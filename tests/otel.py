"""OpenTelemetry for the tests: spans of worker subprocesses go to a file, one JSON a line.

tests/settings.py calls export_spans_to() when JOBSTATE_TEST_SPANS names that file, so
that every process of a `runjobs` (the supervisor and each spawned worker) exports there.
"""

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def export_spans_to(path: str) -> None:
    provider = TracerProvider()
    out = open(path, "a")  # noqa: SIM115  # the process's lifetime: exports write to it
    provider.add_span_processor(
        SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=one_line))
    )
    trace.set_tracer_provider(provider)
