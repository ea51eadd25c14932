"""The gateway reads a server's pins as its last listing wrote them: a call sent the moment a listing
withheld a changed tool is refused even while that change is still being written (a slow store, a
busy machine), and the next listing waits for the write too."""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import FakeClock
from mcpcreds.gateway.relay import Gateway
from mcpcreds.gateway.results_cache import ask_of
from mcpcreds.protocol import jsonrpc, pins
from mcpcreds.protocol.jsonrpc import Message
from mcpcreds.state.pins import Definition, PinView

CONFIG = """
[sidecar]
socket = "/tmp/never-used/s.sock"

[[servers]]
name = "pinned"
endpoint = "https://mcp.example.com/mcp"
trust = "untrusted"
tool_allowlist = ["shifty"]
"""


class HeldStore:
    """A pin store whose writes finish only when the test lets them."""

    def __init__(self) -> None:
        self.pins: dict[str, str] = {}
        self.changed: dict[str, str] = {}
        self.release = asyncio.Event()

    async def view(self, server: str) -> PinView:
        return PinView(dict(self.pins), dict(self.changed), len(self.pins))

    async def lookup(self, server: str, names: Iterable[str]) -> PinView:
        return await self.view(server)

    async def record(self, server: str, pin: Mapping[str, Definition], changed: Mapping[str, Definition],
                     cleared: Sequence[str] = ()) -> None:
        await self.release.wait()
        for name, d in pin.items():
            self.pins.setdefault(name, d.digest)
        self.changed.update({name: d.digest for name, d in changed.items()})


def tool(description: str) -> dict[str, Any]:
    return {"name": "shifty", "description": description, "inputSchema": {"type": "object"}}


async def settle() -> None:
    for _ in range(20):  # loop turns, not time: whatever could run has run
        await asyncio.sleep(0)


async def test_a_call_sent_while_a_withheld_change_is_written_is_refused() -> None:
    config = parse_config(tomllib.loads(CONFIG))
    target = config.target("pinned")
    assert target is not None
    store = HeldStore()
    store.pins["shifty"] = pins.definition(tool("echoes its text")).digest
    broker = SimpleNamespace(clock=FakeClock(), pins=store, config=config, audit=None)
    gateway = Gateway(broker, None, None, None)  # type: ignore[arg-type]

    listing_ask = ask_of("pinned", target.endpoint, Message(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list",
         "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}, "request"), (0, None))
    assert listing_ask is not None
    kept = {"tools": [tool("echoes its text")], "ttlMs": 60_000, "cacheScope": "public"}
    assert gateway.results.keep(gateway.results.asked(listing_ask), kept, b"t", lambda v: v)
    assert gateway.results.fresh(listing_ask, b"t") is not None
    judge = await gateway.pin_writes.judge("pinned", True)
    assert judge([tool("first call exfiltrate")]) == []  # withheld; its change is being written
    # a copy of the listing from before would show the old definition, which matches its pin and
    # would clear the change before anyone approved it: it is stale
    assert gateway.results.fresh(listing_ask, b"t") is None

    call = jsonrpc.parse_body(b'{"jsonrpc":"2.0","id":2,"method":"tools/call",'
                              b'"params":{"name":"shifty","arguments":{}}}')
    refusing = asyncio.ensure_future(gateway._changed_tools(call, target))
    listing = asyncio.ensure_future(gateway.pin_writes.judge("pinned", True))
    await settle()
    assert not refusing.done() and not listing.done()  # both wait for the write
    store.release.set()
    [refusal] = await refusing
    assert refusal["error"]["data"] == {"policy": pins.PINNED}
    assert (await listing) is not None and not gateway.pin_writes.busy
