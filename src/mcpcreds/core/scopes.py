"""OAuth scopes of a person's login, pure (no I/O): the scope-tokens of RFC 6749 §3.3, the
`scope` and `error` of a Bearer challenge (RFC 6750 §3), and the step-up choice of the MCP
authorization spec's "Scope Challenge Handling" (a `403` with `error="insufficient_scope"`:
authorize again with the union of the scopes, a bounded number of times).

A scope here comes from a server's header or a caller's report: every string is bounded and
checked against the scope-token grammar, and no error ever quotes one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

SCOPE_TOKEN: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 §3.3 scope-token
MAX_SCOPE_CHARS: Final = 4096
MAX_SCOPES: Final = 64
MAX_CHALLENGE_CHARS: Final = 4 * MAX_SCOPE_CHARS
MAX_STEP_UPS: Final = 2  # step-up logins in a row: with the first login, at most 3 authorizations
# an auth-param of a challenge (RFC 9110 §11.2): name = token / quoted-string
_PARAM: Final = re.compile(r'(?:^|[\s,])([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]+))')
_ERROR_CODE: Final = re.compile(r"[a-z_]{1,64}")


def scope_of(tokens: list[str]) -> str | None:
    """A scope from tokens that are all valid (else None), duplicates dropped, order kept;
    None when empty or past the bounds."""
    if not tokens or len(tokens) > MAX_SCOPES or not all(SCOPE_TOKEN.fullmatch(t) for t in tokens):
        return None
    scope = " ".join(dict.fromkeys(tokens))
    return scope if len(scope) <= MAX_SCOPE_CHARS else None


def parse_scope(value: object) -> str | None:
    """A scope string (space-separated scope-tokens), normalised; None if not one."""
    if not isinstance(value, str) or len(value) > MAX_SCOPE_CHARS:
        return None
    return scope_of(value.split())


@dataclass(frozen=True, slots=True)
class Challenge:
    """What mcpcreds reads of a Bearer challenge: the error code and the scope, each None when
    absent or malformed."""

    error: str | None
    scope: str | None


def parse_challenge(header: str | None) -> Challenge:
    """The `error` and `scope` auth-params of a `WWW-Authenticate: Bearer ...` header (a
    quoted-string's escapes undone); anything malformed is absent."""
    if not header or len(header) > MAX_CHALLENGE_CHARS:
        return Challenge(None, None)
    scheme, _, params = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return Challenge(None, None)
    found: dict[str, str] = {}
    for match in _PARAM.finditer(params):
        name = match.group(1).lower()
        quoted = match.group(2)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else match.group(3)
        found.setdefault(name, value)
    error = found.get("error")
    if error is not None and not _ERROR_CODE.fullmatch(error):
        error = None
    scope = found.get("scope")
    return Challenge(error, scope_of(scope.split()) if scope is not None else None)


def challenge_scope(header: str | None) -> str | None:
    """The `scope` of a Bearer challenge (RFC 6750 §3), e.g. a 401's WWW-Authenticate."""
    return parse_challenge(header).scope


def insufficient_scope(status: int, header: str | None) -> str | None:
    """The scope a `403 insufficient_scope` answer asks for (None: not such an answer, or one
    that names no usable scope, which no step-up can satisfy)."""
    if status != 403:
        return None
    challenge = parse_challenge(header)
    return challenge.scope if challenge.error == "insufficient_scope" else None


def union(*scopes: str | None) -> str | None:
    """The union of scopes, in first-seen order (None if empty, or past the bounds)."""
    tokens = [t for scope in scopes if scope for t in scope.split()]
    return scope_of(tokens) if tokens else None


OFFLINE_ACCESS: Final = "offline_access"


def with_offline_access(scope: str | None, server_scopes: tuple[str, ...]) -> str | None:
    """The scope a person's login asks for, with `offline_access` added when the authorization
    server lists it in its metadata's `scopes_supported` (SEP-2207: such a server may issue a
    refresh token only when asked this way), and never otherwise (another server could refuse
    the unknown scope). A login that asks for no scope is left without one: an omitted scope is
    the server's default, which `offline_access` alone would replace."""
    if scope is None or OFFLINE_ACCESS not in server_scopes:
        return scope
    return union(scope, OFFLINE_ACCESS) or scope


StepUpVerdict = Literal["login", "held", "limit", "too_wide"]


@dataclass(frozen=True, slots=True)
class StepUp:
    """The step-up choice: `login` (a new login asking for `scope`), or why not: `held` (the
    login already asked for every scope the server names: the same login again would be refused
    again), `limit` (MAX_STEP_UPS step-up logins in a row already), `too_wide` (the union is past
    the bounds)."""

    verdict: StepUpVerdict
    scope: str | None = None


def step_up(asked: str | None, required: str, step_ups: int, limit: int = MAX_STEP_UPS) -> StepUp:
    """Whether a `403 insufficient_scope` naming `required` calls for a new login, given the
    scope the current login `asked` for and how many step-up logins in a row led to it."""
    held = set(asked.split()) if asked else set()
    if set(required.split()) <= held:
        return StepUp("held")
    if step_ups >= limit:
        return StepUp("limit")
    wanted = union(asked, required)
    if wanted is None:
        return StepUp("too_wide")
    return StepUp("login", wanted)
