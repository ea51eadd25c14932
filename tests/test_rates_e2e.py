"""Shared buckets end to end: several clients (and processes) against one real sidecar.

Times: the sidecar's buckets read `time.monotonic()`, one clock for every process of the machine,
and so do these tests. A permit is granted after its request was sent and before its answer is
read, so the client's two readings bracket the sidecar's: the asserts below hold whatever the load
(upper bounds are exact; lower bounds only where the sidecar guarantees them). A bucket that
refills slowly (`SLOW`) keeps a drained bucket drained for as long as any test step may take.
"""

from __future__ import annotations

import asyncio
import json
import math
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
from tests.windows import SLACK, overfull_windows

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


SLOW = "10/100s"  # a permit every 10 s
SLOW_PER_SECOND = 0.1


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(socket=tmp_path / "run" / "s.sock", rate="10/1s"))
    return path


@pytest.fixture
def sidecar(config: Path, tmp_path: Path) -> Iterator[SidecarProcess]:
    with run_sidecar(config, tmp_path / "run" / "s.sock", {"API_KEY": "k-123456"}) as proc:
        yield proc


@pytest.fixture
def slow_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(socket=tmp_path / "run" / "s.sock", rate=SLOW))
    return path


@pytest.fixture
def slow_sidecar(slow_config: Path, tmp_path: Path) -> Iterator[SidecarProcess]:
    with run_sidecar(slow_config, tmp_path / "run" / "s.sock", {"API_KEY": "k-123456"}) as proc:
        yield proc


WORKER = """
import json, sys, time
from mcpcreds import Client
with Client(sys.argv[1]) as c:
    c.health()
    print("ready", flush=True)
    sys.stdin.readline()  # every worker starts at once
    grants = []
    for i in range(10):
        sent = time.monotonic()
        c.acquire(sys.argv[2], cost=1, max_wait=30)
        grants.append((sent, time.monotonic()))
print(json.dumps(grants))
"""


def test_processes_share_one_bucket(sidecar: SidecarProcess) -> None:
    """Four processes, through two servers of one service, take 40 permits of its 10/1s bucket:
    no window of time holds more grants, across them all, than the one bucket allows."""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(sidecar.socket), name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for name in ("a", "b", "a", "b")]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    grants = [tuple(g) for p in procs for g in json.loads(p.communicate(timeout=120)[0])]
    assert all(p.returncode == 0 for p in procs) and len(grants) == 40
    assert overfull_windows(grants, burst=10, per_second=10.0) == []
    with Client(sidecar.socket) as client:
        [bucket] = client.status()["buckets"]
    assert bucket["key"] == "service:api" and bucket["capacity"] == 10
    assert bucket["granted"] == 40 and bucket["refused"] == 0  # each wait well within max_wait


