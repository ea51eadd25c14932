"""Status shows live grants (issue 19, "status at a glance": leases and grants): the count of
unexpired, unrevoked grants and the limit, from the memory store and from the shared Redis
store (real redis-server) on a fake clock; a shared state that cannot be asked gives null and
status still answers; the terminal view draws the row."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rich.console import Console

from mcpcreds.broker.broker import Broker
from mcpcreds.cli.status_view import show
from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.metrics import Metrics
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from mcpcreds.errors import StateUnavailable
from mcpcreds.state.grants import Grant, GrantStore, MemoryGrants, RedisGrants
from mcpcreds.state.redis_state import RedisState
from tests.peers.redis_peer import RedisPeer


async def live_counts(store: GrantStore, clock: FakeClock) -> list[int]:
    """Live counts as grants are made, revoked (with their sub-grants) and expire."""
    now = clock.time()
    counts = [await store.live()]
    await store.put(Grant("a", ("crm",), now + 3600), "h-a")
    await store.put(Grant("a1", ("crm",), now + 3600, "a", ("a",)), "h-a1")
    await store.put(Grant("b", ("crm",), now + 10), "h-b")
    await store.put(Grant("c", ("crm",), now + 3600), "h-c")
    counts.append(await store.live())
    assert await store.revoke("a")  # and a1 below it
    counts.append(await store.live())
    clock.advance(10)  # b expires
    counts.append(await store.live())
    return counts


async def test_memory_store_counts_live_grants() -> None:
    clock = FakeClock()
    assert await live_counts(MemoryGrants(clock), clock) == [0, 4, 2, 1]


async def test_redis_store_counts_the_live_grants_of_every_sidecar(redis: RedisPeer) -> None:
    clock = FakeClock(time.time())
    state = RedisState(redis.url, "status-grants-key")
    other = RedisState(redis.url, "status-grants-key")  # a second sidecar on the same Redis
    try:
        assert await live_counts(RedisGrants(state, clock), clock) == [0, 4, 2, 1]
        assert await RedisGrants(other, clock).live() == 1
    finally:
        await state.aclose()
        await other.aclose()


class Unreachable:
    """A grant store whose shared state is down (fault injection)."""

    async def live(self) -> int:
        raise StateUnavailable("shared state unreachable (count grants: ConnectionError)")


async def test_status_reports_live_grants_and_null_when_the_state_cannot_say() -> None:
    clock = FakeClock()
    config = parse_config({"sidecar": {"max_grants": 50}, "servers": [
        {"name": "docs", "endpoint": "https://docs.example.com/mcp", "headers": {"X-Key": "{{secret:K}}"}}]})
    broker = Broker(config, SecretResolver([EnvSource({"K": "v"})]), clock, Metrics())
    try:
        await broker.grants.put(Grant("g", ("docs",), clock.time() + 60), "h-g")
        assert (await broker.status())["grants"] == {"live": 1, "limit": 50}
        broker.grants = Unreachable()  # type: ignore[assignment]
        status = await broker.status()
        assert status["grants"] is None and status["servers"][0]["name"] == "docs"
    finally:
        await broker.aclose()


@pytest.mark.parametrize(("grants", "row"), [({"live": 3, "limit": 10000}, ["3", "10000"])])
def test_the_terminal_view_draws_the_grants(grants: dict[str, Any], row: list[str]) -> None:
    out = Console(record=True, width=120, force_terminal=True, color_system=None)
    show({"version": "1", "servers": [], "grants": grants}, out, 0.0)
    lines = [line.replace("│", " ").replace("┃", " ").split() for line in out.export_text().splitlines()]
    assert ["grants"] in lines and ["live", "limit"] in lines and row in lines
