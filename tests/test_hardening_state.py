"""Issue #12, shared-state integrity and grant limits: whoever can write to Redis cannot mint or
widen a grant, send an event or shut a bucket for good; a grant holder cannot fill the store."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from mcpcreds import Client, Forbidden
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.rates import Rate
from mcpcreds.credentials.tokens import Token
from mcpcreds.errors import TooManyGrants
from mcpcreds.state.grants import Grant, GrantLimits, MemoryGrants, RedisGrants
from mcpcreds.state.redis_state import EVENTS, RedisState
from tests.conftest import module_peer
from tests.grant_config import MAIL, WEB
from tests.peers.oidc_peer import OidcPeer
from tests.peers.redis_peer import RedisPeer
from tests.redis_sidecar import STATE_KEY, oidc_client, start_on_state
from tests.sidecar_proc import SidecarProcess

SECRET = "shared-client-secret-0"


@pytest.fixture
async def raw(redis: RedisPeer) -> AsyncIterator[aioredis.Redis]:
    """A plain client, as someone who can write to Redis but holds no state_key."""
    client = aioredis.Redis(unix_socket_path=str(redis.socket))
    try:
        yield client
    finally:
        await client.aclose()


async def record_key(raw: aioredis.Redis, grant_id: str) -> bytes:
    """The Redis key of a grant's record, found by its content (wherever the store puts it)."""
    async for key in raw.scan_iter():
        if await raw.type(key) == b"string":
            value = cast(bytes, await raw.get(key))  # a client without decode_responses reads bytes
            if f'"id": "{grant_id}"'.encode() in value and b'"servers"' in value:
                return bytes(key)
    raise AssertionError(f"no record for grant {grant_id}")


# -- grant limits, memory store (fake clock)

async def test_memory_the_65th_sub_grant_of_a_holder_is_refused_until_one_is_revoked_or_expires() -> None:
    clock = FakeClock()
    store = MemoryGrants(clock)
    now = clock.time()
    await store.put(Grant("p", ("crm",), now + 3600), "h-p")
    await store.put(Grant("q", ("crm",), now + 3600), "h-q")
    for i in range(63):
        await store.put(Grant(f"c{i}", ("crm",), now + 3600, "p", ("p",)), f"h-c{i}")
    await store.put(Grant("short", ("crm",), now + 10, "p", ("p",)), "h-short")  # the 64th
    with pytest.raises(TooManyGrants) as info:
        await store.put(Grant("x", ("crm",), now + 3600, "p", ("p",)), "h-x")
    assert info.value.status == 429 and info.value.code == "too_many_grants"
    await store.put(Grant("q1", ("crm",), now + 3600, "q", ("q",)), "h-q1")  # another holder's own count
    assert await store.revoke("c0")
    await store.put(Grant("x", ("crm",), now + 3600, "p", ("p",)), "h-x")  # the revoked one's place
    with pytest.raises(TooManyGrants):
        await store.put(Grant("y", ("crm",), now + 3600, "p", ("p",)), "h-y")
    clock.advance(10)  # "short" lapses: its place is free without anyone revoking it
    await store.put(Grant("y", ("crm",), now + 3600, "p", ("p",)), "h-y")
    assert await store.get("h-y") is not None


async def test_memory_the_sidecar_wide_cap_holds_and_lapsed_grants_free_it() -> None:
    clock = FakeClock()
    store = MemoryGrants(clock)
    now = clock.time()
    for i in range(10_000):  # the default cap
        await store.put(Grant(f"g{i}", ("crm",), now + (60 if i < 10 else 3600)), f"h{i}")
    with pytest.raises(TooManyGrants):
        await store.put(Grant("more", ("crm",), now + 3600), "h-more")
    with pytest.raises(TooManyGrants):
        await store.put(Grant("kid", ("crm",), now + 3600, "g100", ("g100",)), "h-kid")
    clock.advance(60)
    for i in range(10):
        await store.put(Grant(f"more{i}", ("crm",), now + 3600), f"h-more{i}")
    with pytest.raises(TooManyGrants):
        await store.put(Grant("one-more", ("crm",), now + 3600), "h-one-more")
    assert await store.revoke("g500")
    await store.put(Grant("one-more", ("crm",), now + 3600), "h-one-more")