async def wait_until_waiting(client: AsyncClient, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        buckets = (await client.status())["buckets"]
        if buckets and buckets[0]["waiting"] == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never saw {count} waiting")


async def reload(sidecar: SidecarProcess, config: Path, old: str, new: str) -> None:
    config.write_text(config.read_text().replace(old, new))
    sidecar.signal(signal.SIGHUP)
    await asyncio.to_thread(sidecar.wait_for, "config reloaded")


async def test_waiting_is_first_come_first_served(slow_sidecar: SidecarProcess, slow_config: Path) -> None:
    """Three callers queue on a drained bucket: a big one first, then two small ones. On the slow
    rate nothing is granted for 10 s, so the queue is seen whole; a reload to 10/1s then grants
    the big one (0.5 s) before the small ones, which fit long before it."""
    observer = AsyncClient(slow_sidecar.socket)
    clients = [AsyncClient(slow_sidecar.socket) for _ in range(3)]
    try:
        drained = time.monotonic()
        await observer.acquire("a", cost=10)
        done: list[str] = []

        async def take(client: AsyncClient, label: str, cost: int) -> None:
            await client.acquire("b", cost=cost, max_wait=300)
            done.append(label)

        big = asyncio.create_task(take(clients[0], "big", 5))
        await wait_until_waiting(observer, 1)
        small = asyncio.create_task(take(clients[1], "small", 1))
        await wait_until_waiting(observer, 2)
        tiny = asyncio.create_task(take(clients[2], "tiny", 1))
        await wait_until_waiting(observer, 3)
        # a newcomer is told its place behind the queue: 5 + 1 + 1 + 1 permits at 0.1/s from the
        # drain, less what refilled since
        with pytest.raises(RateLimited) as info:
            await observer.acquire("a", cost=1, max_wait=0)
        assert 80 - (time.monotonic() - drained) <= info.value.retry_after <= 80
        await reload(slow_sidecar, slow_config, SLOW, "10/1s")
        await asyncio.gather(big, small, tiny)
        assert done == ["big", "small", "tiny"]  # the small ones did not overtake the big one
    finally:
        for c in (observer, *clients):
            await c.aclose()


async def test_a_client_that_leaves_gives_up_its_place(slow_sidecar: SidecarProcess) -> None:
    async with AsyncClient(slow_sidecar.socket) as observer, AsyncClient(slow_sidecar.socket) as leaver:
        drained = time.monotonic()
        await observer.acquire("a", cost=10)
        waiting = asyncio.create_task(leaver.acquire("a", cost=10, max_wait=300))
        await wait_until_waiting(observer, 1)
        waiting.cancel()  # closes its connection
        await wait_until_waiting(observer, 0)  # as it leaves, not when its turn (100 s away) comes
        bucket = (await observer.status())["buckets"][0]
        assert bucket["granted"] == 10  # the leaver consumed nothing
        # the next caller is told the wait of its own 10 permits, not 100 s more behind the leaver
        with pytest.raises(RateLimited) as info:
            await observer.acquire("a", cost=10, max_wait=0)
        assert 100 - (time.monotonic() - drained) <= info.value.retry_after <= 100


def test_refusal_past_max_wait_has_an_exact_retry_after(slow_sidecar: SidecarProcess) -> None:
    socket = str(slow_sidecar.socket)
    with Client(socket) as client:
        drained = time.monotonic()
        client.acquire("a", cost=10)
        with pytest.raises(RateLimited) as info:
            client.acquire("b", cost=5, max_wait=0.1)
        # 5 permits at 0.1/s: 50 s from the drain, less what refilled since (at most `span` s' worth)
        span = time.monotonic() - drained
        assert 50 - span <= info.value.retry_after <= 50
        out = subprocess.run(["curl", "-si", "--unix-socket", socket, "-X", "POST", "-d",
                              '{"cost": 10, "max_wait": 0}', "http://x/v1/servers/a/acquire"],
                             capture_output=True, text=True, check=True).stdout
        span = time.monotonic() - drained
        assert out.startswith("HTTP/1.1 429 ")
        body = json.loads(out.split("\n\n", 1)[1])
        retry_after = body["error"]["retry_after"]
        assert body["error"]["code"] == "rate_limited" and 100 - span <= retry_after <= 100
        assert f"\nRetry-After: {math.ceil(retry_after)}\n" in out  # whole seconds, rounded up
        with pytest.raises(InvalidRequest):
            client.acquire("a", cost=11)  # more than the burst: never grantable
        with pytest.raises(InvalidRequest):
            client.acquire("a", cost=0)
        client.backoff("a", 3600)  # refused for certain, however long the CLI takes to start
    result = run_cli("acquire", "a", "--cost", "1", "--max-wait", "0", "--socket", socket)
    assert result.code == 75 and "rate_limited" in result.stderr


def test_call_returns_permits_and_headers(slow_sidecar: SidecarProcess) -> None:
    with Client(slow_sidecar.socket) as client:
        before = time.monotonic()
        result = client.call("a", cost=2, max_wait=1)
        assert result["granted"] == 2 and result["waited"] == 0.0
        assert result["headers"] == {"X-Api-Key": "k-123456"} and result["key"] == "service:api"
        [bucket] = client.status()["buckets"]
        span = time.monotonic() - before
        assert bucket["granted"] == 2 and bucket["level"] <= 8 + SLOW_PER_SECOND * span + 0.001  # taken
        free = client.call("free", cost=1000)  # no rate: granted at once
        assert free["granted"] == 1000 and free["headers"] == {"X-Client": "free"}


def test_backoff_pauses_every_client(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as one, Client(sidecar.socket) as other:
        before, wall = time.monotonic(), time.time()
        until = one.backoff("a", 2)
        assert until is not None and wall + 2 - SLACK <= until <= time.time() + 2 + SLACK
        other.acquire("b", max_wait=5)  # the same service, another server, another client
        assert time.monotonic() - before >= 2 - SLACK  # granted no sooner than the pause ended
        # a caller that will not wait is refused, told the pause left (never more)
        before = time.monotonic()
        one.backoff("a", 3600)
        with pytest.raises(RateLimited) as info:
            other.acquire("b", max_wait=0)
        # (retry_after travels rounded to the millisecond: up to 0.5 ms under the exact value)
        assert 3600 - (time.monotonic() - before) - 0.0005 <= info.value.retry_after <= 3600
        assert one.backoff("free", 3600) is not None  # a rate-less server can be paused too
        with pytest.raises(RateLimited):
            other.acquire("free", max_wait=0)


def test_reload_keeps_the_level_of_an_unchanged_rate(slow_sidecar: SidecarProcess, slow_config: Path) -> None:
    with Client(slow_sidecar.socket) as client:
        drained = time.monotonic()
        client.acquire("a", cost=10)
        slow_config.write_text(slow_config.read_text() + "\n")
        slow_sidecar.signal(signal.SIGHUP)
        slow_sidecar.wait_for("config reloaded")
        [bucket] = client.status()["buckets"]
        # still drained: what refilled since the drain, not a new full bucket
        assert bucket["level"] <= SLOW_PER_SECOND * (time.monotonic() - drained) + 0.001
        slow_config.write_text(slow_config.read_text().replace(SLOW, "50/100s"))
        slow_sidecar.signal(signal.SIGHUP)
        slow_sidecar.wait_for("config reloaded")
        [bucket] = client.status()["buckets"]
        assert bucket["capacity"] == 50 and bucket["rate"] == "50/100s"
        assert bucket["level"] <= 0.5 * (time.monotonic() - drained) + 0.001  # refilling at 0.5/s at most
