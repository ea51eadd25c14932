"""Whether the sidecar traces (`[telemetry]`, config/telemetry.py): `tracer` is None unless
`start` turned traces on. Every call site tests it and only then calls into `spans`, where the
OpenTelemetry SDK is imported: off, a request costs one `if` per site and nothing of
OpenTelemetry is ever imported (tests/test_traces.py checks the sidecar's imports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import McpcredsError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from ..config.telemetry import TelemetryConfig
    from .spans import Tracing

tracer: Tracing | None = None


class TelemetryUnavailable(McpcredsError):
    code = "telemetry_unavailable"


def start(settings: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
    """Traces on when `settings` say so (or, for tests, to `exporter`, each span exported as it
    ends); nothing happens otherwise."""
    global tracer
    if not settings.enabled and exporter is None:
        return
    try:
        from .export import provider
        from .spans import Tracing
    except ImportError:
        raise TelemetryUnavailable("telemetry.exporter = \"otlp\" needs the OpenTelemetry SDK and its OTLP "
                                   "exporter: pip install 'mcpcreds[otel]'") from None
    tracer = Tracing(provider(settings, exporter))


def stop() -> None:
    """Traces off, the spans still queued sent first (bounded by the exporter's timeout)."""
    global tracer
    ending, tracer = tracer, None
    if ending is not None:
        ending.shutdown()
