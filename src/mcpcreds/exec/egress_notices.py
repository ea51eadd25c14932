"""The refusal lines of an exec session: what the egress proxy tells `mcpcreds exec`'s forwarder,
which prints each on `mcpcreds exec`'s stderr (the MCP client's log of the server), so that a
child that fails on a refused host does not fail unexplained.

The forwarder asks for them in its hold request (`Mcpcreds-Notices: 1`); the proxy then writes one
line per notice on the hold connection and the forwarder answers each with an empty line once it
has printed it. The proxy answers the refused connection only after that answer (or
`NOTICE_WAIT`), so the line is on stderr before the child can exit over the refusal.

One line per host and port a session is refused, at most `MAX_HOSTS` of them, then one line saying
there are more; repeats are counted (in the session's `exec_session_end` audit line), never
printed again. The host is the child's: printed with anything outside `SAFE` replaced by `?` and
cut at `MAX_HOST_TEXT` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Final

HEADER: Final = b"mcpcreds-notices"
MAX_HOSTS: Final = 32
MAX_HOST_TEXT: Final = 253  # the longest DNS name
NOTICE_WAIT: Final = 2.0  # the refused connection waits this long at most for the forwarder
SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:[]%*")


def printable(host: str) -> str:
    """The child's host as it may be printed: safe characters only, bounded."""
    text = "".join(c if c in SAFE else "?" for c in host[:MAX_HOST_TEXT]) or "?"
    return text + "..." if len(host) > MAX_HOST_TEXT else text


def destination(host: str, port: object) -> str:
    shown = printable(host)
    if ":" in shown and not shown.startswith("["):  # an IPv6 literal from an absolute URL
        shown = f"[{shown}]"
    return f"{shown}:{port}" if isinstance(port, int) else shown


@dataclass(slots=True, eq=False)
class Notices:
    """One session's refusals as told to its forwarder."""

    holder: asyncio.StreamWriter | None = None  # the hold connection, once it asked for notices
    refused: dict[str, int] = field(default_factory=dict)  # host:port -> refusals
    more: int = 0  # refusals of hosts past MAX_HOSTS
    _waiting: deque[asyncio.Future[None]] = field(default_factory=deque, init=False)

    def line(self, name: str, host: str, port: object, why: str) -> str | None:
        """Count this refusal; the line to print if it is the first of its host and port."""
        where = destination(host, port)
        if where in self.refused:
            self.refused[where] += 1
            return None
        if len(self.refused) >= MAX_HOSTS:
            self.more += 1
            if self.more > 1:
                return None
            return (f"{name}: refused egress to more hosts than {MAX_HOSTS}; the sidecar's audit log "
                    f"has each (exec_egress)")
        self.refused[where] = 1
        return f"{name}: refused egress to {where} ({why})"

    async def tell(self, name: str, host: str, port: object, why: str) -> None:
        """Count the refusal; a first one is sent to the forwarder, and waited for until it
        answers that the line is printed (NOTICE_WAIT at most)."""
        text = self.line(name, host, port, why)
        holder = self.holder
        if text is None or holder is None or holder.is_closing():
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        holder.write(text.encode("ascii", "replace") + b"\n")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(NOTICE_WAIT):
                await done

    def answered(self, data: bytes) -> None:
        """What the forwarder sent on the hold connection: each newline answers one notice."""
        for _ in range(data.count(b"\n")):
            if not self._waiting:
                return
            done = self._waiting.popleft()
            if not done.done():
                done.set_result(None)

    def release(self) -> None:
        """The hold connection is gone: nobody will answer."""
        self.holder = None
        while self._waiting:
            done = self._waiting.popleft()
            if not done.done():
                done.set_result(None)

    def audit_fields(self) -> dict[str, object]:
        if not self.refused:
            return {}
        return {"refused": dict(self.refused), **({"refused_more": self.more} if self.more else {})}
