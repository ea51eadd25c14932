"""A login's token and when to renew it: pure, and light to import (the token request itself,
with httpx and authlib, is oauth.py's). The broker, the login cache and the shared state hold
tokens without sending any request, so a sidecar without a login imports neither."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

MIN_LIFETIME: Final = 1.0  # a token that expires sooner is refused (RFC 6749 counts whole seconds)
REFRESH_JITTER: Final = 0.1  # of the refresh-ahead window
REFRESH_LEAD: Final = 0.05  # renew at least this long before a token stops being handed out


@dataclass(frozen=True, slots=True)
class Token:
    """A login. `access_token` is registered with the redactor when parsed."""

    access_token: str
    token_type: str
    obtained_at: float
    expires_at: float
    scope: str | None
    fingerprint: str

    @property
    def lifetime(self) -> float:
        return self.expires_at - self.obtained_at

    def __repr__(self) -> str:
        return f"Token(fingerprint={self.fingerprint!r}, expires_at={self.expires_at})"


def refresh_at(token: Token, refresh_ahead: float, jitter: float) -> float:
    """When to renew: `refresh_ahead` before expiry, capped at half the lifetime, moved earlier
    by `jitter` (a fraction in [0, 1) of REFRESH_JITTER of that window) so logins spread out, and
    never later than just before the token stops being handed out (so callers never wait)."""
    ahead = min(refresh_ahead, token.lifetime / 2)
    return min(token.expires_at - ahead * (1 + REFRESH_JITTER * jitter), usable_until(token) - REFRESH_LEAD)


def usable_until(token: Token) -> float:
    """Stop handing a token out a little before it expires (2 % of its life, 0.1 s to 2 s), so
    none arrives at the resource expired."""
    return token.expires_at - min(2.0, max(0.1, token.lifetime * 0.02))


def backoff_delay(failures: int, rng: random.Random | None = None,
                  base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential backoff with full jitter, after `failures` consecutive failures (>= 1)."""
    ceiling = min(cap, base * 2 ** (failures - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)
