"""Numbers from an upstream (issue #12): a garbage `Retry-After` is a default pause, never an error.

The flow is stepped by hand first (no I/O); then the real sidecar process and a local upstream
that answers `429` with `Retry-After: nan`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mcpcreds import AsyncClient, RateLimited
from mcpcreds.client.auth import credential_flow
from mcpcreds.core.rates import DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER, parse_retry_after
from tests.peers.upstream import Upstream, start_upstream
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_auth_flow import answer, request, run
from tests.test_client_e2e import STATIC_ENV, static_config

NOW = 1445412470.0  # Wed, 21 Oct 2015 07:27:50 GMT

GARBAGE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "1e3", "1_0", "0x10", "3.",
           "soon", "Wed, 21 Oct 99999 07:28:00 GMT", "Wed, 21 Oct 2015 25:28:00 GMT",
           "Wed, 21 Oct 2015 07:28:00 +9999"]


@pytest.mark.parametrize("value", GARBAGE)
def test_garbage_retry_after_is_the_default_pause(value: str) -> None:
    assert parse_retry_after(value, now=NOW) == DEFAULT_RETRY_AFTER


@pytest.mark.parametrize(("value", "seconds"), [
    ("2", 2.0), (" 2.5 ", 2.5), ("-5", 0.0), ("-0", 0.0), ("99999", MAX_RETRY_AFTER),
    ("9" * 400, MAX_RETRY_AFTER),  # too many digits for a float: the longest pause, not inf
    ("Wed, 21 Oct 2015 07:28:00 GMT", 10.0),
    ("Wed, 21 Oct 2015 07:28:00 -0000", 10.0),  # -0000 is UTC, whatever the local time zone
    ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),
    ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER),
])
def test_retry_after_is_finite_and_in_range(value: str, seconds: float) -> None:
    got = parse_retry_after(value, now=NOW)
    assert got == seconds and math.copysign(1.0, got) == 1.0


@pytest.mark.parametrize("on_429", ["return", "wait", "raise"])
def test_a_nan_retry_after_still_pauses_the_bucket_with_a_valid_number(on_429: str) -> None:
    flow = credential_flow("crm-ro", request(), max_wait=5, on_429=on_429)  # type: ignore[arg-type]
    sidecar = [answer("t1", "f1"), {"paused_until": 1.0}]
    upstream = [httpx.Response(429, headers={"Retry-After": "nan"})]
    if on_429 == "wait":  # waits out the pause, then asks and sends again
        sidecar.append(answer("t1", "f1"))
        upstream.append(httpx.Response(200))
    try:
        trace, response = run(flow, sidecar, upstream)
    except RateLimited as exc:
        assert on_429 == "raise" and exc.retry_after == DEFAULT_RETRY_AFTER
    else:
        expected = 429 if on_429 == "return" else 200
        assert response.status_code == expected
        assert trace[2] == "sidecar POST /v1/servers/crm-ro/backoff {'retry_after': 1.0}"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with start_upstream() as up:
        yield up


@pytest.fixture
def static_sidecar(upstream: Upstream, tmp_path: Path) -> Iterator[SidecarProcess]:
    config, socket = static_config(tmp_path, upstream)
    with run_sidecar(config, socket, STATIC_ENV) as proc:
        yield proc


async def test_on_429_return_hands_back_a_garbage_retry_after_without_an_error(
        upstream: Upstream, static_sidecar: SidecarProcess) -> None:
    async with AsyncClient(static_sidecar.socket) as creds:
        async with httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("a", on_429="return")) as http:
            for value in ("nan", "inf", "1e400"):
                upstream.reject_next(1, retry_after=value)
                response = await http.get("/mcp")
                assert response.status_code == 429 and response.headers["Retry-After"] == value
        with pytest.raises(RateLimited) as info:
            await creds.acquire("b", max_wait=0)  # the shared bucket was paused all the same
        assert 0 < info.value.retry_after <= DEFAULT_RETRY_AFTER
    assert [static_sidecar.wait_for("backoff")["retry_after"] for _ in range(3)] == [1.0] * 3
    assert upstream.counts() == {429: 3}
