"""Shared buckets end to end: several clients (and processes) against one real sidecar."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpcreds import AsyncClient, Client, InvalidRequest, RateLimited
from tests.conftest import run_cli
from tests.sidecar_proc import SidecarProcess, run_sidecar

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[services.api]
endpoint = "https://api.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:API_KEY}}}}" }}
rate = "{rate}"
[[servers]]
name = "a"
service = "api"
[[servers]]
name = "b"
service = "api"
[[servers]]
name = "free"
endpoint = "https://free.example.com/mcp"
headers = {{ "X-Client" = "free" }}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(socket=tmp_path / "run" / "s.sock", rate="10/1s"))
    return path


@pytest.fixture
def sidecar(config: Path, tmp_path: Path) -> Iterator[SidecarProcess]:
    with run_sidecar(config, tmp_path / "run" / "s.sock", {"API_KEY": "k-123456"}) as proc:
        yield proc


WORKER = """
import sys, time
from mcpcreds import Client
with Client(sys.argv[1]) as c:
    for i in range(10):
        c.acquire(sys.argv[2], cost=1, max_wait=30)
print(time.time())
"""


def test_processes_share_one_bucket(sidecar: SidecarProcess) -> None:
    started = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(sidecar.socket), name],
                              stdout=subprocess.PIPE, text=True) for name in ("a", "b", "a", "b")]
    finished = [float(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    # 40 permits from a 10/1s bucket that starts full: 10 at once, 30 more take 3 s between them all
    assert max(finished) - started >= 2.9
    with Client(sidecar.socket) as client:
        bucket = client.status()["buckets"][0]
    assert bucket["key"] == "service:api" and bucket["granted"] == 40 and bucket["capacity"] == 10


async def wait_until_waiting(client: AsyncClient, count: int) -> None:
    for _ in range(500):
        buckets = (await client.status())["buckets"]
        if buckets and buckets[0]["waiting"] == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never saw {count} waiting")


async def test_waiting_is_first_come_first_served(sidecar: SidecarProcess) -> None:
    observer = AsyncClient(sidecar.socket)
    clients = [AsyncClient(sidecar.socket) for _ in range(3)]
    try:
        await observer.acquire("a", cost=10)  # drain: the bucket refills 1 permit per 0.1 s
        done: list[str] = []

        async def take(client: AsyncClient, label: str, cost: int) -> None:
            await client.acquire("b", cost=cost, max_wait=10)
            done.append(label)

        big = asyncio.create_task(take(clients[0], "big", 5))
        await wait_until_waiting(observer, 1)
        small = asyncio.create_task(take(clients[1], "small", 1))
        await wait_until_waiting(observer, 2)
        tiny = asyncio.create_task(take(clients[2], "tiny", 1))
        await asyncio.gather(big, small, tiny)
        assert done == ["big", "small", "tiny"]  # the small ones did not overtake the big one
    finally:
        for c in (observer, *clients):
            await c.aclose()


async def test_a_client_that_leaves_gives_up_its_place(sidecar: SidecarProcess) -> None:
    async with AsyncClient(sidecar.socket) as observer, AsyncClient(sidecar.socket) as leaver:
        await observer.acquire("a", cost=10)
        waiting = asyncio.create_task(leaver.acquire("a", cost=10, max_wait=20))
        await wait_until_waiting(observer, 1)
        waiting.cancel()  # closes its connection
        await wait_until_waiting(observer, 0)
        bucket = (await observer.status())["buckets"][0]
        assert bucket["granted"] == 10  # the leaver consumed nothing
        started = time.monotonic()
        await observer.acquire("a", cost=10, max_wait=5)
        assert time.monotonic() - started < 1.5  # the first 1 s refill, not 2 s behind the leaver


def test_refusal_past_max_wait_has_an_exact_retry_after(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        client.acquire("a", cost=10)
        with pytest.raises(RateLimited) as info:
            client.acquire("b", cost=5, max_wait=0.1)
        assert 0.4 < info.value.retry_after <= 0.5
        out = subprocess.run(["curl", "-si", "--unix-socket", str(sidecar.socket), "-X", "POST",
                              "-d", '{"cost": 10, "max_wait": 0}', "http://x/v1/servers/a/acquire"],
                             capture_output=True, text=True, check=True).stdout
        assert out.startswith("HTTP/1.1 429 ") and "Retry-After: 1" in out
        body = json.loads(out.split("\n\n", 1)[1])
        assert body["error"]["code"] == "rate_limited" and body["error"]["retry_after"] > 0.5
        with pytest.raises(InvalidRequest):
            client.acquire("a", cost=11)  # more than the burst: never grantable
        with pytest.raises(InvalidRequest):
            client.acquire("a", cost=0)
        client.backoff("a", 30)  # refused for certain, however long the CLI takes to start
    result = run_cli("acquire", "a", "--cost", "1", "--max-wait", "0", "--socket", str(sidecar.socket))
    assert result.code == 75 and "rate_limited" in result.stderr


def test_call_returns_permits_and_headers(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        result = client.call("a", cost=2, max_wait=1)
        assert result["granted"] == 2 and result["waited"] == 0.0
        assert result["headers"] == {"X-Api-Key": "k-123456"} and result["key"] == "service:api"
        free = client.call("free", cost=1000)  # no rate: granted at once
        assert free["granted"] == 1000 and free["headers"] == {"X-Client": "free"}


def test_backoff_pauses_every_client(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as one, Client(sidecar.socket) as other:
        until = one.backoff("a", 2)
        assert until is not None and until == pytest.approx(time.time() + 2, abs=0.5)
        with pytest.raises(RateLimited) as info:
            other.acquire("b", max_wait=0)  # the same service, another server, another client
        assert 1.5 < info.value.retry_after <= 2.0
        started = time.monotonic()
        other.acquire("b", max_wait=5)
        assert time.monotonic() - started >= 1.4
        assert one.backoff("free", 1) is not None  # a rate-less server can be paused too
        with pytest.raises(RateLimited):
            other.acquire("free", max_wait=0)


def test_reload_keeps_the_level_of_an_unchanged_rate(sidecar: SidecarProcess, config: Path) -> None:
    with Client(sidecar.socket) as client:
        client.acquire("a", cost=10)
        config.write_text(config.read_text() + "\n")
        sidecar.signal(signal.SIGHUP)
        sidecar.wait_for("config reloaded")
        with pytest.raises(RateLimited):
            client.acquire("a", cost=10)  # still drained
        config.write_text(config.read_text().replace('rate = "10/1s"', 'rate = "50/1s"'))
        sidecar.signal(signal.SIGHUP)
        sidecar.wait_for("config reloaded")
        bucket = client.status()["buckets"][0]
        assert bucket["capacity"] == 50 and bucket["rate"] == "50/1s" and bucket["level"] < 50
