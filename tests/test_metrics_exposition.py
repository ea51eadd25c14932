"""/metrics, read as Prometheus reads it: `prometheus_client`'s text parser takes a scrape of the
real Api and Broker (a login from the fault IdP, a rated bucket, the gateway's counters), every
name follows the conventions (`_total` counters, `_seconds` durations, `_timestamp_seconds`
points in time), values come back exact, and the metrics table of docs/operations.md lists every
metric."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import tomllib
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpcreds.broker.broker import Actor, Broker
from mcpcreds.config.load import parse_config
from mcpcreds.core.audit import AuditLog
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.http import Request, Response
from mcpcreds.core.metrics import Metrics
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from mcpcreds.errors import RateLimited
from mcpcreds.limits.buckets import Limiter
from mcpcreds.sidecar.api import Api
from tests.conftest import CANARY
from tests.peers.fault_idp import FaultIdp, fault_idp

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"^mcpcreds_[a-z][a-z0-9_]*[a-z0-9]$")
CONFIG = """
[[servers]]
name = "mail"
endpoint = "https://mail.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
rate = "10/1s"
[[servers]]
name = "crm"
endpoint = "{base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{token_url}" }}
"""


@pytest.fixture(scope="module")
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


class Scraped:
    def __init__(self, text: str, status: dict[str, Any]) -> None:
        self.text = text
        self.status = status
        self.families = list(text_string_to_metric_families(text))


@pytest.fixture
async def scrape(idp: FaultIdp) -> AsyncIterator[Scraped]:
    clock = FakeClock()
    config = parse_config(tomllib.loads(CONFIG.format(base=idp.base, token_url=idp.token_url)))
    metrics = Metrics()
    broker = Broker(config, SecretResolver([EnvSource({"KEY": CANARY, "S": "client-secret"})]), clock,
                    metrics, AuditLog(None, clock))
    api = Api(broker, metrics, AuditLog(None, clock))

    async def call(method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        result = api.handle(Request(method, path, "", data, None, os.getuid(), 4242))
        response = result if isinstance(result, Response) else await cast(Awaitable[Response], result)
        assert response.status == 200, response.body
        answer: dict[str, Any] = json.loads(response.body)
        return answer

    try:
        await call("GET", "/v1/servers/crm/headers")  # a login: token requests, expiry, state
        for _ in range(3):
            await call("POST", "/v1/servers/mail/acquire", {"cost": 1, "max_wait": 0})
        await call("POST", "/v1/servers/mail/backoff", {"retry_after": 30})  # paused_until
        target = config.servers["mail"]
        api.gateway.records.tool_call_done(target, "echo", Actor(os.getuid(), 4242), "ok", 0.0125)
        api.gateway.records.request(target, "POST", 200, time.perf_counter())
        status = await call("GET", "/v1/status")
        result = api.handle(Request("GET", "/metrics", "", b"", None, os.getuid(), 4242))
        response = result if isinstance(result, Response) else await cast(Awaitable[Response], result)
        assert response.status == 200
        yield Scraped(response.body.decode(), status)
    finally:
        await broker.aclose()


def raw_samples(text: str) -> list[str]:
    """The sample names of the text as written (the parser renames a counter without _total)."""
    return [re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
            if line and not line.startswith("#")]


def test_a_scrape_parses_and_every_name_follows_the_conventions(scrape: Scraped) -> None:
    types = {f.name: f.type for f in scrape.families}
    # every kind the sidecar exposes is in this scrape
    assert {"counter", "gauge", "histogram"} <= set(types.values())
    assert len(scrape.families) >= 15, sorted(types)
    parsed = [s.name for f in scrape.families for s in f.samples]
    assert parsed == raw_samples(scrape.text)  # nothing renamed by the parser
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", scrape.text, re.M))
    for name, kind in typed.items():
        assert NAME.match(name), name
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
        if kind == "histogram":
            assert name.endswith("_seconds"), name  # durations in the base unit
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", scrape.text, re.M))
    assert set(helps) == set(typed)
    for name, text in helps.items():
        assert text and text != name, name  # a real help line
        if "unix time" in text.lower():
            assert name.endswith("_timestamp_seconds"), name
    assert CANARY not in scrape.text and "client-secret" not in scrape.text


def sample(scrape: Scraped, name: str, **labels: str) -> float:
    for family in scrape.families:
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_the_values_read_back_as_status_says(scrape: Scraped) -> None:
    login = next(row for row in scrape.status["logins"] if row["key"] == "mcp:crm")
    bucket = next(row for row in scrape.status["buckets"] if row["key"] == "mcp:mail")
    # a unix time to the second (a 6-digit rendering was up to an hour off)
    assert sample(scrape, "mcpcreds_login_expiry_timestamp_seconds", key="mcp:crm") == login["expires_at"]
    assert sample(scrape, "mcpcreds_token_requests_total", key="mcp:crm") == 1
    assert sample(scrape, "mcpcreds_login_state", key="mcp:crm", state="valid") == 1
    assert sample(scrape, "mcpcreds_bucket_granted_permits_total", key="mcp:mail") == bucket["granted"] == 3
    assert sample(scrape, "mcpcreds_bucket_paused_until_timestamp_seconds", key="mcp:mail") == \
        bucket["paused_until"]
    assert sample(scrape, "mcpcreds_tool_call_seconds_sum", server="mail", tool="echo") == 0.0125
    assert sample(scrape, "mcpcreds_tool_calls_total", server="mail", tool="echo", status="ok") == 1


def test_large_and_odd_values_are_exact() -> None:
    metrics = Metrics()
    metrics.inc("mcpcreds_x_total", (("k", 'a"b\\c\nd'),), 123_456_789.0, help_text="A count.")
    text = metrics.render([("mcpcreds_t_timestamp_seconds", "A unix time.", (), 1_800_003_600.25),
                           ("mcpcreds_g", "A gauge.", (("k", "a"),), float("inf")),
                           ("mcpcreds_c_total", "Read at scrape.", (), 2**60)])
    values = {(s.name, tuple(s.labels.items())): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert values[("mcpcreds_x_total", (("k", 'a"b\\c\nd'),))] == 123_456_789
    assert values[("mcpcreds_t_timestamp_seconds", ())] == 1_800_003_600.25
    assert values[("mcpcreds_g", (("k", "a"),))] == float("inf")
    assert values[("mcpcreds_c_total", ())] == 2**60
    assert "# TYPE mcpcreds_c_total counter" in text  # a count read at scrape is a counter


def test_an_observation_counts_in_every_bucket_whose_bound_it_does_not_pass() -> None:
    """A histogram's `le` buckets, read back by the Prometheus parser: an observation equal to a
    bound is in that bucket, one past the last bound only in +Inf."""
    metrics = Metrics()
    observed = [0.0, 0.0005, 0.0006, 0.01, 0.0100001, 1.0, 1e9]
    for seconds in observed:
        metrics.observe("mcpcreds_h_seconds", (("k", "a"),), seconds, help_text="A latency.")
        metrics.observe_request("/v1/x", 200, seconds)
    text = metrics.render()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket"):
                bound = float(s.labels["le"])
                assert s.value == sum(1 for o in observed if o <= bound), (s.name, bound)
    assert sum(f.name in ("mcpcreds_h_seconds", "mcpcreds_request_seconds")
               for f in text_string_to_metric_families(text)) == 2


def source_metric_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "src" / "mcpcreds").rglob("*.py"):
        # a name in quotes, or one an f-string renders with its labels
        names |= set(re.findall(r"[\"'](mcpcreds_[a-z0-9_]+)[\"'{]", path.read_text()))
    return names


def documented_metric_names() -> set[str]:
    """The names in the table of the "## Metrics" section of docs/operations.md."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = re.split(r"^## Metrics\n", text, maxsplit=1, flags=re.M)[1]
    section = re.split(r"^##? ", section, maxsplit=1, flags=re.M)[0]
    return set(re.findall(r"^\| `(mcpcreds_[a-z0-9_]+)` \|", section, re.M))


