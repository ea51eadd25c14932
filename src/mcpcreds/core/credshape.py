"""Does a literal in the config look like a credential? (pure)

A config is shared, committed and shown (`spawn-payload`, `GET /v1/servers`): a credential written
into it leaks wherever it goes. These checks refuse the literal values that look like one, by the
name they are given (a header or query parameter) or by their shape (an auth scheme, a well-known
token prefix, a JWT, a long high-entropy run). A header meant to carry a public literal that looks
like a credential is named in `literal_headers`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Final

_NAME_EXACT: Final = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie", "api-key", "apikey", "x-api-key",
    "token", "password", "passwd", "pwd", "secret", "auth", "x-auth", "key", "sig", "signature",
    "code", "session", "sessionid", "session_id", "jwt", "bearer", "credentials", "credential",
})
_NAME_PARTS: Final = ("auth", "token", "secret", "password", "passwd", "cookie", "credential", "apikey",
                      "api-key", "api_key", "signature", "session")
_NAME_SUFFIXES: Final = ("-key", "_key", ".key", "-sig", "_sig")
_SCHEMES: Final = re.compile(r"\s*(bearer|basic|digest|token|negotiate|aws4-hmac-sha256|dpop)\s+\S",
                             re.IGNORECASE)
# prefixes of tokens issued by widely used services (GitHub, Slack, OpenAI, Stripe, AWS, Google, ...)
_PREFIXES: Final = re.compile(
    r"(ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|xox[abposr]-|sk-|sk_live_|sk_test_|rk_live_|"
    r"pk_live_|AKIA|ASIA|AIza|ya29\.|npm_|pypi-|hf_|dop_v1_|shpat_|SG\.|xapp-|figd_|lin_api_)",
)
_JWT: Final = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")
_RUN: Final = re.compile(r"[A-Za-z0-9+/=_\-.~]{24,}")
_MIN_ENTROPY: Final = 3.5  # bits a character; English words and slugs sit well below, random keys above


def credential_name(name: str) -> bool:
    """A header or query-parameter name whose value is a credential."""
    lowered = name.strip().lower()
    return (lowered in _NAME_EXACT or lowered.endswith(_NAME_SUFFIXES)
            or any(part in lowered for part in _NAME_PARTS))


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _random_looking(run: str) -> bool:
    classes = sum((any(c.isdigit() for c in run), any(c.islower() for c in run),
                   any(c.isupper() for c in run)))
    return classes >= 2 and _entropy(run) >= _MIN_ENTROPY


def credential_value(value: str) -> str | None:
    """Why `value` looks like a credential (never quoting it), or None."""
    if _SCHEMES.match(value):
        return "it starts with an HTTP auth scheme"
    if _JWT.search(value):
        return "it contains a JWT"
    for match in _PREFIXES.finditer(value):
        start = match.start()
        if (start == 0 or not value[start - 1].isalnum()) and len(value) - match.end() >= 8:
            return "it starts like a well-known token"
    if any(_random_looking(run) for run in _RUN.findall(value)):
        return "it contains a long random-looking string"
    return None
