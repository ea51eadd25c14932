"""The tool pins as the gateway reads and writes them while it relays: a `tools/list` answer is
judged against the server's pins read just before it (`judge`); the first definitions and the
changes it finds are written as it passes, and every later read of that server's pins (the next
listing, a call's check) waits for those writes first (`written`). So a call sent the moment a
listing withheld a changed tool is refused even while that change is still being written (a slow
store, a busy machine). What a listing's decision is, is protocol/pins.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..core.logs import get_logger
from ..protocol import pins
from ..state.pins import PinStore

_log = get_logger("gateway")

Judge = Callable[[list[Any]], list[Any]]  # a listing's tools -> the tools to pass on


class PinWrites:
    def __init__(self, store: Callable[[], PinStore], on_change: Callable[[str], None]) -> None:
        self._store = store  # the broker's of now
        self._on_change = on_change  # a server with a tool found changed (its listings are stale)
        self._writes: dict[str, set[asyncio.Task[None]]] = {}  # server -> its pins being written

    @property
    def busy(self) -> bool:
        """Whether some server's pins are being written."""
        return bool(self._writes)

    async def judge(self, server: str, enforce: bool) -> Judge:
        """The pins' judgement of a listing of `server` (the pins read now, after the writes of
        the listing before; the first definitions and the changes written as this one passes)."""
        store = self._store()
        await self.written(server)
        view = await store.view(server)

        def judge(tools: list[Any]) -> list[Any]:
            decision = pins.decide(view, tools, enforce)
            for warning in decision.warnings:
                _log.warning("tool pins", extra={"server": server, "warning": warning})
            if decision.changed:
                self._on_change(server)
            if decision.writes:
                task = asyncio.get_running_loop().create_task(
                    store.record(server, decision.pin, decision.changed, decision.cleared))
                self._writes.setdefault(server, set()).add(task)
                task.add_done_callback(lambda done: self._done(server, done))
            return decision.tools
        return judge

    async def written(self, server: str) -> None:
        """Once the pins a listing of `server` found are written: they are read as written, never
        as they were before."""
        writing = self._writes.get(server)
        if writing:
            await asyncio.wait(list(writing))

    def _done(self, server: str, task: asyncio.Task[None]) -> None:
        writing = self._writes.get(server, set())
        writing.discard(task)
        if not writing:
            self._writes.pop(server, None)