def test_the_metrics_table_lists_every_metric(scrape: Scraped) -> None:
    in_source = source_metric_names()
    assert len(in_source) >= 20, sorted(in_source)
    assert documented_metric_names() == in_source
    assert {f.name if f.type != "counter" else f"{f.name}_total" for f in scrape.families} <= in_source


def counter_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) if f.type == "counter" for s in f.samples}


async def test_no_counter_goes_down_across_reloads(idp: FaultIdp) -> None:
    """A counter lower at the next scrape reads, to Prometheus, as a restart: rate() counts it all
    again. Grants, a grant given back by a caller that left, a refusal, then a SIGHUP whose config
    drops the bucket's rate and one that restores it: every counter is where it was, or higher."""
    clock = FakeClock()
    with_rate = CONFIG.format(base=idp.base, token_url=idp.token_url)
    resolver = SecretResolver([EnvSource({"KEY": CANARY, "S": "client-secret"})])
    config = parse_config(tomllib.loads(with_rate))
    metrics = Metrics()
    broker = Broker(config, resolver, clock, metrics, AuditLog(None, clock))
    try:
        mail = config.servers["mail"]
        assert mail.rate is not None
        await broker.headers(config.servers["crm"])
        await broker.limiter.acquire(mail.key, mail.rate, 10)
        waiter = asyncio.create_task(broker.limiter.acquire(mail.key, mail.rate, 2, max_wait=5))
        for _ in range(5):
            await asyncio.sleep(0)
        with pytest.raises(RateLimited):
            await broker.limiter.acquire(mail.key, mail.rate, 1)
        clock.advance(0.2)
        assert isinstance(broker.limiter, Limiter)  # a local bucket: no shared state in CONFIG
        broker.limiter.wake(mail.key)  # granted; its caller goes before it runs
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        scrapes = [metrics.render(await broker.gauges())]
        for text in (with_rate.replace('rate = "10/1s"\n', ""), with_rate):
            broker.reload(parse_config(tomllib.loads(text)), resolver)
            scrapes.append(metrics.render(await broker.gauges()))
    finally:
        await broker.aclose()
    first, _, last = (counter_samples(text) for text in scrapes)
    labels = (("key", "mcp:mail"),)
    assert first[("mcpcreds_bucket_granted_permits_total", labels)] == 12
    assert first[("mcpcreds_bucket_returned_permits_total", labels)] == 2
    assert first[("mcpcreds_bucket_refused_requests_total", labels)] == 1
    assert first == last  # nothing happened in between: the same, not reset


async def test_login_counters_survive_a_reload_that_changes_the_login(idp: FaultIdp) -> None:
    clock = FakeClock()
    text = CONFIG.format(base=idp.base, token_url=idp.token_url)
    resolver = SecretResolver([EnvSource({"KEY": CANARY, "S": "client-secret"})])
    config = parse_config(tomllib.loads(text))
    metrics = Metrics()
    broker = Broker(config, resolver, clock, metrics, AuditLog(None, clock))
    labels = (("key", "mcp:crm"),)
    try:
        await broker.headers(config.servers["crm"])
        await broker.logins.renew(config.servers["crm"])
        before = counter_samples(metrics.render(await broker.gauges()))
        assert before[("mcpcreds_login_renewals_total", labels)] == 1
        config = parse_config(tomllib.loads(text.replace('client_id = "c"', 'client_id = "c2"')))
        broker.reload(config, resolver)  # a new login for the key: the old one is forgotten
        await broker.headers(config.servers["crm"])
        after = counter_samples(metrics.render(await broker.gauges()))
    finally:
        await broker.aclose()
    assert after[("mcpcreds_login_renewals_total", labels)] >= 1
