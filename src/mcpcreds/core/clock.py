"""One clock for everything that reads time, so tests can move it."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (for expires_at on the wire)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (for deadlines, buckets and backoff)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._wall = start
        self._mono = 1000.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds


SYSTEM_CLOCK = SystemClock()
