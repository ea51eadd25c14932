"""The gateway as a shared cache of what MCP 2026-07-28 servers mark cacheable (`ttlMs`,
`cacheScope`): the cache's rules on a fake clock, then through a real sidecar to the SDK's own
server of both eras (tests/peers/mcp_eras_peer.py), with the SDK's `Client` and raw requests."""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged

from mcpcreds import AsyncClient
from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError
from mcpcreds.gateway import results_cache
from mcpcreds.gateway.results_cache import ResultCache, ask_of
from mcpcreds.gateway.sessions import Owner
from mcpcreds.protocol.jsonrpc import Message
from mcpcreds.protocol.strict_json import Masker
from tests.peers.mcp_eras_peer import start_eras_peer
from tests.peers.process import PeerHandle
from tests.sidecar_proc import SidecarProcess, run_sidecar

MODERN = "2026-07-28"
ALLOWED = '["add", "ask", "grow", "grown", "region", "slow"]'
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "MCP-Protocol-Version": MODERN}
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
ME: Owner = (1000, None)
GRANTEE: Owner = (1000, "g-1")


# ------------------------------------------------------------------ the rules, on a fake clock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(method: str = "tools/list", **params: Any) -> Message:
    return Message({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": META, **params}}, "request")


def listing(ttl: Any = 30_000, scope: str = "public", **more: Any) -> dict[str, Any]:
    return {"tools": [{"name": "add", "inputSchema": {"type": "object"}}], "ttlMs": ttl, "cacheScope": scope,
            "resultType": "complete", **more}


def ask(message: Message | None = None, owner: Owner = ME) -> results_cache.Ask:
    found = ask_of("docs", "https://docs.example/mcp", message or request(), owner)
    assert found is not None
    return found


def unmasked(value: Any) -> Any:
    return value


def test_a_public_result_serves_every_caller_and_says_how_long_it_stays_fresh() -> None:
    clock = Clock()
    cache = ResultCache(clock)
    assert cache.keep(ask(), listing(), b"token-1", unmasked)
    clock.now += 10.0
    for owner, context in ((ME, b"token-1"), (GRANTEE, b"token-2"), (GRANTEE, None)):
        served = cache.fresh(ask(owner=owner), context)
        assert served is not None and served["tools"] == listing()["tools"]
        assert served["ttlMs"] == 20_000 and served["cacheScope"] == "public"
    clock.now += 20.0  # its 30 s are over
    assert cache.fresh(ask(), b"token-1") is None


def test_a_private_result_serves_only_the_caller_and_the_credential_that_fetched_it() -> None:
    cache = ResultCache(Clock())
    assert cache.keep(ask(), listing(scope="private"), b"token-1", unmasked)
    assert cache.fresh(ask(), b"token-1") is not None
    assert cache.fresh(ask(owner=GRANTEE), b"token-1") is None  # another caller
    assert cache.fresh(ask(), b"token-2") is None  # a new token: another authorization context
    assert cache.fresh(ask(), None) is None  # no credential at hand
    assert cache.keep(ask(), listing(scope="nonsense"), b"token-1", unmasked)  # not public: private
    assert cache.fresh(ask(owner=GRANTEE), b"token-1") is None


@pytest.mark.parametrize("result", [
    listing(ttl=0), listing(ttl=-5), listing(ttl=True), listing(ttl=1.5), listing(ttl="60000"),
    {k: v for k, v in listing().items() if k != "ttlMs"}, listing(resultType="input_required"),
    listing(tools=[{"name": "x" * results_cache.MAX_RESULT}]), ["not", "a", "result"],
], ids=["zero", "negative", "bool", "float", "string", "absent", "input_required", "too_big", "array"])
def test_what_the_hints_do_not_allow_is_never_kept(result: Any) -> None:
    cache = ResultCache(Clock())
    assert not cache.keep(ask(), result, b"token-1", unmasked)
    assert cache.fresh(ask(), b"token-1") is None and len(cache) == 0


def test_a_ttl_past_a_day_is_cut_to_a_day() -> None:
    clock = Clock()
    cache = ResultCache(clock)
    assert cache.keep(ask(), listing(ttl=10 * results_cache.MAX_TTL_MS), b"t", unmasked)
    served = cache.fresh(ask(), b"t")
    assert served is not None and served["ttlMs"] == results_cache.MAX_TTL_MS
    clock.now += results_cache.MAX_TTL_MS / 1000
    assert cache.fresh(ask(), b"t") is None


def test_the_key_is_what_reaches_the_server_less_what_is_per_request() -> None:
    cache = ResultCache(Clock())
    assert cache.keep(ask(), listing(), b"t", unmasked)
    traced = request(_meta={**META, "progressToken": 7, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert cache.fresh(ask(traced), b"t") is not None  # a progress token and trace context: the same request
    for other in (request(cursor="page-2"), request("prompts/list"),
                  request(_meta={**META, "io.modelcontextprotocol/clientCapabilities": {"roots": {}}})):
        assert cache.fresh(ask(other), b"t") is None
    elsewhere = ask_of("docs", "https://elsewhere.example/mcp", request(), ME)
    assert elsewhere is not None and cache.fresh(elsewhere, b"t") is None
    # never cached: a call, a notification, an input round's retry, the 2025 revisions (no hints;
    # sessions with state of their own)
    assert ask_of("docs", "u", request("tools/call", name="add"), ME) is None
    assert ask_of("docs", "u", Message({"jsonrpc": "2.0", "method": "tools/list"}, "notification"), ME) is None
    assert ask_of("docs", "u", request("resources/read", uri="a://b", requestState="s"), ME) is None
    assert ask_of("docs", "u", request("resources/read", uri="a://b", inputResponses={}), ME) is None
    legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for params in ({}, {"_meta": {"io.modelcontextprotocol/protocolVersion": "2025-11-25"}}, {"_meta": None}):
        assert ask_of("docs", "u", Message({**legacy, "params": params}, "request"), ME) is None
    assert ask_of("docs", "u", Message(legacy, "request"), ME) is None


def test_a_list_changed_notice_makes_that_list_stale_and_no_other() -> None:
    cache = ResultCache(Clock())
    reads = ask(request("resources/read", uri="file:///a"))
    prompts = ask(request("prompts/list"))
    for each in (ask(), reads, prompts):
        assert cache.keep(each, listing(), b"t", unmasked)
    cache.notified("other-server", "notifications/tools/list_changed")
    cache.notified("docs", "notifications/message")
    assert all(cache.fresh(each, b"t") is not None for each in (ask(), reads, prompts))
    cache.notified("docs", "notifications/tools/list_changed")
    assert cache.fresh(ask(), b"t") is None
    assert cache.fresh(reads, b"t") is not None and cache.fresh(prompts, b"t") is not None
    cache.notified("docs", "notifications/resources/updated")
    assert cache.fresh(reads, b"t") is None and cache.fresh(prompts, b"t") is not None


def test_an_error_for_a_later_page_makes_every_page_of_that_list_stale() -> None:
    """The server no longer takes a cursor a kept page holds (it restarted, say): the client must
    not be sent that page again, or it would ask for the next one with the same cursor."""
    cache = ResultCache(Clock())
    first, second = ask(), ask(request(cursor="c-1"))
    assert cache.keep(first, listing(nextCursor="c-1"), b"t", unmasked)
    prompts = ask(request("prompts/list"))
    assert cache.keep(prompts, listing(), b"t", unmasked)
    cache.failed(first)  # an error for a first page: nothing follows from it
    assert cache.fresh(first, b"t") is not None
    cache.failed(second)
    assert cache.fresh(first, b"t") is None and cache.fresh(prompts, b"t") is not None


def test_a_credential_in_a_result_is_kept_masked() -> None:
    cache = ResultCache(Clock())
    canary = "canary-6b1f0c4e9d"
    result = listing(tools=[{"name": "add", "description": f"send {canary} along"}])
    assert cache.keep(ask(), result, b"t", Masker([canary]).value)
    assert canary not in repr(cache.fresh(ask(), b"t"))


def test_an_answer_asked_for_before_a_notice_of_a_change_is_not_kept() -> None:
    cache = ResultCache(Clock())
    on_its_way = cache.asked(ask())
    cache.notified("docs", "notifications/tools/list_changed")
    assert not cache.keep(on_its_way, listing(), b"t", unmasked)
    assert cache.keep(cache.asked(ask()), listing(), b"t", unmasked)  # asked after the notice
    on_its_way = cache.asked(ask())
    cache.clear()  # a reload: everything kept, or on its way, is stale
    assert cache.fresh(ask(), b"t") is None and not cache.keep(on_its_way, listing(), b"t", unmasked)


def test_no_private_result_is_kept_without_a_credential_to_tell_it_by() -> None:
    cache = ResultCache(Clock())  # a signed server: its identity is not in a header
    flight = cache.lead(ask())
    assert flight is not None and not cache.keep(ask(), listing(scope="private"), None, unmasked)
    cache.land(ask(), flight)
    assert cache.lead(ask()) is not None and cache.in_flight(ask()) is None  # so not waited for
    assert cache.keep(ask(), listing(), None, unmasked) and cache.fresh(ask(), None) is not None


async def test_one_request_on_its_way_is_waited_for_unless_its_last_answer_was_not_cacheable() -> None:
    cache = ResultCache(Clock())
    assert cache.in_flight(ask()) is None
    flight = cache.lead(ask())
    assert flight is not None and cache.lead(ask()) is None  # one leads; the next follows
    assert cache.in_flight(ask()) is flight and not flight.is_set()
    cache.keep(ask(), listing(ttl=0), b"t", unmasked)  # not cacheable
    cache.land(ask(), flight)
    assert flight.is_set() and cache.in_flight(ask()) is None
    again = cache.lead(ask())
    assert again is not None
    assert cache.in_flight(ask()) is None  # its last answer was not cacheable: not waited for
    cache.land(ask(), flight)  # the first flight landing twice ends no other
    assert ask().key in cache._flights
    cache.keep(ask(), listing(), b"t", unmasked)
    cache.land(ask(), again)
    third = cache.lead(ask())
    assert third is not None and cache.in_flight(ask()) is third  # cacheable again: waited for
    cache.keep(ask(), listing(scope="private"), b"t", unmasked)
    cache.land(ask(), third)
    mine = cache.lead(ask())
    assert mine is not None
    assert cache.in_flight(ask()) is mine  # private, and the same caller leads: waited for
    assert cache.in_flight(ask(owner=GRANTEE)) is None  # another caller's private answer: not


# ------------------------------------------------------------------ through a real sidecar


@pytest.fixture(scope="module")
def public() -> Iterator[PeerHandle]:
    with start_eras_peer(public=True) as server:
        yield server


@pytest.fixture(scope="module")
def private() -> Iterator[PeerHandle]:
    with start_eras_peer() as server:
        yield server


def server_block(name: str, url: str, more: str = "") -> str:
    return f'\n[[servers]]\nname = "{name}"\nendpoint = "{url}"\ntrust = "untrusted"\ntool_allowlist = {ALLOWED}\n{more}'


@pytest.fixture(scope="module")
def sidecar(public: PeerHandle, private: PeerHandle, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("results-cache")
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    servers = "".join(server_block(name, public.url) for name in ("burst", "narrow", "changing"))
    servers += server_block("metered", public.url, 'rate = "2/1h"\nmax_wait = "0s"\n')
    servers += server_block("plain", public.url, "cache_results = false\n")
    servers += server_block("mine", private.url)
    config.write_text(f'[sidecar]\nsocket = "{socket}"\naudit_log = "{workdir / "audit.jsonl"}"\n{servers}')
    with run_sidecar(config, socket) as proc:
        yield proc


def methods(peer: PeerHandle) -> dict[str, int]:
    counted: dict[str, int] = peer.stats()["methods"]
    return counted


def asked(before: dict[str, int], peer: PeerHandle) -> dict[str, int]:
    """What the server was asked since `before`, by method."""
    now = methods(peer)
    return {m: now[m] - before.get(m, 0) for m in now if now[m] != before.get(m, 0)}


@asynccontextmanager
async def client(sidecar: SidecarProcess, server: str, grant: str | None = None) -> AsyncIterator[Client]:
    """The SDK's `Client` in `auto` mode (2026-07-28) through the gateway on the socket."""
    async with AsyncClient(sidecar.socket, grant=grant) as creds, creds.mcp_httpx2_client(server) as http, \
            Client(streamable_http_client(creds.mcp_url(server), http_client=http), mode="auto") as session:
        yield session


@asynccontextmanager
async def raw(sidecar: SidecarProcess, server: str, grant: str | None = None) -> AsyncIterator[
        tuple[httpx.AsyncClient, str]]:
    async with AsyncClient(sidecar.socket, grant=grant) as creds, creds.mcp_http_client(server) as http:
        yield http, creds.mcp_url(server)


async def tools_listed(http: httpx.AsyncClient, url: str, id_: int = 1) -> tuple[int, dict[str, Any]]:
    answer = await http.post(url, headers=HEADERS, json={"jsonrpc": "2.0", "id": id_, "method": "tools/list",
                                                         "params": {"_meta": META}})
    body: dict[str, Any] = answer.json()
    assert body.get("id") == id_
    return answer.status_code, body


async def test_a_burst_of_new_sessions_asks_the_server_once_for_what_it_marked_public(
        public: PeerHandle, sidecar: SidecarProcess) -> None:
    """Six SDK clients open at once and each calls `add`: each sends server/discover, and the
    tools/list the SDK sends to check a result; the server is asked each of those once."""
    before = methods(public)

    async def one(n: int) -> Any:
        async with client(sidecar, "burst") as session:
            result = await session.call_tool("add", {"a": n, "b": 1})
            return result.structured_content

    assert await asyncio.gather(*(one(n) for n in range(6))) == [{"result": n + 1} for n in range(6)]
    assert asked(before, public) == {"server/discover": 1, "tools/list": 1, "tools/call": 6}


async def test_a_cached_answer_takes_no_permit(public: PeerHandle, sidecar: SidecarProcess) -> None:
    """`metered` has 2 permits an hour and waits for none: five listings take one, a call the other."""
    before = methods(public)
    async with raw(sidecar, "metered") as (http, url):
        for n in range(5):
            status, body = await tools_listed(http, url, n)
            assert status == 200 and "add" in {t["name"] for t in body["result"]["tools"]}, body
            assert 0 < body["result"]["ttlMs"] <= 30_000
        called = await http.post(url, headers=HEADERS, json={
            "jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": META}})
        assert called.status_code == 200 and called.json()["result"]["structuredContent"] == {"result": 3}
        refused = await http.post(url, headers=HEADERS, json={
            "jsonrpc": "2.0", "id": 10, "method": "tools/call",
            "params": {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": META}})
        assert refused.status_code == 429  # the rate is still the rate
    assert asked(before, public) == {"tools/list": 1, "tools/call": 1}
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)),
                                 base_url="http://mcpcreds") as http:
        scraped = (await http.get("/metrics")).text
    assert 'mcpcreds_gateway_cached_total{server="metered",method="tools/list"} 4' in scraped


async def test_a_grant_sees_only_its_tools_in_a_listing_served_from_the_cache(
        public: PeerHandle, sidecar: SidecarProcess) -> None:
    before = methods(public)
    async with raw(sidecar, "narrow") as (http, url):
        _, whole = await tools_listed(http, url)
    assert {"add", "ask", "region"} <= {t["name"] for t in whole["result"]["tools"]}
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["narrow"], ttl=60, tools={"narrow": ["add"]})
    async with raw(sidecar, "narrow", grant=minted["grant"]) as (http, url):
        _, narrowed = await tools_listed(http, url, 2)
    assert [t["name"] for t in narrowed["result"]["tools"]] == ["add"]
    assert asked(before, public) == {"tools/list": 1}  # the second from the cache, judged anew


async def test_a_private_result_is_not_served_to_another_caller(private: PeerHandle, sidecar: SidecarProcess) -> None:
    before = methods(private)
    async with raw(sidecar, "mine") as (http, url):
        for n in range(3):
            status, body = await tools_listed(http, url, n)
            assert status == 200 and body["result"]["cacheScope"] == "private"
    assert asked(before, private) == {"tools/list": 1}
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["mine"], ttl=60)
    async with raw(sidecar, "mine", grant=minted["grant"]) as (http, url):
        for n in range(2):
            status, body = await tools_listed(http, url, n)
            assert status == 200 and "add" in {t["name"] for t in body["result"]["tools"]}
    assert asked(before, private) == {"tools/list": 2}  # the grant's own, once


async def test_cache_results_false_asks_the_server_every_time(public: PeerHandle, sidecar: SidecarProcess) -> None:
    before = methods(public)
    async with raw(sidecar, "plain") as (http, url):
        for n in range(3):
            status, body = await tools_listed(http, url, n)
            assert status == 200 and body["result"]["ttlMs"] == 30_000  # as the server sent it
    assert asked(before, public) == {"tools/list": 3}


async def test_a_tools_list_changed_notice_makes_the_cached_listing_stale(
        public: PeerHandle, sidecar: SidecarProcess) -> None:
    async with client(sidecar, "changing") as session:
        assert "grown" not in {tool.name for tool in (await session.list_tools()).tools}
        before = methods(public)
        async with client(sidecar, "changing") as other:  # another process: the gateway's copy
            assert "grown" not in {tool.name for tool in (await other.list_tools()).tools}
        assert asked(before, public) == {}
        async with session.listen(tools_list_changed=True) as subscription:
            assert not (await session.call_tool("grow", {})).is_error
            event = await asyncio.wait_for(anext(aiter(subscription)), 30)
        assert isinstance(event, ToolsListChanged)
        before = methods(public)
        assert "grown" in {tool.name for tool in (await session.list_tools()).tools}
    assert asked(before, public) == {"tools/list": 1}


def test_cache_results_is_read_per_server_over_its_service() -> None:
    config = parse_config(tomllib.loads(
        '[services.docs]\nendpoint = "https://docs.example/mcp"\ncache_results = false\n'
        '[[servers]]\nname = "quiet"\nservice = "docs"\n'
        '[[servers]]\nname = "loud"\nservice = "docs"\ncache_results = true\n'
        '[[servers]]\nname = "plain"\nendpoint = "https://plain.example/mcp"\n'))
    assert not config.servers["quiet"].gateway.cache_results
    assert config.servers["loud"].gateway.cache_results and config.servers["plain"].gateway.cache_results
    with pytest.raises(ConfigError) as refused:
        parse_config(tomllib.loads('[[servers]]\nname = "x"\nendpoint = "https://x.example/mcp"\n'
                                   'cache_results = "no"\n'))
    assert "cache_results: expected bool, got string" in str(refused.value)
