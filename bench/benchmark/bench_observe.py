"""JOBSTATE_BENCH_OBSERVE=1: an OpenTelemetry SDK whose exporter drops every span."""

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class DropSpans(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def install_tracing() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropSpans()))
    trace.set_tracer_provider(provider)
