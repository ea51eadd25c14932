"""systemd's readiness protocol (sd_notify(3)), spoken directly: one datagram per message.

`NOTIFY_SOCKET` names a Unix datagram socket (a path, or `@name` in the abstract namespace);
each message is newline-separated `KEY=VALUE` lines. Without `NOTIFY_SOCKET` (not started by
systemd, or not `Type=notify`) every call is a no-op. The variables are taken out of the
environment when read, as `sd_notify(unset_environment=1)` does, so a process the sidecar starts
never notifies in its name.

The `sdnotify` package is not used: its last release is from 2017, it swallows every error,
has no watchdog or MONOTONIC_USEC helpers, and the protocol is one `sendto` per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

NOTIFY_ENV: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV: Final = "WATCHDOG_USEC"
WATCHDOG_PID_ENV: Final = "WATCHDOG_PID"
MAX_STATUS: Final = 400  # systemctl shows one line; keep a STATUS= short
STATUS_EVERY: Final = 10.0  # seconds between STATUS= refreshes (sent only when changed)


def _address(raw: str) -> str | None:
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]  # the abstract namespace
    if raw.startswith("/"):
        return raw
    return None  # vsock: and relative paths are not supported; notify nothing


def _watchdog_usec(env: MutableMapping[str, str]) -> int | None:
    raw = env.pop(WATCHDOG_USEC_ENV, "").strip()
    pid = env.pop(WATCHDOG_PID_ENV, "").strip()
    if not raw.isdigit() or int(raw) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None  # meant for another process (our parent, say)
    return int(raw)


class Notifier:
    """Sends sd_notify messages to the service manager, if there is one. Never raises: the
    sidecar serves whether or not systemd hears it."""

    def __init__(self, env: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = _address(env.pop(NOTIFY_ENV, ""))
        self.watchdog_usec = _watchdog_usec(env)
        self._sock: socket.socket | None = None
        self._last_status = ""

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half the timeout, as sd_watchdog_enabled(3) advises)."""
        if self.watchdog_usec is None or not self.enabled:
            return None
        return self.watchdog_usec / 2_000_000

    def send(self, *lines: str) -> bool:
        if self.address is None:
            return False
        message = "\n".join(lines).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)  # the manager reads at once; never stall the loop
            self._sock.sendto(message, self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *self._status_lines(status))

    def reloading(self) -> bool:
        # MONOTONIC_USEC: CLOCK_MONOTONIC when the reload began (systemd >= 253 requires it)
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={now}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping: draining requests")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """STATUS=text, sent only when it changed."""
        lines = self._status_lines(text)
        return self.send(*lines) if lines else False

    def _status_lines(self, text: str) -> list[str]:
        text = " ".join(text.split())[:MAX_STATUS]
        if not text or text == self._last_status:
            return []
        self._last_status = text
        return [f"STATUS={text}"]

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def status_text(servers: int, logins: list[dict[str, Any]], buckets: list[dict[str, Any]]) -> str:
    """The STATUS= line: what `systemctl status mcpcreds` shows (counts only, never a key or a
    secret)."""
    held = sum(1 for row in logins if row.get("fingerprint") is not None)
    failing = sum(1 for row in logins if row.get("state") in ("failing", "stale") and row.get("last_error"))
    waiting = sum(int(row.get("waiting") or 0) for row in buckets)
    paused = sum(1 for row in buckets if row.get("paused_until") is not None)
    text = f"serving {servers} server{_s(servers)}; {held} login{_s(held)} held"
    if failing:
        text += f" ({failing} failing)"
    text += f"; {len(buckets)} bucket{_s(len(buckets))}"
    if waiting or paused:
        text += f" ({waiting} waiting, {paused} paused)"
    return text


async def keepalive(notifier: Notifier, status: Callable[[], Awaitable[str]],
                    status_every: float = STATUS_EVERY) -> None:
    """WATCHDOG=1 at half of WATCHDOG_USEC (while the event loop runs: a stuck loop stops the
    pings and systemd restarts the service), and a fresh STATUS= when it changed."""
    interval = notifier.watchdog_interval
    every = min(interval, status_every) if interval is not None else status_every
    next_status = 0.0
    loop = asyncio.get_running_loop()
    while True:
        if interval is not None:
            notifier.watchdog()
        if loop.time() >= next_status:
            next_status = loop.time() + status_every
            with contextlib.suppress(Exception):  # a status is never worth stopping the pings for
                notifier.status(await status())
        await asyncio.sleep(every)
