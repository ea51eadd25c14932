"""What the gateway follows while an answer is relayed: the `tools/call` requests of a POST, each
audited once when its fate is known (`ToolCalls`), and an upstream SSE answer relayed event by
event, each event checked and written anew, the wait for the next one bounded (`SseBody`); a JSON
answer read whole, bounded (`read_whole`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import httpx

from ..broker.broker import Actor
from ..config.model import Target
from ..core.http import MAX_GATEWAY_BODY_BYTES, Request
from ..core.logs import get_logger
from ..errors import UpstreamError, UpstreamTimeout
from ..net.egress_http import RawAnswer
from ..protocol import jsonrpc
from ..protocol.sse import EventTooLarge, SseSplitter
from . import records

_log = get_logger("gateway")

MAX_SSE_EVENT: Final = MAX_GATEWAY_BODY_BYTES  # one SSE event (the MCP SDK client takes 1 MiB)
# once a POST's requests are all answered, how long its SSE answer may take to end and still go out
# as one JSON body; a server that keeps the stream open longer has it relayed as a stream
END_GRACE: Final = 0.05
ToolCallDone = Callable[[Target, str, Actor, str, float], None]  # target, tool, actor, status, seconds


class ToolCalls:
    """The `tools/call` requests of one POST, each audited once when its fate is known."""

    def __init__(self, done: ToolCallDone, target: Target, request: Request,
                 calls: dict[jsonrpc.IdKey, str]) -> None:
        self.done = done
        self.target = target
        self.actor = Actor(request.peer_uid, request.peer_pid, request.grant.id if request.grant else None,
                           request.trace_id)
        self.started = time.perf_counter()
        self.calls = calls

    def answered(self, key: jsonrpc.IdKey, method: str, status: str) -> None:
        tool = self.calls.pop(key, None)
        if tool is not None:
            seconds = time.perf_counter() - self.started
            self.done(self.target, tool, self.actor, status, seconds)

    def finish_all(self, status: str) -> None:
        for key in list(self.calls):
            self.answered(key, jsonrpc.TOOLS_CALL, status)


class SseBody:
    """An upstream SSE answer, relayed event by event (see `wire.ResponseBody`)."""

    def __init__(self, response: RawAnswer, inspector: jsonrpc.Inspector, calls: ToolCalls | None,
                 target: Target, gap: float | None, outbox: list[bytes] | None = None,
                 given_up: Callable[[dict[jsonrpc.IdKey, str]], None] | None = None) -> None:
        self.response = response
        self.given_up = given_up  # told the requests still waiting when the gap runs out (to cancel them)
        self.outbox = outbox if outbox is not None else []  # the gateway's own events, sent with the next
        self.gap = gap  # the longest wait for the next event (None: a listening stream, never cut)
        self.inspector = inspector
        self.calls = calls
        self.target = target
        self.gen: AsyncIterator[bytes] | None = None
        self.end = "cancelled"  # what befalls the calls still unanswered when the body is closed
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self.gen is None:
            self.gen = self._events()
        return self.gen

    async def whole(self, first: bytes, rest: bytes | None, grace: float = END_GRACE) -> bytes | None:
        """The one JSON-RPC message of an answer whose first events answered every request of the
        POST, when the upstream's stream then ended (`rest`: what came after `first`, see
        `rest_if_ended`) or ends within `grace`: it goes out as an application/json body, which a
        client reads to its end and so keeps its connection (the MCP SDK client leaves an SSE
        answer before its last chunk, and opens a new connection for its next request). None: the
        answer is relayed as a stream, `first` then what follows (nothing of it read here)."""
        if rest is not None:
            return single_message(first + rest)
        data = single_message(first)
        if data is None or self.outbox:
            return None
        try:
            await self.response.news(asyncio.get_running_loop().time() + grace)
        except TimeoutError:
            return None
        return data if self.response.at_end() else None

    async def first(self) -> bytes:
        """The first events, once the upstream sent them (b"" if it ended first): they go out with
        the head of the answer. Later events are relayed as they come (see `__aiter__`)."""
        return await anext(aiter(self), b"")

    async def rest_if_ended(self) -> bytes | None:
        """After `first`: the rest of the answer when the upstream's all came already (read with
        no wait: it goes out with the head and the first events, and the end), else None."""
        if not self.response.at_end():
            return None
        return b"".join([chunk async for chunk in self])

    async def _events(self) -> AsyncIterator[bytes]:
        splitter = SseSplitter(MAX_SSE_EVENT)
        inspector = self.inspector
        response = self.response  # its bytes never decoded: see `_send`
        loop = asyncio.get_running_loop()
        deadline = None if self.gap is None else loop.time() + self.gap
        try:
            while True:
                chunk = await response.next_chunk(deadline)  # each event (a progress one too) resets it
                if not chunk:
                    break
                events = splitter.feed(chunk)
                if events:
                    if self.gap is not None:
                        deadline = loop.time() + self.gap
                    out = b"".join([inspector.event(event) for event in events])
                    if self.outbox:
                        out = b"".join(self.outbox) + out
                        self.outbox.clear()
                    if out:
                        yield out
            self.end = "no_response"
        except TimeoutError:  # the server went quiet for longer than `timeout`: its request is cancelled
            self.end = "upstream_timeout"
            records.timed_out(self.target.name, self.gap, "no SSE event")
            await response.aclose()  # at once, not once the client has read the error
            if self.given_up is not None and inspector.pending:
                self.given_up(dict(inspector.pending))
            if inspector.pending:
                yield self._void(f"no event from the MCP server within {self.gap:g} s (its timeout)",
                                 "upstream_timeout")
        except httpx.HTTPError as exc:  # the upstream dropped mid-stream
            self.end = "dropped"
            records.failed(self.target.name, "cut", f"stream cut ({type(exc).__name__})")
        except EventTooLarge:
            self.end = "dropped"
            records.failed(self.target.name, "refused_answer",
                           f"an SSE event larger than {MAX_SSE_EVENT} bytes: stream ended")
        if inspector.dropped:
            _log.warning("upstream SSE events withheld: not JSON-RPC read one way only",
                         extra={"server": self.target.name, "events": inspector.dropped})
            if inspector.pending:  # what waits for an answer that was withheld gets an error instead
                yield self._void("an event not JSON-RPC read one way only", "withheld")
        if self.calls is not None:  # before the client sees the end of the stream
            self.calls.finish_all(self.end)

    def _void(self, what: str, status: str) -> bytes:
        """An SSE event of errors for the requests still waiting, each audited with `status`."""
        pending = self.inspector.pending
        answer = jsonrpc.withheld_answer(pending, what, "upstream_timeout" if status == "upstream_timeout"
                                         else "upstream_error")
        for key, method in list(pending.items()):
            if self.calls is not None:
                self.calls.answered(key, method, status)
        pending.clear()
        return b"data: " + jsonrpc.dumps(answer) + b"\n\n"

    async def aclose(self) -> None:
        self.closed = True
        try:
            if self.gen is not None:
                await self.gen.aclose()  # type: ignore[attr-defined]
        finally:
            await self.response.aclose()
            if self.calls is not None:
                self.calls.finish_all(self.end)


def single_message(events: bytes) -> bytes | None:
    """The data of the one message in `events` (SSE events as the gateway writes them: one `data`
    line each, see `sse.SseEvent.write`), None when there are several or none; events without data
    (keep-alives, resumption ids) do not count."""
    found = None
    for line in events.split(b"\n"):
        if line.startswith(b"data: "):
            if found is not None:
                return None
            found = line[6:]
    return found


async def read_whole(response: RawAnswer, limit: int, timeout: float, server: str) -> bytes:
    """A JSON (or other non-SSE) answer read whole, at most `limit` bytes within `timeout`."""
    if response.is_stream_consumed:  # a signer read a refusal already (bounded; identity: see `_send`)
        return response.content
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in response.aiter_raw():  # never decoded: a compressed answer is refused
                size += len(chunk)
                if size > limit:
                    records.failed(server, "refused_answer", f"an answer larger than {limit} bytes")
                    raise UpstreamError(f"the MCP server's answer exceeds {limit} bytes")
                parts.append(chunk)
    except (httpx.TimeoutException, TimeoutError):
        records.timed_out(server, timeout, "reading the answer")
        raise UpstreamTimeout(f"the MCP server did not finish its answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        records.failed(server, "cut", f"answer cut ({type(exc).__name__})")
        raise UpstreamError(f"the MCP server's answer was cut ({type(exc).__name__})") from None
    return b"".join(parts)
