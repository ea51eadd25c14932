"""`mcpcreds serve` with its spans going to the OpenTelemetry SDK's in-memory exporter instead of
[telemetry]'s OTLP one. When the sidecar stops (its tracer provider shut down), every finished
span is written to OUT, one JSON object a line: ``{"name", "kind", "trace_id", "span_id",
"parent_id", "parent_remote", "links", "attributes", "status", "start", "end"}`` (ids in hex,
times in ns).

The wrapper of a tests/sidecar_proc.py SidecarProcess: ``python -m tests.peers.traced_sidecar OUT``
followed by the sidecar's own command (``python -m mcpcreds.cli.main serve --config ...``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcpcreds.config.telemetry import TelemetryConfig
from mcpcreds.telemetry import switch


def plain(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None
    return {"name": span.name, "kind": span.kind.name, "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
            "parent_remote": span.parent is not None and span.parent.is_remote,
            "links": [f"{link.context.span_id:016x}" for link in span.links],
            "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
            "start": span.start_time, "end": span.end_time}


class Written(InMemorySpanExporter):
    """The in-memory exporter, its spans written to `out` when it is shut down."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def shutdown(self) -> None:
        self.out.write_text("".join(json.dumps(plain(span)) + "\n" for span in self.get_finished_spans()))
        super().shutdown()


def main(argv: list[str]) -> int:
    out, command = Path(argv[0]), argv[1:]
    memory = Written(out)
    start = switch.start

    def in_memory(settings: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
        start(settings, memory)

    switch.start = in_memory  # what the sidecar calls at start
    from mcpcreds.cli.main import main as cli

    return cli(command[command.index("mcpcreds.cli.main") + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
