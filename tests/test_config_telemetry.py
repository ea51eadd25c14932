"""`[telemetry]`: traces off unless asked for, each key validated by its path, never its value;
and a sidecar asked for traces without the SDK says what to install."""

from __future__ import annotations

import sys
import tomllib

import pytest

from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config
from mcpcreds.config.telemetry import TelemetryConfig
from mcpcreds.errors import ConfigError
from mcpcreds.telemetry import switch


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.errors


def test_traces_are_off_without_the_table() -> None:
    telemetry = parse("").telemetry
    assert telemetry == TelemetryConfig() and not telemetry.enabled
    assert telemetry.traces_url == "http://127.0.0.1:4318/v1/traces"


def test_the_table_as_written() -> None:
    telemetry = parse('[telemetry]\nexporter = "otlp"\nendpoint = "https://otel.example.com/"\n'
                      'service_name = "mcpcreds-prod.eu"\nsample_ratio = 0.25\n').telemetry
    assert telemetry.enabled and telemetry.service_name == "mcpcreds-prod.eu" and telemetry.sample_ratio == 0.25
    assert telemetry.traces_url == "https://otel.example.com/v1/traces"
    as_is = parse('[telemetry]\nendpoint = "http://[::1]:4318/v1/traces"\nsample_ratio = 0\n').telemetry
    assert as_is.traces_url == "http://[::1]:4318/v1/traces" and not as_is.enabled


@pytest.mark.parametrize(("line", "key", "says"), [
    ('exporter = "jaeger-SECRETLY"', "exporter", "expected one of 'none', 'otlp'"),
    ('endpoint = "http://collector-SECRETLY.example.com:4318"', "endpoint", "https://"),
    ('endpoint = "https://user:SECRETLY@otel.example.com"', "endpoint", "credentials"),
    ('endpoint = "https://otel.example.com/?k=SECRETLY"', "endpoint", "query"),
    ("endpoint = 4318", "endpoint", "expected a URL string"),
    ('service_name = "my SECRETLY service"', "service_name", "expected a name"),
    ('service_name = ""', "service_name", "expected a name"),
    ("sample_ratio = 1.5", "sample_ratio", "from 0 to 1"),
    ("sample_ratio = nan", "sample_ratio", "from 0 to 1"),
    ("sample_ratio = true", "sample_ratio", "from 0 to 1"),
    ('sample_ratio = "0.5"', "sample_ratio", "from 0 to 1"),
    ('headers = "SECRETLY"', "headers", "unknown key"),
])
def test_a_bad_key_is_named_never_quoted(line: str, key: str, says: str) -> None:
    (error,) = errors_of(f"[telemetry]\n{line}\n")
    assert error.startswith(f"telemetry.{key}: ") and says in error
    assert "SECRETLY" not in error


def test_a_table_that_is_no_table() -> None:
    assert errors_of('telemetry = "otlp"\n') == ["telemetry: expected a table, got string"]


def test_traces_asked_for_without_the_sdk_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcpcreds.telemetry.export", None)  # as if the extra were absent
    with pytest.raises(switch.TelemetryUnavailable) as info:
        switch.start(TelemetryConfig(exporter="otlp"))
    assert "pip install 'mcpcreds[otel]'" in str(info.value)
    assert switch.tracer is None
    switch.start(TelemetryConfig())  # off: nothing to import, nothing started
    assert switch.tracer is None


def test_the_default_endpoint_is_a_url_the_check_accepts() -> None:
    """The default is not checked at each start (that would import httpx): it must pass as given."""
    from mcpcreds.config.reader import check_url
    from mcpcreds.config.telemetry import DEFAULT_ENDPOINT

    assert check_url(DEFAULT_ENDPOINT) is None
