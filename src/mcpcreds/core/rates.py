"""The `rate:` grammar and durations (pure), and the seconds of a Retry-After header."""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time
from dataclasses import dataclass
from typing import Final

_UNIT_SECONDS: Final = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_BARE_UNITS: Final = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0,
                      "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_NUMBER: Final = re.compile(r"(\d+(?:\.\d+)?)\Z")
_SECONDS: Final = re.compile(r"(\d+(?:\.\d+)?)(s|sec)\Z")
_WHOLE_WITH_UNIT: Final = re.compile(r"(\d+)(ms|s|sec|m|min|h|d|w)\Z")
_RATE: Final = re.compile(r"\s*(\d+)\s*/\s*(\S+)\s*\Z")
MAX_BURST: Final = 1_000_000_000
MIN_PERIOD: Final = 0.001
MAX_SECONDS: Final = 366 * 86400.0  # a year: the longest period or duration anything here needs
DEFAULT_RETRY_AFTER: Final = 1.0
MAX_RETRY_AFTER: Final = 3600.0  # within the 0 to 86400 the sidecar's backoff route takes
# RFC 9110 delay-seconds are digits; a sign and a fraction are tolerated (a negative is 0)
_DELTA_SECONDS: Final = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Rate:
    """A bucket of `burst` permits, refilled at `burst / per` permits a second."""

    burst: int
    per: float

    @property
    def per_second(self) -> float:
        return self.burst / self.per

    def __str__(self) -> str:
        return f"{self.burst}/{_format_seconds(self.per)}"


def _format_seconds(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if seconds < 1 and (seconds * 1000).is_integer():
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


def parse_period(text: str) -> float | None:
    """Seconds for a `per` string, or None if it is not one."""
    t = text.strip().lower()
    if m := _NUMBER.match(t):
        return float(m.group(1))
    if m := _SECONDS.match(t):
        return float(m.group(1))
    if m := _WHOLE_WITH_UNIT.match(t):
        return int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return _BARE_UNITS.get(t)


def parse_rate(text: str) -> Rate:
    """Parse `"<burst>/<per>"`; raise ValueError quoting the string otherwise."""
    m = _RATE.match(text) if isinstance(text, str) and len(text) <= 64 else None
    if m is None:
        raise ValueError("invalid rate: expected '<burst>/<per>', e.g. '60/1m' or '5/1s'")
    burst = int(m.group(1)) if len(m.group(1)) <= 10 else MAX_BURST + 1
    per = parse_period(m.group(2))
    if per is None:
        raise ValueError(
            "invalid rate: period must be seconds ('1', '0.5s') "
            "or a whole number with ms|s|m|h|d|w ('500ms', '1m')"
        )
    if burst <= 0 or per <= 0:
        raise ValueError("invalid rate: burst and period must be greater than zero")
    if burst > MAX_BURST or not MIN_PERIOD <= per <= MAX_SECONDS:
        raise ValueError(f"invalid rate: burst at most {MAX_BURST}, period from 1ms to 366d")
    return Rate(burst, per)


def parse_duration(value: str | int | float) -> float:
    """Seconds for a duration like `60s`, `5m`, `1.5s` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError("invalid duration: expected e.g. '60s', '5m', '1h' or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        parsed = parse_period(value) if isinstance(value, str) and len(value) <= 32 else None
        if parsed is None:
            raise ValueError("invalid duration: expected e.g. '60s', '5m', '1h'")
        seconds = parsed
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise ValueError("invalid duration: must be a finite number of seconds from 0 to 366 days")
    return seconds


def parse_retry_after(value: str | None, now: float | None = None) -> float:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), from 0 to
    MAX_RETRY_AFTER; DEFAULT_RETRY_AFTER if absent or neither form (`nan`, `inf`, `1_0`, a bad date).

    The value comes from an upstream: whatever it is, the answer is a number the sidecar's
    backoff route accepts, so a 429 is never turned into an error.
    """
    if not value:
        return DEFAULT_RETRY_AFTER
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)  # digits: never nan; too many of them is inf, clamped below
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
            if when.tzinfo is None:  # "-0000": UTC, not the local time
                when = when.replace(tzinfo=datetime.UTC)
            seconds = when.timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError, OverflowError, OSError):
            return DEFAULT_RETRY_AFTER
    return min(max(0.0, seconds), MAX_RETRY_AFTER)
