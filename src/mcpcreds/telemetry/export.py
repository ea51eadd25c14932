"""The OpenTelemetry SDK's tracer provider as `[telemetry]` sets it up: the resource
(`service.name`, `service.version`), a parent-based ratio sampler, and the OTLP/HTTP exporter
behind a bounded batch queue (a full queue drops spans, never blocks a request). Its own provider,
never the process's global one."""

from __future__ import annotations

from typing import Final

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from ..config.telemetry import TelemetryConfig
from ..core.version import installed_version

EXPORT_TIMEOUT: Final = 10.0  # seconds for one batch to reach the collector
MAX_QUEUE: Final = 2048  # spans waiting for export; past it new ones are dropped
MAX_BATCH: Final = 512


def provider(settings: TelemetryConfig, exporter: SpanExporter | None = None) -> TracerProvider:
    """The provider for `settings`; with `exporter` (tests: the SDK's in-memory one), each span
    goes to it as it ends instead of to the collector."""
    resource = Resource.create({"service.name": settings.service_name,
                                "service.version": installed_version()})
    made = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
    if exporter is not None:
        made.add_span_processor(SimpleSpanProcessor(exporter))
        return made
    otlp = OTLPSpanExporter(endpoint=settings.traces_url, timeout=EXPORT_TIMEOUT)
    made.add_span_processor(BatchSpanProcessor(otlp, max_queue_size=MAX_QUEUE,
                                               max_export_batch_size=MAX_BATCH))
    return made