async def test_memory_a_deep_chain_of_sub_grants_is_revoked_whole() -> None:
    clock = FakeClock()
    store = MemoryGrants(clock)
    now = clock.time()
    parent: Grant | None = None
    limits = GrantLimits(max_children=3000)  # the whole chain counts against its top grant
    for i in range(3000):  # each a sub-grant of the one before: deeper than Python's stack
        ancestors = (*parent.ancestors, parent.id) if parent else ()
        parent = Grant(f"g{i}", ("crm",), now + 3600, parent.id if parent else None, ancestors)
        await store.put(parent, f"h{i}", limits)
    assert await store.revoke("g0")
    assert await store.get("h2999") is None
    await store.put(Grant("fresh", ("crm",), now + 3600), "h-fresh")


# -- grant limits, shared store (real Redis, fake clock)

async def test_redis_the_65th_sub_grant_is_refused_until_one_is_revoked_or_expires(redis: RedisPeer) -> None:
    clock = FakeClock(time.time())
    state = RedisState(redis.url, STATE_KEY)
    store = RedisGrants(state, clock)
    now = clock.time()
    try:
        await store.put(Grant("p", ("crm",), now + 3600), "h-p")
        for i in range(63):
            await store.put(Grant(f"c{i}", ("crm",), now + 3600, "p", ("p",)), f"h-c{i}")
        await store.put(Grant("short", ("crm",), now + 10, "p", ("p",)), "h-short")
        with pytest.raises(TooManyGrants):
            await store.put(Grant("x", ("crm",), now + 3600, "p", ("p",)), "h-x")
        assert await store.revoke("c0")
        await store.put(Grant("x", ("crm",), now + 3600, "p", ("p",)), "h-x")
        with pytest.raises(TooManyGrants):
            await store.put(Grant("y", ("crm",), now + 3600, "p", ("p",)), "h-y")
        clock.advance(10)
        await store.put(Grant("y", ("crm",), now + 3600, "p", ("p",)), "h-y")
        assert await store.get("h-y") is not None
        assert await store.revoke("p")  # the cascade takes every sub-grant with it
        assert await store.get("h-y") is None and await store.get("h-x") is None
    finally:
        await state.aclose()


async def test_redis_the_global_cap_holds_for_two_sidecars_racing(redis: RedisPeer) -> None:
    clock = FakeClock(time.time())
    states = [RedisState(redis.url, STATE_KEY) for _ in range(2)]
    stores = [RedisGrants(s, clock) for s in states]
    limits = GrantLimits(max_total=10, max_children=64)

    async def mint(i: int) -> bool:
        try:
            await stores[i % 2].put(Grant(f"g{i}", ("crm",), clock.time() + 60 + i), f"h{i}", limits)
            return True
        except TooManyGrants:
            return False

    try:
        minted = await asyncio.gather(*(mint(i) for i in range(30)))
        assert sum(minted) == 10
        assert await stores[1].revoke(f"g{minted.index(True)}")  # a grant minted through the other
        assert sum(await asyncio.gather(*(mint(i) for i in range(30, 40)))) == 1
        clock.advance(3600)  # all lapse
        assert sum(await asyncio.gather(*(mint(i) for i in range(40, 70)))) == 10
    finally:
        for s in states:
            await s.aclose()


# -- integrity of what Redis holds

async def test_a_grant_written_into_redis_by_hand_is_not_honoured(redis: RedisPeer, raw: aioredis.Redis) -> None:
    clock = FakeClock(time.time())
    state = RedisState(redis.url, STATE_KEY)
    store = RedisGrants(state, clock)
    try:
        await store.put(Grant("g1", ("crm",), clock.time() + 3600), "hash-1")
        assert await store.get("hash-1") is not None
        key = await record_key(raw, "g1")
        forged = Grant("g1", ("crm", "web", "mail"), clock.time() + 3600).to_json()
        ttl = await raw.pttl(key)
        for value in (forged, "0" * 64 + "." + forged):  # plain JSON, then a made-up MAC
            await raw.set(key, value, px=ttl)
            assert await store.get("hash-1") is None
        assert state.refusals == 2
    finally:
        await state.aclose()


