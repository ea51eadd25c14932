"""The gateway's upstream transport (mcpcreds.net.upstream.H1Transport) against a scripted raw HTTP/1.1
server on loopback: one write per request, keep-alive reuse, every way an answer's body can end
(Content-Length, chunked, the connection's end, a drop), bounds (the head, buffered body bytes,
open connections) and checked request headers. The gateway's own tests run it end to end."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds.errors import Forbidden
from mcpcreds.net.egress import EgressPolicy
from mcpcreds.net.egress_http import ConnectError, EgressTransport, RawAnswer, egress_client
from mcpcreds.net.upstream import DRAIN_BYTES, HIGH_WATER, MAX_HEAD_BYTES, H1Transport
from tests.test_egress import _cert, fixed_resolver, open_listener

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUTS = httpx.Timeout(5.0).as_dict()


@asynccontextmanager
async def server(script: Script) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback server running `script` per connection; yields its URL and the first bytes each
    connection received."""
    firsts: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        firsts.append(b"")
        await handle(reader, writer)

    srv = await asyncio.start_server(track, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp", firsts
    finally:
        srv.close()
        await srv.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


def request(url: str, body: bytes = b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
            headers: list[tuple[bytes, bytes]] | None = None, pool: float = 5.0) -> httpx.Request:
    return httpx.Request("POST", url, content=body, headers=headers or [(b"accept", b"application/json")],
                         extensions={"timeout": {**TIMEOUTS, "pool": pool}})


async def send(transport: H1Transport, req: httpx.Request) -> tuple[int, bytes]:
    response = await transport.handle_async_request(req)
    try:
        return response.status_code, b"".join([chunk async for chunk in response.aiter_bytes()])
    finally:
        await response.aclose()


async def test_one_connection_serves_requests_in_turn_each_request_whole() -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            seen.append(head + body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
            await writer.drain()

    async with server(script) as (url, connections):
        transport = H1Transport()
        for i in range(3):
            body = b'{"n":%d}' % i
            assert await send(transport, request(url, body)) == (200, body)
        await transport.aclose()
    assert len(connections) == 1 and len(seen) == 3
    assert seen[0].startswith(b"POST /mcp HTTP/1.1\r\n") and seen[0].endswith(b'\r\n\r\n{"n":0}')


async def test_chunked_and_connection_delimited_bodies_and_an_interim_answer() -> None:
    answers = [b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            await read_request(reader)
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if b"close" in answer:
                return

    async with server(script) as (url, connections):
        transport = H1Transport()
        assert await send(transport, request(url)) == (200, b"abcde")
        assert await send(transport, request(url)) == (200, b"until the end")
        await transport.aclose()
    assert len(connections) == 1 and transport.open == 0


async def test_an_answer_cut_mid_body_is_a_read_error_and_its_connection_is_not_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async with server(script) as (url, connections):
        transport = H1Transport()
        with pytest.raises(httpx.ReadError):
            await send(transport, request(url))
        with pytest.raises(httpx.ReadError):
            await send(transport, request(url))
        await transport.aclose()
    assert len(connections) == 2 and transport.open == 0


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES + HIGH_WATER),  # never ends
    b"NOT HTTP AT ALL\r\n\r\n",
], ids=["big", "endless", "invalid"])
async def test_an_oversized_or_invalid_head_is_refused(answer: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()

    async with server(script) as (url, _):
        transport = H1Transport()
        with pytest.raises(httpx.RemoteProtocolError):
            await send(transport, request(url))
        await transport.aclose()


@pytest.mark.parametrize("header", [(b"x-a", b"v\r\nInjected: 1"), (b"x-a", b"v\nx"), (b"x-a", b"v\x00"),
                                    (b"x a", b"v"), (b"x:a", b"v"), (b"", b"v")],
                         ids=["crlf", "lf", "nul", "space", "colon", "empty name"])
async def test_a_header_that_could_smuggle_anything_is_never_sent(header: tuple[bytes, bytes]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with server(script) as (url, connections):
        transport = H1Transport()
        with pytest.raises(httpx.LocalProtocolError):
            await send(transport, request(url, headers=[header]))
        await transport.aclose()
    assert connections == []


async def test_a_body_the_caller_does_not_read_is_not_buffered_past_the_high_water_mark() -> None:
    size = 8 * 1024 * 1024

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    async with server(script) as (url, _):
        transport = H1Transport()
        response = await transport.handle_async_request(request(url))
        await asyncio.sleep(0.3)  # the server writes as fast as it can meanwhile
        total = 0
        async for chunk in response.aiter_raw():
            assert len(chunk) <= HIGH_WATER + 256 * 1024  # paused past the mark: at most one more read
            total += len(chunk)
        await response.aclose()
        await transport.aclose()
    assert total == size


async def test_past_the_connection_limit_a_request_waits_for_a_free_one() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async with server(script) as (url, connections):
        transport = H1Transport(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        held = await transport.handle_async_request(request(url))  # its body not yet read: busy
        with pytest.raises(httpx.PoolTimeout):
            await transport.handle_async_request(request(url, pool=0.05))
        waiting = asyncio.ensure_future(send(transport, request(url)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await held.aread()
        await held.aclose()  # its connection goes back: the waiting request takes it
        assert await waiting == (200, b"ok")
        await transport.aclose()
    assert len(connections) == 1


async def test_bytes_no_request_asked_for_close_the_connection_and_reach_nobody() -> None:
    """A server that answers twice: the extra answer is never handed to the next request."""
    forged = True

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal forged
        if forged:
            forged = False
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
            await writer.drain()
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async with server(script) as (url, connections):
        transport = H1Transport()
        assert await send(transport, request(url)) == (200, b"first")
        await asyncio.sleep(0.3)  # the forged answer arrives while the connection is idle
        assert await send(transport, request(url)) == (200, b"ok")
        await transport.aclose()
    assert len(connections) == 2


@pytest.mark.parametrize(("cert_name", "ok"), [("mcp.test", True), ("other.test", False)])
async def test_https_under_the_egress_transport_verifies_the_name_it_was_pinned_for(
        tmp_path: Path, cert_name: str, ok: bool) -> None:
    """The gateway's stack (`EgressTransport` over `H1Transport`) against a TLS listener: the
    connection goes to the pinned address, sends the name in SNI and Host, and verifies the
    certificate against it (a certificate for another name is refused)."""
    cert, key = _cert(tmp_path, cert_name)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni.append(name)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with (open_listener(tls=server_ctx) as lst,
                egress_client(EgressPolicy(allow_private=("127.0.0.1",)), resolver=fixed_resolver({"mcp.test": ["127.0.0.1"]}),
                              transport_kwargs={"verify": client_ctx, "pool_class": H1Transport}, timeout=10) as http):
        if ok:
            for _ in range(2):
                assert (await http.get(f"https://mcp.test:{lst.port}/mcp")).json() == {"ok": True}
            assert [r["host"] for r in lst.requests] == [f"mcp.test:{lst.port}"] * 2
        else:
            with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
                await http.get(f"https://mcp.test:{lst.port}/mcp")
    assert sni == ["mcp.test"]  # one TLS connection, kept alive for the second request


# ------------------------------------------------- the gateway's raw way: EgressTransport.relay


def gateway_pool(policy: EgressPolicy, audit: list[tuple[str, str, int]] | None = None) -> EgressTransport:
    """The egress transport the gateway relays through (see `Broker.http_for`)."""
    return EgressTransport(policy, on_connect=None if audit is None else lambda h, a, p: audit.append((h, a, p)),
                           resolver=fixed_resolver({"mcp.test": ["127.0.0.1"]}), pool_class=H1Transport)


async def test_relay_sends_what_httpx_would_and_reads_the_answer_without_httpx_objects() -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            seen.append(head + body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Twice: a\r\nx-twice: b\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            await writer.drain()

    audit: list[tuple[str, str, int]] = []
    async with server(script) as (url, firsts):
        port = httpx.URL(url).port
        named = httpx.URL(f"http://mcp.test:{port}/mcp")
        transport = gateway_pool(EgressPolicy("broad_audited", allow_private=("127.0.0.1",)), audit)
        assert transport.relays
        headers = [(b"accept", b"application/json, text/event-stream")]
        for method, body in ((b"POST", b'{"a":1}'), (b"DELETE", None), (b"POST", None)):
            answer = await transport.relay(method, named, headers, body, TIMEOUTS)
            assert answer.status_code == 200 and answer.response is None
            assert answer.header(b"content-type") == "text/event-stream"
            assert answer.header(b"x-twice") == "a, b" and answer.header(b"x-none") is None
            assert answer.headers["x-twice"] == "a, b"  # the httpx view, made when asked for
            assert b"".join([c async for c in answer.aiter_raw()]) == b"hello"
            await answer.aclose()
        await transport.aclose()
    assert len(firsts) == 1  # one connection, reused
    host = f"Host: mcp.test:{port}".encode()
    assert seen == [b"POST /mcp HTTP/1.1\r\n" + host + b"\r\naccept: application/json, text/event-stream\r\n"
                    b"Content-Length: 7\r\n\r\n{\"a\":1}",
                    b"DELETE /mcp HTTP/1.1\r\n" + host + b"\r\naccept: application/json, text/event-stream\r\n\r\n",
                    b"POST /mcp HTTP/1.1\r\n" + host + b"\r\naccept: application/json, text/event-stream\r\n"
                    b"Content-Length: 0\r\n\r\n"]
    assert audit == [("mcp.test", "127.0.0.1", port)] * 3  # each request audited


@pytest.mark.parametrize("policy", [EgressPolicy(), EgressPolicy("off"),
                                    EgressPolicy(allow_private=("127.0.0.1",), deny_hosts=("mcp.test",))])
async def test_relay_keeps_every_egress_refusal(policy: EgressPolicy) -> None:
    """A private address not allowed, no egress at all, a denied host: refused before any connection."""
    transport = gateway_pool(policy)
    with pytest.raises(Forbidden):
        await transport.relay(b"POST", httpx.URL("http://mcp.test:9/mcp"), [], b"{}", TIMEOUTS)
    assert transport._pools == {}
    await transport.aclose()


async def test_relay_a_deadline_bounds_the_wait_for_the_head_and_the_connection_is_not_kept() -> None:
    """The gateway's deadline (its `timeout`), kept by the transport's own waits: a head not here by
    then is a TimeoutError, and the connection it was awaited on never serves another request; the
    wait for a free connection is bounded by it too."""
    answered = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if not answered.is_set():  # the first request: no answer, ever
            answered.set()
            await reader.read()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async with server(script) as (url, firsts):
        named = httpx.URL(f"http://mcp.test:{httpx.URL(url).port}/mcp")
        transport = gateway_pool(EgressPolicy(allow_private=("127.0.0.1",)))
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await transport.relay(b"POST", named, [], b"{}", TIMEOUTS, started + 0.3)
        assert 0.25 <= loop.time() - started < 4.0  # the deadline, not the transport's own 5 s
        answer = await transport.relay(b"POST", named, [], b"{}", TIMEOUTS, loop.time() + 5.0)
        assert answer.status_code == 200 and b"".join([c async for c in answer.aiter_raw()]) == b"ok"
        assert len(firsts) == 2  # the connection that timed out was dropped, not reused
        pool: Any = next(iter(transport._pools.values()))
        pool.max_open = pool.open  # no room for one more: the next request waits for a free one
        started = loop.time()
        with pytest.raises(TimeoutError):
            await transport.relay(b"POST", named, [], b"{}", TIMEOUTS, started + 0.3)
        assert 0.25 <= loop.time() - started < 4.0
        await answer.aclose()
        await transport.aclose()


async def test_relay_a_connect_error_is_httpx_s_and_names_no_address() -> None:
    async with server(lambda r, w: asyncio.sleep(0)) as (url, _):
        port = httpx.URL(url).port
    transport = gateway_pool(EgressPolicy(allow_private=("127.0.0.1",)))
    with pytest.raises(httpx.ConnectError) as caught:
        await transport.relay(b"POST", httpx.URL(f"http://mcp.test:{port}/mcp"), [], b"{}", TIMEOUTS)
    assert isinstance(caught.value, ConnectError) and "127.0.0.1" not in caught.value.reason
    await transport.aclose()


class _Chunks:
    """A `BodyReader` over chunks given in advance (`all_in`: all received, or more to come;
    `ends`: the end arrives once something waits for news)."""

    def __init__(self, chunks: list[bytes], all_in: bool, ends: bool = False) -> None:
        self.chunks = chunks
        self.all_in = all_in
        self.ends = ends
        self.closed = False

    async def news(self, deadline: float) -> None:
        if self.chunks or self.all_in:
            return
        if self.ends:
            self.all_in = True
            return
        await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
        raise TimeoutError

    def at_end(self) -> bool:
        return self.all_in and not self.chunks

    async def read(self, deadline: float | None) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        if self.all_in:
            return b""
        await asyncio.sleep(3600)  # what never comes
        return b""

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("all_in", [True, False])
async def test_an_sse_answer_all_in_is_relayed_whole_else_its_rest_is_left_to_stream(all_in: bool) -> None:
    from types import SimpleNamespace

    from mcpcreds.core.policy import TrustPolicy
    from mcpcreds.gateway.stream import SseBody
    from mcpcreds.protocol.jsonrpc import Inspector

    answer = b'data: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'
    body = _Chunks([answer[:10], answer[10:]], all_in)
    pending = {("n", 1): "tools/call"}
    stream = SseBody(RawAnswer(200, [], body), Inspector(TrustPolicy("trusted"), pending=pending),
                     None, SimpleNamespace(name="s"), 5.0)  # type: ignore[arg-type]
    first = await stream.first()
    assert first == answer and not pending  # the answer checked (and noted), once whole
    assert await stream.rest_if_ended() == (b"" if all_in else None)
    await stream.aclose()
    assert body.closed


@pytest.mark.parametrize(("all_in", "ends", "json"), [(True, False, True), (False, True, True),
                                                      (False, False, False)])
async def test_one_message_then_the_end_is_a_json_answer_never_waited_for_long(all_in: bool, ends: bool,
                                                                                json: bool) -> None:
    """Ended already, or within the grace: the one message; still open: None (relayed as a stream)."""
    from types import SimpleNamespace

    from mcpcreds.core.policy import TrustPolicy
    from mcpcreds.gateway.stream import SseBody
    from mcpcreds.protocol.jsonrpc import Inspector

    message = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    body = _Chunks([b"id: 0\ndata:\n\n" + b"data: " + message + b"\n\n"], all_in, ends)
    stream = SseBody(RawAnswer(200, [], body), Inspector(TrustPolicy("trusted"), pending={("n", 1): "tools/call"}),
                     None, SimpleNamespace(name="s"), 5.0)  # type: ignore[arg-type]
    first = await stream.first()
    whole = await stream.whole(first, await stream.rest_if_ended(), grace=0.05)
    assert whole == (message if json else None)
    await stream.aclose()


# ------------------------------------------------- the rest of an answer its reader left


@pytest.mark.parametrize("rest", [b"6\r\nsecond\r\n0\r\n\r\n",  # its end comes: the connection is kept
                                  b"%x\r\n%b\r\n" % (DRAIN_BYTES + 1, b"x" * (DRAIN_BYTES + 1))],  # too long
                         ids=["its-end-comes", "too-long"])
async def test_an_answer_left_before_its_end_is_dropped_to_its_end_and_its_connection_reused(
        rest: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """(The MCP SDK client closes an SSE answer before its last chunk.) Up to DRAIN_BYTES, what is
    left of it is read and dropped (never seen by the next request); past that, it is closed."""
    left = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await left.wait()
            left.clear()
            writer.write(rest)
            await writer.drain()

    transport = H1Transport()
    kept = asyncio.Event()
    keep = transport._keep

    def keeping(conn: Any) -> None:
        keep(conn)
        kept.set()

    monkeypatch.setattr(transport, "_keep", keeping)
    async with server(script) as (url, firsts):
        response = await transport.handle_async_request(request(url))
        assert await anext(response.aiter_raw()) == b"first"
        await response.aclose()  # its end not come yet
        assert transport.open == 1 and transport.idle_count == 0  # dropping the rest
        left.set()
        await kept.wait()
        drained = rest.endswith(b"0\r\n\r\n")
        assert (transport.idle_count, transport.open) == ((1, 1) if drained else (0, 0))
        response = await transport.handle_async_request(request(url))
        assert await anext(response.aiter_raw()) == b"first"  # nothing of the answer before
        left.set()
        await response.aclose()
        assert len(firsts) == (1 if drained else 2)
    await transport.aclose()


async def test_a_get_left_before_its_end_closes_its_connection_at_once() -> None:
    """A GET's answer (an MCP listening stream) is never drained: the server takes one listening
    stream per session, and the client's next GET must not find the old one still open."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()  # until the client goes

    transport = H1Transport()
    async with server(script) as (url, _):
        get = httpx.Request("GET", url, extensions={"timeout": TIMEOUTS})
        response = await transport.handle_async_request(get)
        assert await anext(response.aiter_raw()) == b"first"
        await response.aclose()
        assert transport.open == 0 and transport.idle_count == 0
    await transport.aclose()
