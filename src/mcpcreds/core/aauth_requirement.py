"""What an AAuth resource's answer asks of the agent (pure, no I/O; the gateway and `creds.auth()`
both use it).

- `AAuth-Access` (draft-hardt-oauth-aauth-protocol, "AAuth-Access Response Header"): a session
  token the resource gives the agent, presented back as `Authorization: AAuth <token>` with
  `authorization` covered by the signature. It is a `token68` (RFC 9110 11.2): an empty value,
  one with whitespace or control characters, or an answer carrying more than one is refused.
- `AAuth-Requirement` on a 401: what the resource wants that the signature alone did not give
  (`agent-token`, `person-token`, `auth-token`, `interaction`, `approval`, `claims`). mcpcreds
  signs with its agent key and presents session tokens; it does not run the Person Server
  exchanges, so such a 401 becomes an error naming what is missing. Only a requirement value
  from the draft's list is ever named: the resource's own text is never echoed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar, Final

from ..errors import McpcredsError

MAX_ACCESS_TOKEN: Final = 16384
_TOKEN68: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*\Z")
_REQUIREMENT: Final = re.compile(r"\s*requirement\s*=\s*\"?([a-z][a-z0-9-]{0,31})\b")

_MISSING: Final = {
    "agent-token": "an AAuth agent token (requirement=agent-token): configure [aauth] provider, an Agent "
                   "Provider that issues one; without it requests carry a bare key (hwk)",
    "person-token": "a person token from the agent's Person Server (requirement=person-token), which "
                    "mcpcreds does not obtain",
    "auth-token": "an auth token from the agent's Person Server, exchanged for the resource token of the "
                  "challenge (requirement=auth-token), which mcpcreds does not obtain",
    "interaction": "a person's interaction at the resource (requirement=interaction), which mcpcreds does "
                   "not relay",
    "approval": "an approval the resource is waiting for (requirement=approval)",
    "claims": "identity claims from the agent's Person Server (requirement=claims), which mcpcreds does "
              "not obtain",
}


class AAuthRequirementError(McpcredsError):
    """A signed server refused the request for something the sidecar cannot obtain."""

    code: ClassVar[str] = "aauth_requirement"
    status: ClassVar[int] = 401


def access_token(headers: Iterable[tuple[str, str]]) -> str | None:
    """The session token of an answer's `AAuth-Access` header, if exactly one valid one is there."""
    given = [v.strip(" \t") for k, v in headers if k.lower() == "aauth-access"]
    if len(given) != 1 or len(given[0]) > MAX_ACCESS_TOKEN or not _TOKEN68.match(given[0]):
        return None
    return given[0]


def requirement(headers: Iterable[tuple[str, str]]) -> str | None:
    """The requirement a 401 names (`AAuth-Requirement`, else `WWW-Authenticate: AAuth ...`):
    one of the draft's values, `"other"` for one it does not define, None when there is none."""
    lines = list(headers)
    asked = [v for k, v in lines if k.lower() == "aauth-requirement"]
    asked += [v[5:] for k, v in lines if k.lower() == "www-authenticate" and v[:5].lower() == "aauth"
              and "requirement" in v.lower()]  # a bare `AAuth` challenge (a signature error) asks nothing
    if not asked:
        return None
    found = _REQUIREMENT.match(asked[0][:256])
    value = found.group(1) if found else None
    return value if value in _MISSING else "other"


def describe(server: str, value: str) -> str:
    """The error message for a 401 whose requirement is `value` (a name from `requirement`)."""
    missing = _MISSING.get(value, "something the AAuth draft's requirement values do not name")
    return f"server {server!r} refused the signed request: it requires {missing}"


def refusal(server: str, status: int, headers: Iterable[tuple[str, str]]) -> AAuthRequirementError | None:
    """The error for a signed server's 401 that names a requirement, else None."""
    if status != 401:
        return None
    value = requirement(headers)
    if value is None:
        return None
    return AAuthRequirementError(describe(server, value), requirement=value, server=server)
