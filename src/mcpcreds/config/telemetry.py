"""`[telemetry]` (parsed, pure): where the sidecar sends its OpenTelemetry traces.

- `exporter`: `"none"` (the default: traces off, the SDK never imported) or `"otlp"` (OTLP over
  HTTP, protobuf, to `endpoint`; needs the `otel` extra).
- `endpoint`: the collector's OTLP/HTTP base URL (spans go to `{endpoint}/v1/traces`, or to the
  URL as written when it already ends so); `http://` only to a loopback host, like every URL of
  the config.
- `service_name`: the `service.name` of the spans' resource (a name: letters, digits, `_.-`).
- `sample_ratio`: the share of new traces recorded (0 to 1); a request that comes with a trace
  follows the caller's decision.

Errors name the key, never the value written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .reader import NAME, check_url, join, kind_of

if TYPE_CHECKING:
    from .reader import Collector

TELEMETRY_KEYS: Final = ("exporter", "endpoint", "service_name", "sample_ratio")
EXPORTERS: Final = ("none", "otlp")
DEFAULT_ENDPOINT: Final = "http://127.0.0.1:4318"
TRACES_PATH: Final = "/v1/traces"


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """The `[telemetry]` table (traces off when the config has none)."""

    exporter: str = "none"
    endpoint: str = DEFAULT_ENDPOINT
    service_name: str = "mcpcreds"
    sample_ratio: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"

    @property
    def traces_url(self) -> str:
        """Where the OTLP/HTTP exporter posts the spans."""
        base = self.endpoint.rstrip("/")
        return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def parse_telemetry(c: Collector, raw: Any) -> TelemetryConfig:
    path = "telemetry"
    t = c.table(path, raw)
    c.keys(path, t, TELEMETRY_KEYS)
    default = TelemetryConfig()
    exporter = t.get("exporter", default.exporter)
    if exporter not in EXPORTERS:
        c.error(join(path, "exporter"), f"expected one of {', '.join(repr(e) for e in EXPORTERS)}")
        exporter = default.exporter
    endpoint = t.get("endpoint", default.endpoint)
    if "endpoint" not in t:
        pass  # the default is a valid URL (checking it would import httpx at every start)
    elif not isinstance(endpoint, str):
        c.error(join(path, "endpoint"), f"expected a URL string, got {kind_of(endpoint)}")
        endpoint = default.endpoint
    elif (problem := check_url(endpoint)) is not None:
        c.error(join(path, "endpoint"), problem)
        endpoint = default.endpoint
    elif "?" in endpoint:
        c.error(join(path, "endpoint"), "must not have a query")
        endpoint = default.endpoint
    name = t.get("service_name", default.service_name)
    if not isinstance(name, str) or not NAME.match(name):
        c.error(join(path, "service_name"), "expected a name of 1 to 128 letters, digits, '_', '.' or '-'")
        name = default.service_name
    ratio = t.get("sample_ratio", default.sample_ratio)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        c.error(join(path, "sample_ratio"), "expected a number from 0 to 1")
        ratio = default.sample_ratio
    return TelemetryConfig(exporter=exporter, endpoint=endpoint, service_name=name, sample_ratio=float(ratio))