async def test_a_grant_record_copied_to_another_token_is_not_honoured(redis: RedisPeer,
                                                                     raw: aioredis.Redis) -> None:
    clock = FakeClock(time.time())
    state = RedisState(redis.url, STATE_KEY)
    store = RedisGrants(state, clock)
    try:
        await store.put(Grant("wide", ("crm", "web", "mail"), clock.time() + 3600), "hash-wide")
        await store.put(Grant("narrow", ("web",), clock.time() + 3600), "hash-narrow")
        wide, narrow = await record_key(raw, "wide"), await record_key(raw, "narrow")
        await raw.set(narrow, cast(bytes, await raw.get(wide)), px=await raw.pttl(narrow))
        assert await store.get("hash-narrow") is None  # the narrow token does not get the wide grant
        assert (await store.get("hash-wide")) == Grant("wide", ("crm", "web", "mail"), clock.time() + 3600)
    finally:
        await state.aclose()


async def test_keys_come_from_hkdf_with_one_salt_that_every_sidecar_agrees_on(redis: RedisPeer,
                                                                              raw: aioredis.Redis) -> None:
    a, b = RedisState(redis.url, STATE_KEY), RedisState(redis.url, STATE_KEY)
    token = Token("access-0", "Bearer", time.time(), time.time() + 300, None, "fp-0")
    try:
        first, second = await asyncio.gather(a.keys(), b.keys())
        assert first.salt == second.salt == await raw.get("mcpcreds:salt")
        assert first.mac_key == second.mac_key
        await a.put_login("service:crm", token, 60)
        assert (await b.get_login("service:crm")) == token
        # Redis loses everything (a restart without persistence): b comes back first with a new
        # salt; a, still on the old one, reads b's login and b reads a's
        await raw.flushall()
        await b.aclose()
        b = RedisState(redis.url, STATE_KEY)
        await b.put_login("service:crm", token, 60)
        assert (await b.keys()).salt != first.salt
        assert (await a.get_login("service:crm")) == token
        await a.put_login("service:other", token, 60)
        assert (await b.get_login("service:other")) == token
        assert a.refusals == b.refusals == 0
    finally:
        await a.aclose()
        await b.aclose()


async def wait_subscribed(raw: aioredis.Redis, count: int) -> None:
    deadline = time.monotonic() + 10
    while dict(await raw.pubsub_numsub(EVENTS)).get(EVENTS.encode(), 0) < count:
        assert time.monotonic() < deadline, "the listener never subscribed"
        await asyncio.sleep(0.01)


async def test_a_forged_event_is_not_delivered(redis: RedisPeer, raw: aioredis.Redis) -> None:
    listener, sender = RedisState(redis.url, STATE_KEY), RedisState(redis.url, STATE_KEY)
    other_key = RedisState(redis.url, "another-state-key-0123456789")
    got: list[dict[str, Any]] = []
    marker = asyncio.Event()

    def handler(event: dict[str, Any]) -> None:
        got.append(event)
        if event.get("key") == "service:marker":
            marker.set()

    try:
        listener.listen(handler)
        await wait_subscribed(raw, 1)
        forged = {"kind": "invalidate", "key": "service:crm", "fingerprint": "fp-1", "node": "forged"}
        await raw.publish(EVENTS, json.dumps(forged))
        await raw.publish(EVENTS, "0" * 64 + "." + json.dumps(forged))
        await other_key.publish("invalidate", "service:crm", fingerprint="fp-1")  # another state_key
        await sender.publish("login", "service:marker", fingerprint="fp-2")  # genuine, sent last
        await asyncio.wait_for(marker.wait(), timeout=10)
        assert [e["key"] for e in got] == ["service:marker"]
        assert listener.refusals == 3
    finally:
        for s in (listener, sender, other_key):
            await s.aclose()


async def test_a_forged_bucket_record_cannot_shut_or_drain_a_bucket_for_long(redis: RedisPeer,
                                                                            raw: aioredis.Redis) -> None:
    state = RedisState(redis.url, STATE_KEY)
    rate = Rate(10, 1.0)
    try:
        assert (await state.bucket("service:crm", rate, 1, "take"))[0]
        name = "mcpcreds:{service:crm}:bucket"
        await raw.hset(name, mapping={"paused_until": "1e300"})
        granted, wait, _, paused = await state.bucket("service:crm", rate, 1, "take")
        assert not granted and wait <= 86400 and paused <= 86400  # no longer than the API allows
        await raw.hset(name, mapping={"paused_until": "0", "level": "-1e300", "updated": "1e300"})
        granted, wait, level, _ = await state.bucket("service:crm", rate, 1, "take")
        assert wait <= 0.1 + 1e-6 and 0 <= level <= 10  # at worst empty, refilling from now
        for junk in ("nan", "inf", "-inf"):
            await raw.hset(name, mapping={"paused_until": junk, "level": junk, "updated": junk})
            _, wait, level, paused = await state.bucket("service:crm", rate, 1, "peek")
            assert 0 <= wait <= 86400 and 0 <= level <= 10 and 0 <= paused <= 86400
    finally:
        await state.aclose()


