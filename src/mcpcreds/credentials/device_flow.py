"""The device authorization grant (RFC 8628), pure: the device authorization answer, and the
poll schedule (interval, `slow_down` adds 5 s, `authorization_pending` waits, expiry ends it).
The I/O (requests, sleeping, printing) is in login_flow.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from ..errors import TokenEndpointError
from .oauth import oauth_error as oauth_error

DEFAULT_INTERVAL: Final = 5.0  # RFC 8628 §3.2: when the server names none
MIN_INTERVAL: Final = 1.0
MAX_INTERVAL: Final = 60.0
SLOW_DOWN_STEP: Final = 5.0  # RFC 8628 §3.5
MAX_EXPIRES_IN: Final = 3600.0
DEFAULT_EXPIRES_IN: Final = 600.0
MAX_CODE_CHARS: Final = 1024
MAX_URI_CHARS: Final = 2048
DEVICE_GRANT: Final = "urn:ietf:params:oauth:grant-type:device_code"


@dataclass(frozen=True, slots=True)
class DeviceAuthorization:
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: float
    interval: float

    def __repr__(self) -> str:  # the device code is a credential until it is redeemed
        return f"DeviceAuthorization(user_code={self.user_code!r}, expires_in={self.expires_in})"


def _seconds(value: Any, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenEndpointError("device authorization answer has a non-numeric expires_in or interval",
                                 "invalid_response")
    try:
        seconds = float(value)
    except OverflowError:
        return high
    if not math.isfinite(seconds) or seconds <= 0:
        raise TokenEndpointError("device authorization answer has an invalid expires_in or interval",
                                 "invalid_response")
    return min(max(seconds, low), high)


def _visible(value: Any, limit: int) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= limit and value.isascii()
            and value.isprintable() and " " not in value)


def parse_device_authorization(status: int, body: bytes) -> DeviceAuthorization:
    """The answer of the device authorization endpoint (RFC 8628 §3.2). Never quotes the body."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if status != 200:
        raise oauth_error(status, data)
    if not isinstance(data, dict):
        raise TokenEndpointError("device authorization answer is not a JSON object", "invalid_response")
    device_code, user_code = data.get("device_code"), data.get("user_code")
    uri, complete = data.get("verification_uri"), data.get("verification_uri_complete")
    if not (_visible(device_code, MAX_CODE_CHARS) and _visible(user_code, 64)
            and _visible(uri, MAX_URI_CHARS)):
        raise TokenEndpointError("device authorization answer lacks a usable device_code, user_code or "
                                 "verification_uri", "invalid_response")
    if not (isinstance(uri, str) and uri.startswith(("https://", "http://"))):
        raise TokenEndpointError("device authorization answer has a verification_uri that is not a "
                                 "web address", "invalid_response")
    if not (_visible(complete, MAX_URI_CHARS) and isinstance(complete, str)
            and complete.startswith(("https://", "http://"))):
        complete = None
    return DeviceAuthorization(
        device_code=str(device_code), user_code=str(user_code), verification_uri=uri,
        verification_uri_complete=complete,
        expires_in=_seconds(data.get("expires_in"), DEFAULT_EXPIRES_IN, 1.0, MAX_EXPIRES_IN),
        interval=_seconds(data.get("interval"), DEFAULT_INTERVAL, MIN_INTERVAL, MAX_INTERVAL))


class PollSchedule:
    """When to poll the token endpoint, and what an answer means (RFC 8628 §3.4, §3.5).

    `first()` is the time of the first poll; after each answer, `after(error, now)` is the time
    of the next poll, or raises TokenEndpointError when the login is over (expired, denied, or
    another error). A `slow_down` adds 5 s to the interval for good. No poll is scheduled past
    the device code's expiry: that is `expired_token`."""

    def __init__(self, started: float, auth: DeviceAuthorization) -> None:
        self.interval = auth.interval
        self.deadline = started + auth.expires_in
        self.started = started

    def first(self) -> float:
        return self._next(self.started)

    def _next(self, now: float) -> float:
        at = now + self.interval
        if at > self.deadline:
            raise TokenEndpointError("the device code expired before the login was approved; run the "
                                     "login again", "expired_token")
        return at

    def after(self, error: str, now: float) -> float:
        if error in ("authorization_pending", "temporarily_unavailable", "server_error"):
            return self._next(now)  # or a passing outage of the server (or the way there): poll on
        if error == "slow_down":
            self.interval = min(self.interval + SLOW_DOWN_STEP, MAX_INTERVAL + SLOW_DOWN_STEP * 12)
            return self._next(now)
        if error == "expired_token":
            raise TokenEndpointError("the device code expired before the login was approved; run the "
                                     "login again", "expired_token")
        if error == "access_denied":
            raise TokenEndpointError("the login was denied at the authorization server", "access_denied")
        raise TokenEndpointError(f"the device login failed ({error})", error)
