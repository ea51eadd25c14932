"""The credential flow, stepped by hand: no sidecar, no network."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import httpx
import pytest

from mcpcreds.client.auth import Sidecar, Step, Upstream, credential_flow
from mcpcreds.core.rates import parse_retry_after
from mcpcreds.errors import RateLimited


def answer(token: str, fp: str) -> dict[str, Any]:
    return {"granted": 1, "waited": 0.0, "headers": {"Authorization": f"Bearer {token}"},
            "key": "service:crm", "expires_at": None, "fingerprint": fp}


def drive(flow: Generator[Step, Any, Any], sidecar: list[Any], upstream: list[httpx.Response],
          trace: list[str]) -> Any:
    """Drive the flow with canned answers, recording each step in `trace` (also when the flow
    raises); return the flow's result once every canned answer was asked for, none left over."""
    value: Any = None
    try:
        step = next(flow)
        while True:
            if isinstance(step, Sidecar):
                trace.append(f"sidecar {step.call.method} {step.call.path} {step.call.body}")
                value = sidecar.pop(0)
            else:
                assert isinstance(step, Upstream)
                trace.append(f"upstream {step.request.headers.get('authorization')}")
                value = upstream.pop(0)
            step = flow.send(value)
    except StopIteration as stop:
        assert sidecar == [] and upstream == [], f"answers never asked for: {sidecar} {upstream}"
        return stop.value


def run(flow: Generator[Step, Any, Any], sidecar: list[Any], upstream: list[httpx.Response]
        ) -> tuple[list[str], Any]:
    """Drive the flow with canned answers; return the trace of steps and the flow's result."""
    trace: list[str] = []
    return trace, drive(flow, sidecar, upstream, trace)


CALL = "sidecar POST /v1/servers/crm-ro/call {'cost': 1, 'max_wait': 30.0}"


def request() -> httpx.Request:
    return httpx.Request("POST", "https://crm.example.com/mcp", json={"jsonrpc": "2.0"})


def test_one_call_then_the_upstream() -> None:
    trace, response = run(credential_flow("crm-ro", request()), [answer("t1", "f1")],
                          [httpx.Response(200)])
    assert trace == ["sidecar POST /v1/servers/crm-ro/call {'cost': 1, 'max_wait': 30.0}",
                     "upstream Bearer t1"]
    assert response.status_code == 200


def test_401_invalidates_that_fingerprint_and_retries_once() -> None:
    trace, response = run(credential_flow("crm-ro", request()),
                          [answer("t1", "f1"), True, answer("t2", "f2")],
                          [httpx.Response(401), httpx.Response(200)])
    assert trace[1:] == ["upstream Bearer t1",
                         "sidecar POST /v1/servers/crm-ro/invalidate {'reason': '401', 'fingerprint': 'f1'}",
                         "sidecar POST /v1/servers/crm-ro/call {'cost': 1, 'max_wait': 30.0}",
                         "upstream Bearer t2"]
    assert response.status_code == 200


def test_a_second_401_is_returned_not_retried_forever() -> None:
    trace, response = run(credential_flow("crm-ro", request()),
                          [answer("t1", "f1"), True, answer("t2", "f2")],
                          [httpx.Response(401), httpx.Response(401)])
    assert response.status_code == 401 and len(trace) == 5


def test_a_401_within_the_invalidation_cooldown_is_returned_without_resending() -> None:
    # the sidecar keeps the login (renewed: false): resending it would only be refused again
    trace, response = run(credential_flow("crm-ro", request()), [answer("t1", "f1"), False],
                          [httpx.Response(401)])
    assert response.status_code == 401
    assert trace == ["sidecar POST /v1/servers/crm-ro/call {'cost': 1, 'max_wait': 30.0}", "upstream Bearer t1",
                     "sidecar POST /v1/servers/crm-ro/invalidate {'reason': '401', 'fingerprint': 'f1'}"]


def test_refused_reads_renewed_and_falls_back_to_dropped() -> None:
    from mcpcreds.client.calls import Calls

    extract = Calls.refused("crm-ro", "f1").extract
    assert extract({"dropped": False, "renewed": True}) is True
    assert extract({"dropped": False, "renewed": False}) is False
    assert extract({"dropped": True}) is True


def test_429_pauses_the_bucket_then_raises() -> None:
    trace: list[str] = []
    sidecar = [answer("t1", "f1"), {"paused_until": 1.0}]
    with pytest.raises(RateLimited) as info:
        drive(credential_flow("crm-ro", request(), on_429="raise"), sidecar,
              [httpx.Response(429, headers={"Retry-After": "2"})], trace)
    assert info.value.retry_after == 2.0
    # the pause was asked of the sidecar (shared by every client of the bucket) before raising
    assert trace == [CALL, "upstream Bearer t1", "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 2.0}"]
    assert sidecar == []


def test_429_return_mode_pauses_the_bucket_then_hands_back_the_429() -> None:
    trace, response = run(credential_flow("crm-ro", request(), on_429="return"),
                          [answer("t1", "f1"), {"paused_until": 1.0}],
                          [httpx.Response(429, headers={"Retry-After": "7"})])
    assert response.status_code == 429
    assert trace == [CALL, "upstream Bearer t1", "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 7.0}"]


def test_429_without_a_usable_retry_after_pauses_for_the_default() -> None:
    trace, response = run(credential_flow("crm-ro", request(), on_429="return"),
                          [answer("t1", "f1"), {"paused_until": 1.0}],
                          [httpx.Response(429, headers={"Retry-After": "nan"})])
    assert response.status_code == 429
    assert trace[-1] == "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 1.0}"


def test_429_wait_mode_retries_after_the_pause() -> None:
    trace, response = run(credential_flow("crm-ro", request(), max_wait=5, on_429="wait"),
                          [answer("t1", "f1"), {"paused_until": 1.0}, answer("t1", "f1")],
                          [httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(200)])
    assert trace[2] == "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 2.0}"
    assert trace[3] == "sidecar POST /v1/servers/crm-ro/call {'cost': 1, 'max_wait': 5}"
    assert response.status_code == 200


def test_429_wait_mode_returns_a_pause_longer_than_max_wait() -> None:
    trace, response = run(credential_flow("crm-ro", request(), max_wait=5, on_429="wait"),
                          [answer("t1", "f1"), {"paused_until": 1.0}],
                          [httpx.Response(429, headers={"Retry-After": "3600"})])
    assert response.status_code == 429  # no retry, no oversized wait asked for; the pause is shared
    assert trace == [CALL.replace("30.0", "5"), "upstream Bearer t1",
                     "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 3600.0}"]


def test_a_second_429_is_shared_too() -> None:
    trace, response = run(credential_flow("crm-ro", request(), max_wait=5, on_429="wait"),
                          [answer("t1", "f1"), {"paused_until": 1.0}, answer("t1", "f1"),
                           {"paused_until": 2.0}],
                          [httpx.Response(429, headers={"Retry-After": "1"}),
                           httpx.Response(429, headers={"Retry-After": "3"})])
    assert response.status_code == 429
    assert trace[-1] == "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 3.0}"


def test_retry_after_forms() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) == 1.0 and parse_retry_after("soon") == 1.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("-5") == 0.0 and parse_retry_after("99999") == 3600.0