# -- end to end, through real sidecars

OIDC_CLIENTS = [oidc_client("shared", SECRET)]  # on the shared peer (conftest)


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 300)


def start(stack: ExitStack, tmp_path: Path, state: str, token_url: str) -> SidecarProcess:
    """A sidecar on `state` ("memory" or a Redis URL): `crm` (sensitive) logs in as `shared` at
    `token_url`, `web` and `mail` are the other two legs of the Rule of Two; every uid may mint."""
    body = f"""
[services.crm]
endpoint = "https://crm.example.com/mcp"
rate = "100/1s"
tags = ["sensitive"]
oauth = {{ token_url = "{token_url}", client_id = "shared", client_secret = "{{{{secret:CRM_SECRET}}}}", scope = "tools:read" }}
[[servers]]
name = "crm"
service = "crm"
{WEB}{MAIL}"""
    return start_on_state(stack, tmp_path, state, body, {"CRM_SECRET": SECRET, "KEY_WEB": "key-value-0", "KEY_MAIL": "key-value-1"},
                          "grant_only_uids = []")


async def test_a_grant_widened_in_redis_gives_the_child_nothing_more(tmp_path: Path, redis: RedisPeer,
                                                                    raw: aioredis.Redis) -> None:
    with ExitStack() as stack:
        socket = start(stack, tmp_path, redis.url, "https://127.0.0.1:9/token").socket
        with Client(socket) as parent:
            minted = parent.grant(["web"], ttl=600)
        key = await record_key(raw, minted["id"])
        await raw.set(key, Grant(minted["id"], ("crm", "web", "mail"), minted["expires_at"]).to_json(),
                      px=await raw.pttl(key))
        with Client(socket, grant=minted["grant"]) as child:
            for name in ("web", "mail"):
                with pytest.raises(Forbidden):
                    child.headers(name)


def test_a_forged_invalidation_does_not_drop_the_login(tmp_path: Path, redis: RedisPeer,
                                                       peer: OidcPeer) -> None:
    import redis as syncredis

    peer.reset_stats()
    with ExitStack() as stack:
        sidecar = start(stack, tmp_path, redis.url, peer.token_url)
        with Client(sidecar.socket) as client, syncredis.Redis(unix_socket_path=str(redis.socket)) as r:
            fingerprint = client.headers_info("crm")["fingerprint"]
            r.publish(EVENTS, json.dumps({"kind": "invalidate", "key": "service:crm",
                                          "fingerprint": fingerprint, "node": "forged"}))
            # the refusal is logged as the event is handled: after it, the sidecar has decided
            sidecar.wait_for("a shared event failed verification and is ignored "
                             "(forged, or another state_key)", timeout=10)
            assert client.headers_info("crm")["fingerprint"] == fingerprint
    # read once the sidecar has stopped and its log is complete: a drop is logged right after the
    # event is handled, which may be after the refusal line was read (the login itself comes back
    # from Redis unchanged, so only the log shows a drop)
    assert "login dropped by another sidecar" not in sidecar.log
    assert peer.stats()["token_requests"] == 1


def test_the_65th_sub_grant_through_the_sidecar_is_429(tmp_path: Path) -> None:
    with ExitStack() as stack:
        socket = start(stack, tmp_path, "memory", "https://127.0.0.1:9/token").socket
        with Client(socket) as parent:
            top = parent.grant(["web"], ttl=600)
        with Client(socket, grant=top["grant"]) as child:
            kids = [child.grant(["web"], ttl=60) for _ in range(64)]
            with pytest.raises(TooManyGrants):
                child.grant(["web"], ttl=60)
        with Client(socket, grant=kids[0]["grant"]) as kid:
            assert kid.revoke_grant(kids[0]["id"])
        with Client(socket, grant=top["grant"]) as child:
            child.grant(["web"], ttl=60)  # the revoked one's place
